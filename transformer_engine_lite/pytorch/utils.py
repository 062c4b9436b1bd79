"""TE's public helpers from `transformer_engine.pytorch.utils` that model code imports.

Same names, signatures and results as TE. Device queries answer for the machine: with no GPU,
get_device_compute_capability() is (0, 0) (there is no CUDA device to describe) while the CPU
backend still runs bf16 and every FP8 recipe TE-lite implements (see is_bf16_available and the
is_*_available checks in fp8.py).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable

import torch

from ..common import config

__all__ = [
    "make_weak_ref",
    "nvtx_range_pop",
    "nvtx_range_push",
    "round_up_to_nearest_multiple",
    "attention_mask_func",
    "divide",
    "get_default_init_method",
    "get_cudnn_version",
    "get_device_compute_capability",
    "gpu_autocast_ctx",
    "init_method_constant",
    "init_method_normal",
    "is_bf16_available",
    "is_bf16_compatible",
    "is_non_tn_fp8_gemm_supported",
    "resolve_grouped_linear_single_param_flags",
    "scaled_init_method_normal",
]


def init_method_normal(sigma: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """Init method drawing from N(0, sigma)."""
    sigma = float(sigma)

    def init_(tensor: torch.Tensor) -> torch.Tensor:
        return torch.nn.init.normal_(tensor, mean=0.0, std=sigma)

    return init_


def scaled_init_method_normal(
    sigma: float, num_layers: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Init method drawing from N(0, sigma / sqrt(2 * num_layers)) (output projections)."""
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(
            f"scaled_init_method_normal: num_layers: expected an int >= 1, got {num_layers!r}"
        )
    return init_method_normal(sigma / math.sqrt(2.0 * num_layers))


