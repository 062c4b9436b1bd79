"""transformer_engine_lite.pytorch: TransformerEngine's PyTorch API over the te_lite dispatcher ops.

Importing it loads the C++ extension and registers torch.ops.te_lite.* (see ops.py), then exposes
TE's public API layered on those ops: the modules (Linear, LayerNorm, RMSNorm, LayerNormLinear,
LayerNormMLP), attention (DotProductAttention, MultiheadAttention, TransformerLayer), rotary
position embeddings (RotaryPositionEmbedding, apply_rotary_pos_emb), fp8_autocast / autocast,
quantized_model_init / fp8_model_init, the recipes (`recipe`, shared with the JAX front end) and
the availability checks.
"""

from ..common import recipe
from . import ops  # registers torch.ops.te_lite: extension, fake kernels, autograd
from .attention import DotProductAttention, MultiheadAttention
from .attention.rope import RotaryPositionEmbedding, apply_rotary_pos_emb
from .distributed import allreduce_sequence_parallel_grads
from .fp8 import (
    FP8GlobalStateManager,
    autocast,
    fp8_autocast,
    fp8_model_init,
    get_default_fp8_recipe,
    is_fp8_available,
    is_mxfp8_available,
    quantized_model_init,
)
from .module import (
    LayerNorm,
    LayerNormLinear,
    LayerNormMLP,
    Linear,
    RMSNorm,
    TransformerEngineBaseModule,
)
from .transformer import TransformerLayer

__all__ = [
    "DotProductAttention",
    "FP8GlobalStateManager",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "MultiheadAttention",
    "RMSNorm",
    "RotaryPositionEmbedding",
    "TransformerEngineBaseModule",
    "TransformerLayer",
    "allreduce_sequence_parallel_grads",
    "apply_rotary_pos_emb",
    "autocast",
    "fp8_autocast",
    "fp8_model_init",
    "get_default_fp8_recipe",
    "is_fp8_available",
    "is_mxfp8_available",
    "ops",
    "quantized_model_init",
    "recipe",
]
