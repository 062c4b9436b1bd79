"""Float8BlockwiseQTensor (TE's Float8BlockScaling tensor: 1x128 tiles or 128x128 blocks, fp32
scales, row-wise and/or transposed column-wise copies) and Float8BlockQuantizer, over
torch.ops.te_lite.quantize_fp8_block / dequantize_fp8_block."""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from ..dynamo.quantizer_opaque import register_value_opaque_quantizer
from ..quantization import ops
from ..tex import DType
from ._quantizer_value import flatten_context, unflatten_kwargs
from .quantized_tensor import QuantizedTensor, Quantizer, fp8_torch_dtype, to_dtype_enum
from .storage.float8_blockwise_tensor_storage import Float8BlockwiseQTensorStorage

__all__ = ["Float8BlockQuantizer", "Float8BlockwiseQTensor", "Float8BlockwiseQTensorStorage"]

_INNER = ("_rowwise_data", "_rowwise_scale_inv", "_columnwise_data", "_columnwise_scale_inv")


class Float8BlockwiseQTensor(QuantizedTensor, Float8BlockwiseQTensorStorage):
    """See storage/float8_blockwise_tensor_storage.py for the layout. Operations other than the
    quantized ones here (view / reshape keeping the last dim) run on the dequantized values."""

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
        is_2D_scaled: bool = False,
        requires_grad: bool = False,
        **_: Any,
    ) -> Float8BlockwiseQTensor:
        ref = rowwise_data if rowwise_data is not None else columnwise_data
        if ref is None:
            raise ValueError(
                "Float8BlockwiseQTensor: expected rowwise_data or columnwise_data, got neither"
            )
        self = super().__new__(cls, shape, dtype, device=ref.device, requires_grad=requires_grad)
        self._set_block_fields(
            "Float8BlockwiseQTensor",
            rowwise_data,
            rowwise_scale_inv,
            columnwise_data,
            columnwise_scale_inv,
            fp8_dtype,
            quantizer,
            is_2D_scaled,
        )
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # __new__ set everything

    size = torch.Tensor.size  # the wrapper's shape

    def _logical_shape(self) -> torch.Size:
        return torch.Size(self.shape)

    def fp8_data_dtype(self) -> torch.dtype:
        return fp8_torch_dtype("Float8BlockwiseQTensor", self._fp8_dtype)

    def _dequantize(self, dtype: torch.dtype | None) -> torch.Tensor:
        dtype = dtype or self.dtype
        # a nominal dtype that is not a high-precision one (TE's make_empty takes any): fp32
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            dtype = torch.float32
        return self._dequantize_nd(dtype)

    def _assign_from(self, other: QuantizedTensor) -> None:
        assert isinstance(other, Float8BlockwiseQTensor)
        for name in _INNER:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None and theirs is not None and mine.shape == theirs.shape:
                mine.copy_(theirs)
            else:
                setattr(self, name, theirs)
        self._is_2D_scaled = other._is_2D_scaled

    def _quantized_op(self, func: Any, args: Any, kwargs: Any) -> Any:
        aten = torch.ops.aten
        if func in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            # Tiles run along the last dim and over the flattened leading dims: any shape that
            # keeps the last dim keeps every buffer (the column-wise copy's leading dims follow).
            shape = list(args[1])
            if -1 in shape:
                known = math.prod(d for d in shape if d != -1)
                shape[shape.index(-1)] = self.numel() // max(known, 1)
            if not shape or shape[-1] != self.shape[-1] or math.prod(shape) != self.numel():
                return NotImplemented
            rd = None if self._rowwise_data is None else self._rowwise_data.view(shape)
            cd = None
            if self._columnwise_data is not None:
                cd = self._columnwise_data.view(shape[-1], *shape[:-1])
            return self._like(shape, rd, self._rowwise_scale_inv, cd, self._columnwise_scale_inv)
        return NotImplemented

    def _like(self, shape: Any, rd: Any, rs: Any, cd: Any, cs: Any) -> Float8BlockwiseQTensor:
        return type(self)(
            shape=shape,
            dtype=self.dtype,
            rowwise_data=rd,
            rowwise_scale_inv=rs,
            columnwise_data=cd,
            columnwise_scale_inv=cs,
            fp8_dtype=self._fp8_dtype,
            quantizer=self._quantizer,
            is_2D_scaled=self._is_2D_scaled,
        )

    def _inner_names(self) -> list[str]:
        return list(_INNER)

    def _with_inner(self, inner: dict[str, torch.Tensor | None]) -> Float8BlockwiseQTensor:
        return self._like(self.shape, *(inner[n] for n in _INNER))

    def _shallow_copy(self) -> Float8BlockwiseQTensor:
        return self._like(self.shape, *(getattr(self, n) for n in _INNER))

    # torch.compile: a traceable wrapper subclass (AOTAutograd flattens it into these tensors);
    # TE's context dict (the quantizer in it: a value quantizer, compared by value in guards).
    def __tensor_flatten__(self) -> tuple[list[str], dict[str, Any]]:
        names = [n for n in _INNER if getattr(self, n) is not None]
        q = self._quantizer
        kwargs = {
            "fp8_dtype": self._fp8_dtype,
            "fake_dtype": self.dtype,
            "quantizer": None if q is None else q._context_quantizer(),
            "is_2D_scaled": self._is_2D_scaled,
        }
        return names, flatten_context(self, kwargs)

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], ctx: dict[str, Any], outer_size: Any, outer_stride: Any
    ) -> Float8BlockwiseQTensor:
        cls, kw, requires_grad = unflatten_kwargs("Float8BlockwiseQTensor", ctx)
        return cls(
            shape=outer_size,
            dtype=kw["fake_dtype"],
            **{n[1:]: inner.get(n) for n in _INNER},
            fp8_dtype=kw["fp8_dtype"],
            quantizer=kw.get("quantizer"),
            is_2D_scaled=kw.get("is_2D_scaled", False),
            requires_grad=requires_grad,
        )

    def __reduce_ex__(self, protocol: int) -> Any:
        q = self._quantizer
        return (
            rebuild_float8_blockwise_tensor,
            (
                {n: getattr(self, n) for n in _INNER},
                str(self.fp8_data_dtype()).replace("torch.", ""),
                tuple(self.shape),
                self.dtype,
                self._is_2D_scaled,
                None if q is None else q.state(),
            ),
        )


