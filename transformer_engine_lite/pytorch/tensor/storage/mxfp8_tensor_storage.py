"""MXFP8TensorStorage: TE's MXFP8 buffers without the torch.Tensor wrapper (MXFP8Tensor inherits
its usage and FSDP2 methods).

Layout (the te_lite MXFP8 kernels'): data are uint8 FP8 bytes of the tensor flattened to 2-D
[rows, cols] (rows = product of the leading dims); _rowwise_scale_inv holds one E8M0 byte per 1x32
block along cols ([rows, ceil(cols/32)]), _columnwise_scale_inv one per 32x1 block along rows
([ceil(rows/32), cols]). Scales are compact: TE's GEMM-swizzled layout is not implemented. A scale
buffer may carry TE's alignment padding (rows padded to 128 row-wise, 4 column-wise); only its
leading rows are used.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...constants import MXFP8_BLOCK_SCALING_SIZE
from ...quantization import ops
from ..quantized_tensor import QuantizedTensorStorage, fp8_torch_dtype, to_dtype_enum

__all__ = ["MXFP8TensorStorage"]

_FIELDS = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")


def _as_u8(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.dtype == torch.uint8 else t.view(torch.uint8)


class MXFP8TensorStorage(QuantizedTensorStorage):
    """See the module docstring. fake_dtype: the dtype dequantize() returns by default."""

    def __init__(
        self,
        *,
        rowwise_data: torch.Tensor | None,
        rowwise_scale_inv: torch.Tensor | None,
        columnwise_data: torch.Tensor | None,
        columnwise_scale_inv: torch.Tensor | None,
        fp8_dtype: Any,
        quantizer: Any = None,
        with_gemm_swizzled_scales: bool = False,
        fake_dtype: torch.dtype | None = None,
        **_: Any,
    ) -> None:
        self._set_mxfp8_fields(
            "MXFP8TensorStorage",
            rowwise_data,
            rowwise_scale_inv,
            columnwise_data,
            columnwise_scale_inv,
            fp8_dtype,
            quantizer,
            with_gemm_swizzled_scales,
        )
        self._fake_dtype = torch.float32 if fake_dtype is None else fake_dtype

    def _set_mxfp8_fields(
        self,
        owner: str,
        rowwise_data: torch.Tensor | None,
        rowwise_scale_inv: torch.Tensor | None,
        columnwise_data: torch.Tensor | None,
        columnwise_scale_inv: torch.Tensor | None,
        fp8_dtype: Any,
        quantizer: Any,
        with_gemm_swizzled_scales: bool,
    ) -> None:
        if rowwise_data is None and columnwise_data is None:
            raise ValueError(f"{owner}: expected rowwise_data or columnwise_data, got neither")
        if with_gemm_swizzled_scales:
            raise NotImplementedError(
                f"{owner}: with_gemm_swizzled_scales=True is not implemented in "
                "transformer_engine_lite (its MXFP8 kernels take compact scales)"
            )
        for name, data, scale in (
            ("rowwise", rowwise_data, rowwise_scale_inv),
            ("columnwise", columnwise_data, columnwise_scale_inv),
        ):
            if (data is None) != (scale is None):
                raise ValueError(
                    f"{owner}: {name}_scale_inv: expected it exactly when {name}_data is given, "
                    f"got data {'None' if data is None else 'a tensor'} and scale_inv "
                    f"{'None' if scale is None else 'a tensor'}"
                )
        self._rowwise_data, self._rowwise_scale_inv = _as_u8(rowwise_data), rowwise_scale_inv
        self._columnwise_data = _as_u8(columnwise_data)
        self._columnwise_scale_inv = columnwise_scale_inv
        self._fp8_dtype = to_dtype_enum(fp8_torch_dtype(owner, fp8_dtype))
        self._quantizer = quantizer
        self._with_gemm_swizzled_scales = False

    # ------------------------------------------------------------------------------- data
    def _data_2d_shape(self) -> torch.Size:
        data = self._rowwise_data if self._rowwise_data is not None else self._columnwise_data
        if data is None:
            raise RuntimeError(f"{type(self).__name__} holds no data (both usages were dropped)")
        return data.reshape(-1, data.shape[-1]).shape if data.dim() != 2 else data.shape

    def size(self, *args: Any, **kwargs: Any) -> Any:
        data = self._rowwise_data if self._rowwise_data is not None else self._columnwise_data
        if data is None:
            raise RuntimeError(f"{type(self).__name__} holds no data (both usages were dropped)")
        return data.size(*args, **kwargs)

    def _dequantize_2d(self, dtype: torch.dtype) -> torch.Tensor:
        """The values as [rows, cols] (from the row-wise copy if kept, else the column-wise)."""
        rows, cols = self._data_2d_shape()
        col = self._rowwise_data is None
        data = self._columnwise_data if col else self._rowwise_data
        scale = self._columnwise_scale_inv if col else self._rowwise_scale_inv
        block = MXFP8_BLOCK_SCALING_SIZE
        # Only the leading (unpadded) scale rows and columns describe blocks.
        if col:
            scale = scale[: math.ceil(rows / block), :cols]
        else:
            scale = scale[:rows, : math.ceil(cols / block)]
        fp8 = fp8_torch_dtype(type(self).__name__, self._fp8_dtype)
        data = data.reshape(rows, cols).view(fp8)
        return ops().dequantize_mxfp8(data, scale.contiguous(), col, dtype)

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self._dequantize_2d(dtype or self._fake_dtype).reshape(self.size())

    def get_data_tensors(self, rowwise_data: bool = True, columnwise_data: bool = True) -> Any:
        """TE's: (row-wise data, column-wise data), or the one asked for."""
        if rowwise_data and columnwise_data:
            return self._rowwise_data, self._columnwise_data
        if rowwise_data:
            return self._rowwise_data
        if columnwise_data:
            return self._columnwise_data
        raise ValueError(
            f"{type(self).__name__}.get_data_tensors: expected rowwise_data or columnwise_data, "
            "got neither"
        )

    def get_usages(self) -> dict[str, bool]:
        return {
            "rowwise": self._rowwise_data is not None,
            "columnwise": self._columnwise_data is not None,
        }

    def update_usage(
        self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None
    ) -> None:
        """Drop the copies not needed (None: keep what is there). A dropped copy cannot be
        regenerated (each comes from its own scaling pass over the high-precision values)."""
        owner = f"{type(self).__name__}.update_usage"
        for name, wanted in (("rowwise", rowwise_usage), ("columnwise", columnwise_usage)):
            data = getattr(self, f"_{name}_data")
            if wanted is None:
                continue
            if wanted and (data is None or getattr(self, f"_{name}_scale_inv") is None):
                raise RuntimeError(
                    f"{owner}: {name}_usage=True, but this tensor holds no {name} data"
                )
            if not wanted:
                setattr(self, f"_{name}_data", None)
                setattr(self, f"_{name}_scale_inv", None)

    # ------------------------------------------------------------------------------ FSDP2
    def fsdp_buffer_fields(self) -> tuple[str, ...]:
        """Each kept direction's data and scales (dropped directions are left out)."""
        fields: list[str] = []
        if self._rowwise_data is not None:
            fields += ["_rowwise_data", "_rowwise_scale_inv"]
        if self._columnwise_data is not None:
            fields += ["_columnwise_data", "_columnwise_scale_inv"]
        return tuple(fields)

    def fsdp_extract_buffers(self) -> tuple[tuple[torch.Tensor | None, ...], dict[str, Any]]:
        """As the base, with each scale buffer cut to its block rows: alignment padding would
        land between the shards when FSDP2 concatenates them along dim 0."""
        buffers, meta = super().fsdp_extract_buffers()
        rows = self._data_2d_shape()[0]
        wanted = {
            "_rowwise_scale_inv": rows,
            "_columnwise_scale_inv": math.ceil(rows / MXFP8_BLOCK_SCALING_SIZE),
        }
        out = []
        for name, buf in zip(meta["field_names"], buffers):
            if name in wanted and buf is not None and buf.shape[0] != wanted[name]:
                buf = buf[: wanted[name]]
            out.append(buf)
        return tuple(out), meta
