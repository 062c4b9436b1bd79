"""Fused ops the op fuser substitutes for runs of basic ops (see fuser.py for the list)."""

from __future__ import annotations

from ..op import BasicOperation, FusibleOperation
from .forward_linear_bias import ForwardLinearBias, fuse_forward_linear_bias

__all__ = ["ForwardLinearBias", "fuse_forward_linear_bias", "fuse_forward_ops"]


def fuse_forward_ops(ops: list[BasicOperation]) -> list[FusibleOperation]:
    """Apply every forward fusion pass in turn."""
    out: list[FusibleOperation] = list(ops)
    for fusion in (fuse_forward_linear_bias,):
        out = fusion(out)
    return out
