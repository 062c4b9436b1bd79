"""TE's IdentityQuantizer: the "no quantization" answer of a CustomRecipe factory.

A module whose factory returns it for a GEMM's operands runs that GEMM in high precision, exactly
as outside autocast (quantizer_factories.high_precision_factory returns it for every role).
Called directly it hands the tensor back unchanged: there is nothing to quantize.
"""

from __future__ import annotations

from typing import Any

import torch

from .quantized_tensor import Quantizer

__all__ = ["IdentityQuantizer"]


class IdentityQuantizer(Quantizer):
    """Leaves tensors in their high-precision dtype."""

    def state(self) -> dict[str, Any]:
        return {"kind": "identity", "rowwise": self.rowwise_usage,
                "columnwise": self.columnwise_usage}

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.quantize(tensor)

    def quantize(self, tensor: torch.Tensor, *, out: Any = None) -> torch.Tensor:  # type: ignore[override]
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"IdentityQuantizer: tensor: expected a torch.Tensor, got "
                            f"{type(tensor).__name__}")
        if out is not None:
            raise ValueError("IdentityQuantizer: out: expected None (nothing is quantized into a "
                             "buffer), got a tensor")
        return tensor

    def _quantize(self, tensor: torch.Tensor) -> torch.Tensor:
        # what a HybridQuantizer's high-precision direction holds (and make_empty's zeros)
        return tensor
