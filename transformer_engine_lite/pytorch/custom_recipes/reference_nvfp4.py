"""TE's NVFP4 reference factory. TE's returns its pure-torch reference quantizer; ours returns
NVFP4Quantizer with the same settings, whose bytes equal that reference's (tests/pytorch/
test_nvfp4.py, tests/cpp/test_nvfp4.cpp): RHT on inputs and gradients, 16x16 weight blocks, no
stochastic rounding."""

from __future__ import annotations

from typing import Any

__all__ = ["nvfp4_ref_rht_2d_factory"]


def nvfp4_ref_rht_2d_factory(role: Any) -> Any:
    """Linear / grouped-linear weights: 16x16 blocks, no RHT; every other role: 1x16 blocks with
    the random Hadamard transform of the column-wise copy (TE's reference factory)."""
    from ..tensor.nvfp4_tensor import NVFP4Quantizer

    weight = (role is not None and getattr(role, "module_type", None) in ("linear", "grouped_linear")
              and getattr(role, "tensor_type", None) == "weight")
    if weight:
        return NVFP4Quantizer(with_2d_quantization=True)
    return NVFP4Quantizer(with_rht=True, with_post_rht_amax=True)
