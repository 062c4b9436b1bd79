"""Flax (linen) modules of the JAX front end, with TE-JAX's names, fields, defaults and parameter
names (`import transformer_engine_lite.jax.flax as te_flax`)."""

from .module import (  # noqa: F401
    DenseGeneral,
    LayerNorm,
    LayerNormDenseGeneral,
    LayerNormMLP,
    Softmax,
    TransformerEngineBase,
    extend_logical_axis_rules,
    make_dot_general_cls,
    wrap_function_in_te_state_module,
)
from .transformer import (
    DotProductAttention,
    MultiHeadAttention,
    RelativePositionBiases,
    TransformerLayer,
    TransformerLayerType,
)

__all__ = [
    "DenseGeneral",
    "DotProductAttention",
    "LayerNorm",
    "LayerNormDenseGeneral",
    "LayerNormMLP",
    "MultiHeadAttention",
    "RelativePositionBiases",
    "TransformerLayer",
    "TransformerLayerType",
    "extend_logical_axis_rules",
    "make_dot_general_cls",
    "wrap_function_in_te_state_module",
]
