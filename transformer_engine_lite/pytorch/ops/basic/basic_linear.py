"""BasicLinear: y = x W^T (no bias) with TE's arguments, FP8 under fp8_autocast and TP modes."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ...distributed import TPConfig, set_tensor_model_parallel_attributes, split_size
from ...fp8 import get_fp8_torch_dtype
from ...module.base import TransformerEngineBaseModule
from ...tensor import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    Quantizer,
)
from .._common import check_positive_int, compute_dtype, param_device, param_dtype, resolve_group
from ..op import BasicOperation

__all__ = ["BasicLinear"]

_OWNER = "BasicLinear"


def _kaiming_uniform(w: torch.Tensor) -> None:
    # TE's (and torch.nn.Linear's) default weight init
    torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))


def _check_userbuffers_options(options: Any) -> None:
    """{"comm_name": str} or None (the one key TE's Userbuffers fusions read)."""
    if options is None:
        return
    if not isinstance(options, dict):
        raise TypeError(f"{_OWNER}: userbuffers_options: expected a dict or None, got {options!r}")
    if not isinstance(options.get("comm_name"), str):
        raise ValueError(
            f"{_OWNER}: userbuffers_options: expected a 'comm_name' str (the initialize_ub "
            f"communicator prefix, e.g. 'qkv'), got {options!r}"
        )
    unknown = sorted(set(options) - {"comm_name"})
    if unknown:
        raise ValueError(
            f"{_OWNER}: userbuffers_options: unknown key(s) {unknown}; expected only 'comm_name'"
        )


class BasicLinear(TransformerEngineBaseModule, BasicOperation):
    """Apply y = x W^T (TE's transformer_engine.pytorch.ops.BasicLinear).

    The GEMM is te.Linear's own (TransformerEngineBaseModule._run_linear): under fp8_autocast both
    operands are quantized with the active recipe (delayed scaling with this op's amax history and
    scales, current scaling, MXFP8), FP8 weight parameters (quantized_model_init) enter as stored,
    and the gradients follow the recipe's backward. So BasicLinear (+ Bias) gives te.Linear's bytes.

    tensor_parallel_mode: None, "column" (weight split along out_features; input all-gathered on
    dim 0 with sequence_parallel) or "row" (split along in_features; output all-reduced, or
    reduce-scattered on dim 0 with sequence_parallel). tensor_parallel_group defaults to the world
    group. accumulate_into_main_grad: weight gradient added into weight.main_grad (fp32).
    userbuffers_options: {"comm_name": name} (TE's comm/GEMM overlap): the op fuser runs this
    linear as UserbuffersForwardLinear / UserbuffersBackwardLinear (ops/fused/userbuffers_*.py).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        tensor_parallel_mode: str | None = None,
        tensor_parallel_group: Any = None,
        sequence_parallel: bool = False,
        rng_state_tracker_function: Callable[[], Any] | None = None,
        accumulate_into_main_grad: bool = False,
        userbuffers_options: dict[str, Any] | None = None,
    ) -> None:
        _check_userbuffers_options(userbuffers_options)
        check_positive_int(_OWNER, "in_features", in_features)
        check_positive_int(_OWNER, "out_features", out_features)
        if tensor_parallel_mode not in (None, "column", "row"):
            raise ValueError(
                f"{_OWNER}: tensor_parallel_mode: expected None, 'column' or 'row', got "
                f"{tensor_parallel_mode!r}"
            )
        dev = param_device(device)
        dtype = param_dtype(_OWNER, dtype)
        super().__init__(num_gemms=1, device=dev)
        group = resolve_group(tensor_parallel_mode is not None, tensor_parallel_group)
        sp = bool(sequence_parallel) and tensor_parallel_mode is not None
        self._tp = TPConfig(_OWNER, tensor_parallel_mode, group, 1, sp)
        self.in_features = in_features
        self.out_features = out_features
        self.tensor_parallel_mode = tensor_parallel_mode
        self.tensor_parallel_group = group
        self.tensor_parallel_size = self._tp.size
        self.sequence_parallel = self._tp.sequence_parallel
        tp = self._tp.size
        self.local_in_features = (
            split_size(_OWNER, "in_features", in_features, tp)
            if tensor_parallel_mode == "row"
            else in_features
        )
        self.local_out_features = (
            split_size(_OWNER, "out_features", out_features, tp)
            if tensor_parallel_mode == "column"
            else out_features
        )
        self._rng_state_tracker_function = rng_state_tracker_function
        self.accumulate_into_main_grad = bool(accumulate_into_main_grad)
        # {"comm_name": name}: the fuser runs this linear as UserbuffersForwardLinear /
        # UserbuffersBackwardLinear over the initialize_ub communicators <name>_fprop/_dgrad/_wgrad
        self._userbuffers_options = userbuffers_options
        self._last_forward_quantized = False
        w = torch.empty(self.local_out_features, self.local_in_features, dtype=dtype, device=dev)
        self.weight = torch.nn.Parameter(w)
        if dev.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialize the weight (kaiming uniform, as TE); a weight on "meta" is first allocated on
        the default device (TE's deferred initialization)."""
        if self.weight.device.type == "meta":
            w = torch.empty(self.weight.shape, dtype=self.weight.dtype, device=param_device(None))
            self.weight = torch.nn.Parameter(w, requires_grad=self.weight.requires_grad)
        tracker = self._rng_state_tracker_function
        self._init_weight(self.weight, _kaiming_uniform, tracker)
        set_tensor_model_parallel_attributes(
            self.weight, self.tensor_parallel_mode is not None,
            1 if self.tensor_parallel_mode == "row" else 0, 1,
        )

    def linear_forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        acc: torch.Tensor | None = None,
        alpha: float = 1.0,
    ) -> torch.Tensor:
        """alpha x W^T (+ bias in the GEMM epilogue, or after the row-parallel reduction); acc: a
        tensor the GEMM adds its result into, in place, returned as the output (the fuser checks
        that it fits: same shape and compute dtype, contiguous, not row-parallel)."""
        if self.weight.device.type == "meta":
            raise RuntimeError(
                f"{_OWNER}: weight is on the meta device; call reset_parameters() or assign one"
            )
        dtype = compute_dtype(_OWNER, x, self.weight)
        if x.dim() < 1 or x.shape[-1] != self.local_in_features:
            raise ValueError(
                f"{_OWNER}: input: expected last dim {self.local_in_features} (in_features per TP "
                f"rank), got shape {tuple(x.shape)}"
            )
        x = x if x.dtype == dtype else x.to(dtype)
        fp8 = self._fp8_mode()
        self._note_recipe(fp8[1])
        # which communicator set (FP8 or not) the Userbuffers backward looks up
        self._last_forward_quantized = fp8[0] not in ("hp", "calibrate")
        main_grad = self._main_grad(_OWNER, self.accumulate_into_main_grad, self.weight)
        return self._run_linear(
            x, self.weight, bias, 0, self.tensor_parallel_mode, self._tp, fp8,
            add_bias=bias is not None, main_grad=main_grad, acc=acc, alpha=alpha,
        )

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        return self.linear_forward(input_), ()

    @property
    def _fp8_metas(self) -> dict[str, dict[str, Any]]:
        """TE's BasicOperation._fp8_metas: {"forward": fp8_meta, "backward": fp8_meta} (each with
        its direction's recipe state; views of this op's buffers, see module.fp8_meta)."""
        meta = self.fp8_meta
        out = {}
        for mode, key in (("forward", "scaling_fwd"), ("backward", "scaling_bwd")):
            out[mode] = {k: v for k, v in meta.items() if k not in ("scaling_fwd", "scaling_bwd")}
            if key in meta:
                out[mode][key] = meta[key]
        return out

    def num_quantizers(self, mode: str) -> int:
        """TE's count: forward (input, weight), backward (grad output)."""
        if mode not in ("forward", "backward"):
            raise ValueError(f"{_OWNER}: mode: expected 'forward' or 'backward', got {mode!r}")
        return 2 if mode == "forward" else 1

    def get_quantizer(self, mode: str, index: int) -> Quantizer | None:
        """TE's BasicOperation.get_quantizer for the recipe this op last ran under (None before
        any FP8 forward): forward index 0 = input, 1 = weight; backward 0 = grad output. Delayed
        scaling: a Float8Quantizer over this op's own scale and current amax slots (views, so
        they show the recipe's updates); current scaling / MXFP8: the recipe's quantizer."""
        n = self.num_quantizers(mode)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
            raise ValueError(f"{_OWNER}: index: expected 0..{n - 1} for {mode!r}, got {index!r}")
        recipe = getattr(self, "_last_recipe_obj", None)
        if recipe is None:
            return None
        fwd = mode == "forward"
        if fwd and index == 1 and isinstance(getattr(self.weight, "_quantizer", None), Quantizer):
            return self.weight._quantizer  # an FP8 weight parameter quantizes itself
        if recipe.custom():  # what the recipe's qfactory gave this slot (module/_custom.py)
            return self.quantizers["scaling_fwd" if fwd else "scaling_bwd"][index]
        dtype = get_fp8_torch_dtype(recipe.fp8_format, fwd)
        if recipe.delayed():
            scale = self.fp8_fwd_scale if fwd else self.fp8_bwd_scale
            hist = self.fp8_fwd_amax_history if fwd else self.fp8_bwd_amax_history
            return Float8Quantizer(scale[index : index + 1], hist[0, index : index + 1], dtype)
        if recipe.float8_current_scaling():
            qp = (recipe.fp8_quant_fwd_inp, recipe.fp8_quant_fwd_weight)[index] if fwd else (
                recipe.fp8_quant_bwd_grad)
            return Float8CurrentScalingQuantizer(
                dtype, force_pow_2_scales=bool(qp.power_2_scale), amax_epsilon=float(qp.amax_epsilon)
            )
        if recipe.nvfp4():
            from ...quantization import block_spec, nvfp4_quantizer

            return nvfp4_quantizer(block_spec(recipe, ("input", "weight")[index] if fwd else "grad"))
        if recipe.float8_block_scaling():
            from ...quantization import block_spec

            spec = block_spec(recipe, ("input", "weight")[index] if fwd else "grad")
            return Float8BlockQuantizer(dtype, rowwise=True, columnwise=True,
                                        amax_epsilon=spec.eps, force_pow_2_scales=spec.pow2,
                                        block_scaling_dim=spec.block_dim)
        return MXFP8Quantizer(dtype)
