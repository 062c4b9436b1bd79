"""ReduceScatter op: sum over the group and keep this rank's slice of dim 0; backward all-gather."""

from __future__ import annotations

import torch

from ...distributed import reduce_scatter_along_first_dim
from ._collective import CollectiveOp

__all__ = ["ReduceScatter"]


class ReduceScatter(CollectiveOp):
    """Row-parallel -> sequence-parallel: dim 0 must divide by the group size."""

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_scatter_along_first_dim(x, self.process_group)
