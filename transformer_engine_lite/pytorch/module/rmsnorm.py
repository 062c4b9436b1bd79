"""TE's module path `transformer_engine.pytorch.module.rmsnorm`: te.RMSNorm (defined beside
te.LayerNorm in layernorm.py, which both share their code with)."""

from .layernorm import RMSNorm

__all__ = ["RMSNorm"]
