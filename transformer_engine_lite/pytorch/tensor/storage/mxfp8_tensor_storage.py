"""MXFP8TensorStorage: TE's MXFP8 buffers without the torch.Tensor wrapper (MXFP8Tensor inherits
its usage and FSDP2 methods).

Layout (the te_lite MXFP8 kernels'): data are uint8 FP8 bytes of the tensor flattened to 2-D
[rows, cols] (rows = product of the leading dims); _rowwise_scale_inv holds one E8M0 byte per 1x32
block along cols ([rows, ceil(cols/32)]), _columnwise_scale_inv one per 32x1 block along rows
([ceil(rows/32), cols]). Scales are compact, or, when _with_gemm_swizzled_scales (a quantizer with
optimize_for_gemm), in TE's GEMM-swizzled order and padded shapes (_gemm_swizzle.py; every reader
goes through _scale_grid, which undoes it). A compact scale buffer may carry TE's alignment padding
(rows padded to 128 row-wise, 4 column-wise); only its leading rows are used.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...constants import MXFP8_BLOCK_SCALING_SIZE
from ...quantization import ops
from .._gemm_swizzle import (
    swizzle_grid,
    swizzle_mxfp8_columnwise,
    unswizzle_grid,
    unswizzle_mxfp8_columnwise,
)
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
        self._with_gemm_swizzled_scales = bool(with_gemm_swizzled_scales)

    # ------------------------------------------------------------------------------- data
    def _data_2d_shape(self) -> torch.Size:
        data = self._rowwise_data if self._rowwise_data is not None else self._columnwise_data
        if data is None:
            raise RuntimeError(f"{type(self).__name__} holds no data (both usages were dropped)")
        return torch.Size((math.prod(data.shape[:-1]), data.shape[-1])) if data.dim() != 2 \
            else data.shape

    def size(self, *args: Any, **kwargs: Any) -> Any:
        data = self._rowwise_data if self._rowwise_data is not None else self._columnwise_data
        if data is None:
            raise RuntimeError(f"{type(self).__name__} holds no data (both usages were dropped)")
        return data.size(*args, **kwargs)

    def _scale_grid(self, columnwise: bool) -> torch.Tensor | None:
        """A copy's compact scale grid, [rows, ceil(cols/32)] or [ceil(rows/32), cols] (padding
        cut off; unswizzled if stored GEMM-swizzled)."""
        scale = self._columnwise_scale_inv if columnwise else self._rowwise_scale_inv
        if scale is None:
            return None
        rows, cols = self._data_2d_shape()
        blocks = math.ceil(cols / MXFP8_BLOCK_SCALING_SIZE)
        if self._with_gemm_swizzled_scales:
            if columnwise:
                return unswizzle_mxfp8_columnwise(scale, rows, cols)
            return unswizzle_grid(scale, rows, blocks)[:rows, :blocks]
        # Only the leading (unpadded) scale rows and columns describe blocks.
        if columnwise:
            return scale[: math.ceil(rows / MXFP8_BLOCK_SCALING_SIZE), :cols]
        return scale[:rows, :blocks]

    def _swizzle_scales_for_gemm(self) -> None:
        """TE's inplace_swizzle_scale_for_gemm: each kept grid into the GEMM-swizzled layout in
        TE's padded shapes (row-wise [roundup(rows, 128), roundup(ceil(cols/32), 4)], column-wise
        [roundup(ceil(rows/32), 4), roundup(cols, 128)]), in new buffers."""
        if self._with_gemm_swizzled_scales:
            return
        self._swizzle_grid_of(False)
        self._swizzle_grid_of(True)
        self._with_gemm_swizzled_scales = True

    def _swizzle_grid_of(self, columnwise: bool) -> None:
        """One copy's (compact) grid into the GEMM-swizzled layout, in a new buffer; the flag is
        the caller's (TE's multi-tensor swizzle sets it only after both copies)."""
        rows, cols = self._data_2d_shape()
        if columnwise and self._columnwise_scale_inv is not None:
            self._columnwise_scale_inv = swizzle_mxfp8_columnwise(
                self._columnwise_scale_inv, rows, cols)
        if not columnwise and self._rowwise_scale_inv is not None:
            self._rowwise_scale_inv = swizzle_grid(
                self._rowwise_scale_inv, rows, math.ceil(cols / MXFP8_BLOCK_SCALING_SIZE))

    def get_metadata(self) -> dict[str, Any]:
        """TE's: the constructor keywords that rebuild this tensor (buffers shared)."""
        fake = self.dtype if isinstance(self, torch.Tensor) else self._fake_dtype
        return {"rowwise_data": self._rowwise_data, "rowwise_scale_inv": self._rowwise_scale_inv,
                "columnwise_data": self._columnwise_data,
                "columnwise_scale_inv": self._columnwise_scale_inv, "fp8_dtype": self._fp8_dtype,
                "quantizer": self._quantizer,
                "with_gemm_swizzled_scales": self._with_gemm_swizzled_scales,
                "fake_dtype": fake}

    def _dequantize_2d(self, dtype: torch.dtype) -> torch.Tensor:
        """The values as [rows, cols] (from the row-wise copy if kept, else the column-wise)."""
        rows, cols = self._data_2d_shape()
        col = self._rowwise_data is None
        data = self._columnwise_data if col else self._rowwise_data
        scale = self._scale_grid(col)
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
        if self._with_gemm_swizzled_scales:
            # Swizzled tiles mix 128 rows: shards' grids cannot be concatenated along dim 0.
            raise NotImplementedError(
                f"{type(self).__name__}.fsdp_extract_buffers: an MXFP8 tensor with GEMM-swizzled "
                "scales (optimize_for_gemm) cannot be all-gathered by FSDP2 in "
                "transformer_engine_lite; quantize FSDP2 weights with compact scales")
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
