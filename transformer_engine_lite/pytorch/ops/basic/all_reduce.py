"""AllReduce op: sum over the group in the forward; the backward passes the gradient as is."""

from __future__ import annotations

from typing import Any

import torch

from ...distributed import reduce_from_tp_region
from ._collective import CollectiveOp

__all__ = ["AllReduce"]


class AllReduce(CollectiveOp):
    """Sum the tensor over `process_group` (the output of a row-parallel GEMM). The output is
    assumed to feed ops computed redundantly on every rank, so gradients are already identical
    and the backward is an identity (TE's semantics; reduce_in_backward is kept for TE's
    signature and, as in TE 2.8, does not change the backward)."""

    def __init__(self, process_group: Any = None, reduce_in_backward: bool = True) -> None:
        super().__init__(process_group)
        self._reduce_in_backward = bool(reduce_in_backward)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp_region(x, self.process_group)
