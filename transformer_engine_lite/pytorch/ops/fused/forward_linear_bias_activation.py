"""ForwardLinearBiasActivation: BasicLinear + Bias as one GEMM with the bias in its epilogue.

TE's name; as in TE 2.8 the activation slot is always empty (no fusion pass fills it)."""

from __future__ import annotations

import torch

from ..basic.basic_linear import BasicLinear
from ..basic.bias import Bias
from ..op import FusedOperation, FusibleOperation

__all__ = ["ForwardLinearBiasActivation", "fuse_forward_linear_bias_activation", "OpList"]

OpList = list[tuple[FusibleOperation, list[int]]]  # ops with the indices of their basic ops


class ForwardLinearBiasActivation(FusedOperation):
    """y = x W^T + b in one GEMM (te.Linear's path: same bytes as te.Linear with a bias)."""

    def __init__(
        self, *, linear: BasicLinear, bias: Bias | None, activation: None = None
    ) -> None:
        if activation is not None:
            raise NotImplementedError(
                "ForwardLinearBiasActivation: activation: a fused activation epilogue is not "
                f"implemented (TE 2.8 has none either), got {type(activation).__name__}"
            )
        super().__init__((linear,) if bias is None else (linear, bias))

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        linear = self.basic_ops[0]
        bias = self.basic_ops[1].bias if len(self.basic_ops) > 1 else None
        return linear.linear_forward(input_, bias=bias), ()  # type: ignore[attr-defined]


def bias_fits(linear: BasicLinear, bias: FusibleOperation) -> bool:
    """Whether `bias` can go into `linear`'s GEMM epilogue: this rank's slice of the output."""
    return (
        isinstance(bias, Bias)
        and linear.tensor_parallel_mode != "row"  # a row-parallel bias follows the reduction
        and bias.bias.shape[-1] == linear.local_out_features
    )


def fuse_forward_linear_bias_activation(ops: OpList) -> OpList:
    """BasicLinear followed by Bias -> ForwardLinearBiasActivation (both fp32 and 16-bit weights:
    our GEMM's bias epilogue takes every high-precision dtype, unlike cuBLAS's)."""
    out: OpList = []
    i = 0
    while i < len(ops):
        op, idxs = ops[i]
        if isinstance(op, BasicLinear) and i + 1 < len(ops) and bias_fits(op, ops[i + 1][0]):
            fused = ForwardLinearBiasActivation(linear=op, bias=ops[i + 1][0])  # type: ignore[arg-type]
            out.append((fused, idxs + ops[i + 1][1]))
            i += 2
        else:
            out.append((op, idxs))
            i += 1
    return out