def init_method_constant(val: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """Init method filling the tensor with `val`."""
    val = float(val)

    def init_(tensor: torch.Tensor) -> torch.Tensor:
        return torch.nn.init.constant_(tensor, val)

    return init_


def get_default_init_method() -> Callable[[torch.Tensor], torch.Tensor]:
    """TE's default weight init: N(0, 0.023)."""
    return init_method_normal(0.023)


def attention_mask_func(
    attention_scores: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """TE's mask function for the unfused softmax: masked positions (True) become -10000, in
    place."""
    attention_scores.masked_fill_(attention_mask, -10000.0)
    return attention_scores


def get_device_compute_capability() -> tuple[int, int]:
    """(major, minor) of the current CUDA/ROCm device; (0, 0) when there is none."""
    if not torch.cuda.is_available():
        return (0, 0)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return (props.major, props.minor)


def is_bf16_compatible() -> bool:
    """bf16 compute: always on the CPU backend; compute capability 8.0+ on a GPU."""
    if not torch.cuda.is_available():
        return True
    return torch.version.hip is not None or get_device_compute_capability() >= (8, 0)


def is_bf16_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """Whether bf16 runs here (TE's API: a bool, or (bool, reason) with return_reason=True)."""
    ok = is_bf16_compatible()
    reason = "" if ok else "bf16 needs compute capability 8.0 or higher"
    return (ok, reason) if return_reason else ok


# TE's torch.amp.autocast on the device its kernels run on: CUDA when torch has a GPU, otherwise
# the CPU, where this build's kernels run (autocast then casts to bf16 on the CPU).
gpu_autocast_ctx = functools.partial(
    torch.amp.autocast, device_type="cuda" if torch.cuda.is_available() else "cpu"
)


def divide(numerator: int, denominator: int) -> int:
    """numerator / denominator, which must divide exactly (TE's helper for parallel sizes)."""
    if denominator == 0 or numerator % denominator:
        raise ValueError(f"divide: {numerator} is not divisible by {denominator}")
    return numerator // denominator


def round_up_to_nearest_multiple(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value (TE's helper)."""
    if not isinstance(multiple, int) or multiple <= 0:
        raise ValueError(f"round_up_to_nearest_multiple: multiple: expected an int > 0, got {multiple!r}")
    return ((value + multiple - 1) // multiple) * multiple


def nvtx_range_push(msg: str) -> None:
    """Opens a named range in profiles: torch.profiler's record_function on the CPU (TE pushes an
    NVTX range, which only GPU profilers show)."""
    rf = torch.autograd.profiler.record_function(msg)
    rf.__enter__()
    _RANGES.append(rf)


def nvtx_range_pop(msg: str | None = None) -> None:
    """Closes the innermost range nvtx_range_push opened (msg, if given, must name it)."""
    if not _RANGES:
        raise RuntimeError("nvtx_range_pop: no range is open (nvtx_range_push was not called)")
    rf = _RANGES[-1]
    if msg is not None and getattr(rf, "name", msg) != msg:
        raise RuntimeError(f"nvtx_range_pop: the innermost open range is {rf.name!r}, not {msg!r}")
    _RANGES.pop().__exit__(None, None, None)


_RANGES: list = []


def make_weak_ref(x):
    """TE's helper for CUDA-graph outputs: a tensor (or nested list/tuple/dict of them) with the same
    storage that does not keep the original tensor object alive. On the CPU a detached alias
    serves: it shares the storage and holds no reference to the original tensor or its graph."""
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (list, tuple)):
        return type(x)(make_weak_ref(v) for v in x)
    if isinstance(x, dict):
        return {k: make_weak_ref(v) for k, v in x.items()}
    if x is None or isinstance(x, (int, float, bool)):
        return x
    raise TypeError(f"make_weak_ref: expected tensors (or lists/tuples/dicts of them), got {type(x).__name__}")


def is_non_tn_fp8_gemm_supported() -> bool:
    """Whether FP8 GEMMs take layouts other than TN (TE's: so no transposed FP8 copy is needed).

    TE answers from the GPU generation (cuBLAS on Blackwell takes any layout, Hopper only TN). The
    lite's GEMM (te_lite::gemm, on every device it runs on) takes transa / transb for FP8 operands
    as for any other, so the answer is True: a Float8Tensor's column-wise usage is served by its
    row-wise data and no _transpose is made (TE's behaviour on such devices).
    """
    return True


def get_cudnn_version() -> tuple[int, int, int]:
    """TE's (major, minor, patch) of the cuDNN its attention uses. This library uses no cuDNN (its
    fused attention is its own kernels), so the answer is (0, 0, 0) on every machine, with or
    without cuDNN installed: TE's gates such as `get_cudnn_version() >= (8, 9, 1)` read False."""
    return (0, 0, 0)


def torch_version() -> tuple[int, ...]:
    """TE's torch_version(): torch's (major, minor, patch) as ints (local suffixes dropped)."""
    from packaging.version import Version

    return Version(str(torch.__version__)).release


def resolve_grouped_linear_single_param_flags(
    single_grouped_weight: bool, single_grouped_bias: bool
) -> tuple[bool, bool]:
    """TE's gate on GroupedLinear's single grouped weight / bias: they are experimental in TE and
    only honoured when NVTE_GROUPED_LINEAR_SINGLE_PARAM is an integer > 0; otherwise both fall back
    to per-expert parameters (with a warning), so a TE user's module gets the same parameter names
    and state_dict keys here as on TE."""
    if not (single_grouped_weight or single_grouped_bias):
        return single_grouped_weight, single_grouped_bias
    raw = config.get("NVTE_GROUPED_LINEAR_SINGLE_PARAM")
    try:
        enabled = int(raw) > 0
    except ValueError:
        raise ValueError(
            f"NVTE_GROUPED_LINEAR_SINGLE_PARAM: expected an integer (0 or 1), got {raw!r}"
        ) from None
    if not enabled:
        warnings.warn(
            f"GroupedLinear was constructed with single_grouped_weight={single_grouped_weight} "
            f"and single_grouped_bias={single_grouped_bias}, but the "
            "NVTE_GROUPED_LINEAR_SINGLE_PARAM environment variable is not set. "
            "Disabling single grouped weight/bias and falling back to per-expert parameters.",
            UserWarning,
            stacklevel=3,
        )
        return False, False
    warnings.warn(
        "GroupedLinear is using single_grouped_weight/single_grouped_bias. This feature is "
        "experimental in TransformerEngine and may change in future releases.",
        UserWarning,
        stacklevel=3,
    )
    return single_grouped_weight, single_grouped_bias
