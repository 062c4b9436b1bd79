"""Options of the reference quantized GEMM (reference_current_scaling.CurrentScalingQuantizerRef
.qgemm), with TE's names."""

from __future__ import annotations

import dataclasses
from enum import Enum

import torch

__all__ = ["GEMMType", "MMParams"]


class GEMMType(Enum):
    """Which of a linear layer's three GEMMs a call is (the reference GEMM does not depend on it)."""

    FPROP = "fprop"
    DGRAD = "dgrad"
    WGRAD = "wgrad"


@dataclasses.dataclass
class MMParams:
    """out_dtype: the GEMM's output dtype (None: the caller's). use_split_accumulator: a GPU FP8
    option (cuBLAS promotes partial sums to FP32 every few steps); the reference GEMM sums exactly,
    so it is checked and recorded, not used."""

    out_dtype: torch.dtype | None = None
    use_split_accumulator: bool = True

    def __post_init__(self) -> None:
        if self.out_dtype is not None and not isinstance(self.out_dtype, torch.dtype):
            raise TypeError(f"MMParams: out_dtype: expected a torch.dtype or None, got "
                            f"{self.out_dtype!r}")
        if not isinstance(self.use_split_accumulator, bool):
            raise TypeError(f"MMParams: use_split_accumulator: expected a bool, got "
                            f"{self.use_split_accumulator!r}")
