"""AddExtraInput: add the next extra input of the Sequential to the tensor (a residual add)."""

from __future__ import annotations

from typing import Any

import torch

from ..op import BasicOperation

__all__ = ["AddExtraInput"]


class _AddIntoExtra(torch.autograd.Function):
    """extra += x in extra's own storage, returned as the output (TE's in_place=True).

    The write happens inside the Function, as in TE's op fuser: autograd sees an output aliasing
    the extra input, not an in-place op on it, so a leaf extra input that requires grad may take
    it. The gradient of an add is dy for both operands, so nothing is saved."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        extra += x  # a quantized extra input requantizes the sum into itself, as TE's does
        return extra

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):  # type: ignore[override]
        return dy, dy


class AddExtraInput(BasicOperation):
    """y = x + extra, extra taken from Sequential.forward(input, *extra_inputs) in op order.

    in_place=True (TE's option): the sum is written into the extra input's storage and that tensor
    is the output (the caller's tensor changes; the residual stream needs no new buffer). The
    fuser may fold it into a preceding GEMM (ForwardLinearBiasAdd: the GEMM accumulates into it).
    """

    num_extra_inputs = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        self._in_place = bool(in_place)

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        (extra,) = extra_inputs
        if not isinstance(extra, torch.Tensor):
            raise TypeError(
                f"AddExtraInput: extra input: expected a tensor, got {type(extra).__name__}"
            )
        if not self._in_place:
            return extra + input_, ()
        if extra.shape != input_.shape:
            raise ValueError(
                f"AddExtraInput: extra input: in_place=True needs the input's shape "
                f"{tuple(input_.shape)}, got {tuple(extra.shape)}"
            )
        return _AddIntoExtra.apply(input_, extra), ()
