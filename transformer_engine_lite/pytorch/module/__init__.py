"""TE-lite PyTorch modules: Linear, GroupedLinear, LayerNorm, RMSNorm, LayerNormLinear,
LayerNormMLP."""

from __future__ import annotations

from typing import Any

from .base import TransformerEngineBaseModule
from .grouped_linear import GroupedLinear
from .layernorm import LayerNorm, RMSNorm
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear
from .userbuffers import UserBufferQuantizationMode, destroy_ub, initialize_ub


def is_module_grouped_tensor_path_supported(recipe: Any = None, dtype: Any = None) -> bool:
    """TE's check for GroupedLinear's single grouped parameters (single_grouped_weight/bias).
    Here they are views of one parameter fed to the same per-expert GEMMs, so every recipe and
    dtype supports them."""
    del recipe, dtype
    return True


__all__ = [
    "GroupedLinear",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "RMSNorm",
    "TransformerEngineBaseModule",
    "UserBufferQuantizationMode",
    "destroy_ub",
    "initialize_ub",
    "is_module_grouped_tensor_path_supported",
]
