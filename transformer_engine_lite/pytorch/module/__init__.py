"""TE-lite PyTorch modules: Linear, LayerNorm, RMSNorm, LayerNormLinear, LayerNormMLP."""

from .base import TransformerEngineBaseModule
from .layernorm import LayerNorm, RMSNorm
from .layernorm_linear import LayerNormLinear
from .layernorm_mlp import LayerNormMLP
from .linear import Linear

__all__ = [
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "RMSNorm",
    "TransformerEngineBaseModule",
]
