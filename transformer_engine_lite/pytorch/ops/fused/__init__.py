"""Fused ops the op fuser substitutes for runs of basic ops (see fuser.py for the list)."""

from __future__ import annotations

from .backward_fusions import (
    BackwardActivationBias,
    BackwardAddRMSNorm,
    BackwardLinearAdd,
    BackwardLinearScale,
    ForwardLinearScaleAdd,
)
from .forward_linear_bias_activation import (
    ForwardLinearBiasActivation,
    OpList,
    fuse_forward_linear_bias_activation,
)
from .forward_linear_bias_add import ForwardLinearBiasAdd, fuse_forward_linear_bias_add

__all__ = [
    "BackwardActivationBias",
    "BackwardAddRMSNorm",
    "BackwardLinearAdd",
    "BackwardLinearScale",
    "ForwardLinearBiasActivation",
    "ForwardLinearBiasAdd",
    "ForwardLinearScaleAdd",
    "fuse_forward_linear_bias_activation",
    "fuse_forward_linear_bias_add",
    "fuse_forward_ops",
]


def fuse_forward_ops(ops: OpList) -> OpList:
    """Apply every forward fusion pass in turn (TE's order: the add fusion first, so a linear
    feeding an in-place residual add takes the accumulate epilogue)."""
    for fusion in (fuse_forward_linear_bias_add, fuse_forward_linear_bias_activation):
        ops = fusion(ops)
    return ops
