"""BackwardAddRMSNorm: MakeExtraOutput + RMSNorm in the backward pass. RMSNorm's backward kernel
adds the extra output's gradient (the residual stream's gradient) into dx itself
(nvte_rmsnorm_bwd_add) instead of a separate add afterwards."""

from __future__ import annotations

from typing import Any

import torch

from ..basic.make_extra_output import MakeExtraOutput
from ..basic.rmsnorm import RMSNorm
from ..op import FusedOperation

__all__ = ["BackwardAddRMSNorm", "fuse_backward_add_rmsnorm"]


def _rmsnorm_node(y: Any) -> Any:
    """The te_lite::rmsnorm_fwd autograd node behind RMSNorm's output (under its reshape)."""
    node = getattr(y, "grad_fn", None)
    while node is not None and type(node).__name__.startswith("ViewBackward"):
        node = node.next_functions[0][0]
    return node if node is not None and "rmsnorm_fwd" in type(node).__name__ else None


class BackwardAddRMSNorm(FusedOperation):
    """dx = rmsnorm_bwd(dy) + d_extra in one kernel pass (TE's fused op of the same name)."""

    def __init__(self, *, add: MakeExtraOutput, rmsnorm: RMSNorm) -> None:
        super().__init__((add, rmsnorm))

    def fuser_forward(self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]):
        raise RuntimeError("BackwardAddRMSNorm is a backward-pass op; the fuser runs its forward ops")

    def fuser_backward(
        self, runs: list[Any], dy: torch.Tensor | None, d_extras: list[tuple[Any, ...]]
    ) -> tuple[torch.Tensor | None, list[tuple[Any, ...]], dict[int, torch.Tensor]]:
        """runs / d_extras: RMSNorm's forward run, then MakeExtraOutput's (backward order)."""
        norm, fork = runs
        (d_extra,) = d_extras[1]
        node = _rmsnorm_node(norm.y)
        x_node_shape = None if node is None else node.saved_tensors[0].shape
        fits = (
            d_extra is not None
            and dy is not None
            and node is not None
            and type(d_extra) is torch.Tensor
            and d_extra.numel() == norm.x.numel()
            and type(norm.x) is torch.Tensor
            and norm.x.dtype == node.saved_tensors[0].dtype  # no cast before the kernel
        )
        if fits:
            node.grad_add = d_extra.reshape(x_node_shape)
            try:
                dx, _, grads = norm.backward(dy, ())
            finally:
                node.grad_add = None
            if dx is None:
                dx = d_extra
            return dx, [(), ()], grads
        dx, _, grads = norm.backward(dy, ())
        dx, _, g2 = fork.backward(dx, (d_extra,))
        return dx, [(), ()], {**grads, **g2}


def fuse_backward_add_rmsnorm(plan: list[tuple[Any, list[int]]]) -> list[tuple[Any, list[int]]]:
    """In backward order: RMSNorm then MakeExtraOutput (not in place: TE's condition; an in-place
    fork accumulates into the extra gradient's buffer instead) -> BackwardAddRMSNorm."""
    out: list[tuple[Any, list[int]]] = []
    i = 0
    while i < len(plan):
        op, units = plan[i]
        nxt = plan[i + 1][0] if i + 1 < len(plan) else None
        if isinstance(op, RMSNorm) and isinstance(nxt, MakeExtraOutput) and not nxt._in_place:
            out.append((BackwardAddRMSNorm(add=nxt, rmsnorm=op), units + plan[i + 1][1]))
            i += 2
        else:
            out.append((op, units))
            i += 1
    return out
