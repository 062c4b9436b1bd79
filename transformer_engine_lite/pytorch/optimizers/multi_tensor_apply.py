"""TE's multi_tensor_applier: calls op(chunk_size, noop_flag, tensor_lists, *args), DTensors
replaced by their local shards."""

from __future__ import annotations

from typing import Any, Callable

import torch

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch without distributed
    DTensor = None  # type: ignore[assignment, misc]


class MultiTensorApply:  # pylint: disable=too-few-public-methods
    """Multi-tensor apply entry with a fixed chunk size."""

    def __init__(self, chunk_size: int) -> None:
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ValueError(
                f"MultiTensorApply: chunk_size: expected an int > 0, got {chunk_size!r}"
            )
        self.chunk_size = chunk_size

    def __call__(self, op: Callable[..., Any], noop_flag_buffer: torch.Tensor,
                 tensor_lists: list[list[torch.Tensor]], *args: Any) -> Any:
        if DTensor is not None:
            for ts in tensor_lists:
                for j, t in enumerate(ts):
                    if isinstance(t, DTensor):
                        ts[j] = t._local_tensor
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)
