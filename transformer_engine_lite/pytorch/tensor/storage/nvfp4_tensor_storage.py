"""NVFP4TensorStorage: TE's NVFP4 buffers without the torch.Tensor wrapper (NVFP4Tensor inherits
its data and usage methods).

Layout (TE's, the te_lite kernels': core cast.h / nvfp4_quantize.cpp): _rowwise_data is uint8 of
the tensor's shape with the last dim halved, two E2M1 codes per byte (element 2j in the low
nibble); _columnwise_data the transposed copy [last dim, leading dims...] packed the same way,
random-Hadamard-transformed along its rows when the quantizer had with_rht; scale_inv grids are
uint8 E4M3, [roundup(rows, 128), roundup(ceil(cols / 16), 4)] (column-wise: rows and cols
swapped), padding zero, or the same bytes in TE's GEMM-swizzled order when
_with_gemm_swizzled_scales (a quantizer with optimize_for_gemm; see _gemm_swizzle.py);
_amax_rowwise / _amax_columnwise the fp32 [1] amax each copy was scaled by ([rows of the copy]
with row_scaled_nvfp4). A value is e2m1 * e4m3 scale * amax / (6 * 448) (6 * nvfp4_e4m3_max:
256 with 4over6; _row_scaled_nvfp4 / _nvfp4_e4m3_max record how the bytes were made).
"""

from __future__ import annotations

from typing import Any

import torch

from ...quantization import ops
from .._gemm_swizzle import swizzle_grid, unswizzle_grid
from ..quantized_tensor import QuantizedTensorStorage

__all__ = ["NVFP4TensorStorage"]

_INNER = (
    "_rowwise_data",
    "_rowwise_scale_inv",
    "_columnwise_data",
    "_columnwise_scale_inv",
    "_amax_rowwise",
    "_amax_columnwise",
)


def rht_inverse(y: torch.Tensor, sign_mask: int) -> torch.Tensor:
    """Undoes the 16-point RHT along the last dim of y (fp32): y = x S H / 4, so x = y H S / 4."""
    from ..nvfp4_tensor import get_hadamard_matrix

    h = get_hadamard_matrix(16, y.device) * 4.0  # entries +-1
    signs = torch.tensor([-1.0 if (sign_mask >> i) & 1 else 1.0 for i in range(16)],
                         device=y.device)
    m = (h * signs) / 4.0  # H @ diag(signs) / 4
    shape = y.shape
    return (y.reshape(-1, 16).double() @ m.double()).float().reshape(shape)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n/2] -> uint8 codes [..., n] (low nibble first)."""
    out = torch.stack((packed & 0x0F, packed >> 4), dim=-1)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., n] -> uint8 [..., n/2]."""
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (c[..., 0] | (c[..., 1] << 4)).contiguous()


