"""ForwardLinearBiasAdd: BasicLinear (+ Bias) + AddExtraInput(in_place=True) as one GEMM that adds
its product and the bias into the extra input's storage (the GEMM's accumulate epilogue)."""

from __future__ import annotations

import torch

from ...tensor import QuantizedTensor
from .._common import compute_dtype
from ..basic.add_extra_input import AddExtraInput
from ..basic.basic_linear import BasicLinear
from ..basic.bias import Bias
from ..op import FusedOperation
from .forward_linear_bias_activation import OpList, bias_fits

__all__ = ["ForwardLinearBiasAdd", "can_accumulate_into", "fuse_forward_linear_bias_add"]


def can_accumulate_into(extra: object, input_: torch.Tensor, linear: BasicLinear) -> bool:
    """Whether the linear's GEMM can add its product into `extra` in place: a plain contiguous
    tensor of the output's shape, device and compute dtype (else the fused ops run unfused)."""
    return (
        isinstance(extra, torch.Tensor)
        and not isinstance(extra, QuantizedTensor)
        and tuple(extra.shape) == (*input_.shape[:-1], linear.local_out_features)
        and extra.is_contiguous()
        and extra.dtype == compute_dtype("ForwardLinearBiasAdd", input_, linear.weight)
        and extra.device == input_.device
    )


class ForwardLinearBiasAdd(FusedOperation):
    """y = extra += x W^T (+ b): the residual add of a projection without an output buffer.

    The extra input is the accumulator when it can be one (a plain contiguous tensor of the
    output's shape and the GEMM's output dtype); otherwise (a quantized or differently typed extra
    input) the product is computed first and added in place as AddExtraInput does."""

    def __init__(self, *, linear: BasicLinear, bias: Bias | None, add: AddExtraInput) -> None:
        ops = (linear, add) if bias is None else (linear, bias, add)
        super().__init__(ops)

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        linear, add = self.basic_ops[0], self.basic_ops[-1]
        bias = self.basic_ops[1].bias if len(self.basic_ops) == 3 else None  # type: ignore[attr-defined]
        (extra,) = extra_inputs
        if not can_accumulate_into(extra, input_, linear):  # type: ignore[arg-type]
            y = linear.linear_forward(input_, bias=bias)  # type: ignore[attr-defined]
            return add.fuser_forward(y, extra_inputs)
        return linear.linear_forward(input_, bias=bias, acc=extra), ()  # type: ignore[attr-defined]


def fuse_forward_linear_bias_add(ops: OpList) -> OpList:
    """BasicLinear [+ Bias] + AddExtraInput(in_place=True) -> ForwardLinearBiasAdd (not for a
    row-parallel linear: its output is reduced after the GEMM)."""
    out: OpList = []
    i = 0
    while i < len(ops):
        op, idxs = ops[i]
        if isinstance(op, BasicLinear) and op.tensor_parallel_mode != "row":
            j, bias = i + 1, None
            if j < len(ops) and bias_fits(op, ops[j][0]):
                bias, j = ops[j][0], j + 1
            nxt = ops[j][0] if j < len(ops) else None
            if isinstance(nxt, AddExtraInput) and nxt._in_place:
                fused = ForwardLinearBiasAdd(linear=op, bias=bias, add=nxt)  # type: ignore[arg-type]
                out.append((fused, [k for _, ks in ops[i : j + 1] for k in ks]))
                i = j + 1
                continue
        out.append((op, idxs))
        i += 1
    return out
