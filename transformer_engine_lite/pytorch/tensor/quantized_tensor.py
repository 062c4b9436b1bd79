"""QuantizedTensor and Quantizer: TE's quantized-tensor API over the te_lite cast ops.

A QuantizedTensor is a torch.Tensor wrapper subclass: it reports the nominal (high-precision) shape
and dtype and holds the FP8 bytes and scales. `dequantize()` returns the values it represents.
Any torch op without a quantized implementation here runs on the dequantized values (TE does the
same), so such a tensor can be printed, compared, reshaped or fed to torch code; results are then
ordinary tensors. `detach()` keeps the quantized form (nn.Parameter needs it).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch.utils._pytree import tree_map

from ..tex import DType, dtype_to_torch
from ._quantizer_value import QuantizerValueBase

__all__ = ["QuantizedTensor", "QuantizedTensorStorage", "Quantizer"]

_HP = (torch.float32, torch.float16, torch.bfloat16)


def check_hp_input(owner: str, tensor: Any) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor) or isinstance(tensor, QuantizedTensor):
        got = type(tensor).__name__
        raise TypeError(f"{owner}: tensor: expected a high-precision torch.Tensor, got {got}")
    if tensor.dtype not in _HP:
        raise TypeError(
            f"{owner}: tensor: expected dtype float32, float16 or bfloat16, got {tensor.dtype}"
        )
    return tensor


def fp8_torch_dtype(owner: str, fp8_dtype: Any) -> torch.dtype:
    dt = dtype_to_torch(fp8_dtype, f"{owner}: fp8_dtype")
    if dt not in (
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.float8_e4m3fnuz,
        torch.float8_e5m2fnuz,
    ):
        raise ValueError(
            f"{owner}: fp8_dtype: expected an FP8 dtype (E4M3 or E5M2), got {fp8_dtype!r}"
        )
    return dt


class Quantizer(QuantizerValueBase):
    """Builds quantized tensors of one recipe. rowwise / columnwise: which copies are produced
    (TE's usages; per-tensor FP8 keeps one copy, its transpose is made on demand). Value
    semantics and data-free allocation for torch.compile: see _quantizer_value.py."""

    def __init__(self, *, rowwise: bool = True, columnwise: bool = True) -> None:
        self.rowwise_usage = bool(rowwise)
        self.columnwise_usage = bool(columnwise)
        self.internal = False
        self.optimize_for_gemm = False

    def set_usage(self, *, rowwise: bool | None = None, columnwise: bool | None = None) -> None:
        if rowwise is not None:
            self.rowwise_usage = bool(rowwise)
        if columnwise is not None:
            self.columnwise_usage = bool(columnwise)

    def _usage_state(self, kind: str) -> dict[str, Any]:
        dt = str(dtype_to_torch(self.dtype, f"{type(self).__name__}.dtype")).replace("torch.", "")
        return {
            "kind": kind,
            "fp8_dtype": dt,
            "rowwise": self.rowwise_usage,
            "columnwise": self.columnwise_usage,
        }

    def state(self) -> dict[str, Any]:  # pragma: no cover - abstract
        """Plain values (and tensors) describing this quantizer, for checkpoints."""
        raise NotImplementedError

    def __call__(self, tensor: torch.Tensor) -> QuantizedTensor:
        return self.quantize(tensor)

    def quantize(
        self, tensor: torch.Tensor, *, out: QuantizedTensor | None = None
    ) -> QuantizedTensor:
        if out is not None:
            return self.update_quantized(tensor, out)
        check_hp_input(type(self).__name__, tensor)
        if torch.is_grad_enabled() and tensor.requires_grad:
            # TE: the quantized tensor joins the autograd graph (a straight-through cast), so a
            # loss computed from its dequantized values reaches `tensor`.
            return _QuantizeFunc.apply(tensor, self)
        return self._quantize(tensor)

    def _quantize(self, tensor: torch.Tensor) -> QuantizedTensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def update_quantized(
        self,
        src: torch.Tensor,
        dst: QuantizedTensor,
        *,
        noop_flag: torch.Tensor | None = None,
    ) -> QuantizedTensor:
        """Quantize src into dst's storage (same shape), in place. noop_flag (TE's): a 1-element
        fp32 tensor; when it holds 1.0 nothing is written (neither dst nor this quantizer's amax),
        so a step can be skipped without leaving the caller's code path."""
        owner = f"{type(self).__name__}.update_quantized"
        if noop_flag is not None and noop_skips(owner, noop_flag):
            return dst
        check_hp_input(owner, src)
        if not isinstance(dst, QuantizedTensor) or tuple(dst.shape) != tuple(src.shape):
            got = tuple(dst.shape) if isinstance(dst, torch.Tensor) else type(dst).__name__
            raise ValueError(
                f"{owner}: dst: expected a QuantizedTensor of shape {tuple(src.shape)}, got {got}"
            )
        dst._assign_from(self._quantize(src))
        return dst

    def make_empty(
        self,
        shape: Any,
        *,
        dtype: torch.dtype = torch.float32,
        device: Any = None,
        requires_grad: bool = False,
    ) -> QuantizedTensor:
        """A quantized tensor of `shape` holding zeros (fill it with update_quantized)."""
        zeros = torch.zeros(tuple(shape), dtype=dtype, device=device)
        q = self._quantize(zeros)
        q.requires_grad_(requires_grad)
        return q


class QuantizedTensorStorage:
    """TE's storage base: the quantized buffers and their usages without the torch.Tensor wrapper
    (what TE's internal quantizers return). A concrete storage answers get_data_tensors,
    get_usages, update_usage and the FSDP2 buffer hooks; QuantizedTensor subclasses inherit them."""

    def get_data_tensors(self, rowwise_data: bool = True, columnwise_data: bool = True) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} class does not implement get_data_tensors function"
        )

    def get_usages(self) -> dict[str, bool]:
        raise NotImplementedError(f"{type(self).__name__} class does not implement get_usages")

    def update_usage(
        self, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None
    ) -> None:
        raise NotImplementedError(f"{type(self).__name__} class does not implement update_usage")

    def fsdp_buffer_fields(self) -> tuple[str, ...]:
        raise NotImplementedError(
            f"{type(self).__name__} class does not implement fsdp_buffer_fields"
        )

    def fsdp_extract_buffers(self) -> tuple[tuple[torch.Tensor | None, ...], dict[str, Any]]:
        """The buffers FSDP2 all-gathers along dim 0, and the metadata to put them back."""
        names = self.fsdp_buffer_fields()
        return tuple(getattr(self, n) for n in names), {"field_names": names}

    def fsdp_assign_gathered(
        self, gathered: tuple[torch.Tensor | None, ...], meta: dict[str, Any]
    ) -> None:
        """Inverse of fsdp_extract_buffers: adopt the gathered buffers."""
        names = meta["field_names"]
        if len(names) != len(gathered):
            raise ValueError(
                f"{type(self).__name__}.fsdp_assign_gathered: gathered: expected {len(names)} "
                f"buffers (one per field {names}), got {len(gathered)}"
            )
        for name, buf in zip(names, gathered):
            setattr(self, name, buf)


