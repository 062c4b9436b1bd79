"""MXFP8Tensor (1x32 blocks with E8M0 scales, row-wise and/or column-wise copies) and its quantizer,
over torch.ops.te_lite.quantize_mxfp8 / dequantize_mxfp8."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..constants import MXFP8_BLOCK_SCALING_SIZE
from ..dynamo.quantizer_opaque import register_value_opaque_quantizer
from ..quantization import ops
from ..tex import DType
from ._quantizer_value import flatten_context, unflatten_kwargs
from .quantized_tensor import (
    QuantizedTensor,
    Quantizer,
    fp8_torch_dtype,
    infer_view_shape,
    to_dtype_enum,
)
from .storage.mxfp8_tensor_storage import MXFP8TensorStorage

__all__ = ["MXFP8Quantizer", "MXFP8Tensor", "MXFP8TensorStorage"]


class MXFP8Tensor(QuantizedTensor, MXFP8TensorStorage):
    """_rowwise_data [rows, cols] + _rowwise_scale_inv [rows, ceil(cols/32)] (blocks along the last
    dim) and/or _columnwise_data + _columnwise_scale_inv [ceil(rows/32), cols] (blocks along the
    flattened leading dims); data are uint8 FP8 bytes, scales E8M0 bytes. Usages, data tensors and
    FSDP2 hooks come from MXFP8TensorStorage; the shape is the wrapper's."""

    @staticmethod
    def __new__(
        cls,
        *,
        shape: Any,
        dtype: torch.dtype,
        rowwise_data: torch.Tensor | None,
        rowwise_scale_inv: torch.Tensor | None,
        columnwise_data: torch.Tensor | None,
        columnwise_scale_inv: torch.Tensor | None,
        fp8_dtype: Any,
        quantizer: Quantizer | None = None,
        requires_grad: bool = False,
        with_gemm_swizzled_scales: bool = False,
        **_: Any,
    ) -> MXFP8Tensor:
        ref = rowwise_data if rowwise_data is not None else columnwise_data
        if ref is None:
            raise ValueError("MXFP8Tensor: expected rowwise_data or columnwise_data, got neither")
        self = super().__new__(cls, shape, dtype, device=ref.device, requires_grad=requires_grad)
        self._set_mxfp8_fields(
            "MXFP8Tensor",
            rowwise_data,
            rowwise_scale_inv,
            columnwise_data,
            columnwise_scale_inv,
            fp8_dtype,
            quantizer,
            with_gemm_swizzled_scales,
        )
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # __new__ set everything (MXFP8TensorStorage.__init__ would run again on these kwargs).
        pass

    size = torch.Tensor.size  # the wrapper's shape, not the 2-D buffers' (storage's size)

    def fp8_data_dtype(self) -> torch.dtype:
        return fp8_torch_dtype("MXFP8Tensor", self._fp8_dtype)

    def _dequantize(self, dtype: torch.dtype | None) -> torch.Tensor:
        return self._dequantize_2d(dtype or self.dtype).reshape(self.shape)

    def _data_2d_shape(self) -> torch.Size:
        shape = tuple(self.shape)
        return torch.Size((math.prod(shape[:-1]), shape[-1]))

    def _assign_from(self, other: QuantizedTensor) -> None:
        assert isinstance(other, MXFP8Tensor)
        for name in (
            "_rowwise_data",
            "_rowwise_scale_inv",
            "_columnwise_data",
            "_columnwise_scale_inv",
        ):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None and theirs is not None and mine.shape == theirs.shape:
                mine.copy_(theirs)
            else:  # a dropped copy, or a grid of the other layout's shape
                setattr(self, name, theirs)
        self._with_gemm_swizzled_scales = other._with_gemm_swizzled_scales  # the bytes' layout

    # ----------------------------------------------------- ops that keep the quantized form
    def _quantized_op(self, func: Any, args: Any, kwargs: Any) -> Any:
        aten = torch.ops.aten
        if func is aten.view.default:
            # The buffers are the flattened [rows, cols]: any view keeping the last dim keeps
            # them (TE refuses the others: the blocks run along the last dim).
            shape = infer_view_shape("MXFP8Tensor.view", args[1], self.numel())
            if not shape or shape[-1] != self.shape[-1]:
                raise ValueError(
                    f"MXFP8Tensor.view: size: expected a shape keeping the last dim "
                    f"{self.shape[-1]}, got {shape}"
                )
            return self._like(shape, *(getattr(self, n) for n in self._INNER))
        if func is aten.split.Tensor:
            return self._split(args[1], kwargs.get("dim", args[2] if len(args) > 2 else 0))
        return NotImplemented

    def _split(self, split_size: Any, dim: int) -> Any:
        """Split along dim 0 into whole 32-row blocks: slices of the buffers (TE's). Anything
        else: NotImplemented (the pieces are then the dequantized values')."""
        if self.dim() < 2 or dim not in (0, -self.dim()) or not isinstance(split_size, int):
            return NotImplemented
        if self._with_gemm_swizzled_scales:  # swizzled tiles span 128 rows: no row slices
            return NotImplemented
        if split_size <= 0 or self.shape[0] % split_size:
            return NotImplemented
        inner = math.prod(self.shape[1:-1])
        rows = split_size * inner
        block = MXFP8_BLOCK_SCALING_SIZE
        if self._columnwise_data is not None and rows % block:
            return NotImplemented
        out = []
        for k in range(self.shape[0] // split_size):
            r0 = k * rows

            def cut(t: torch.Tensor | None, a: int, n: int) -> torch.Tensor | None:
                return None if t is None else t[a : a + n]

            out.append(
                self._like(
                    (split_size, *self.shape[1:]),
                    cut(self._rowwise_data, r0, rows),
                    cut(self._rowwise_scale_inv, r0, rows),
                    cut(self._columnwise_data, r0, rows),
                    cut(self._columnwise_scale_inv, r0 // block, rows // block),
                )
            )
        return out

    def _like(self, shape: Any, rd: Any, rs: Any, cd: Any, cs: Any) -> MXFP8Tensor:
        return type(self)(
            shape=shape,
            dtype=self.dtype,
            rowwise_data=rd,
            rowwise_scale_inv=rs,
            columnwise_data=cd,
            columnwise_scale_inv=cs,
            fp8_dtype=self._fp8_dtype,
            quantizer=self._quantizer,
            with_gemm_swizzled_scales=self._with_gemm_swizzled_scales,
        )

    _INNER = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")

    def _inner_names(self) -> list[str]:
        return list(self._INNER)

    def _with_inner(self, inner: dict[str, torch.Tensor | None]) -> MXFP8Tensor:
        return self._like(self.shape, *(inner[n] for n in self._INNER))

    # torch.compile: a traceable wrapper subclass (AOTAutograd flattens it into these tensors);
    # TE's context dict (the quantizer in it: a value quantizer, compared by value in guards).
    def __tensor_flatten__(self) -> tuple[list[str], dict[str, Any]]:
        names = [n for n in self._INNER if getattr(self, n) is not None]
        q = self._quantizer
        kwargs = {
            "fp8_dtype": self._fp8_dtype,
            "fake_dtype": self.dtype,
            "quantizer": None if q is None else q._context_quantizer(),
            "with_gemm_swizzled_scales": self._with_gemm_swizzled_scales,
        }
        return names, flatten_context(self, kwargs)

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: dict[str, Any], outer_size: Any, outer_stride: Any
    ) -> MXFP8Tensor:
        cls, kw, requires_grad = unflatten_kwargs("MXFP8Tensor", ctx)
        return cls(
            shape=outer_size,
            dtype=kw["fake_dtype"],
            **{n[1:]: inner.get(n) for n in MXFP8Tensor._INNER},
            fp8_dtype=kw["fp8_dtype"],
            quantizer=kw.get("quantizer"),
            requires_grad=requires_grad,
            with_gemm_swizzled_scales=kw.get("with_gemm_swizzled_scales", False),
        )

    def __reduce_ex__(self, protocol: int) -> Any:
        q = self._quantizer
        return (
            rebuild_mxfp8_tensor,
            (
                {n: getattr(self, n) for n in self._INNER},
                str(self.fp8_data_dtype()).replace("torch.", ""),
                tuple(self.shape),
                self.dtype,
                None if q is None else q.state(),
                self._with_gemm_swizzled_scales,
            ),
        )

    def _shallow_copy(self) -> MXFP8Tensor:
        return type(self)(
            shape=self.shape,
            dtype=self.dtype,
            rowwise_data=self._rowwise_data,
            rowwise_scale_inv=self._rowwise_scale_inv,
            columnwise_data=self._columnwise_data,
            columnwise_scale_inv=self._columnwise_scale_inv,
            fp8_dtype=self._fp8_dtype,
            quantizer=self._quantizer,
            with_gemm_swizzled_scales=self._with_gemm_swizzled_scales,
        )


def rebuild_mxfp8_tensor(
    inner: dict[str, torch.Tensor | None],
    fp8_dtype: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    quantizer_state: dict[str, Any] | None,
    with_gemm_swizzled_scales: bool = False,
) -> MXFP8Tensor:
    """Unpickling target of MXFP8Tensor (see __reduce_ex__)."""
    from .float8_tensor import quantizer_from_state

    return MXFP8Tensor(
        shape=shape,
        dtype=dtype,
        **{n[1:]: inner.get(n) for n in MXFP8Tensor._INNER},
        fp8_dtype=getattr(torch, fp8_dtype),
        quantizer=None if quantizer_state is None else quantizer_from_state(quantizer_state),
        with_gemm_swizzled_scales=with_gemm_swizzled_scales,
    )


class MXFP8Quantizer(Quantizer):
    """MXFP8: 32-element blocks, each with a power-of-two E8M0 scale. A torch.compile value
    quantizer (value: dtype and the usages)."""

    dtype: DType

    def __init__(self, fp8_dtype: Any, *, rowwise: bool = True, columnwise: bool = True) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = to_dtype_enum(fp8_torch_dtype("MXFP8Quantizer", fp8_dtype))

    def state(self) -> dict[str, Any]:
        return self._usage_state("mxfp8")

    def copy(self) -> MXFP8Quantizer:
        # Through the constructor: torch.compile traces that (TensorSpec copies inside graphs).
        new = MXFP8Quantizer(
            self.dtype, rowwise=self.rowwise_usage, columnwise=self.columnwise_usage
        )
        new.internal, new.optimize_for_gemm = self.internal, self.optimize_for_gemm
        return new

    def _quantize(self, tensor: torch.Tensor) -> MXFP8Tensor:
        if not (self.rowwise_usage or self.columnwise_usage):
            raise ValueError("MXFP8Quantizer: expected rowwise or columnwise usage, got neither")
        if tensor.dim() < 1:
            raise ValueError("MXFP8Quantizer: tensor: expected at least 1 dimension, got a scalar")
        fp8 = fp8_torch_dtype("MXFP8Quantizer", self.dtype)
        # leading dims spelled out: -1 cannot be inferred for an empty last dim (K = 0)
        x2 = tensor.contiguous().reshape(math.prod(tensor.shape[:-1]), tensor.shape[-1])
        r, rs, c, cs = ops().quantize_mxfp8(x2, fp8, self.rowwise_usage, self.columnwise_usage)
        keep = lambda t, on: t if on else None
        out = MXFP8Tensor(
            shape=tensor.shape,
            dtype=tensor.dtype,
            rowwise_data=keep(r, self.rowwise_usage),
            rowwise_scale_inv=keep(rs, self.rowwise_usage),
            columnwise_data=keep(c, self.columnwise_usage),
            columnwise_scale_inv=keep(cs, self.columnwise_usage),
            fp8_dtype=fp8,
            quantizer=self,
        )
        if self.optimize_for_gemm:
            # TE's MXFP8 kernels write GEMM-swizzled scales when the quantizer asks for them
            # (create_tensor: with_gemm_swizzled_scales = optimize_for_gemm): same bytes.
            out._swizzle_scales_for_gemm()
        return out

    def inner_tensor_specs(
        self, shape: tuple[int, ...]
    ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The buffers _quantize makes for a tensor of `shape` viewed as [rows, cols] (rows: the
        leading dims flattened): FP8 bytes [rows, cols] per usage, row-wise scales
        [rows, ceil(cols/32)], column-wise scales [ceil(rows/32), cols] (E8M0 bytes); with
        optimize_for_gemm the scales are GEMM-swizzled in TE's padded shapes (rows to 128 and
        blocks to 4, the column-wise grid's [blocks, cols] to [4, 128])."""
        if len(shape) < 1:
            raise ValueError("MXFP8Quantizer: shape: expected at least 1 dimension, got ()")
        cols = int(shape[-1])
        rows = 1
        for d in shape[:-1]:
            rows *= int(d)
        blocks = lambda n: (n + 31) // 32
        up = (lambda v, n: (v + n - 1) // n * n) if self.optimize_for_gemm else (lambda v, n: v)
        specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        if self.rowwise_usage:
            specs["_rowwise_data"] = ((rows, cols), torch.uint8)
            specs["_rowwise_scale_inv"] = ((up(rows, 128), up(blocks(cols), 4)), torch.uint8)
        if self.columnwise_usage:
            specs["_columnwise_data"] = ((rows, cols), torch.uint8)
            specs["_columnwise_scale_inv"] = ((up(blocks(rows), 4), up(cols, 128)), torch.uint8)
        return specs

    def storage_metadata(self, fake_dtype: torch.dtype) -> dict[str, Any]:
        return {
            "cls": MXFP8Tensor,
            "nontensor_kwargs": {
                "fp8_dtype": self.dtype,
                "fake_dtype": fake_dtype,
                "quantizer": self._context_quantizer(),
                "with_gemm_swizzled_scales": self.optimize_for_gemm,
            },
        }


register_value_opaque_quantizer(MXFP8Quantizer)
