"""The linear + ConstantScale fusions: the scale becomes the GEMMs' alpha.

ForwardLinearScaleAdd: BasicLinear + ConstantScale + AddExtraInput(in_place=True): the GEMM adds
    scale * x W^T into the extra input's storage (alpha and the accumulate epilogue), and the
    backward GEMMs apply the same alpha.
BackwardLinearScale: BasicLinear + ConstantScale in the backward pass: the linear's dgrad and
    wgrad GEMMs take the scale as alpha instead of a separate pass scaling the gradient."""

from __future__ import annotations

from typing import Any

import torch

from ..basic.add_extra_input import AddExtraInput
from ..basic.basic_linear import BasicLinear
from ..basic.constant_scale import ConstantScale
from ..op import FusedOperation
from .forward_linear_bias_activation import OpList
from .forward_linear_bias_add import can_accumulate_into

__all__ = [
    "BackwardLinearScale",
    "ForwardLinearScaleAdd",
    "fuse_backward_linear_scale",
    "fuse_forward_linear_scale_add",
]


class ForwardLinearScaleAdd(FusedOperation):
    """y = extra += scale * x W^T in one GEMM (TE's fused op of the same name)."""

    def __init__(self, *, linear: BasicLinear, scale: ConstantScale, add: AddExtraInput) -> None:
        super().__init__((linear, scale, add))

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        linear, scale, add = self.basic_ops
        (extra,) = extra_inputs
        alpha = scale.scale  # type: ignore[attr-defined]
        if not can_accumulate_into(extra, input_, linear):  # type: ignore[arg-type]
            # a residual the GEMM cannot accumulate into: the ops one by one
            y = scale.fuser_forward(linear.linear_forward(input_), ())[0]  # type: ignore[attr-defined]
            return add.fuser_forward(y, extra_inputs)
        return linear.linear_forward(input_, acc=extra, alpha=alpha), ()  # type: ignore[attr-defined]


class BackwardLinearScale(FusedOperation):
    """dx = scale * dy W and dW = scale * dy^T x by the GEMMs' alpha (TE's fused op)."""

    def __init__(self, *, scale: ConstantScale, linear: BasicLinear) -> None:
        super().__init__((linear, scale))

    def fuser_forward(self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]):
        raise RuntimeError("BackwardLinearScale is a backward-pass op; the fuser runs its forward ops")

    def fuser_backward(
        self, runs: list[Any], dy: torch.Tensor | None, d_extras: list[tuple[Any, ...]]
    ) -> tuple[torch.Tensor | None, list[tuple[Any, ...]], dict[int, torch.Tensor]]:
        """runs: ConstantScale's forward run, then the linear's (backward order)."""
        scale_run, lin = runs
        node = getattr(lin.y, "grad_fn", None)
        if dy is None or type(node).__name__ != "_LinearFnBackward":
            dy, _, _ = scale_run.backward(dy, ())
            dx, _, grads = lin.backward(dy, ())
            return dx, [(), ()], grads
        node.grad_alpha = self.basic_ops[1].scale  # type: ignore[attr-defined]
        try:
            dx, _, grads = lin.backward(dy, ())
        finally:
            node.grad_alpha = 1.0
        return dx, [(), ()], grads


def fuse_forward_linear_scale_add(ops: OpList) -> OpList:
    """BasicLinear + ConstantScale + AddExtraInput(in_place=True) -> ForwardLinearScaleAdd (not
    for a row-parallel linear: its output is reduced after the GEMM)."""
    out: OpList = []
    i = 0
    while i < len(ops):
        op, idxs = ops[i]
        window = [o for o, _ in ops[i : i + 3]]
        if (
            len(window) == 3
            and isinstance(op, BasicLinear)
            and op.tensor_parallel_mode != "row"
            and isinstance(window[1], ConstantScale)
            and isinstance(window[2], AddExtraInput)
            and window[2]._in_place
        ):
            fused = ForwardLinearScaleAdd(linear=op, scale=window[1], add=window[2])
            out.append((fused, [k for _, ks in ops[i : i + 3] for k in ks]))
            i += 3
        else:
            out.append((op, idxs))
            i += 1
    return out


def fuse_backward_linear_scale(plan: list[tuple[Any, list[int]]]) -> list[tuple[Any, list[int]]]:
    """In backward order: ConstantScale then BasicLinear -> BackwardLinearScale."""
    out: list[tuple[Any, list[int]]] = []
    i = 0
    while i < len(plan):
        op, units = plan[i]
        nxt = plan[i + 1][0] if i + 1 < len(plan) else None
        if isinstance(op, ConstantScale) and isinstance(nxt, BasicLinear):
            out.append((BackwardLinearScale(scale=op, linear=nxt), units + plan[i + 1][1]))
            i += 2
        else:
            out.append((op, units))
            i += 1
    return out
