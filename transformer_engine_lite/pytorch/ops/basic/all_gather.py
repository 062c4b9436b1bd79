"""AllGather op: concatenate every rank's tensor along dim 0; backward reduce-scatter."""

from __future__ import annotations

import torch

from ...distributed import gather_along_first_dim
from ._collective import CollectiveOp

__all__ = ["AllGather"]


class AllGather(CollectiveOp):
    """Sequence-parallel -> column-parallel input."""

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        return gather_along_first_dim(x, self.process_group)
