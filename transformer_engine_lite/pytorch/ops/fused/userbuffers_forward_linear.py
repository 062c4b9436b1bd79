"""UserbuffersForwardLinear: TE's fused op for a linear whose tensor-parallel communication runs
through a Userbuffers communicator (BasicLinear(userbuffers_options={"comm_name": name})).

Column-parallel: all-gather the sequence-parallel input, GEMM (+ bias in the epilogue).
Row-parallel, or a non-parallel linear followed by a ReduceScatter op: GEMM, reduce-scatter the
output. TE overlaps the collective with chunks of the GEMM; on the CPU the collective is one
blocking call (module/userbuffers.py), so this op runs the same GEMM and the same collective as
the basic ops it replaces and gives their bytes. What it adds is TE's checks: the communicator
`<comm_name>_fprop` must exist for this step's FP8 mode, the recipe must be one TE's Userbuffers
path supports, and the linear must be sequence-parallel."""

from __future__ import annotations

from typing import Any

import torch

from ...fp8 import FP8GlobalStateManager
from ...module.userbuffers import get_ub
from ..basic.basic_linear import BasicLinear
from ..basic.bias import Bias
from ..basic.reduce_scatter import ReduceScatter
from ..op import FusedOperation
from .forward_linear_bias_activation import OpList, bias_fits

__all__ = ["UserbuffersForwardLinear", "fuse_userbuffers_forward_linear", "ub_distributed",
           "ub_window"]


def check_ub_config(owner: str, mode: str | None, size: int, sequence_parallel: bool) -> None:
    """TE's RuntimeErrors for a linear that cannot use Userbuffers."""
    if size == 1:
        mode = None
    if mode not in ("column", "row"):
        raise RuntimeError(f"{owner}: Invalid configuration for Userbuffers "
                           f"(tensor_parallel_size={size}, tensor_parallel_mode={mode!r})")
    if not sequence_parallel:
        raise RuntimeError(f"{owner}: Invalid configuration for Userbuffers "
                           f"(sequence_parallel={sequence_parallel})")


def set_tp_config(fused: Any, linear: BasicLinear, reduce_scatter: ReduceScatter | None) -> None:
    """The TP configuration a Userbuffers fused op's communication follows (TE's: a trailing
    ReduceScatter makes the pair a row-parallel sequence-parallel linear; else the linear's)."""
    if reduce_scatter is None:
        fused.tensor_parallel_mode = linear.tensor_parallel_mode
        fused.tensor_parallel_group = linear.tensor_parallel_group
        fused.tensor_parallel_size = linear.tensor_parallel_size
        fused.sequence_parallel = linear.sequence_parallel
    else:
        fused.tensor_parallel_mode = "row"
        fused.tensor_parallel_group = reduce_scatter.process_group
        fused.tensor_parallel_size = reduce_scatter.process_group_size
        fused.sequence_parallel = True


