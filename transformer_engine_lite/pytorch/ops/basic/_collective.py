"""Shared base of the communication ops (AllReduce, ReduceScatter, AllGather)."""

from __future__ import annotations

from typing import Any

import torch

from .._common import group_size
from ..op import BasicOperation


class CollectiveOp(BasicOperation):
    """process_group: the group to communicate over (default: the world group). With one process
    (or torch.distributed not initialized) the op is an identity."""

    def __init__(self, process_group: Any = None) -> None:
        super().__init__()
        self.process_group = process_group

    @property
    def process_group_size(self) -> int:
        """TE's attribute: the number of ranks in process_group (1 without torch.distributed)."""
        return group_size(self.process_group)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        if not isinstance(input_, torch.Tensor):
            raise TypeError(f"{type(self).__name__}: input: expected a tensor")
        return self._run(input_.contiguous()), ()
