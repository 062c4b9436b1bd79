"""Identity op: returns its input (TE's ops.Identity)."""

from __future__ import annotations

import torch

from ..op import BasicOperation

__all__ = ["Identity"]


class Identity(BasicOperation):
    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        return input_, ()
