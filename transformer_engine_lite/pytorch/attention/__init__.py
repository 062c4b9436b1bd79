"""te.attention: DotProductAttention (backend selection + flash / unfused backends),
MultiheadAttention and rotary position embeddings (TE's transformer_engine.pytorch.attention)."""

from .backends import FlashAttention, UnfusedDotProductAttention
from .dot_product_attention import DotProductAttention
from .multi_head_attention import MultiheadAttention
from .rope import RotaryPositionEmbedding, apply_rotary_pos_emb

__all__ = [
    "DotProductAttention",
    "FlashAttention",
    "MultiheadAttention",
    "RotaryPositionEmbedding",
    "UnfusedDotProductAttention",
    "apply_rotary_pos_emb",
]
