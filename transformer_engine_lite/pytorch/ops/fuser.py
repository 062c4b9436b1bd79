"""OperationFuser: runs a list of fusible ops, replacing adjacent ones by a fused op where one of
our kernels covers them.

Forward fusions (fused/__init__.py lists them; each gives the results of its ops run one by one,
up to the rounding of the output dtype):
  BasicLinear + Bias -> ForwardLinearBiasActivation: the bias is added in the GEMM epilogue (fp32
      accumulator, one rounding to the output dtype; te.Linear's own path, so te.Linear and
      ops.Linear with the same weights give the same bytes).
  BasicLinear [+ Bias] + AddExtraInput(in_place=True) -> ForwardLinearBiasAdd: the GEMM adds its
      product (and the bias) into the extra input's storage (accumulate epilogue).
Backward: no fusions. Each forward op's autograd node runs its own backward, in reverse order
(_backward_ops); TE's backward fused ops exist by name and say they are not implemented.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .fused import OpList, fuse_forward_ops
from .op import BasicOperation, FusedOperation, FusibleOperation

__all__ = ["OperationFuser"]


class OperationFuser:
    """Executes `ops` (fusible ops, basic or fused) in order as one unit of a Sequential.

    forward(input, *extra_inputs) -> output, or (output, *extra_outputs) when an op makes extra
    outputs; the extra inputs are consumed in op order (AddExtraInput takes one each).
    """

    def __init__(self, ops: Iterable[FusibleOperation]) -> None:
        basic: list[BasicOperation] = []
        for op in ops:
            if isinstance(op, FusedOperation):
                basic.extend(op.basic_ops)
            elif isinstance(op, BasicOperation):
                basic.append(op)
            else:
                raise TypeError(
                    f"OperationFuser: ops: expected FusibleOperation, got {type(op).__name__}"
                )
        self._basic_ops = basic
        self._ops: OpList | None = None
        self.num_extra_inputs = sum(op.num_extra_inputs for op in basic)

    @property
    def _forward_ops(self) -> OpList:
        """TE's view: the ops as executed forward, each with the indices of its basic ops (after
        the fusion passes; built on the first forward)."""
        if self._ops is None:
            for op in self._basic_ops:
                op.pre_first_fuser_forward()
            self._ops = fuse_forward_ops([(op, [i]) for i, op in enumerate(self._basic_ops)])
        return self._ops

    @property
    def _backward_ops(self) -> OpList:
        """TE's view: the ops whose backward runs, in the order it runs (the forward ops reversed:
        autograd runs each one's backward; there are no backward-only fusions)."""
        return list(reversed(self._forward_ops))

    @property
    def fused_ops(self) -> list[FusibleOperation]:
        """The ops as executed forward."""
        return [op for op, _ in self._forward_ops]

    def __call__(
        self, input: torch.Tensor, *extra_inputs: torch.Tensor  # noqa: A002 (TE's name)
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if not isinstance(input, torch.Tensor):
            raise TypeError(
                f"Sequential: input: expected a torch.Tensor, got {type(input).__name__}"
            )
        if len(extra_inputs) != self.num_extra_inputs:
            raise ValueError(
                f"Sequential: extra_inputs: the ops take {self.num_extra_inputs} extra input(s), "
                f"got {len(extra_inputs)}"
            )
        x, outs = input, []
        for op in self.fused_ops:
            n = op.num_extra_inputs
            x, extra = op.fuser_forward(x, tuple(extra_inputs[:n]))
            extra_inputs = extra_inputs[n:]
            outs.extend(extra)
        return (x, *outs) if outs else x
