"""TE's quantized-tensor utilities (transformer_engine.pytorch.tensor.utils)."""

from __future__ import annotations

import torch

from ._master_weights import (
    cast_master_weights_to_fp8,
    post_all_gather_processing,
    quantize_master_weights,
)
from .float8_tensor import Float8Tensor

__all__ = [
    "cast_master_weights_to_fp8",
    "post_all_gather_processing",
    "quantize_master_weights",
    "replace_raw_data",
]


def replace_raw_data(tensor: Float8Tensor, new_raw_data: torch.Tensor) -> None:
    """Move a Float8Tensor's bytes into `new_raw_data` (e.g. a slice of a contiguous buffer), in
    place: the values and every other attribute stay the same."""
    if not isinstance(tensor, Float8Tensor):
        raise TypeError(
            f"replace_raw_data: tensor: expected a Float8Tensor, got {type(tensor).__name__}"
        )
    old = tensor._data
    if not isinstance(new_raw_data, torch.Tensor) or new_raw_data.shape != old.shape:
        got = (
            tuple(new_raw_data.shape)
            if isinstance(new_raw_data, torch.Tensor)
            else type(new_raw_data).__name__
        )
        raise ValueError(
            f"replace_raw_data: new_raw_data: expected shape {tuple(old.shape)}, got {got}"
        )
    if new_raw_data.dtype != old.dtype:
        new_raw_data = new_raw_data.view(old.dtype)
    new_raw_data.detach().copy_(old)
    tensor._data = new_raw_data
