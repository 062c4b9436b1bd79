"""BackwardLinearAdd: MakeExtraOutput(in_place=True) + BasicLinear in the backward pass. The
linear's dgrad GEMM accumulates into the extra output's gradient (the residual stream's
gradient) instead of writing a new tensor that is then added to it."""

from __future__ import annotations

from typing import Any

import torch

from ..basic.basic_linear import BasicLinear
from ..basic.bias import Bias
from ..basic.make_extra_output import MakeExtraOutput
from ..op import FusedOperation
from .forward_linear_bias_activation import ForwardLinearBiasActivation

__all__ = ["BackwardLinearAdd", "fuse_backward_linear_add"]


class BackwardLinearAdd(FusedOperation):
    """dx = d_extra + dy W, the GEMM accumulating into d_extra's storage (TE's in-place
    semantics: the extra output's gradient buffer becomes the input gradient)."""

    def __init__(
        self, *, backward_add: MakeExtraOutput, linear: BasicLinear, bias: Bias | None = None
    ) -> None:
        super().__init__((backward_add, linear) if bias is None else (backward_add, linear, bias))

    def fuser_forward(self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]):
        raise RuntimeError("BackwardLinearAdd is a backward-pass op; the fuser runs its forward ops")

    def fuser_backward(
        self, runs: list[Any], dy: torch.Tensor | None, d_extras: list[tuple[Any, ...]]
    ) -> tuple[torch.Tensor | None, list[tuple[Any, ...]], dict[int, torch.Tensor]]:
        """runs / d_extras: the linear's forward run, then MakeExtraOutput's (backward order)."""
        lin, fork = runs
        (d_extra,) = d_extras[1]
        node = getattr(lin.y, "grad_fn", None)
        fits = (
            d_extra is not None
            and dy is not None
            and type(node).__name__ == "_LinearFnBackward"
            and type(d_extra) is torch.Tensor
            and d_extra.is_contiguous()
            and d_extra.dtype == dy.dtype
            and d_extra.shape == lin.x.shape
            and type(lin.x) is torch.Tensor
            and lin.x.dtype == dy.dtype  # no cast between the fork and the GEMM
        )
        if fits:
            node.dgrad_into = d_extra
            try:
                dx, _, grads = lin.backward(dy, ())
            finally:
                node.dgrad_into = None
            if dx is None:  # the input needs no gradient: only the residual's flows on
                dx = d_extra
            return dx, [(), ()], grads
        # Cannot accumulate in place (no residual gradient, another dtype, a quantized tensor):
        # the two backward passes one after the other.
        dx, _, grads = lin.backward(dy, ())
        dx, _, g2 = fork.backward(dx, (d_extra,))
        return dx, [(), ()], {**grads, **g2}


def _bias(op: Any) -> Bias | None:
    return op.basic_ops[1] if isinstance(op, ForwardLinearBiasActivation) else None


def fuse_backward_linear_add(plan: list[tuple[Any, list[int]]]) -> list[tuple[Any, list[int]]]:
    """In backward order: BasicLinear (or ForwardLinearBiasActivation: the bias gradient comes from
    the same GEMM node) then MakeExtraOutput(in_place=True) -> BackwardLinearAdd (not for a
    column-parallel linear: its dgrad is reduced across ranks before the add)."""
    out: list[tuple[Any, list[int]]] = []
    i = 0
    while i < len(plan):
        op, units = plan[i]
        nxt = plan[i + 1][0] if i + 1 < len(plan) else None
        # the linear alone, or with its bias in the GEMM epilogue (one _LinearFn node either way)
        lin = op.basic_ops[0] if isinstance(op, ForwardLinearBiasActivation) else op
        if (
            isinstance(lin, BasicLinear)
            and (lin.tensor_parallel_mode != "column" or lin.tensor_parallel_size == 1)
            and isinstance(nxt, MakeExtraOutput)
            and nxt._in_place
        ):
            fused = BackwardLinearAdd(backward_add=nxt, linear=lin, bias=_bias(op))
            out.append((fused, units + plan[i + 1][1]))
            i += 2
        else:
            out.append((op, units))
            i += 1
    return out
