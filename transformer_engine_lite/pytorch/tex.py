"""TE's `transformer_engine_torch` names that Python code uses: the DType enum (same values as the
C API's NVTEDType), its torch dtype mapping, and the multi_tensor_* functions (same signatures:
chunk_size, noop_flag, tensor_lists, *scalars)."""

from __future__ import annotations

from enum import IntEnum

import torch

# TE's extension exposes these as module functions; ours live in optimizers._ops and are looked up
# lazily (module __getattr__) because optimizers imports this module's package at import time.
_MULTI_TENSOR = (
    "multi_tensor_adam",
    "multi_tensor_adam_capturable",
    "multi_tensor_adam_capturable_master",
    "multi_tensor_adam_fp8",
    "multi_tensor_adam_param_remainder",
    "multi_tensor_compute_scale_and_scale_inv",
    "multi_tensor_l2norm",
    "multi_tensor_scale",
    "multi_tensor_sgd",
    "multi_tensor_unscale_l2norm",
)
__all__ = ["DType", "dtype_to_torch", "torch_to_dtype", *_MULTI_TENSOR]


class DType(IntEnum):
    kByte = 0
    kInt16 = 1
    kInt32 = 2
    kInt64 = 3
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat8E8M0 = 9
    # NVFP4's element type (TE's value). Named so that TE code comparing against it runs; no op of
    # ours takes it yet (the NVFP4 recipe is not implemented): dtype_to_torch refuses it.
    kFloat4E2M1 = 10


_TO_TORCH = {
    DType.kByte: torch.uint8,
    DType.kInt16: torch.int16,
    DType.kInt32: torch.int32,
    DType.kInt64: torch.int64,
    DType.kFloat32: torch.float32,
    DType.kFloat16: torch.float16,
    DType.kBFloat16: torch.bfloat16,
    DType.kFloat8E4M3: torch.float8_e4m3fn,
    DType.kFloat8E5M2: torch.float8_e5m2,
    DType.kFloat8E8M0: torch.uint8,
}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items() if k is not DType.kFloat8E8M0}


def dtype_to_torch(dtype: DType | torch.dtype, what: str = "fp8_dtype") -> torch.dtype:
    """torch dtype of a DType (a torch dtype passes through)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == DType.kFloat4E2M1:
        raise NotImplementedError(f"{what}: DType.kFloat4E2M1 (NVFP4) is not implemented")
    try:
        return _TO_TORCH[DType(dtype)]
    except (ValueError, KeyError):
        raise ValueError(f"{what}: expected a DType or torch.dtype, got {dtype!r}") from None


def torch_to_dtype(dtype: torch.dtype) -> DType:
    try:
        return _FROM_TORCH[dtype]
    except KeyError:
        raise ValueError(f"dtype: {dtype} has no transformer_engine DType") from None


def __getattr__(name: str):  # noqa: ANN202  (PEP 562)
    if name in _MULTI_TENSOR:
        from .optimizers import _ops

        return getattr(_ops, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_fused_attn_backend(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """TE's tex.get_fused_attn_backend: the sub-backend of the FusedAttention slot
    (cpp_extensions/fused_attn.py; imported at the call: cpp_extensions imports this module)."""
    from .cpp_extensions.fused_attn import get_fused_attn_backend as impl

    return impl(*args, **kwargs)
