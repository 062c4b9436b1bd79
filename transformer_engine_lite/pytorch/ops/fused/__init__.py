"""Fused ops the op fuser substitutes for runs of basic ops (see fuser.py for the list)."""

from __future__ import annotations

from typing import Any

from .backward_fusions import BackwardActivationBias, fuse_backward_activation_bias
from .linear_scale import (
    BackwardLinearScale,
    ForwardLinearScaleAdd,
    fuse_backward_linear_scale,
    fuse_forward_linear_scale_add,
)
from .backward_add_rmsnorm import BackwardAddRMSNorm, fuse_backward_add_rmsnorm
from .backward_linear_add import BackwardLinearAdd, fuse_backward_linear_add
from .forward_linear_bias_activation import (
    ForwardLinearBiasActivation,
    OpList,
    fuse_forward_linear_bias_activation,
)
from .forward_linear_bias_add import ForwardLinearBiasAdd, fuse_forward_linear_bias_add
from .userbuffers_backward_linear import (
    UserbuffersBackwardLinear,
    fuse_userbuffers_backward_linear,
)
from .userbuffers_forward_linear import (
    UserbuffersForwardLinear,
    fuse_userbuffers_forward_linear,
)
from ..op import FusibleOperation

__all__ = [
    "BackwardActivationBias",
    "BackwardAddRMSNorm",
    "BackwardLinearAdd",
    "BackwardLinearScale",
    "ForwardLinearBiasActivation",
    "ForwardLinearBiasAdd",
    "ForwardLinearScaleAdd",
    "UserbuffersBackwardLinear",
    "UserbuffersForwardLinear",
    "fuse_backward_activation_bias",
    "fuse_backward_add_rmsnorm",
    "fuse_backward_linear_add",
    "fuse_backward_linear_scale",
    "fuse_backward_ops",
    "fuse_forward_linear_bias_activation",
    "fuse_forward_linear_bias_add",
    "fuse_forward_linear_scale_add",
    "fuse_forward_ops",
    "fuse_userbuffers_backward_linear",
    "fuse_userbuffers_forward_linear",
]


def fuse_forward_ops(ops: OpList, recipe: Any = None) -> OpList:
    """Apply every forward fusion pass in turn (TE's order: Userbuffers first, then the add
    fusion, so a linear feeding an in-place residual add takes the accumulate epilogue).
    recipe: the forward's quantization recipe (the Userbuffers fusion is off under a
    backward_override, TE's rule)."""
    ops = fuse_userbuffers_forward_linear(ops, recipe)
    for fusion in (
        fuse_forward_linear_bias_add,
        fuse_forward_linear_bias_activation,
        fuse_forward_linear_scale_add,
    ):
        ops = fusion(ops)
    return ops


def fuse_backward_ops(
    forward_ops: OpList, recipe: Any = None
) -> list[tuple[FusibleOperation, list[int]]]:
    """The backward plan: the forward ops reversed (each with its index in forward_ops), then
    every backward fusion pass in turn. recipe: the quantization recipe of the forward (None
    unquantized); the activation + bias fusion depends on it (TE's fuse_backward_ops(recipe=))."""
    plan = [(forward_ops[u][0], [u]) for u in reversed(range(len(forward_ops)))]
    plan = fuse_userbuffers_backward_linear(plan)
    plan = fuse_backward_activation_bias(plan, recipe)
    for fusion in (fuse_backward_linear_add, fuse_backward_add_rmsnorm, fuse_backward_linear_scale):
        plan = fusion(plan)
    return plan
