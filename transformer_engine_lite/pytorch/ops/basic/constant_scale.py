"""ConstantScale op: y = scale * x (TE's ops.ConstantScale)."""

from __future__ import annotations

import torch

from ..op import BasicOperation

__all__ = ["ConstantScale"]


class ConstantScale(BasicOperation):
    def __init__(self, scale: float) -> None:
        super().__init__()
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"ConstantScale: scale: expected a float, got {scale!r}")
        self.scale = float(scale)

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        return input_ * self.scale, ()
