"""Shared helpers of the Python tests: op-availability skips, the per-dtype tolerance table, a verbose
closeness check and the workspace protocol."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from transformer_engine_lite.common import capi, get_lib

# (atol, rtol) per output dtype, for results compared with an fp64 reference. Low-precision outputs
# get about two ulps at 1.0 (bf16 ulp 2^-7, fp16 2^-10): one for the rounding of the result, one
# for fp32 accumulation-order differences in large reductions.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def require_ops(*ops: str) -> None:
    """Skips the calling test when the library does not (yet) export one of `ops`."""
    lib = get_lib()
    missing = [op for op in ops if not hasattr(lib, op)]
    if missing:
        pytest.skip(f"op family not built yet: {', '.join(missing)} missing from the library")


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "") -> None:
    """torch.testing-style check with the table's tolerance for `dtype`, reporting the count and
    first indices of mismatches."""
    atol, rtol = TOLERANCES[dtype]
    out64, ref64 = out.double(), ref.double()
    bad = ~torch.isclose(out64, ref64, atol=atol, rtol=rtol)
    if bad.any():
        idx = bad.nonzero()[:5].tolist()
        err = (out64 - ref64).abs().max().item()
        pytest.fail(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements off (atol {atol}, rtol "
            f"{rtol}); max abs err {err:.3g}; first at {idx}: got "
            f"{[out64[tuple(i)].item() for i in idx]}, expected "
            f"{[ref64[tuple(i)].item() for i in idx]}"
        )


_NP_OF_DTYPE = {
    capi.DType.Byte: np.uint8,
    capi.DType.Int16: np.int16,
    capi.DType.Int32: np.int32,
    capi.DType.Int64: np.int64,
    capi.DType.Float32: np.float32,
    capi.DType.Float16: np.float16,
    capi.DType.BFloat16: ml_dtypes.bfloat16,
}


def workspace_for(call) -> capi.Tensor:
    """TE's workspace protocol: `call(ws)` with an empty workspace queries the size; allocate it."""
    query = capi.Tensor()
    call(query)
    bt = query.param(capi.TensorParam.RowwiseData)
    shape = tuple(bt.shape.data[i] for i in range(bt.shape.ndim))
    dtype = capi.DType(bt.dtype)
    numel = int(np.prod(shape)) if shape else 1
    # A zero-size NumPy view keeps a real pointer, so the second call is never another query.
    buf = np.empty(max(numel, 1), _NP_OF_DTYPE.get(dtype, np.uint8))[:numel].reshape(shape)
    return capi.Tensor(buf, dtype=dtype)
