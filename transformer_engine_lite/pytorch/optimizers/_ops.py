"""TE's multi-tensor functions (transformer_engine_torch names) over the te_lite ops.

Each takes TE's arguments: (chunk_size, noop_flag, tensor_lists, *scalars); tensor_lists is a list
of lists of tensors (one list per role: grads, params, ...), passed to the dispatcher op as one
Tensor[] per list. Fake kernels for FakeTensor tracing are registered here (the ops mutate their
lists in place; only the L2 norms return tensors).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .. import te_lite_ops  # noqa: F401  (loads the extension: torch.ops.te_lite.*)

_ops = torch.ops.te_lite
TensorLists = Sequence[Sequence[torch.Tensor]]


def _lists(name: str, tensor_lists: TensorLists, counts: Sequence[int]) -> list[list[torch.Tensor]]:
    if not isinstance(tensor_lists, (list, tuple)) or not all(
        isinstance(ts, (list, tuple)) for ts in tensor_lists
    ):
        raise TypeError(f"{name}: tensor_lists: expected a list of lists of tensors")
    if len(tensor_lists) not in counts:
        expected = " or ".join(str(c) for c in counts)
        raise ValueError(
            f"{name}: tensor_lists: expected {expected} lists, got {len(tensor_lists)}"
        )
    return [list(ts) for ts in tensor_lists]


def multi_tensor_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: TensorLists,
                       scale: float) -> None:
    """tensor_lists[1][j] = tensor_lists[0][j] * scale; noop_flag = 1 on a non-finite input."""
    src, dst = _lists("multi_tensor_scale", tensor_lists, (2,))
    _ops.multi_tensor_scale(chunk_size, noop_flag, src, dst, float(scale))


def multi_tensor_l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: TensorLists,
                        per_tensor: bool | None = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm [1], per-tensor norms [n] or [0]) of tensor_lists[0] (fp32)."""
    (xs, *_) = _lists("multi_tensor_l2norm", tensor_lists, (1, 2, 3, 4, 5))
    return _ops.multi_tensor_l2norm(chunk_size, noop_flag, xs, bool(per_tensor))


