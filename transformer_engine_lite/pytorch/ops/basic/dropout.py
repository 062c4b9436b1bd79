"""Dropout op: zero each element with probability p in training mode, scale the rest by 1/(1-p)."""

from __future__ import annotations

import torch

from ..op import BasicOperation

__all__ = ["Dropout"]


class Dropout(BasicOperation):
    def __init__(self, p: float) -> None:
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p: expected a probability in [0, 1], got {p!r}")
        self.dropout_probability = float(p)

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        p = self.dropout_probability
        return torch.nn.functional.dropout(input_, p, self.training and p > 0.0), ()
