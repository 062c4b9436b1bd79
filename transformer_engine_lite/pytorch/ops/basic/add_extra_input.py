"""AddExtraInput: add the next extra input of the Sequential to the tensor (a residual add)."""

from __future__ import annotations

import torch

from ..op import BasicOperation

__all__ = ["AddExtraInput"]


class AddExtraInput(BasicOperation):
    """y = x + extra, extra taken from Sequential.forward(input, *extra_inputs) in op order.
    in_place=True (TE: write the sum into the extra input's storage) is not implemented: it would
    change a caller's tensor behind autograd's back."""

    num_extra_inputs = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        if in_place:
            raise NotImplementedError("AddExtraInput: in_place=True is not implemented")
        self._in_place = False

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        (extra,) = extra_inputs
        if not isinstance(extra, torch.Tensor):
            raise TypeError(
                f"AddExtraInput: extra input: expected a tensor, got {type(extra).__name__}"
            )
        return extra + input_, ()
