"""TE's NVFP4 reference factory name. NVFP4 (FP4 E2M1 with two-level scaling, random Hadamard
transform) is not implemented by transformer_engine_lite (issue #24): the factory raises."""

from __future__ import annotations

from typing import Any

__all__ = ["nvfp4_ref_rht_2d_factory"]


def nvfp4_ref_rht_2d_factory(role: Any) -> Any:
    """TE: NVFP4 reference quantizers (RHT on inputs/gradients, 2D weight blocks)."""
    raise NotImplementedError(
        "nvfp4_ref_rht_2d_factory: NVFP4 quantization is not implemented by "
        f"transformer_engine_lite (issue #24); role: {role}"
    )
