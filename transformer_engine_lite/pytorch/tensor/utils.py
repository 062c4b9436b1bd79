"""TE's quantized-tensor utilities (transformer_engine.pytorch.tensor.utils)."""

from __future__ import annotations

import torch

from ._master_weights import (
    cast_master_weights_to_fp8,
    post_all_gather_processing,
    quantize_master_weights,
)
from .float8_tensor import Float8Tensor
from .quantized_tensor import QuantizedTensorStorage, Quantizer

__all__ = [
    "cast_master_weights_to_fp8",
    "is_custom",
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


def is_custom(x: Quantizer | QuantizedTensorStorage | None = None) -> bool:
    """Whether x is a custom quantizer or quantized tensor (its `custom` attribute is True, as the
    custom_recipes references'): GEMMs of such tensors run the quantizer's qgemm
    (custom_recipes.gemm.custom_gemm). None and plain tensors are not; other objects are an error
    (TE's AssertionError)."""
    if x is None or isinstance(x, torch.Tensor):
        return False
    if not isinstance(x, (Quantizer, QuantizedTensorStorage)):
        raise AssertionError(f"is_custom: x: expected a Quantizer or QuantizedTensorStorage, got "
                             f"{type(x).__name__}")
    return bool(getattr(x, "custom", False))