class QuantizedTensor(torch.Tensor):
    """Base of Float8Tensor and MXFP8Tensor (see the module docstring)."""

    _quantizer: Quantizer | None

    @staticmethod
    def __new__(
        cls,
        shape: Any,
        dtype: torch.dtype,
        *,
        device: Any = None,
        requires_grad: bool = False,
        **_: Any,
    ) -> QuantizedTensor:
        return torch.Tensor._make_wrapper_subclass(
            cls, tuple(shape), dtype=dtype, device=device, requires_grad=requires_grad
        )

    def _assign_from(self, other: QuantizedTensor) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _shallow_copy(self) -> QuantizedTensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return (
            f"{type(self).__name__}(shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"data={self.dequantize()})"
        )

    def quantize_(
        self, tensor: torch.Tensor, *, noop_flag: torch.Tensor | None = None
    ) -> QuantizedTensor:
        """Overwrite with `tensor` quantized by this tensor's quantizer (skipped when noop_flag
        holds 1.0, see Quantizer.update_quantized)."""
        if self._quantizer is None:
            raise RuntimeError(f"{type(self).__name__}.quantize_: this tensor has no quantizer")
        return self._quantizer.update_quantized(tensor, self, noop_flag=noop_flag)

    def dequantize(self, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The values this tensor represents (dtype: the nominal dtype unless given). Under
        autograd the result is differentiable: its gradient passes to this tensor unchanged."""
        if torch.is_grad_enabled() and self.requires_grad:
            return _DequantizeFunc.apply(self, dtype)
        return self._dequantize(dtype)

    def _dequantize(self, dtype: torch.dtype | None) -> torch.Tensor:
        raise NotImplementedError(
            f"{type(self).__name__} class does not implement dequantize function"
        )

    def _quantized_op(self, func: Any, args: Any, kwargs: Any) -> Any:
        """A subclass's quantized implementation of `func` (views, splits), or NotImplemented
        (the op then runs on the dequantized values)."""
        return NotImplemented

    # -------------------------------------------------------------- parameters (fp8_model_init)
    def get_high_precision_init_val(self) -> torch.Tensor | None:
        """The values before quantization (a CPU copy), kept under quantized_model_init(
        preserve_high_precision_init_val=True) until clear_high_precision_init_val()."""
        return getattr(self, "_high_precision_init_val", None)

    def clear_high_precision_init_val(self) -> None:
        self._high_precision_init_val = None

    def _inner_names(self) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _with_inner(self, inner: dict[str, torch.Tensor | None]) -> QuantizedTensor:
        """A tensor of this type, shape, dtype and quantizer over other inner buffers (named as
        _inner_names()); its device is theirs."""
        raise NotImplementedError(
            f"{type(self).__name__} class does not implement _with_inner"
        )  # pragma: no cover - abstract

    def __deepcopy__(self, memo: dict[int, Any]) -> QuantizedTensor:
        # A wrapper subclass has no storage for Tensor.__deepcopy__ to copy: copy the inner tensors,
        # the quantizer and every other attribute (the high-precision init value, _is_param).
        if id(self) in memo:
            return memo[id(self)]
        new = self._shallow_copy()
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            setattr(new, k, copy.deepcopy(v, memo))
        new.requires_grad_(self.requires_grad)
        return new

    # ------------------------------------------------------------ .data (module.float() etc.)
    def _get_data(self) -> QuantizedTensor:
        return self.detach()

    def _set_data(self, tensor: torch.Tensor) -> None:
        """TE's semantics: a quantized tensor of the same type is adopted (its bytes, scales and
        quantizer; the nominal dtype, shape and device follow it); anything else is quantized
        with this tensor's quantizer. So module.float() / .half() / .to(dtype) on a module with
        FP8 parameters keeps them FP8 and changes their nominal dtype only."""
        if type(tensor) is not type(self):
            if self._quantizer is None:
                raise RuntimeError(
                    f"{type(self).__name__}.data: assigning a {type(tensor).__name__} needs a "
                    "quantizer to cast it; this tensor has none"
                )
            if isinstance(tensor, QuantizedTensor):
                tensor = tensor.dequantize()
            tensor = self._quantizer(tensor.detach())
        if (tensor.shape, tensor.dtype, tensor.device) != (self.shape, self.dtype, self.device):
            self._rewrap(tensor.shape, tensor.dtype, tensor.device)
        self.__dict__.update(
            {k: v for k, v in tensor.__dict__.items() if k != "_high_precision_init_val"}
        )

    data = property(_get_data, _set_data)  # type: ignore[assignment]

    def _rewrap(self, shape: Any, dtype: torch.dtype, device: Any) -> None:
        # The wrapper's metadata is replaced; the Python object (its inner tensors, quantizer,
        # parameter attributes) stays.
        wrapper = torch.Tensor._make_wrapper_subclass(
            type(self), tuple(shape), dtype=dtype, device=device
        )
        torch.Tensor.data.__set__(self, wrapper)  # type: ignore[attr-defined]

    def retype_(self, dtype: torch.dtype) -> QuantizedTensor:
        """Change the nominal dtype (what dequantize() and the GEMMs produce) in place; the
        quantized bytes and scales stay."""
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(
                f"{type(self).__name__}.retype_: dtype: expected float32, float16 or bfloat16, "
                f"got {dtype}"
            )
        self._rewrap(self.shape, dtype, self.device)
        return self

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.detach.default:
            return args[0]._shallow_copy()
        if args and isinstance(args[0], QuantizedTensor):
            out = args[0]._quantized_op(func, args, kwargs)
            if out is not NotImplemented:
                return out
        if func is torch.ops.aten.view.default:
            # TE: a view shares the quantized bytes, so only a subclass that knows its layout
            # can make one (Float8Tensor, MXFP8Tensor); dequantizing would silently copy.
            raise NotImplementedError(f"{cls.__name__} class does not support tensor views")
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") in (
            None,
            args[0].dtype,
        ):
            # .to(device) / .cpu() (TE's): the same quantized tensor with its buffers moved; a
            # change of dtype leaves the quantized form (the dequantized values are converted).
            src = args[0]
            device = torch.device(kwargs.get("device") or src.device)
            moved = {}
            for name in src._inner_names():
                t = getattr(src, name)
                if t is not None:
                    t = t.to(device, non_blocking=bool(kwargs.get("non_blocking")), copy=True)
                    if kwargs.get("pin_memory") and device.type == "cpu":
                        t = t.pin_memory()
                moved[name] = t
            return src._with_inner(moved)
        if func is torch.ops.aten.clone.default:
            new = args[0]._shallow_copy()
            for name in new._inner_names():
                t = getattr(new, name)
                setattr(new, name, None if t is None else t.clone())
            return new
        if func is torch.ops.aten.copy_.default and isinstance(args[0], QuantizedTensor):
            dst, src = args[0], args[1]
            if type(src) is type(dst) and src._same_layout(dst):
                dst._assign_from(src)  # load_state_dict: the same bytes and scales, no re-cast
                return dst
            src = _unwrap(src)
            q = dst._quantizer
            if q is None:
                raise RuntimeError(f"{type(dst).__name__}.copy_: this tensor has no quantizer")
            q.update_quantized(src.to(device=dst.device, dtype=dst.dtype), dst)
            return dst
        if (
            args
            and isinstance(args[0], QuantizedTensor)
            and func._schema.name.endswith("_")
            and func._schema.arguments
            and func._schema.arguments[0].is_write
        ):
            # An in-place op on a quantized tensor (an optimizer's param.add_(grad, alpha=-lr)):
            # dequantize, update in high precision, quantize back with the tensor's own quantizer
            # (the recipe's scaling), in place.
            dst = args[0]
            if dst._quantizer is None:
                raise RuntimeError(
                    f"{type(dst).__name__}: in-place {func._schema.name} needs a quantizer to "
                    "write the result back; this tensor has none"
                )
            hp = dst._dequantize(None)
            rest = tree_map(_unwrap, (args[1:], kwargs))
            func(hp, *rest[0], **rest[1])
            dst._quantizer.update_quantized(hp, dst)
            return dst
        if (
            args
            and isinstance(args[0], (list, tuple))
            and any(isinstance(t, QuantizedTensor) for t in args[0])
            and func._schema.name.endswith("_")
            and func._schema.arguments
            and func._schema.arguments[0].is_write
        ):
            # An in-place foreach op over a list holding quantized tensors (optimizers with
            # foreach=True): the same per tensor, so no update lands on a temporary copy.
            dsts = list(args[0])
            for d in dsts:
                if isinstance(d, QuantizedTensor) and d._quantizer is None:
                    raise RuntimeError(
                        f"{type(d).__name__}: in-place {func._schema.name} needs a quantizer to "
                        "write the result back; this tensor has none"
                    )
            hps = [_unwrap(d) for d in dsts]
            rest = tree_map(_unwrap, (args[1:], kwargs))
            func(hps, *rest[0], **rest[1])
            for d, hp in zip(dsts, hps):
                if isinstance(d, QuantizedTensor):
                    d._quantizer.update_quantized(hp, d)
            return None
        return func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))

    def _same_layout(self, other: QuantizedTensor) -> bool:
        """Whether other's inner tensors can be copied into self's byte for byte."""
        for name in self._inner_names():
            a, b = getattr(self, name), getattr(other, name)
            if (a is None) != (b is None) or (a is not None and a.shape != b.shape):
                return False
        return tuple(self.shape) == tuple(other.shape)


def _unwrap(t: Any) -> Any:
    # Inside __torch_dispatch__ autograd has already recorded the op: no graph here.
    return t._dequantize(None) if isinstance(t, QuantizedTensor) else t


def noop_skips(owner: str, noop_flag: Any) -> bool:
    """Whether TE's noop_flag (a 1-element float32 tensor) says to skip: it holds 1.0."""
    if (
        not isinstance(noop_flag, torch.Tensor)
        or noop_flag.numel() != 1
        or noop_flag.dtype != torch.float32
    ):
        got = (
            f"{noop_flag.dtype} with {noop_flag.numel()} elements"
            if isinstance(noop_flag, torch.Tensor)
            else type(noop_flag).__name__
        )
        raise ValueError(f"{owner}: noop_flag: expected a 1-element float32 tensor, got {got}")
    return bool(noop_flag.reshape(()).item() == 1.0)