class UserbuffersForwardLinear(FusedOperation):
    """BasicLinear [+ Bias] [+ ReduceScatter] with the communication through Userbuffers."""

    def __init__(
        self, *, linear: BasicLinear, bias: Bias | None, reduce_scatter: ReduceScatter | None
    ) -> None:
        ops: list[Any] = [linear]
        self_idx = {"linear": 0, "bias": None, "reduce_scatter": None}
        if bias is not None:
            self_idx["bias"] = len(ops)
            ops.append(bias)
        if reduce_scatter is not None:
            self_idx["reduce_scatter"] = len(ops)
            ops.append(reduce_scatter)
        super().__init__(ops)
        self._op_idxs = self_idx
        set_tp_config(self, linear, reduce_scatter)

    def _op(self, key: str) -> Any:
        i = self._op_idxs[key]
        return None if i is None else self.basic_ops[i]

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        linear, bias, rs = self._op("linear"), self._op("bias"), self._op("reduce_scatter")
        owner = type(self).__name__
        quantized = FP8GlobalStateManager.is_fp8_enabled()
        if quantized:
            recipe = FP8GlobalStateManager.get_fp8_recipe()
            if not (recipe.delayed() or recipe.float8_current_scaling() or recipe.mxfp8()):
                raise RuntimeError(
                    f"Unsupported recipe for Userbuffers ({recipe.__class__.__name__})")
        opts = linear._userbuffers_options
        if opts is None:
            raise RuntimeError(f"{owner}: Linear op is missing dict for Userbuffers options")
        check_ub_config(owner, self.tensor_parallel_mode, self.tensor_parallel_size,
                        self.sequence_parallel)
        comm = get_ub(opts["comm_name"] + "_fprop", quantized)  # KeyError for a missing one
        if comm.tp_size != self.tensor_parallel_size:
            raise ValueError(
                f"{owner}: tensor_parallel_size: the Userbuffers communicators serve TP domains of "
                f"{comm.tp_size} ranks (initialize_ub's tp_size), got {self.tensor_parallel_size}"
            )
        # the replaced ops' own computation: the linear's GEMM with its sequence-parallel
        # collective (column: all-gather before; row: reduce-scatter after), the bias in the
        # epilogue where the unfused path puts it there too
        if bias is not None and bias_fits(linear, bias):
            y = linear.linear_forward(input_, bias=bias.bias)
        else:
            y = linear.linear_forward(input_)
            if bias is not None:
                y = bias.fuser_forward(y, ())[0]
        if rs is not None:
            y = rs.fuser_forward(y, ())[0]
        return y, ()


def ub_distributed() -> bool:
    """TE's precondition of both Userbuffers fusions: a multi-process job."""
    return torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1


def ub_window(ops: list[Any], i: int) -> tuple[Any, Any, Any, int] | None:
    """TE's fusion window at ops[i] (basic ops, forward order): (linear, bias, reduce_scatter,
    number of ops taken), or None where the rule does not fuse."""
    linear = ops[i]
    if not isinstance(linear, BasicLinear) or linear._userbuffers_options is None:
        return None
    j = i + 1
    bias = rs = None
    if linear.tensor_parallel_mode != "row" and j < len(ops) and isinstance(ops[j], Bias):
        bias, j = ops[j], j + 1
    if linear.tensor_parallel_mode is None and j < len(ops) and isinstance(ops[j], ReduceScatter):
        rs, j = ops[j], j + 1
    if rs is None:
        if linear.tensor_parallel_mode is None or linear.tensor_parallel_size == 1:
            return None
        if linear.tensor_parallel_mode == "row" and bias is not None:
            return None
    elif rs.process_group_size == 1:
        return None
    return linear, bias, rs, j - i


def fuse_userbuffers_forward_linear(ops: OpList, recipe: Any = None) -> OpList:
    """BasicLinear with userbuffers_options [+ Bias] [+ ReduceScatter] -> UserbuffersForwardLinear
    under TE's conditions: a multi-process job, no backward_override in the recipe (those modes
    take the standard path), a parallel linear of size > 1 (or a non-parallel one feeding a
    ReduceScatter), no bias before a row-parallel reduction."""
    if recipe is None and FP8GlobalStateManager.is_fp8_enabled():
        recipe = FP8GlobalStateManager.get_fp8_recipe()
    if recipe is not None and getattr(recipe, "backward_override", None) is not None:
        return ops
    if not ub_distributed():
        return ops
    basic = [op for op, _ in ops]
    out: OpList = []
    i = 0
    while i < len(ops):
        win = ub_window(basic, i)
        if win is None:
            out.append(ops[i])
            i += 1
            continue
        linear, bias, rs, n = win
        fused = UserbuffersForwardLinear(linear=linear, bias=bias, reduce_scatter=rs)
        out.append((fused, [k for _, idxs in ops[i:i + n] for k in idxs]))
        i += n
    return out
