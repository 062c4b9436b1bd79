"""OperationFuser: runs a list of fusible ops, replacing adjacent ones by a fused op where one of
our kernels covers them.

Forward fusions (fused/__init__.py lists them; each gives the results of its ops run one by one,
up to the rounding of the output dtype):
  BasicLinear(userbuffers_options=) [+ Bias] [+ ReduceScatter] -> UserbuffersForwardLinear (TE's
      rule: a multi-process job, no backward_override; the same GEMM and collective, so the same
      bytes) and, in the backward, UserbuffersBackwardLinear over the same ops.
  BasicLinear + Bias -> ForwardLinearBiasActivation: the bias is added in the GEMM epilogue (fp32
      accumulator, one rounding to the output dtype; te.Linear's own path, so te.Linear and
      ops.Linear with the same weights give the same bytes).
  BasicLinear [+ Bias] + AddExtraInput(in_place=True) -> ForwardLinearBiasAdd: the GEMM adds its
      product (and the bias) into the extra input's storage (accumulate epilogue).
Backward fusions (over whole forward ops; a basic op already inside a forward fusion is not
split again):
  MakeExtraOutput(in_place=True) + BasicLinear -> BackwardLinearAdd: the dgrad GEMM accumulates
      into the extra output's gradient (the residual gradient), no separate add.
  MakeExtraOutput + RMSNorm -> BackwardAddRMSNorm: the norm's backward kernel adds the extra
      output's gradient into dx (nvte_rmsnorm_bwd_add).
  Linear with Bias + ReLU / GELU under a recipe without backward_override ->
      BackwardActivationBias (TE main's; composed of the same kernels, fused/backward_fusions.py).
      The plan is rebuilt when the forward's recipe kind or backward_override changes.

How it runs (with autograd recording): one autograd.Function for the whole list. Its forward runs
each forward op on detached inputs with grad enabled, so each op builds its own small autograd
graph (the ops compute with autograd-aware calls: torch.ops.te_lite.* and the modules'
Functions); its backward walks the backward ops in reverse order, running each op's graph with
torch.autograd.grad, or a backward fused op that reconfigures the graph's node first (the GEMM's
or the norm's: fused/backward_linear_add.py, backward_add_rmsnorm.py). Parameter gradients are returned through the Function, so
autograd accumulates them (hooks, main_grad) as for any module. Without autograd recording the
ops simply run in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .basic.quantize import active_recipe
from .fused import OpList, fuse_backward_ops, fuse_forward_ops
from .op import BasicOperation, FusedOperation, FusibleOperation

__all__ = ["OperationFuser", "ForwardRun"]


@dataclass
class ForwardRun:
    """One forward op's recorded run: its detached inputs (leaves of its own graph), outputs,
    and the parameters of its basic ops."""

    x: Any
    extras_in: tuple[torch.Tensor, ...]
    y: Any
    extras_out: tuple[torch.Tensor, ...]
    params: list[torch.Tensor] = field(default_factory=list)

    def backward(
        self, dy: torch.Tensor | None, d_extras: tuple[torch.Tensor | None, ...]
    ) -> tuple[torch.Tensor | None, tuple[torch.Tensor | None, ...], dict[int, torch.Tensor]]:
        """(dx, d extra inputs, {id(param): grad}) through this op's graph."""
        outs, gouts = [], []
        for t, g in zip((self.y, *self.extras_out), (dy, *d_extras)):
            if g is not None and isinstance(t, torch.Tensor) and t.requires_grad:
                outs.append(t)
                gouts.append(g)
        inputs = [t for t in (self.x, *self.extras_in, *self.params) if t.requires_grad]
        if not outs or not inputs:
            return None, (None,) * len(self.extras_in), {}
        grads = dict(zip(map(id, inputs), torch.autograd.grad(outs, inputs, gouts, allow_unused=True)))
        dx = grads.get(id(self.x))
        d_in = tuple(grads.get(id(t)) for t in self.extras_in)
        return dx, d_in, {id(p): grads[id(p)] for p in self.params if grads.get(id(p)) is not None}


