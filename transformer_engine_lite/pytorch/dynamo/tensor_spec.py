"""TensorSpec: a data-free description of a plain or quantized tensor (TE's API).

What a custom op's fake implementation returns for a quantized output, and how a quantized tensor
is put back together from the flat tensors a custom op returns: shape, nominal dtype and, for a
quantized tensor, the (value) quantizer whose primitives describe the buffers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["TensorSpec", "to_tensor_spec"]


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(strides))


@dataclass
class TensorSpec:
    """shape, dtype (the nominal dtype of a quantized tensor), quantizer (None: a plain
    tensor), requires_grad, device (None: the CPU). The spec keeps its own copy of the quantizer,
    so update_usage never changes the caller's."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    quantizer: Any = None
    requires_grad: bool = False
    device: torch.device | None = None

    def __post_init__(self) -> None:
        self.shape = tuple(int(d) for d in self.shape)
        if self.quantizer is not None:
            q = self.quantizer
            self.quantizer = q.copy() if hasattr(q, "copy") else copy.copy(q)

    @property
    def is_quantized(self) -> bool:
        return self.quantizer is not None

    def _device(self) -> torch.device:
        return torch.device(self.device) if self.device is not None else torch.device("cpu")

    def update_usage(
        self, *, rowwise_usage: bool | None = None, columnwise_usage: bool | None = None
    ) -> None:
        """The layout of the described tensor (QuantizedTensor.update_usage's arguments)."""
        if self.quantizer is None:
            raise ValueError("TensorSpec.update_usage: expected a quantized spec, got a plain one")
        self.quantizer.set_usage(rowwise=rowwise_usage, columnwise=columnwise_usage)

    def inner_names(self) -> tuple[str, ...]:
        """The flat inner tensors, in the order __tensor_flatten__ lists them."""
        if self.quantizer is None:
            return ("data",)
        names = tuple(self.quantizer.inner_tensor_specs(self.shape))
        cls = self.quantizer.storage_metadata(self.dtype)["cls"]
        order = tuple(n for n in getattr(cls, "_INNER", ()) if n in names) or names
        if names != order:
            raise RuntimeError(
                f"TensorSpec: {type(self.quantizer).__name__}.inner_tensor_specs: expected the "
                f"buffers in {cls.__name__}'s flatten order {order}, got {names}"
            )
        return names

    def create_metadata(self) -> dict[str, Any]:
        """The __tensor_unflatten__ context of the described tensor."""
        if self.quantizer is None:
            return {
                "is_tensor": True,
                "is_quantized": False,
                "dtype": self.dtype,
                "requires_grad": self.requires_grad,
            }
        return self.quantizer.create_metadata(
            self.shape, dtype=self.dtype, requires_grad=self.requires_grad
        )

    def create_inner_tensors(self) -> list[torch.Tensor]:
        """Uninitialized inner tensors, in inner_names() order (FakeTensors under a fake mode)."""
        if self.quantizer is None:
            return [torch.empty(self.shape, dtype=self.dtype, device=self._device())]
        inner = self.quantizer.alloc_tensors(self.shape, device=self._device())
        return [inner[n] for n in self.inner_names()]

    def assemble(self, inner_tensors: list[torch.Tensor]) -> torch.Tensor:
        """The described tensor over the given inner tensors (inner_names() order)."""
        names = self.inner_names()
        if len(inner_tensors) != len(names):
            raise ValueError(
                f"TensorSpec.assemble: inner_tensors: expected {len(names)} tensors {names}, "
                f"got {len(inner_tensors)}"
            )
        if self.quantizer is None:
            return inner_tensors[0]
        ctx = self.create_metadata()
        return ctx["cls"].__tensor_unflatten__(
            dict(zip(names, inner_tensors)), ctx, self.shape, _contiguous_strides(self.shape)
        )

    def create_tensor(self) -> torch.Tensor:
        """An uninitialized tensor matching the spec (traceable by torch.compile)."""
        if self.quantizer is None:
            return torch.empty(
                self.shape,
                dtype=self.dtype,
                device=self._device(),
                requires_grad=self.requires_grad,
            )
        return self.assemble(self.create_inner_tensors())


def to_tensor_spec(tensor: torch.Tensor) -> TensorSpec:
    """The TensorSpec of a plain or quantized tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"to_tensor_spec: tensor: expected a torch.Tensor or QuantizedTensor, got "
            f"{type(tensor).__name__}"
        )
    return TensorSpec(
        shape=tuple(tensor.shape),
        dtype=tensor.dtype,
        quantizer=getattr(tensor, "_quantizer", None),
        requires_grad=bool(tensor.requires_grad),
        device=tensor.device,
    )
