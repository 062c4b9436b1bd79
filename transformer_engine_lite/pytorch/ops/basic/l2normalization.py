"""L2Normalization op: y = x / sqrt(sum(x^2) + eps) over the last dim (TE's ops.L2Normalization)."""

from __future__ import annotations

import torch

from ..op import BasicOperation

__all__ = ["L2Normalization"]


class L2Normalization(BasicOperation):
    """Parameter-free; statistics in fp32. seq_length / micro_batch_size (TE's JIT warm-up sizes)
    are accepted and unused: nothing here is JIT-compiled."""

    def __init__(
        self,
        *,
        eps: float = 1e-6,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
            raise ValueError(f"L2Normalization: eps: expected a float >= 0, got {eps!r}")
        self.eps = float(eps)
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        x = input_.float()
        y = x * torch.rsqrt(x.square().sum(-1, keepdim=True) + self.eps)
        return y.to(input_.dtype), ()
