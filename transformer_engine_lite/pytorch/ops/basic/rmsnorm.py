"""RMSNorm op: y = x / sqrt(mean(x^2) + eps) * weight (TE's ops.RMSNorm)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ._norm import NormOp

__all__ = ["RMSNorm"]


class RMSNorm(NormOp):
    """RMS normalization over the trailing `normalized_shape` dims; parameter `weight`.
    zero_centered_gamma: the scale is 1 + weight. sm_margin: accepted, no effect on CPUs."""

    _kind = "RMSNorm"
    _has_bias = False

    def __init__(
        self,
        normalized_shape: Iterable[int] | int,
        *,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        zero_centered_gamma: bool = False,
        sm_margin: int = 0,
    ) -> None:
        super().__init__(
            normalized_shape, eps=eps, device=device, dtype=dtype,
            zero_centered_gamma=zero_centered_gamma, sm_margin=sm_margin,
        )
