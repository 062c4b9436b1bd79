"""BackwardActivationBias (TE main's ops/fused/backward_activation_bias.py): the backward of
Bias + an activation (ReLU or GELU, TE's fusible ones) as one op: dact, dbias = sum of dact over
the tokens, and dact handed on to the linear before them (which quantizes it with the recipe's
grad-output quantizer).

The core has no fused dact + dbias (+ cast) kernel, so the op composes the ones it has, in TE's
order and with TE's numerics: the activation's backward (the core's dact kernel, through the
activation op's recorded graph), then the linear + bias backward of the forward op before it,
whose bias gradient is the fp32-accumulated column sum of that same dact and whose dgrad/wgrad
quantize it for the recipe. The result is byte-identical to the unfused backward; what the fusion
changes is the plan (TE's _backward_ops), which TE's tests and tools read.

TE's rule for when it applies: a quantized forward (a recipe active) whose recipe has no
backward_override (high_precision / dequantized keep the plain backward ops), Bias directly after
the linear and ReLU / GELU directly after the bias.
"""

from __future__ import annotations

from typing import Any

import torch

from ..basic.activation import GELU, ReLU
from ..basic.bias import Bias
from ..op import FusedOperation
from .forward_linear_bias_activation import ForwardLinearBiasActivation

__all__ = ["BackwardActivationBias", "fuse_backward_activation_bias"]

_FUSIBLE_ACTIVATIONS = (GELU, ReLU)


class BackwardActivationBias(FusedOperation):
    """Backward dact + dbias (+ the quantize of the linear before them). TE's constructor:
    BackwardActivationBias(bias=Bias, activation=ReLU or GELU)."""

    def __init__(self, *, bias: Bias, activation: Any) -> None:
        if not isinstance(bias, Bias):
            raise TypeError(
                f"BackwardActivationBias: bias: expected an ops.Bias, got {type(bias).__name__}"
            )
        if not isinstance(activation, _FUSIBLE_ACTIVATIONS):
            raise TypeError(
                "BackwardActivationBias: activation: expected ops.ReLU or ops.GELU (TE's fusible "
                f"activations), got {type(activation).__name__}"
            )
        super().__init__((bias, activation))

    def fuser_forward(self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]):
        raise RuntimeError(
            "BackwardActivationBias is a backward-pass op; the fuser runs its forward ops"
        )

    def fuser_backward(
        self, runs: list[Any], dy: torch.Tensor | None, d_extras: list[tuple[Any, ...]]
    ) -> tuple[torch.Tensor | None, list[tuple[Any, ...]], dict[int, torch.Tensor]]:
        """runs: the activation's forward run, then the linear + bias one (backward order)."""
        act, lin = runs
        dact, _, g_act = act.backward(dy, d_extras[0])
        if dact is None:  # nothing before the activation needs a gradient
            return None, [(), ()], g_act
        dx, _, g_lin = lin.backward(dact, d_extras[1])
        return dx, [(), ()], {**g_act, **g_lin}


def fuse_backward_activation_bias(
    plan: list[tuple[Any, list[int]]], recipe: Any = None
) -> list[tuple[Any, list[int]]]:
    """In backward order: ReLU / GELU, then the linear with its bias (ForwardLinearBiasActivation
    holding a Bias) -> BackwardActivationBias, for a quantized forward without backward_override
    (TE's condition: the linear has a grad-output quantizer, the override keeps the plain ops)."""
    if recipe is None or getattr(recipe, "backward_override", None) is not None:
        return plan
    out: list[tuple[Any, list[int]]] = []
    i = 0
    while i < len(plan):
        op, units = plan[i]
        nxt = plan[i + 1][0] if i + 1 < len(plan) else None
        if (
            isinstance(op, _FUSIBLE_ACTIVATIONS)
            and isinstance(nxt, ForwardLinearBiasActivation)
            and len(nxt.basic_ops) == 2
        ):
            fused = BackwardActivationBias(bias=nxt.basic_ops[1], activation=op)
            out.append((fused, units + plan[i + 1][1]))
            i += 2
        else:
            out.append((op, units))
            i += 1
    return out