def multi_tensor_unscale_l2norm(chunk_size: int, noop_flag: torch.Tensor,
                                tensor_lists: TensorLists, inv_scale: torch.Tensor,
                                per_tensor: bool | None = False,
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """As multi_tensor_l2norm, of x * inv_scale."""
    (xs, *_) = _lists("multi_tensor_unscale_l2norm", tensor_lists, (1, 2, 3, 4, 5))
    return _ops.multi_tensor_unscale_l2norm(chunk_size, noop_flag, xs, inv_scale, bool(per_tensor))


def _adam_scalars(args: tuple) -> tuple:
    lr, beta1, beta2, eps, step, mode, bias_correction, weight_decay = args
    return (float(lr), float(beta1), float(beta2), float(eps), int(step), int(mode),
            int(bias_correction), float(weight_decay))


def multi_tensor_adam(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: TensorLists,
                      *args: Any) -> None:
    """Adam over [grads, params, exp_avgs, exp_avg_sqs(, fp32 master params)]; args: lr, beta1,
    beta2, eps, step, mode (0 L2, 1 AdamW), bias_correction, weight_decay."""
    lists = _lists("multi_tensor_adam", tensor_lists, (4, 5))
    master = lists[4] if len(lists) == 5 else []
    _ops.multi_tensor_adam(chunk_size, noop_flag, *lists[:4], master, *_adam_scalars(args))


def multi_tensor_adam_param_remainder(chunk_size: int, noop_flag: torch.Tensor,
                                      tensor_lists: TensorLists, *args: Any) -> None:
    """Adam over [grads, bf16 params, exp_avgs, exp_avg_sqs, int16 remainders]."""
    lists = _lists("multi_tensor_adam_param_remainder", tensor_lists, (5,))
    _ops.multi_tensor_adam_param_remainder(chunk_size, noop_flag, *lists, *_adam_scalars(args))


def multi_tensor_adam_fp8(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: TensorLists,
                          *args: Any) -> None:
    """Adam over [grads, FP8 params (uint8), exp_avgs, exp_avg_sqs, master, scales, amaxes,
    scale_invs]; args: the 8 Adam scalars, then fp8_dtype (a DType or torch float8 dtype)."""
    lists = _lists("multi_tensor_adam_fp8", tensor_lists, (8,))
    if len(args) != 9:
        raise TypeError(
            f"multi_tensor_adam_fp8: expected 9 arguments after tensor_lists, got {len(args)}"
        )
    from ..tensor.quantized_tensor import fp8_torch_dtype

    fp8 = fp8_torch_dtype("multi_tensor_adam_fp8", args[8])
    _ops.multi_tensor_adam_fp8(chunk_size, noop_flag, *lists, *_adam_scalars(args[:8]), fp8)


def _capturable(name: str, counts: tuple, chunk_size: int, noop_flag: torch.Tensor,
                tensor_lists: TensorLists, lr: torch.Tensor, beta1: float, beta2: float,
                eps: float, step: torch.Tensor, mode: int, bias_correction: int,
                weight_decay: float, inv_scale: torch.Tensor) -> None:
    lists = _lists(name, tensor_lists, counts)
    master = lists[4] if len(lists) == 5 else []
    dev = noop_flag.device
    _ops.multi_tensor_adam_capturable(
        chunk_size, noop_flag, *lists[:4], master,
        lr.to(device=dev, dtype=torch.float32).reshape(1), float(beta1), float(beta2), float(eps),
        step.to(device=dev, dtype=torch.int32).reshape(1), int(mode), int(bias_correction),
        float(weight_decay), inv_scale.to(device=dev, dtype=torch.float32).reshape(1))


def multi_tensor_adam_capturable(chunk_size: int, noop_flag: torch.Tensor,
                                 tensor_lists: TensorLists, *args: Any) -> None:
    """Adam with lr, step and inv_scale as tensors; nothing happens when noop_flag == 1."""
    _capturable("multi_tensor_adam_capturable", (4,), chunk_size, noop_flag, tensor_lists, *args)


def multi_tensor_adam_capturable_master(chunk_size: int, noop_flag: torch.Tensor,
                                        tensor_lists: TensorLists, *args: Any) -> None:
    """multi_tensor_adam_capturable with fp32 master params (5 lists)."""
    _capturable("multi_tensor_adam_capturable_master", (5,), chunk_size, noop_flag, tensor_lists,
                *args)


def multi_tensor_sgd(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: TensorLists,
                     wd: float, momentum: float, dampening: float, lr: float, nesterov: bool,
                     first_run: bool, wd_after_momentum: bool, scale: float) -> None:
    """SGD over [grads, weights, momentum buffers(, fp16/bf16 model weights out)]."""
    lists = _lists("multi_tensor_sgd", tensor_lists, (3, 4))
    out = lists[3] if len(lists) == 4 else []
    _ops.multi_tensor_sgd(chunk_size, noop_flag, *lists[:3], out, float(wd), float(momentum),
                          float(dampening), float(lr), bool(nesterov), bool(first_run),
                          bool(wd_after_momentum), float(scale))


def multi_tensor_compute_scale_and_scale_inv(chunk_size: int, noop_flag: torch.Tensor,
                                             tensor_lists: TensorLists, max_fp8: float,
                                             force_pow_2_scales: bool = False,
                                             epsilon: float = 0.0) -> None:
    """[amaxes, scales, scale_invs]: scale = current-scaling scale of amax, scale_inv = 1/scale."""
    lists = _lists("multi_tensor_compute_scale_and_scale_inv", tensor_lists, (3,))
    _ops.multi_tensor_compute_scale_and_scale_inv(chunk_size, noop_flag, *lists, float(max_fp8),
                                                  bool(force_pow_2_scales), float(epsilon))


# ---- fake kernels: the in-place ops return nothing; the norms return fresh fp32 tensors.
def _no_output(*_: Any, **__: Any) -> None:
    return None


for _name in ("multi_tensor_scale", "multi_tensor_adam", "multi_tensor_adam_param_remainder",
              "multi_tensor_adam_fp8", "multi_tensor_adam_capturable", "multi_tensor_sgd",
              "multi_tensor_compute_scale_and_scale_inv"):
    torch.library.register_fake(f"te_lite::{_name}")(_no_output)


@torch.library.register_fake("te_lite::multi_tensor_l2norm")
def _l2norm_fake(chunk_size, noop_flag, tensors, per_tensor):  # noqa: ANN001, ANN202
    f32 = {"dtype": torch.float32, "device": noop_flag.device}
    return torch.empty(1, **f32), torch.empty(len(tensors) if per_tensor else 0, **f32)


@torch.library.register_fake("te_lite::multi_tensor_unscale_l2norm")
def _unscale_l2norm_fake(chunk_size, noop_flag, tensors, inv_scale, per_tensor):  # noqa: ANN001
    return _l2norm_fake(chunk_size, noop_flag, tensors, per_tensor)
