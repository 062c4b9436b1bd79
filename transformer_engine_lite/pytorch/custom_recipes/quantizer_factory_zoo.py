"""Mixed-format quantizer factories (TE's quantizer_factory_zoo), for CustomRecipe.

mxfp8_fwd_nvfp4_bwd_factory keeps TE's dispatch: MXFP8 for every role outside linear GEMMs,
NVFP4 (or an MXFP8-forward / NVFP4-backward hybrid) for linear inputs, weights and gradients.
TE's HybridQuantizer (one format per usage) is not implemented, so those roles raise
NotImplementedError when asked.
"""

from __future__ import annotations

from typing import Any

from ..quantization import QuantizerRole
from .quantizer_factories import _check_role, mxfp8_factory

__all__ = ["mxfp8_fwd_nvfp4_bwd_factory"]


def mxfp8_fwd_nvfp4_bwd_factory(role: QuantizerRole | None) -> Any:
    """MXFP8 forward, NVFP4 backward (TE: HybridQuantizer(MXFP8 rows, NVFP4 columns) for linear
    inputs and weights, NVFP4 for linear gradients, MXFP8 for everything else)."""
    _check_role("mxfp8_fwd_nvfp4_bwd_factory", role)
    linear = role is not None and role.module_type in ("linear", "grouped_linear")
    if linear and role.tensor_type in ("input", "weight", "grad_output"):
        raise NotImplementedError(
            "mxfp8_fwd_nvfp4_bwd_factory: HybridQuantizer (MXFP8 row-wise with NVFP4 column-wise "
            f"copies) is not implemented by transformer_engine_lite; role: {role}"
        )
    return mxfp8_factory(role)
