"""C-API helpers shared by the benchmarks that call nvte_* through ctypes (bench_core,
_norm_cases)."""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from transformer_engine_lite.common import capi

_NP_OF_DTYPE = {
    capi.DType.Byte: np.uint8,
    capi.DType.Int16: np.int16,
    capi.DType.Int32: np.int32,
    capi.DType.Int64: np.int64,
    capi.DType.Float32: np.float32,
    capi.DType.Float16: np.float16,
    capi.DType.BFloat16: ml_dtypes.bfloat16,
}


def workspace_for(call: Callable[[capi.Tensor], None]) -> capi.Tensor:
    """TE's workspace protocol: call with an empty workspace (a size query), allocate, return it."""
    query = capi.Tensor()
    call(query)
    bt = query.param(capi.TensorParam.RowwiseData)
    shape = tuple(bt.shape.data[i] for i in range(bt.shape.ndim))
    dtype = capi.DType(bt.dtype)
    numel = int(np.prod(shape)) if shape else 1
    # NumPy keeps a real pointer even for a zero-size view, so the second call never re-queries.
    buf = np.empty(max(numel, 1), dtype=_NP_OF_DTYPE.get(dtype, np.uint8))[:numel].reshape(shape)
    return capi.Tensor(buf, dtype=dtype)
