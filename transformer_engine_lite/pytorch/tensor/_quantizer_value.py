"""What torch.compile needs of a quantizer and its tensors (TE's Quantizer value semantics and
data-free allocation primitives).

Value semantics: a quantizer class registered with dynamo.register_value_opaque_quantizer is
compared and hashed by its configuration, the fields its classes annotate (plain int / bool /
float / str / enum values only). torch.compile then bakes it into the graph as a constant (a
custom op may take it as an argument) and guards on its value; unregistered classes keep identity
semantics. A quantizer holding live distributed state (a ProcessGroup in amax_reduction_group)
refuses to become a value: TypeError from hash(), == and __fx_repr__.

Data-free primitives: inner_tensor_specs (the shape / dtype of each buffer a tensor of a given
logical shape holds), storage_metadata / create_metadata (the __tensor_unflatten__ context) and
alloc_tensors (torch.empty per buffer; FakeTensors under FakeTensorMode) build a quantized tensor
without running a kernel, which is what a custom op's fake implementation needs (TensorSpec).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["QuantizerValueBase", "flatten_context", "unflatten_kwargs"]


class QuantizerValueBase:
    """Base of Quantizer: TE's annotated value fields shared by every quantizer."""

    rowwise_usage: bool
    columnwise_usage: bool
    internal: bool
    optimize_for_gemm: bool

    # A rebuilt (value-key) quantizer and one from an older pickle have no instance attribute.
    optimize_for_gemm = False

    # ---------------------------------------------------------------- value semantics
    @classmethod
    def _annotated_fields(cls) -> dict[str, Any]:
        """Annotated fields across the MRO, base first: the class annotations are what defines a
        quantizer's value (register_value_opaque_quantizer checks their types)."""
        fields: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            if issubclass(klass, QuantizerValueBase):
                fields.update(klass.__dict__.get("__annotations__", {}))
        return fields

    def _value_fields(self) -> tuple[str, ...] | None:
        # Registered on the class itself: a subclass of a registered quantizer does not inherit
        # value semantics without registering itself (its extra state would not be in the key).
        # Not type(self).__dict__: dynamo cannot wrap a class dict holding a staticmethod
        # (NVFP4Quantizer's), so the owner is compared instead.
        cls = type(self)
        if getattr(cls, "_value_owner", None) is not cls:
            return None
        return cls._value_field_names

    def _check_value_has_no_process_group(self) -> None:
        group = getattr(self, "amax_reduction_group", None)
        if torch.distributed.is_available() and isinstance(
            group, torch.distributed.ProcessGroup
        ):
            raise TypeError(
                f"{type(self).__name__} cannot be a torch.compile value object: "
                "amax_reduction_group holds a torch.distributed.ProcessGroup (live distributed "
                "state, which cannot be baked into a graph); expected None"
            )

    def _value_key(self) -> tuple[str, tuple[tuple[str, Any], ...]]:
        fields = self._value_fields()
        if fields is None:
            raise TypeError(
                f"{type(self).__name__} is not a value quantizer: register it with "
                "transformer_engine_lite.pytorch.dynamo.register_value_opaque_quantizer"
            )
        self._check_value_has_no_process_group()
        items = []
        for name in fields:
            value = getattr(self, name)
            # The DType enum as its int: a plain value that repr() reproduces in FX code.
            items.append((name, int(value) if name == "dtype" else value))
        return type(self).__qualname__, tuple(items)

    def __eq__(self, other: object) -> Any:
        if self is other:
            return True
        if type(self) is not type(other) or self._value_fields() is None:
            return NotImplemented
        return self._value_key() == other._value_key()

    def __hash__(self) -> int:
        if self._value_fields() is None:
            return object.__hash__(self)
        return hash(self._value_key())

    def copy(self) -> QuantizerValueBase:
        """A shallow copy (TE's Quantizer.copy): usage changes on it leave self alone; buffers
        (a delayed-scaling scale / amax) are shared."""
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    # ---------------------------------------------------------------- data-free allocation
    def inner_tensor_specs(
        self, shape: tuple[int, ...]
    ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """{buffer name: (shape, dtype)} of a tensor of logical `shape`, in flatten order."""
        raise NotImplementedError(
            f"{type(self).__name__}.inner_tensor_specs is not implemented: this quantizer cannot "
            "be used with TensorSpec / data-free allocation"
        )

    def storage_metadata(self, fake_dtype: torch.dtype) -> dict[str, Any]:
        """{"cls": tensor class, "nontensor_kwargs": its non-tensor constructor arguments}."""
        raise NotImplementedError(
            f"{type(self).__name__}.storage_metadata is not implemented: this quantizer cannot "
            "be used with TensorSpec / data-free allocation"
        )

    def alloc_tensors(
        self, shape: Iterable[int], *, device: Any = None
    ) -> dict[str, torch.Tensor]:
        """Uninitialized buffers for `shape` (the inner_tensors of __tensor_unflatten__)."""
        dev = torch.device(device) if device is not None else torch.device("cpu")
        return {
            name: torch.empty(s, dtype=dt, device=dev)
            for name, (s, dt) in self.inner_tensor_specs(tuple(shape)).items()
        }

    def create_metadata(
        self, _shape: Iterable[int], *, dtype: torch.dtype, requires_grad: bool = False
    ) -> dict[str, Any]:
        """The __tensor_unflatten__ context of the tensor this quantizer makes. is_tensor is
        always True: the lite has no bare storage classes, internal quantizers make the same
        wrapper tensors."""
        meta = self.storage_metadata(dtype)
        return {
            "cls": meta["cls"],
            "is_tensor": True,
            "requires_grad": bool(requires_grad),
            "nontensor_kwargs": meta["nontensor_kwargs"],
        }

    def _context_quantizer(self) -> QuantizerValueBase | None:
        """The quantizer a tensor's flatten context carries: value quantizers only (compared by
        value in dynamo's guards); a stateful one (delayed scaling) stays out, as before."""
        return self if self._value_fields() is not None else None


def flatten_context(tensor: Any, nontensor_kwargs: dict[str, Any]) -> dict[str, Any]:
    """TE's __tensor_flatten__ context of a quantized wrapper tensor."""
    return {
        "cls": type(tensor),
        "is_tensor": True,
        "requires_grad": bool(tensor.requires_grad),
        "nontensor_kwargs": nontensor_kwargs,
    }


def unflatten_kwargs(owner: str, ctx: Any) -> tuple[type, dict[str, Any], bool]:
    """(class, non-tensor kwargs, requires_grad) of a flatten context, checked."""
    if not isinstance(ctx, dict) or not {"cls", "nontensor_kwargs"} <= set(ctx):
        raise ValueError(
            f"{owner}.__tensor_unflatten__: ctx: expected the dict of __tensor_flatten__ / "
            f"create_metadata (keys cls, is_tensor, requires_grad, nontensor_kwargs), got {ctx!r}"
        )
    return ctx["cls"], dict(ctx["nontensor_kwargs"]), bool(ctx.get("requires_grad", False))
