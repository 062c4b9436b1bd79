"""MakeExtraOutput: pass the tensor on and also return it as an extra output of the Sequential."""

from __future__ import annotations

import torch

from ..op import BasicOperation

__all__ = ["MakeExtraOutput"]


class MakeExtraOutput(BasicOperation):
    """Fork the main tensor: it continues through the next ops and is returned as an extra output
    (Sequential returns (output, *extra_outputs)). Backward: the two gradients add.
    in_place=True (TE: accumulate the gradient into the extra output's gradient buffer) gives the
    same values; autograd does the sum here."""

    num_extra_outputs = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        self._in_place = bool(in_place)

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        return input_, (input_,)