def infer_view_shape(owner: str, shape: Any, numel: int) -> tuple[int, ...]:
    """aten.view's size argument with its one -1 resolved (the error torch gives otherwise)."""
    shape = [int(d) for d in shape]
    known = math.prod(d for d in shape if d != -1)
    if shape.count(-1) > 1 or (shape.count(-1) == 0 and known != numel):
        raise RuntimeError(f"{owner}: shape {shape} is invalid for input of size {numel}")
    if -1 in shape:
        if known == 0 or numel % known:
            raise RuntimeError(f"{owner}: shape {shape} is invalid for input of size {numel}")
        shape[shape.index(-1)] = numel // known
    return tuple(shape)


class _QuantizeFunc(torch.autograd.Function):
    """quantizer(tensor) under autograd: the gradient passes straight through (TE's)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, quantizer: Quantizer) -> QuantizedTensor:
        return quantizer._quantize(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _unwrap(grad), None


class _DequantizeFunc(torch.autograd.Function):
    """tensor.dequantize() under autograd: the gradient passes to the quantized tensor."""

    @staticmethod
    def forward(ctx: Any, tensor: QuantizedTensor, dtype: torch.dtype | None) -> torch.Tensor:
        ctx.dtype = tensor.dtype
        return tensor._dequantize(dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _unwrap(grad).to(ctx.dtype), None


def to_dtype_enum(dt: torch.dtype) -> DType:
    return {torch.float8_e4m3fn: DType.kFloat8E4M3, torch.float8_e5m2: DType.kFloat8E5M2}.get(
        dt, DType.kByte
    )
