"""UserbuffersBackwardLinear: TE's fused backward op for a linear whose tensor-parallel
communication runs through Userbuffers (see userbuffers_forward_linear.py).

Row-parallel: all-gather dy, then dgrad / wgrad GEMMs. Column-parallel: dgrad GEMM with the
input's all-gather for the wgrad alongside (TE's bulk overlap) and the dgrad reduce-scattered.
On the CPU these are the collectives the forward ops' own backward already runs, so this op runs
that backward (the graphs the forward recorded) and gives the same bytes; it adds TE's checks
(the communicators `<comm_name>_dgrad` / `_wgrad` must exist, no FP8 reduce-scatter buffer)."""

from __future__ import annotations

from typing import Any

import torch

from ...module.userbuffers import get_ub, using_cublasmp_backend
from ..basic.basic_linear import BasicLinear
from ..basic.bias import Bias
from ..basic.reduce_scatter import ReduceScatter
from ..op import FusedOperation
from .forward_linear_bias_activation import ForwardLinearBiasActivation
from .userbuffers_forward_linear import (
    UserbuffersForwardLinear,
    check_ub_config,
    set_tp_config,
    ub_distributed,
    ub_window,
)

__all__ = ["UserbuffersBackwardLinear", "fuse_userbuffers_backward_linear"]


class UserbuffersBackwardLinear(FusedOperation):
    """The backward of BasicLinear [+ Bias] [+ ReduceScatter] with Userbuffers communication."""

    def __init__(
        self, *, linear: BasicLinear, bias: Bias | None, reduce_scatter: ReduceScatter | None
    ) -> None:
        ops: list[Any] = [linear] + [op for op in (bias, reduce_scatter) if op is not None]
        super().__init__(ops)
        self._op_idxs = {
            "linear": 0,
            "bias": None if bias is None else 1,
            "reduce_scatter": None if reduce_scatter is None else len(ops) - 1,
        }
        set_tp_config(self, linear, reduce_scatter)

    def fuser_forward(self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]):
        raise RuntimeError(
            "UserbuffersBackwardLinear is a backward-pass op; the fuser runs its forward ops")

    def _check_communicators(self) -> None:
        linear = self.basic_ops[0]
        owner = type(self).__name__
        check_ub_config(owner, self.tensor_parallel_mode, self.tensor_parallel_size,
                        self.sequence_parallel)
        name = linear._userbuffers_options["comm_name"]
        quantized = bool(getattr(linear, "_last_forward_quantized", False))
        if self.tensor_parallel_mode == "row":
            get_ub(name + "_dgrad", quantized)  # all-gather of dy
            return
        bulk = linear.weight.requires_grad and not using_cublasmp_backend()
        if bulk:  # dgrad with the input's all-gather alongside, dx reduce-scattered by wgrad's
            get_ub(name + "_dgrad", quantized)
            rs = get_ub(name + "_wgrad", quantized)
        else:
            rs = get_ub(name + "_dgrad", quantized)
        if rs.is_fp8_ubuf() and not using_cublasmp_backend():
            raise RuntimeError("Userbuffers reduce-scatter is not supported with FP8 buffers")

    def fuser_backward(
        self, runs: list[Any], dy: torch.Tensor | None, d_extras: list[tuple[Any, ...]]
    ) -> tuple[torch.Tensor | None, list[tuple[Any, ...]], dict[int, torch.Tensor]]:
        """runs / d_extras: the forward ops' runs this op covers, in backward order."""
        self._check_communicators()
        grads: dict[int, torch.Tensor] = {}
        d_ins: list[tuple[Any, ...]] = []
        for run, d_extra in zip(runs, d_extras):
            dy, d_in, g = run.backward(dy, d_extra)
            d_ins.append(d_in)
            grads.update(g)
        return dy, d_ins, grads


def _basic(op: Any) -> list[Any]:
    return list(op.basic_ops) if isinstance(op, FusedOperation) else [op]


def fuse_userbuffers_backward_linear(
    plan: list[tuple[Any, list[int]]]
) -> list[tuple[Any, list[int]]]:
    """Backward plan (backward order, each entry a forward op with its unit indices): TE's
    window rule over the basic ops (as for the forward, without the backward_override condition,
    as in TE) -> UserbuffersBackwardLinear covering the forward units of the window. A window
    must cover whole forward units (a forward fusion is not split)."""
    if not ub_distributed():
        return plan
    fwd = list(reversed(plan))  # forward order
    out: list[tuple[Any, list[int]]] = []
    i = 0
    while i < len(fwd):
        op, units = fwd[i]
        if isinstance(op, UserbuffersForwardLinear):
            b = op.basic_ops
            fused = UserbuffersBackwardLinear(linear=b[0], bias=op._op("bias"),
                                              reduce_scatter=op._op("reduce_scatter"))
            out.append((fused, units))
            i += 1
            continue
        if not isinstance(op, (BasicLinear, ForwardLinearBiasActivation)):
            out.append((op, units))
            i += 1
            continue
        # the basic ops of this and the following units, and where each unit starts
        basic, starts = [], []
        for k in range(i, len(fwd)):
            starts.append(len(basic))
            basic.extend(_basic(fwd[k][0]))
        win = ub_window(basic, 0)
        if win is None or win[3] not in starts[1:] + [len(basic)]:
            out.append((op, units))
            i += 1
            continue
        linear, bias, rs, n = win
        n_units = (starts + [len(basic)]).index(n)
        covered = [u for _, us in fwd[i:i + n_units] for u in us]
        fused = UserbuffersBackwardLinear(linear=linear, bias=bias, reduce_scatter=rs)
        out.append((fused, covered))
        i += n_units
    # back to backward order; a fused op's units run last-forward-first
    return [(op, sorted(units, reverse=True)) for op, units in reversed(out)]