class NVFP4TensorStorage(QuantizedTensorStorage):
    """See the module docstring. fake_dtype: the dtype dequantize() returns by default."""

    def __init__(
        self,
        rowwise_data: torch.Tensor | None = None,
        rowwise_scale_inv: torch.Tensor | None = None,
        columnwise_data: torch.Tensor | None = None,
        columnwise_scale_inv: torch.Tensor | None = None,
        amax_rowwise: torch.Tensor | None = None,
        amax_columnwise: torch.Tensor | None = None,
        fp4_dtype: Any = None,
        quantizer: Any = None,
        with_gemm_swizzled_scales: bool = False,
        *,
        fake_dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        self._set_nvfp4_fields("NVFP4TensorStorage", rowwise_data, rowwise_scale_inv,
                               columnwise_data, columnwise_scale_inv, amax_rowwise,
                               amax_columnwise, fp4_dtype, quantizer, with_gemm_swizzled_scales,
                               **kwargs)
        self._fake_dtype = torch.float32 if fake_dtype is None else fake_dtype

    def _set_nvfp4_fields(self, owner: str, rd: Any, rs: Any, cd: Any, cs: Any, ra: Any, ca: Any,
                          fp4_dtype: Any, quantizer: Any, swizzled: bool,
                          row_scaled_nvfp4: bool | None = None,
                          nvfp4_use_4over6: bool | None = None,
                          nvfp4_e4m3_max: int | None = None, **_: Any) -> None:
        from ...tex import DType

        if rd is None and cd is None:
            raise ValueError(f"{owner}: expected rowwise_data or columnwise_data, got neither")
        for name, data, scale, amax in (("rowwise", rd, rs, ra), ("columnwise", cd, cs, ca)):
            if data is not None and (scale is None or amax is None):
                raise ValueError(f"{owner}: {name}_data given without its {name}_scale_inv and "
                                 f"amax_{name}")
            if data is not None and data.dtype != torch.uint8:
                raise ValueError(f"{owner}: {name}_data: expected uint8 (packed E2M1), got "
                                 f"{data.dtype}")
        # How the buffers were quantized (TE's tensor fields): given, or the quantizer's.
        if row_scaled_nvfp4 is None:
            row_scaled_nvfp4 = bool(getattr(quantizer, "row_scaled_nvfp4", False))
        if nvfp4_use_4over6 is None:
            nvfp4_use_4over6 = bool(getattr(quantizer, "nvfp4_use_4over6", False))
        if nvfp4_e4m3_max is None:
            nvfp4_e4m3_max = int(getattr(quantizer, "nvfp4_e4m3_max", 448))
        if nvfp4_e4m3_max not in (448, 256):
            raise ValueError(f"{owner}: nvfp4_e4m3_max: expected 448 or 256, got {nvfp4_e4m3_max}")
        if fp4_dtype is not None and DType(fp4_dtype) != DType.kFloat4E2M1:
            raise ValueError(f"{owner}: fp4_dtype: expected DType.kFloat4E2M1, got {fp4_dtype!r}")
        self._rowwise_data, self._rowwise_scale_inv, self._amax_rowwise = rd, rs, ra
        self._columnwise_data, self._columnwise_scale_inv, self._amax_columnwise = cd, cs, ca
        self._fp4_dtype = DType.kFloat4E2M1
        self._quantizer = quantizer
        # Scale grids in TE's GEMM-swizzled byte order (tensor/_gemm_swizzle.py) when set; every
        # reader of the grids goes through _scale_grid, which undoes it.
        self._with_gemm_swizzled_scales = bool(swizzled)
        self._row_scaled_nvfp4 = bool(row_scaled_nvfp4)
        self._nvfp4_use_4over6 = bool(nvfp4_use_4over6)
        self._nvfp4_e4m3_max = int(nvfp4_e4m3_max)

    # ------------------------------------------------------------------------------- data
    def _logical_shape(self) -> torch.Size:
        if self._rowwise_data is not None:
            s = self._rowwise_data.shape
            return torch.Size((*s[:-1], s[-1] * 2))
        if self._columnwise_data is None:
            raise RuntimeError(f"{type(self).__name__} holds no data (both usages were dropped)")
        s = self._columnwise_data.shape  # [last dim, leading dims... (last halved)]
        return torch.Size((*s[1:-1], s[-1] * 2, s[0])) if len(s) > 1 else torch.Size((s[0] * 2,))

    def size(self, *args: Any, **kwargs: Any) -> Any:
        shape = self._logical_shape()
        dim = args[0] if args else kwargs.get("dim")
        return shape if dim is None else shape[dim]

    def _rht_mask(self) -> int:
        q = self._quantizer
        return q.rht_matrix_random_sign_mask_t if q is not None and q.with_rht else -1

    def _nvfp4_params(self) -> tuple[bool, int]:
        """(row-scaled, E4M3 bound) the buffers were quantized with."""
        return self._row_scaled_nvfp4, self._nvfp4_e4m3_max

    def _format_fields(self) -> dict[str, Any]:
        """The non-buffer fields a copy of this tensor needs (TE's constructor keywords)."""
        return {"fp4_dtype": self._fp4_dtype, "quantizer": self._quantizer,
                "with_gemm_swizzled_scales": self._with_gemm_swizzled_scales,
                "row_scaled_nvfp4": self._row_scaled_nvfp4,
                "nvfp4_use_4over6": self._nvfp4_use_4over6,
                "nvfp4_e4m3_max": self._nvfp4_e4m3_max}

    def get_metadata(self) -> dict[str, Any]:
        """TE's: the constructor keywords that rebuild this tensor (buffers shared)."""
        fake = self.dtype if isinstance(self, torch.Tensor) else self._fake_dtype
        return {"rowwise_data": self._rowwise_data, "rowwise_scale_inv": self._rowwise_scale_inv,
                "columnwise_data": self._columnwise_data,
                "columnwise_scale_inv": self._columnwise_scale_inv,
                "amax_rowwise": self._amax_rowwise, "amax_columnwise": self._amax_columnwise,
                **self._format_fields(), "fake_dtype": fake}

    def _grid_dims(self, columnwise: bool) -> tuple[int, int]:
        """(rows, 16-blocks per row) of a copy's scale grid: the column-wise copy is stored
        transposed, so its rows are the tensor's columns."""
        shape = self._logical_shape()
        cols = shape[-1] if len(shape) else 1
        rows = shape.numel() // max(cols, 1)
        if columnwise:
            rows, cols = cols, rows
        return rows, -(-cols // 16)

    def _scale_grid(self, columnwise: bool) -> torch.Tensor | None:
        """A copy's scale grid in the compact layout (unswizzled if stored GEMM-swizzled)."""
        s = self._columnwise_scale_inv if columnwise else self._rowwise_scale_inv
        if s is None or not self._with_gemm_swizzled_scales:
            return s
        return unswizzle_grid(s, *self._grid_dims(columnwise))

    def _swizzle_grid_of(self, columnwise: bool) -> None:
        """One copy's (compact) grid into the GEMM-swizzled layout, in a new buffer; the flag is
        the caller's (TE's multi-tensor swizzle sets it only after both copies)."""
        name = "_columnwise_scale_inv" if columnwise else "_rowwise_scale_inv"
        if getattr(self, name) is not None:
            setattr(self, name, swizzle_grid(getattr(self, name), *self._grid_dims(columnwise)))

    def _swizzle_scales_for_gemm(self) -> None:
        """TE's inplace_swizzle_scale_for_gemm: both grids into the GEMM-swizzled layout (padding
        zeroed), in new buffers; nothing to do when they already are."""
        if self._with_gemm_swizzled_scales:
            return
        self._swizzle_grid_of(False)
        self._swizzle_grid_of(True)
        self._with_gemm_swizzled_scales = True

    def _dequantize_copy(self, columnwise: bool, dtype: torch.dtype) -> torch.Tensor:
        """One copy's values in the logical shape, as stored (a column-wise copy transposed back,
        still Hadamard-transformed if it was): what a GEMM contracts."""
        shape = self._logical_shape()
        if not columnwise:
            return ops().dequantize_nvfp4(self._rowwise_data, self._scale_grid(False),
                                          self._amax_rowwise, dtype,
                                          *self._nvfp4_params()).reshape(shape)
        d = self._columnwise_data
        out_t = ops().dequantize_nvfp4(d.reshape(d.shape[0], -1), self._scale_grid(True),
                                       self._amax_columnwise, dtype, *self._nvfp4_params())
        return out_t.t().reshape(shape).contiguous()

    def _dequantize_nd(self, dtype: torch.dtype) -> torch.Tensor:
        """The values in the logical shape (row-wise copy if kept, else the column-wise one,
        transposed back and with the Hadamard transform undone)."""
        if self._rowwise_data is not None:
            return self._dequantize_copy(False, dtype)
        mask = self._rht_mask()
        if mask < 0:
            return self._dequantize_copy(True, dtype)
        shape = self._logical_shape()
        d = self._columnwise_data
        y = ops().dequantize_nvfp4(d.reshape(d.shape[0], -1), self._scale_grid(True),
                                   self._amax_columnwise, torch.float32, *self._nvfp4_params())
        return rht_inverse(y, mask).t().reshape(shape).to(dtype).contiguous()

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
        raise ValueError(f"{type(self).__name__}.get_data_tensors: expected rowwise_data or "
                         "columnwise_data, got neither")

    def get_usages(self) -> dict[str, bool]:
        return {"rowwise": self._rowwise_data is not None,
                "columnwise": self._columnwise_data is not None}

    def prepare_for_saving(self) -> tuple[list[torch.Tensor | None], NVFP4TensorStorage]:
        tensors = [getattr(self, n) for n in _INNER]
        for n in _INNER:
            setattr(self, n, None)
        return tensors, self

    def restore_from_saved(self, tensors: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        for n, t in zip(_INNER, tensors):
            setattr(self, n, t)
        return tensors[len(_INNER):]

    def _create_columnwise(self) -> None:
        """16x16 blocks are square: the column-wise copy is the row-wise codes transposed with
        the transposed scale grid and the same amax (TE's _create_columnwise, 2D only; not with
        the RHT, whose column-wise copy holds other values)."""
        q = self._quantizer
        if q is None or not q.with_2d_quantization or q.with_rht:
            raise RuntimeError("Cannot create columnwise data without 2D quantization enabled "
                               "(and the RHT disabled)")
        shape = self._logical_shape()
        cols = shape[-1]
        rows = shape.numel() // max(cols, 1)
        codes = unpack_codes(self._rowwise_data.reshape(rows, cols // 2))
        tshape = (cols, *shape[:-2], shape[-2] // 2) if len(shape) > 1 else (cols // 2,)
        self._columnwise_data = pack_codes(codes.t().contiguous()).reshape(tshape)
        rb, cb = -(-rows // 16), -(-cols // 16)
        grid = torch.zeros(q.get_scale_shape(shape, True), dtype=torch.uint8,
                           device=self._rowwise_data.device)
        # Row r of the row-wise grid holds block (r // 16, :); column-wise row c: block (:, c // 16).
        blocks = self._scale_grid(False)[: rb * 16 : 16, :cb]  # [rb, cb]
        grid[:cols, :rb] = blocks.t().repeat_interleave(16, dim=0)[:cols]
        if self._with_gemm_swizzled_scales:  # both grids share one layout
            grid = swizzle_grid(grid, *self._grid_dims(True))
        self._columnwise_scale_inv = grid
        self._amax_columnwise = self._amax_rowwise.clone()

    def update_usage(
        self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None
    ) -> None:
        """Drop the copies not needed (None: keep what is there); a 2D-scaled tensor makes its
        column-wise copy from the row-wise one (TE's)."""
        owner = f"{type(self).__name__}.update_usage"
        if rowwise_usage is None:
            rowwise_usage = self._rowwise_data is not None
        if columnwise_usage is None:
            columnwise_usage = self._columnwise_data is not None
        if not (rowwise_usage or columnwise_usage):
            raise ValueError(f"{owner}: expected rowwise_usage or columnwise_usage, got neither")
        if rowwise_usage and self._rowwise_data is None:
            raise RuntimeError(f"{owner}: requested row-wise usage, but this NVFP4 tensor holds "
                               "no row-wise data (it cannot be made from the column-wise copy)")
        if columnwise_usage and self._columnwise_data is None:
            if self._rowwise_data is None:
                raise RuntimeError(f"{owner}: requested column-wise usage, but this tensor holds "
                                   "no data")
            self._create_columnwise()
        if not rowwise_usage:
            self._rowwise_data = self._rowwise_scale_inv = self._amax_rowwise = None
        if not columnwise_usage:
            self._columnwise_data = self._columnwise_scale_inv = self._amax_columnwise = None

    def fsdp_buffer_fields(self) -> tuple[str, ...]:
        raise NotImplementedError(f"{type(self).__name__}: FSDP2 all-gather of NVFP4 tensors is "
                                  "not implemented in transformer_engine_lite")
