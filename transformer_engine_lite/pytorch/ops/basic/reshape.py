"""Reshape op: view the tensor with a new shape (one dim may be -1); backward reshapes back."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..op import BasicOperation

__all__ = ["Reshape"]


class Reshape(BasicOperation):
    def __init__(self, shape: Iterable[int]) -> None:
        super().__init__()
        try:
            self._shape = tuple(int(d) for d in shape)
        except TypeError as e:
            raise TypeError(f"Reshape: shape: expected an iterable of ints, got {shape!r}") from e

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        return input_.reshape(*self._shape), ()