def rebuild_float8_blockwise_tensor(
    inner: dict[str, torch.Tensor | None],
    fp8_dtype: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    is_2D_scaled: bool,
    quantizer_state: dict[str, Any] | None,
) -> Float8BlockwiseQTensor:
    """Unpickling target of Float8BlockwiseQTensor (see __reduce_ex__)."""
    q = None
    if quantizer_state is not None:
        q = Float8BlockQuantizer(
            getattr(torch, quantizer_state["fp8_dtype"]),
            rowwise=quantizer_state["rowwise"],
            columnwise=quantizer_state["columnwise"],
            amax_epsilon=quantizer_state["amax_epsilon"],
            force_pow_2_scales=quantizer_state["force_pow_2_scales"],
            block_scaling_dim=quantizer_state["block_scaling_dim"],
        )
    return Float8BlockwiseQTensor(
        shape=shape,
        dtype=dtype,
        **{n[1:]: inner.get(n) for n in _INNER},
        fp8_dtype=getattr(torch, fp8_dtype),
        quantizer=q,
        is_2D_scaled=is_2D_scaled,
    )


class Float8BlockQuantizer(Quantizer):
    """TE's Float8BlockScaling quantizer: block_scaling_dim 1 (1x128 tiles) or 2 (128x128 blocks),
    fp32 scales (power of two when force_pow_2_scales), amax floored at amax_epsilon. A
    torch.compile value quantizer."""

    dtype: DType
    block_len: int
    amax_epsilon: float
    force_pow_2_scales: bool
    block_scaling_dim: int

    def __init__(
        self,
        fp8_dtype: Any,
        *,
        rowwise: bool,
        columnwise: bool,
        amax_epsilon: float = 0.0,
        force_pow_2_scales: bool = True,
        block_scaling_dim: int = 2,
    ) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        fp8 = fp8_torch_dtype("Float8BlockQuantizer", fp8_dtype)
        if fp8 not in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise ValueError(f"Float8BlockQuantizer: fp8_dtype: expected float8_e4m3fn or "
                             f"float8_e5m2, got {fp8}")
        if block_scaling_dim not in (1, 2) or isinstance(block_scaling_dim, bool):
            raise ValueError(f"Float8BlockQuantizer: block_scaling_dim: expected 1 or 2, got "
                             f"{block_scaling_dim!r}")
        self.dtype = to_dtype_enum(fp8)
        self.block_len = 128
        self.amax_epsilon = float(amax_epsilon)
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.block_scaling_dim = int(block_scaling_dim)

    def state(self) -> dict[str, Any]:
        st = self._usage_state("fp8_block")
        st.update(amax_epsilon=self.amax_epsilon, force_pow_2_scales=self.force_pow_2_scales,
                  block_scaling_dim=self.block_scaling_dim)
        return st

    def copy(self) -> Float8BlockQuantizer:
        new = Float8BlockQuantizer(
            self.dtype,
            rowwise=self.rowwise_usage,
            columnwise=self.columnwise_usage,
            amax_epsilon=self.amax_epsilon,
            force_pow_2_scales=self.force_pow_2_scales,
            block_scaling_dim=self.block_scaling_dim,
        )
        new.internal, new.optimize_for_gemm = self.internal, self.optimize_for_gemm
        return new

    def _quantize(self, tensor: torch.Tensor) -> Float8BlockwiseQTensor:
        if not (self.rowwise_usage or self.columnwise_usage):
            raise ValueError(
                "Float8BlockQuantizer: expected rowwise or columnwise usage, got neither"
            )
        fp8 = fp8_torch_dtype("Float8BlockQuantizer", self.dtype)
        # A 0-d tensor is one 1x1 tile (TE's 2-D view of a scalar); its copies stay 0-d.
        x = tensor.contiguous().reshape(1) if tensor.dim() == 0 else tensor.contiguous()
        r, rs, c, cs = ops().quantize_fp8_block(
            x, fp8, self.block_scaling_dim, self.rowwise_usage,
            self.columnwise_usage, self.force_pow_2_scales, self.amax_epsilon,
        )
        if tensor.dim() == 0:
            r = r.reshape(()) if self.rowwise_usage else r
            c = c.reshape(()) if self.columnwise_usage else c
        keep = lambda t, on: t if on else None  # noqa: E731
        return Float8BlockwiseQTensor(
            shape=tensor.shape,
            dtype=tensor.dtype,
            rowwise_data=keep(r, self.rowwise_usage),
            rowwise_scale_inv=keep(rs, self.rowwise_usage),
            columnwise_data=keep(c, self.columnwise_usage),
            columnwise_scale_inv=keep(cs, self.columnwise_usage),
            fp8_dtype=fp8,
            quantizer=self,
            is_2D_scaled=self.block_scaling_dim == 2,
        )

    def make_empty(
        self,
        shape: Any,
        *,
        dtype: torch.dtype = torch.float32,
        device: Any = None,
        requires_grad: bool = False,
    ) -> Float8BlockwiseQTensor:
        """A tensor of `shape` with zeroed buffers (TE's: allocated, not quantized; dtype is the
        nominal dtype only, so any dtype is taken)."""
        shape = tuple(int(d) for d in shape)
        specs = self.inner_tensor_specs(shape)
        buf = {n: torch.zeros(s, dtype=dt, device=device) for n, (s, dt) in specs.items()}
        return Float8BlockwiseQTensor(
            shape=shape,
            dtype=dtype,
            **{n[1:]: buf.get(n) for n in _INNER},
            fp8_dtype=self.dtype,
            quantizer=self,
            is_2D_scaled=self.block_scaling_dim == 2,
            requires_grad=requires_grad,
        )

    def get_scale_shape(self, shape: Iterable[int], columnwise: bool) -> tuple[int, int]:
        """TE's GEMM_READY scale grid of a tensor of `shape` (see the storage module)."""
        shape = tuple(int(d) for d in shape)
        cols = shape[-1] if shape else 1
        rows = math.prod(shape[:-1]) if shape else 1
        n = self.block_len
        up4 = lambda v: (v + 3) // 4 * 4  # noqa: E731
        if self.block_scaling_dim == 2:
            if columnwise:
                return (math.ceil(cols / n), up4(math.ceil(rows / n)))
            return (math.ceil(rows / n), up4(math.ceil(cols / n)))
        if columnwise:
            return (math.ceil(rows / n), up4(cols))
        return (math.ceil(cols / n), up4(rows))

    def get_columnwise_shape(self, shape: Iterable[int]) -> tuple[int, ...]:
        shape = tuple(int(d) for d in shape)
        return (shape[-1], *shape[:-1]) if shape else ()

    def is_quantizable(self, inp: torch.Tensor) -> bool:
        """TE's: both dims of the 2-D view a multiple of the block length."""
        if inp.dim() < 2:
            return False
        return inp.shape[-1] % self.block_len == 0 and math.prod(inp.shape[:-1]) % self.block_len == 0

    def is_requantization_safe(self) -> bool:
        return True

    def calibrate(self, tensor: torch.Tensor) -> None:
        """Stateless: nothing to record."""

    def inner_tensor_specs(
        self, shape: tuple[int, ...]
    ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        shape = tuple(shape)
        specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        if self.rowwise_usage:
            specs["_rowwise_data"] = (shape, torch.uint8)
            specs["_rowwise_scale_inv"] = (self.get_scale_shape(shape, False), torch.float32)
        if self.columnwise_usage:
            specs["_columnwise_data"] = (self.get_columnwise_shape(shape), torch.uint8)
            specs["_columnwise_scale_inv"] = (self.get_scale_shape(shape, True), torch.float32)
        return specs

    def storage_metadata(self, fake_dtype: torch.dtype) -> dict[str, Any]:
        return {
            "cls": Float8BlockwiseQTensor,
            "nontensor_kwargs": {
                "fp8_dtype": self.dtype,
                "fake_dtype": fake_dtype,
                "quantizer": self._context_quantizer(),
                "is_2D_scaled": self.block_scaling_dim == 2,
            },
        }


register_value_opaque_quantizer(Float8BlockQuantizer)
