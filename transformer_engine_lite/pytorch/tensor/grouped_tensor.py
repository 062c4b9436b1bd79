"""GroupedTensor: TE main's grouped tensor (transformer_engine.pytorch.tensor.grouped_tensor), a
torch.Tensor wrapper over GroupedTensorStorage (layout: storage/grouped_tensor_storage.py).

As a torch.Tensor it has shape (num_tensors, M, N) (or (num_tensors, n) for 1-D members) when all
members share a shape, otherwise the logical 2-D shape. torch ops see the members stacked (and
dequantized, for a quantized one): an op that writes the tensor (copy_, mul_, ...) writes the
members back (re-quantizing them), so a GroupedTensor can be an nn.Parameter an optimizer updates.
Shape-changing ops are refused (the members' packing would not follow them); view(-1) is the flat
row-wise buffer (distributed optimizers flatten parameters that way). Varying-shape members only
support the storage API (split_into_quantized_tensors, quantize), as in TE.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
from torch.utils._pytree import tree_map

from .quantized_tensor import QuantizedTensor
from .storage.grouped_tensor_storage import GroupedTensorStorage

__all__ = ["GroupedTensor"]

_META = ("num_tensors", "quantizer", "tensor_shapes", "fake_dtype", "rowwise_data",
         "columnwise_data", "scale_inv", "columnwise_scale_inv", "amax", "columnwise_amax",
         "scale", "first_dims", "last_dims", "tensor_offsets", "offsets", "scale_inv_offsets",
         "columnwise_scale_inv_offsets", "logical_shape", "quantized_tensors",
         "_with_gemm_swizzled_scales", "row_scaled_nvfp4", "nvfp4_use_4over6", "nvfp4_e4m3_max")

_aten = torch.ops.aten
# Ops that would reinterpret the packed members' shape: refused (TE's list).
_SHAPE_OPS = {
    _aten.reshape.default, _aten._reshape_alias.default, _aten.flatten.using_ints,
    _aten.unflatten.int, _aten.squeeze.dim, _aten.squeeze.dims, _aten.unsqueeze.default,
    _aten.transpose.int, _aten.permute.default, _aten.movedim.int, _aten.t.default,
    _aten.slice.Tensor, _aten.narrow.default, _aten.select.int, _aten.split.Tensor,
    _aten.chunk.default, _aten.cat.default, _aten.stack.default,
}


def _contiguous_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


class _GroupedIdentity(torch.autograd.Function):
    """An identity node over a grouped parameter (DDP / Megatron reach a parameter's gradient
    accumulator through p.expand_as(p).grad_fn)."""

    @staticmethod
    def forward(ctx: Any, t: "GroupedTensor") -> "GroupedTensor":  # type: ignore[override]
        ctx.dtype = t.dtype
        return t.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad if grad.dtype == ctx.dtype else grad.to(ctx.dtype)


class GroupedTensor(GroupedTensorStorage, torch.Tensor):
    """See the module docstring; constructor arguments as GroupedTensorStorage (TE's)."""

    def __new__(cls, shape: Tuple[int, int], dtype: torch.dtype, *, num_tensors: int,
                shapes: Optional[List[Tuple[int, ...]]] = None, requires_grad: bool = False,
                stride: Optional[List[int]] = None, **kwargs: Any):
        wrapper = tuple(shape)
        if shapes and len(shapes) == num_tensors and all(tuple(s) == tuple(shapes[0])
                                                         for s in shapes):
            s0 = tuple(shapes[0])
            if len(s0) not in (1, 2):
                raise ValueError(f"GroupedTensor: shapes: expected 1-D or 2-D members, got {s0}")
            wrapper = (num_tensors, *s0)
        device = None
        for k in ("data", "columnwise_data", "scale_inv", "columnwise_scale_inv", "amax", "scale",
                  "first_dims", "last_dims", "tensor_offsets"):
            if kwargs.get(k) is not None:
                device = kwargs[k].device
                break
        instance = torch.Tensor._make_wrapper_subclass(
            cls, wrapper, strides=_contiguous_strides(wrapper) if stride is None else tuple(stride),
            storage_offset=0, dtype=dtype, layout=torch.strided, requires_grad=requires_grad,
            device=device if device is not None else torch.device("cpu"))
        GroupedTensorStorage._initialize_storage_fields(
            instance, shape, dtype, num_tensors=num_tensors, shapes=shapes, **kwargs)
        return instance

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # noqa: ARG002
        return GroupedTensorStorage.__repr__(self)

    def _like(self, requires_grad: bool) -> "GroupedTensor":
        out = torch.Tensor._make_wrapper_subclass(
            type(self), tuple(self.shape), strides=tuple(self.stride()), storage_offset=0,
            dtype=self.dtype, layout=self.layout, requires_grad=requires_grad, device=self.device)
        for k in _META:
            setattr(out, k, getattr(self, k))
        return out

    def _stacked(self) -> torch.Tensor:
        """The members stacked, dequantized to the nominal dtype."""
        if not self.all_same_shape():
            raise NotImplementedError("GroupedTensor: torch ops on members of different shapes "
                                      "are not supported (use split_into_quantized_tensors)")
        members = self.quantized_tensors or self.split_into_quantized_tensors()
        vals = [m.dequantize(dtype=self.fake_dtype) if isinstance(m, QuantizedTensor) else m
                for m in members]
        return torch.stack(vals, 0)

    def _write_back(self, values: torch.Tensor) -> None:
        """Members <- values (stacked), re-quantized when the grouped tensor is quantized."""
        if not self.all_same_shape():
            raise NotImplementedError("GroupedTensor: in-place torch ops on members of different "
                                      "shapes are not supported")
        parts = list(values.unbind(0))
        if self.quantizer is None:
            for dst, src in zip(self.split_into_quantized_tensors(), parts):
                dst.copy_(src)
        else:
            self.quantize([p.to(self.fake_dtype) for p in parts])

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        src = args[0] if args else None
        if func in (_aten.detach.default, _aten.alias.default):
            return src._like(False if func is _aten.detach.default else src.requires_grad)
        if func is _aten.expand.default and isinstance(src, GroupedTensor):
            want = tuple(args[1])
            if len(want) == src.dim() and all(w in (-1, s) for w, s in zip(want, src.shape)):
                return src._like(src.requires_grad)
        if func is _aten.expand_as.default and isinstance(src, GroupedTensor) \
                and tuple(args[1].shape) == tuple(src.shape):
            return src._like(src.requires_grad)
        if func in (_aten.view.default, _aten._unsafe_view.default) \
                and isinstance(src, GroupedTensor):
            if tuple(args[1]) in ((-1,), (src.numel(),)) and src.rowwise_data is not None \
                    and src.quantizer is None:
                return src.rowwise_data.view(-1)
            raise RuntimeError(f"GroupedTensor: view: only view(-1) of an unquantized grouped "
                               f"tensor (its flat buffer) is supported, got size {list(args[1])}")
        if func in _SHAPE_OPS:
            raise RuntimeError(f"GroupedTensor: shape-changing op {func} is not supported (the "
                               "members' packing would not follow it)")

        def unwrap(a: Any) -> Any:
            return a._stacked() if isinstance(a, GroupedTensor) else a

        new_args, new_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        out = func(*new_args, **new_kwargs)
        if func._schema.is_mutable:
            # Write back every GroupedTensor argument the schema marks as written.
            for j, arg_schema in enumerate(func._schema.arguments):
                writes = arg_schema.alias_info is not None and arg_schema.alias_info.is_write
                val = args[j] if j < len(args) else kwargs.get(arg_schema.name)
                new = new_args[j] if j < len(args) else new_kwargs.get(arg_schema.name)
                if writes and isinstance(val, GroupedTensor):
                    val._write_back(new)
            if isinstance(out, torch.Tensor) and len(args) and isinstance(args[0], GroupedTensor) \
                    and out is new_args[0]:
                return args[0]
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    def expand_as(self, other: torch.Tensor) -> torch.Tensor:
        if other is self:
            return _GroupedIdentity.apply(self)
        return super().expand_as(other)
