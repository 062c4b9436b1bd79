"""ForwardLinearBias: BasicLinear + Bias as one GEMM with the bias in its epilogue."""

from __future__ import annotations

import torch

from ..basic.basic_linear import BasicLinear
from ..basic.bias import Bias
from ..op import FusedOperation, FusibleOperation

__all__ = ["ForwardLinearBias", "fuse_forward_linear_bias"]


class ForwardLinearBias(FusedOperation):
    """y = x W^T + b in one GEMM (te.Linear's path: same bytes as te.Linear with a bias)."""

    def __init__(self, linear: BasicLinear, bias: Bias) -> None:
        super().__init__((linear, bias))

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        linear, bias = self.basic_ops
        return linear.linear_forward(input_, bias=bias.bias), ()


def _fusible(linear: FusibleOperation, bias: FusibleOperation) -> bool:
    if not (isinstance(linear, BasicLinear) and isinstance(bias, Bias)):
        return False
    # A column-parallel bias must be this rank's slice; a row-parallel one the full bias, added
    # after the reduction. Any other pairing is left to the unfused ops (they raise if wrong).
    return bias.bias.shape[-1] == linear.local_out_features and (
        linear.tensor_parallel_mode != "row" or not bias.tensor_parallel
    )


def fuse_forward_linear_bias(ops: list[FusibleOperation]) -> list[FusibleOperation]:
    out: list[FusibleOperation] = []
    i = 0
    while i < len(ops):
        if i + 1 < len(ops) and _fusible(ops[i], ops[i + 1]):
            out.append(ForwardLinearBias(ops[i], ops[i + 1]))  # type: ignore[arg-type]
            i += 2
        else:
            out.append(ops[i])
            i += 1
    return out
