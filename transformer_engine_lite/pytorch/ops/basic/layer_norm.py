"""LayerNorm op: y = (x - mean) / sqrt(var + eps) * weight + bias (TE's ops.LayerNorm)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ._norm import NormOp

__all__ = ["LayerNorm"]


class LayerNorm(NormOp):
    """Layer normalization over the trailing `normalized_shape` dims; parameters `weight`, `bias`.
    zero_centered_gamma: the scale is 1 + weight. sm_margin: accepted, no effect on CPUs."""

    _kind = "LayerNorm"
    _has_bias = True

    def __init__(
        self,
        normalized_shape: Iterable[int] | int,
        *,
        eps: float = 1e-5,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        zero_centered_gamma: bool = False,
        sm_margin: int | dict[str, int] = 0,
    ) -> None:
        super().__init__(
            normalized_shape, eps=eps, device=device, dtype=dtype,
            zero_centered_gamma=zero_centered_gamma, sm_margin=sm_margin,
        )
