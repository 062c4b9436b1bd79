"""Float8BlockwiseQTensorStorage: TE's Float8BlockScaling buffers without the torch.Tensor wrapper
(Float8BlockwiseQTensor inherits its data and usage methods).

Layout (TE's GEMM_READY, the te_lite kernels': core cast.h, nvte_quantize_v2): _rowwise_data holds
the FP8 bytes in the tensor's shape; _columnwise_data the transposed copy [last dim, leading
dims...]; scales are fp32 grids. 1D (1x128 tiles, is_2D_scaled False): row-wise scale_inv
[ceil(cols/128), roundup(rows, 4)], column-wise [ceil(rows/128), roundup(cols, 4)]. 2D (128x128
blocks): row-wise [ceil(rows/128), roundup(ceil(cols/128), 4)], column-wise the transposed grid.
rows = the leading dims flattened.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...quantization import ops
from ..quantized_tensor import QuantizedTensorStorage, fp8_torch_dtype, to_dtype_enum

__all__ = ["Float8BlockwiseQTensorStorage"]


def _as_u8(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.dtype == torch.uint8 else t.view(torch.uint8)


class Float8BlockwiseQTensorStorage(QuantizedTensorStorage):
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
        is_2D_scaled: bool = False,
        fake_dtype: torch.dtype | None = None,
        **_: Any,
    ) -> None:
        self._set_block_fields(
            "Float8BlockwiseQTensorStorage",
            rowwise_data,
            rowwise_scale_inv,
            columnwise_data,
            columnwise_scale_inv,
            fp8_dtype,
            quantizer,
            is_2D_scaled,
        )
        self._fake_dtype = torch.float32 if fake_dtype is None else fake_dtype

    def _set_block_fields(
        self,
        owner: str,
        rowwise_data: torch.Tensor | None,
        rowwise_scale_inv: torch.Tensor | None,
        columnwise_data: torch.Tensor | None,
        columnwise_scale_inv: torch.Tensor | None,
        fp8_dtype: Any,
        quantizer: Any,
        is_2D_scaled: bool,
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
            if scale is not None and scale.dtype != torch.float32:
                raise ValueError(
                    f"{owner}: {name}_scale_inv: expected float32 scales, got {scale.dtype}"
                )
        self._rowwise_data, self._rowwise_scale_inv = _as_u8(rowwise_data), rowwise_scale_inv
        self._columnwise_data = _as_u8(columnwise_data)
        self._columnwise_scale_inv = columnwise_scale_inv
        fp8 = fp8_torch_dtype(owner, fp8_dtype)
        if fp8 not in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise ValueError(f"{owner}: fp8_dtype: expected float8_e4m3fn or float8_e5m2 for "
                             f"block scaling, got {fp8}")
        self._fp8_dtype = to_dtype_enum(fp8)
        self._quantizer = quantizer
        self._is_2D_scaled = bool(is_2D_scaled)

    # ------------------------------------------------------------------------------- data
    def _logical_shape(self) -> torch.Size:
        if self._rowwise_data is not None:
            return self._rowwise_data.shape
        if self._columnwise_data is None:
            raise RuntimeError(f"{type(self).__name__} holds no data (both usages were dropped)")
        dims = tuple(self._columnwise_data.shape)  # [last dim, leading dims...]
        return torch.Size((*dims[1:], dims[0])) if dims else torch.Size(())

    def size(self, *args: Any, **kwargs: Any) -> Any:
        shape = self._logical_shape()
        dim = args[0] if args else kwargs.get("dim")
        return shape if dim is None else shape[dim]

    def _dequantize_nd(self, dtype: torch.dtype) -> torch.Tensor:
        """The values in the logical shape (from the row-wise copy if kept, else the column-wise
        one, transposed back)."""
        shape = self._logical_shape()
        fp8 = fp8_torch_dtype(type(self).__name__, self._fp8_dtype)
        dim = 2 if self._is_2D_scaled else 1
        if self._rowwise_data is not None:
            data = self._rowwise_data.view(fp8).reshape(shape if len(shape) else (1,))
            out = ops().dequantize_fp8_block(data, self._rowwise_scale_inv, dim, False, dtype)
            return out.reshape(shape)
        data = self._columnwise_data.view(fp8)
        data = data.reshape(1) if data.dim() == 0 else data  # a scalar is one 1x1 tile
        out_t = ops().dequantize_fp8_block(data, self._columnwise_scale_inv, dim, True, dtype)
        cols = shape[-1] if len(shape) else 1
        rows = shape[:-1].numel()  # explicit: reshape(0, -1) is ambiguous when cols = 0
        return out_t.reshape(cols, rows).t().reshape(shape).contiguous()

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self._dequantize_nd(dtype or self._fake_dtype)

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

    def _create_columnwise(self) -> None:
        """2D blocks are square: the column-wise copy is the row-wise bytes transposed with the
        transposed scale grid (TE's _create_columnwise). 1D tiles have other scales: no."""
        data = self._rowwise_data
        cols = data.shape[-1] if data.dim() else 1
        rows = data.numel() // max(cols, 1)
        tshape = (cols, *data.shape[:-1]) if data.dim() else ()
        self._columnwise_data = data.reshape(rows, cols).t().contiguous().reshape(tshape)
        n = 128
        s = self._rowwise_scale_inv[: math.ceil(rows / n), : math.ceil(cols / n)]
        grid = torch.zeros(
            (math.ceil(cols / n), (math.ceil(rows / n) + 3) // 4 * 4),
            dtype=torch.float32,
            device=s.device,
        )
        grid[:, : s.shape[0]] = s.t()
        self._columnwise_scale_inv = grid

    def update_usage(
        self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None
    ) -> None:
        """Drop the copies not needed (None: keep what is there). A 2D-scaled tensor can make its
        column-wise copy from the row-wise one; a 1D-scaled one cannot (other tiles, other
        scales)."""
        owner = f"{type(self).__name__}.update_usage"
        if rowwise_usage is None:
            rowwise_usage = self._rowwise_data is not None
        if columnwise_usage is None:
            columnwise_usage = self._columnwise_data is not None
        if not (rowwise_usage or columnwise_usage):
            raise ValueError(f"{owner}: expected rowwise_usage or columnwise_usage, got neither")
        if rowwise_usage and self._rowwise_data is None:
            raise RuntimeError(f"{owner}: rowwise_usage=True, but this tensor holds no rowwise "
                               "data (it cannot be made from the column-wise copy)")
        if columnwise_usage and self._columnwise_data is None:
            if not self._is_2D_scaled or self._rowwise_data is None:
                raise RuntimeError(
                    f"{owner}: columnwise_usage=True, but this tensor holds no columnwise data "
                    "(1x128-tile scaling cannot derive it from the row-wise copy)"
                )
            self._create_columnwise()
        if not rowwise_usage:
            self._rowwise_data = self._rowwise_scale_inv = None
        if not columnwise_usage:
            self._columnwise_data = self._columnwise_scale_inv = None

    def fsdp_buffer_fields(self) -> tuple[str, ...]:
        # The GEMM_READY grids run along the tokens in their inner dim (1D row-wise) or are
        # transposed: shards do not concatenate along dim 0 as FSDP2 gathers them.
        raise NotImplementedError(
            f"{type(self).__name__}: FSDP2 all-gather of Float8BlockScaling tensors is not "
            "implemented in transformer_engine_lite"
        )
