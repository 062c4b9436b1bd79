"""Names the reference quantizers and TE's tests share (TE's custom_recipes.reference_utils)."""

from __future__ import annotations

import enum

import torch

__all__ = ["Fp4Formats", "HIGH_PRECISION_FLOAT_DTYPES", "roundup_div"]

# The dtypes a reference quantizer accepts as input (TE's tuple, torch.float listed as TE does).
HIGH_PRECISION_FLOAT_DTYPES = (torch.float, torch.float16, torch.bfloat16, torch.float32)


class Fp4Formats(enum.Enum):
    """FP4 element formats of the reference quantizers (NVFP4's E2M1)."""

    E2M1 = "e2m1"


def roundup_div(x: int, y: int) -> int:
    """ceil(x / y) for x >= 0, y > 0."""
    if not (isinstance(x, int) and x >= 0):
        raise ValueError(f"roundup_div: x: expected an int >= 0, got {x!r}")
    if not (isinstance(y, int) and y > 0):
        raise ValueError(f"roundup_div: y: expected an int > 0, got {y!r}")
    return (x + y - 1) // y
