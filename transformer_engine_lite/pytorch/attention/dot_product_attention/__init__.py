"""TE's dot_product_attention package: DotProductAttention, the selection record
_attention_backends, the probe and helpers (utils) and TE's backend modules (backends)."""

from .dot_product_attention import DotProductAttention, _attention_backends

__all__ = ["DotProductAttention", "_attention_backends"]