def _leaf(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    return t.detach().requires_grad_(t.requires_grad)


def _params(op: FusibleOperation) -> list[torch.Tensor]:
    basic = op.basic_ops if isinstance(op, FusedOperation) else (op,)
    seen: dict[int, torch.Tensor] = {}
    for b in basic:
        for p in b.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


class _FuserFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, fuser: OperationFuser, x: torch.Tensor, n_extra: int, *tensors: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        extra_inputs, params = tensors[:n_extra], tensors[n_extra:]
        runs: list[ForwardRun] = []
        outs: list[torch.Tensor] = []
        inputs = {id(t): t for t in (x, *extra_inputs)}
        with torch.enable_grad():
            for op, _ in fuser._forward_ops:
                n = op.num_extra_inputs
                run = ForwardRun(_leaf(x), tuple(_leaf(e) for e in extra_inputs[:n]), None, ())
                extra_inputs = extra_inputs[n:]
                run.y, run.extras_out = op.fuser_forward(run.x, run.extras_in)
                run.params = _params(op)
                runs.append(run)
                x = run.y
                outs.extend(run.extras_out)
        ctx.fuser, ctx.runs, ctx.n_extra = fuser, runs, n_extra
        # the backward plan depends on the forward's recipe (backward_override, TE's rule)
        ctx.plan = fuser._backward_plan_for(active_recipe())
        ctx.params = params
        ctx.set_materialize_grads(False)
        # An output that aliases an input (in-place residual add) is returned as that input, so
        # autograd records the alias rather than a new tensor.
        results = []
        for t in (x, *outs):
            src = next((i for i in inputs.values() if _same_storage(i, t)), None)
            results.append(src if src is not None else t.detach())
        return tuple(results)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor | None, *d_outs: torch.Tensor | None):  # type: ignore[override]
        runs: list[ForwardRun] = ctx.runs
        # the extra outputs' gradients, per forward op
        d_extra: list[tuple[torch.Tensor | None, ...]] = []
        it = iter(d_outs)
        for run in runs:
            d_extra.append(tuple(next(it) for _ in run.extras_out))
        d_extra_in: list[tuple[torch.Tensor | None, ...]] = [()] * len(runs)
        pgrads: dict[int, torch.Tensor] = {}
        for op, units in ctx.plan:
            if len(units) == 1 and not hasattr(op, "fuser_backward"):
                u = units[0]
                dy, d_extra_in[u], g = runs[u].backward(dy, d_extra[u])
            else:
                dy, d_ins, g = op.fuser_backward([runs[u] for u in units], dy,
                                                 [d_extra[u] for u in units])
                for u, d in zip(units, d_ins):
                    d_extra_in[u] = d
            for k, v in g.items():
                pgrads[k] = v if k not in pgrads else pgrads[k] + v
        ctx.runs = None  # free the graphs
        d_inputs = [d for ds in d_extra_in for d in ds]
        return (None, dy, None, *d_inputs, *(pgrads.get(id(p)) for p in ctx.params))


def _same_storage(a: torch.Tensor, b: Any) -> bool:
    try:
        return (
            isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and type(a) is torch.Tensor
            and type(b) is torch.Tensor
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.storage_offset() == b.storage_offset()
            and a.numel() > 0
        )
    except (RuntimeError, NotImplementedError):
        return False


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
        self._bwd: list[tuple[FusibleOperation, list[int]]] | None = None
        self._bwd_key: Any = None
        self._fwd_key: Any = None
        self.num_extra_inputs = sum(op.num_extra_inputs for op in basic)

    @staticmethod
    def _recipe_key(recipe: Any) -> Any:
        return None if recipe is None else (type(recipe), getattr(recipe, "backward_override", None))

    @property
    def _num_basic_ops(self) -> int:
        """TE's count of the basic ops this fuser runs."""
        return len(self._basic_ops)

    def maybe_fuse_ops(
        self, is_grad_enabled: bool, recipe: Any, input_: torch.Tensor, extra_inputs: Any
    ) -> None:
        """TE's entry point: (re)build the forward and backward fusion plans for a forward under
        `recipe` when its kind or backward_override differs from the last plan's (the
        Userbuffers fusion is off under a backward_override, TE's rule). is_grad_enabled /
        input_ / extra_inputs: TE's signature (no fusion here depends on them)."""
        del is_grad_enabled, input_, extra_inputs
        key = self._recipe_key(recipe)
        if self._ops is not None and key == self._fwd_key:
            return
        if self._ops is None:
            for op in self._basic_ops:
                op.pre_first_fuser_forward()
        self._ops = fuse_forward_ops([(op, [i]) for i, op in enumerate(self._basic_ops)], recipe)
        self._fwd_key = key
        self._bwd = None  # indexes the old forward plan
        self._backward_plan_for(recipe)

    @property
    def _forward_ops(self) -> OpList:
        """TE's view: the ops as executed forward, each with the indices of its basic ops (after
        the fusion passes; built on the first forward, rebuilt by maybe_fuse_ops)."""
        if self._ops is None:
            self.maybe_fuse_ops(torch.is_grad_enabled(), active_recipe(), None, None)
        assert self._ops is not None
        return self._ops

    @property
    def _backward_plan(self) -> list[tuple[FusibleOperation, list[int]]]:
        """The backward ops in the order they run, each with the forward ops (indices into
        _forward_ops) whose gradients it computes: the plan of the last forward (unquantized
        before any)."""
        if self._bwd is None:
            return self._backward_plan_for(None)
        return self._bwd

    def _backward_plan_for(self, recipe: Any) -> list[tuple[FusibleOperation, list[int]]]:
        """The plan for a forward under `recipe`, rebuilt when the recipe's kind or its
        backward_override changes (TE rebuilds its backward fusions the same way)."""
        key = self._recipe_key(recipe)
        if self._bwd is None or key != self._bwd_key:
            self._bwd = fuse_backward_ops(self._forward_ops, recipe)
            self._bwd_key = key
        return self._bwd

    @property
    def _backward_ops(self) -> OpList:
        """TE's view: the backward ops in the order they run, with their basic ops' indices."""
        fwd = self._forward_ops
        return [(op, [i for u in units for i in fwd[u][1]]) for op, units in self._backward_plan]

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
        self.maybe_fuse_ops(torch.is_grad_enabled(), active_recipe(), input, extra_inputs)
        params = list({id(p): p for op, _ in self._forward_ops for p in _params(op)}.values())
        record = torch.is_grad_enabled() and any(
            t.requires_grad for t in (input, *extra_inputs, *params)
        )
        if record:
            out = _FuserFunction.apply(self, input, len(extra_inputs), *extra_inputs, *params)
            return out if len(out) > 1 else out[0]
        x, outs = input, []
        for op, _ in self._forward_ops:
            n = op.num_extra_inputs
            x, extra = op.fuser_forward(x, tuple(extra_inputs[:n]))
            extra_inputs = extra_inputs[n:]
            outs.extend(extra)
        return (x, *outs) if outs else x
