"""te.attention: DotProductAttention (backend selection + flash / unfused backends),
MultiheadAttention, rotary position embeddings and the KV cache for inference (InferenceParams)
(TE's transformer_engine.pytorch.attention)."""

from .backends import FlashAttention, UnfusedDotProductAttention
from .dot_product_attention import DotProductAttention
from .inference import InferenceParams
from .multi_head_attention import MultiheadAttention
from .rope import RotaryPositionEmbedding, apply_rotary_pos_emb

__all__ = [
    "DotProductAttention",
    "FlashAttention",
    "InferenceParams",
    "MultiheadAttention",
    "RotaryPositionEmbedding",
    "UnfusedDotProductAttention",
    "apply_rotary_pos_emb",
]
