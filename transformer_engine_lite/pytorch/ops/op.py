"""TE's fusible-operation base classes: FusibleOperation, BasicOperation, FusedOperation.

Each op computes with autograd-aware calls (torch.ops.te_lite.* with registered autograd, or the
modules' autograd Functions), so the op fuser needs no hand-written backward of its own: it runs
`fuser_forward` of each (basic or fused) op in order and autograd chains the backward. A user's
own BasicOperation written against TE's interface (`op_forward(ctx, input_, ...)` +
`op_backward(ctx, grad_output)`) runs inside one autograd.Function built from those two methods.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["BasicOperation", "FusedOperation", "FusibleOperation", "OperationContext"]


class OperationContext:
    """State an op keeps from its forward for its backward (TE's OperationContext)."""

    def __init__(self) -> None:
        self.to_save: tuple[torch.Tensor | None, ...] | None = None
        self.saved_tensors: tuple[torch.Tensor | None, ...] = ()
        self.requires_grad: bool = True

    def save_for_backward(self, *tensors: torch.Tensor | None) -> None:
        self.to_save = tensors


class FusibleOperation(torch.nn.Module):
    """A tensor operation the op fuser may combine with its neighbours.

    num_extra_inputs / num_extra_outputs: how many tensors beyond the main one it consumes from
    Sequential.forward(input, *extra_inputs) or adds to its outputs (AddExtraInput,
    MakeExtraOutput).
    """

    num_extra_inputs: int = 0
    num_extra_outputs: int = 0

    def __init__(self) -> None:
        super().__init__()

    @property
    def is_fused_op(self) -> bool:
        raise NotImplementedError

    def pre_first_fuser_forward(self) -> None:
        """Hook run once before the first forward through an op fuser."""

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """(output, extra outputs) from (input, extra inputs), differentiable by autograd."""
        raise NotImplementedError

    def forward(
        self, input: torch.Tensor, *extra_inputs: torch.Tensor  # noqa: A002 (TE's name)
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        from .fuser import OperationFuser  # fuser imports this module

        return OperationFuser([self])(input, *extra_inputs)


class _UserOpFunction(torch.autograd.Function):
    """Autograd for a BasicOperation that implements TE's op_forward / op_backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, op: BasicOperation, x: torch.Tensor, *params: torch.Tensor
    ) -> torch.Tensor:
        octx = OperationContext()
        octx.requires_grad = any(ctx.needs_input_grad[1:])
        y = op.op_forward(octx, x, None, None)
        ctx.op, ctx.octx, ctx.num_params = op, octx, len(params)
        if octx.to_save is not None:
            ctx.save_for_backward(*octx.to_save)
        return y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor):  # type: ignore[override]
        octx = ctx.octx
        if octx.to_save is not None:
            octx.saved_tensors = ctx.saved_tensors
        grad_input, grad_params = ctx.op.op_backward(octx, grad_output)
        grads = list(grad_params or ())
        grads += [None] * (ctx.num_params - len(grads))
        return (None, grad_input, *grads)


class BasicOperation(FusibleOperation):
    """A single tensor operation. The library's ops implement fuser_forward with autograd-aware
    calls; an op written for TE implements op_forward / op_backward instead (TE's signatures,
    without quantizers between ops: both quantizer arguments are None)."""

    @property
    def is_fused_op(self) -> bool:
        return False

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
    ) -> torch.Tensor:
        raise NotImplementedError(
            f"{type(self).__name__} implements neither op_forward nor fuser_forward"
        )

    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor, Iterable[torch.Tensor | None]]:
        raise NotImplementedError(f"{type(self).__name__}: op_backward is not implemented")

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        if self.num_extra_inputs or self.num_extra_outputs:
            raise NotImplementedError(
                f"{type(self).__name__}: extra inputs/outputs need fuser_forward overridden"
            )
        params = tuple(self.parameters(recurse=False))
        return _UserOpFunction.apply(self, input_, *params), ()


class FusedOperation(FusibleOperation):
    """Several basic ops computed together (the fuser's fusions, and ops.Linear). Its basic ops are
    held in a tuple, not as submodules: their parameters belong to whoever registered them."""

    def __init__(self, basic_ops: Iterable[BasicOperation]) -> None:
        super().__init__()
        ops = tuple(basic_ops)
        if not ops or not all(isinstance(op, BasicOperation) for op in ops):
            raise TypeError(
                "FusedOperation: basic_ops: expected a non-empty list of BasicOperation"
            )
        self.basic_ops: tuple[BasicOperation, ...] = ops

    @property
    def is_fused_op(self) -> bool:
        return True

    @property
    def num_extra_inputs(self) -> int:  # type: ignore[override]
        return sum(op.num_extra_inputs for op in self.basic_ops)

    @property
    def num_extra_outputs(self) -> int:  # type: ignore[override]
        return sum(op.num_extra_outputs for op in self.basic_ops)

    def pre_first_fuser_forward(self) -> None:
        for op in self.basic_ops:
            op.pre_first_fuser_forward()

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Unfused reference: the basic ops one after another."""
        x, outs = input_, []
        for op in self.basic_ops:
            n = op.num_extra_inputs
            x, extra = op.fuser_forward(x, extra_inputs[:n])
            extra_inputs = extra_inputs[n:]
            outs.extend(extra)
        return x, tuple(outs)
