"""FP8 attention (TE's recipe flags fp8_dpa / fp8_mha) as an exact emulation on the unfused
backend.

TE quantizes six tensors of the attention to FP8 (its quantizer names, META_* slots of the
DotProductAttention's FP8 meta):

  forward    QKV  q, k, v on entry, one shared scale       slot GEMM1_OUTPUT (2)
             S    the softmax probabilities (after dropout) slot GEMM3_OUTPUT (8)
             O    the output                                slot GEMM2_INPUT  (3)
  backward   dO   the output gradient                       slot GRAD_INPUT2  (3)
             dP   the gradient of the scaled scores         slot GRAD_INPUT3  (5)
             dQKV dq, dk, dv, one shared scale              slot GRAD_OUTPUT1 (0)

Each point here is a round trip through the core's FP8 cast (torch.ops.te_lite.quantize, the same
bytes on every device) and back (dequantize), at TE's points in TE's order (its unfused backend's
FP8 emulation): the GEMMs and the softmax then see exactly the values an FP8 kernel reads. Products
of FP8 values are exact in fp32. The six GEMMs (forward S = Q K^T and O = P V; backward dV = P^T dO,
dP = dO V^T, dQ = dS K, dK = dS^T Q) run through te_lite::ordered_bmm (core
nvte_ordered_batched_gemm): every output an fmaf chain over K in index order from +0, on the CPU
and on CUDA/HIP alike, and autograd's backward of it is the same op. GQA's head expansion sums its
gradient over each group in index order (attention/_attention_gemm.py), not in a reduction
kernel's order. With the casts, the fused softmax ops (the GPU sums each row in the CPU's order,
softmax/softmax.cu) and the elementwise steps (scale, bias add, dropout multiply), which round alike
everywhere, the emulation gives the same bytes on every device (tests/pytorch/
test_fp8_attention_ordered.py, test_gpu_parity.py). A sink softmax (softmax_type off-by-one /
learnable), a learnable bias's and a learnable sink's gradient (sums over broadcast dims) and
context parallelism's per-step LSE and LSE merge (cp_fp8.py) use attention/_canonical_math.py: our
own exp / log as fixed sequences of IEEE fp32 operations and sums in index order
(test_fp8_cp_ordered.py).

Scales follow the recipe:
- DelayedScaling: every point uses the module's delayed-scaling scale of its slot and folds the
  amax it saw into row 0 of the slot's amax history (a running max within the step, as TE's cast
  kernels do); the autocast's update rolls the histories as for a Linear. Forward slots use the
  recipe's forward format (E4M3), backward slots its backward format (E5M2 under HYBRID).
- Float8CurrentScaling: every point takes its scale from the tensor(s) it quantizes (q, k, v
  together), TE's recipe QParams (power-of-two scales, amax epsilon) for forward and backward.
  TE's fused (cuDNN) path keeps delayed scaling for S and dP under this recipe; its unfused
  emulation (this one) scales them currently too. No state is kept.
Activation recompute (checkpoint_core_attention, te.checkpoint, activation_recompute_forward):
the recompute runs in the backward, after the autocast's update changed the delayed-scaling
scales; the forward points then quantize with the scales the forward used (checkpoint.stash_scales,
the mechanism of the modules' GEMMs) and record no amax again (checkpoint.recomputing), so the
recompute is the forward's arithmetic bit for bit. Current scaling recomputes its scales from the
same tensors.
Other recipes raise NotImplementedError (TE's fused FP8 attention takes these two; MXFP8
attention is TE main's newest addition and is not emulated here).

Env vars (TE's): NVTE_FP8_DPA_BWD=0 runs the backward in high precision (no dO / dP / dQKV points);
NVTE_DPA_FP8_RECIPE="F16" runs attention in high precision under an fp8_dpa recipe ("" follows
the recipe; TE's recipe switches "DelayedScaling" / "Float8CurrentScaling" are not implemented).
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint

from ...checkpoint import checkpoint, recomputing, stash_scales
from ...constants import FP8BwdTensorIdx, FP8FwdTensorIdx
from ...fp8 import FP8GlobalStateManager, get_fp8_torch_dtype
from ...quantization import ops

__all__ = [
    "META_DO",
    "META_DP",
    "META_DQKV",
    "META_O",
    "META_QKV",
    "META_S",
    "FP8AttentionPlan",
    "checkpoint_attention",
    "fp8_attention_enabled",
    "fp8_attention_plan",
]

META_QKV = FP8FwdTensorIdx.GEMM1_OUTPUT
META_O = FP8FwdTensorIdx.GEMM2_INPUT
META_S = FP8FwdTensorIdx.GEMM3_OUTPUT
META_DQKV = FP8BwdTensorIdx.GRAD_OUTPUT1
META_DO = FP8BwdTensorIdx.GRAD_INPUT2
META_DP = FP8BwdTensorIdx.GRAD_INPUT3


class _Point:
    """One quantization point: FP8 round trip of one or more tensors with one shared scale."""

    def __init__(self, plan: FP8AttentionPlan, forward: bool, slot: int, local: bool = False
                 ) -> None:
        # local: the amax is this rank's alone (context parallelism's per-step points, cp_fp8.py)
        # The plan holds its points; a point refers back to it weakly, so that no reference cycle
        # keeps the plan -- and through it the module -- alive until Python's cyclic collector
        # runs: a module dropped on one rank of an SPMD program and still alive on another would
        # join that rank's delayed-scaling amax reduction only (fp8.py selects by "ran" flags
        # too). Whoever runs a point (the forward's caller, _FP8Point's ctx) holds the plan.
        self._plan = weakref.ref(plan)
        self.forward, self.slot, self.local = forward, slot, local
        self.dtype = plan.fwd_dtype if forward else plan.bwd_dtype
        self.last_scale: torch.Tensor | None = None  # the scale of the last round trip

    @property
    def plan(self) -> FP8AttentionPlan:
        plan = self._plan()
        if plan is None:  # a caller dropped the plan while still using its point: our bug
            raise RuntimeError("FP8 attention: a quantization point outlived its plan")
        return plan

    @torch.no_grad()
    def round_trip(self, *xs: torch.Tensor, out_dtype: torch.dtype | None = None
                   ) -> tuple[torch.Tensor, ...]:
        te, plan = ops(), self.plan
        xs = tuple(x.contiguous() for x in xs)
        if plan.mode == "current":
            amax = te.compute_amax(xs[0])
            for x in xs[1:]:
                amax = torch.maximum(amax, te.compute_amax(x))
            if not self.local:
                amax = plan.reduce_amax(amax)
            pow2, eps = plan.qparams[self.forward]
            scale, _ = te.compute_scale_from_amax(amax, self.dtype, eps, pow2)
        else:
            scale = plan.scale(self.forward)[self.slot : self.slot + 1]
        self.last_scale = scale.clone()
        outs, amaxes = [], []
        for x in xs:
            data, a, scale_inv = te.quantize(x, scale, self.dtype)
            outs.append(te.dequantize(data, scale_inv, out_dtype or x.dtype))
            amaxes.append(a.reshape(1))
        if plan.mode == "delayed" and plan.records(self.forward):
            amax = torch.stack(amaxes).amax(0)
            plan.record(self.forward, self.slot, amax if self.local else plan.reduce_amax(amax))
        return tuple(outs)


class _FP8Point(torch.autograd.Function):
    """Forward: the round trip of `fwd` (if any) on the tensors; backward: the round trip of `bwd`
    (if any) on their gradients, which otherwise pass through unchanged."""

    @staticmethod
    def forward(ctx: Any, fwd: _Point | None, bwd: _Point | None, out_dtype: Any,
                *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.bwd = bwd
        ctx.plan = bwd.plan if bwd is not None else None  # keeps the point's plan alive for backward
        ctx.dtypes = tuple(x.dtype for x in xs)
        if fwd is None:
            return tuple(x.clone() for x in xs)
        return fwd.round_trip(*xs, out_dtype=out_dtype)

    @staticmethod
    def backward(ctx: Any, *gs: torch.Tensor) -> tuple[Any, ...]:
        # The gradients leave in their tensors' dtypes (the points between the inputs' dtype and
        # the fp32 GEMMs convert in both directions).
        if ctx.bwd is not None:
            gs = ctx.bwd.round_trip(*gs, out_dtype=ctx.dtypes[0])
        gs = tuple(g.to(dt) if g.dtype != dt else g for g, dt in zip(gs, ctx.dtypes))
        return (None, None, None, *gs)


@dataclass
class FP8AttentionPlan:
    """The FP8 points of one DotProductAttention forward (see the module docstring)."""

    module: Any
    recipe: Any
    mode: str  # "delayed" | "current"
    code: int
    fwd_dtype: torch.dtype
    bwd_dtype: torch.dtype
    backward_fp8: bool
    qparams: dict[bool, tuple[bool, float]]
    # Context parallelism: the CP group whose ranks each hold a part of every point's tensor;
    # each point's amax is their max, so scales and the amax history equal one process's.
    # 'a2a+p2p': [a2a_group, p2p_group], the max over one then the other (the CP grid's).
    amax_group: Any = None
    # fp8_output of the forward (context parallelism's ring / all-gather return the merged
    # output unquantized without it, cp_fp8.py)
    fp8_output: bool = False

    def reduce_amax(self, amax: torch.Tensor) -> torch.Tensor:
        if self.amax_group is None:
            return amax
        import torch.distributed as dist  # noqa: PLC0415

        amax = amax.clone()
        groups = self.amax_group if isinstance(self.amax_group, (list, tuple)) else [self.amax_group]
        for group in groups:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
        return amax

    def __post_init__(self) -> None:
        self.qkv = _Point(self, True, META_QKV)
        self.s = _Point(self, True, META_S)
        self.o = _Point(self, True, META_O)
        bwd = self.backward_fp8
        self.dqkv = _Point(self, False, META_DQKV) if bwd else None
        self.do = _Point(self, False, META_DO) if bwd else None
        self.dp = _Point(self, False, META_DP) if bwd else None

    def scale(self, forward: bool) -> torch.Tensor:
        """The module's delayed-scaling scales. Under activation recompute (checkpoint_core_
        attention, te.checkpoint, activation_recompute_forward) the forward ones go through
        checkpoint.stash_scales, as a Linear's do: the recompute, which runs after the
        autocast's update changed them, quantizes with the scales the forward used."""
        scale = self.module.fp8_meta_tensors(forward)[1]
        return stash_scales(self.module, scale) if forward else scale

    @staticmethod
    def records(forward: bool) -> bool:
        """Whether a point records its amax: not the forward points of a recompute (the
        forward recorded them; a backward running inside activation_recompute_forward's
        recompute phase records its own)."""
        return not (forward and recomputing())

    def record(self, forward: bool, slot: int, amax: torch.Tensor) -> None:
        hist, _, ran = self.module.fp8_meta_tensors(forward)
        row = hist[0, slot : slot + 1]
        row.copy_(torch.maximum(row, amax.to(row.device)))
        ran.fill_(self.code)
        if not forward and not torch.compiler.is_compiling():
            FP8GlobalStateManager.queue_backward_update()

    # ---------------------------------------------------------------- the points, in TE's order
    def inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as FP8 values in fp32 (forward: QKV; an FP8 kernel's GEMMs read the bytes and
        accumulate in fp32, so every GEMM and the softmax of the emulation run in fp32); their
        gradients leave through dQKV in the inputs' dtype."""
        return _FP8Point.apply(self.qkv, self.dqkv, torch.float32, q, k, v)

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """The scaled scores (fp32): unchanged forward; their gradient through dP."""
        return _FP8Point.apply(None, self.dp, None, x)[0]

    def probs(self, p: torch.Tensor) -> torch.Tensor:
        """The probabilities (fp32, after dropout) as FP8 values in fp32 (S); the gradient
        passes through."""
        return _FP8Point.apply(self.s, None, torch.float32, p)[0]

    def output(self, o: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The output (fp32) as FP8 values in `dtype` (O); its gradient enters through dO."""
        return _FP8Point.apply(self.o, self.do, dtype, o)[0]


    def fp8_tensor(self, out: torch.Tensor) -> Any:
        """The output (already FP8 values, from `output`) as TE's fp8_output: a Float8Tensor
        holding exactly O's bytes and scale (quantizing FP8 values again with their own scale
        gives their bytes back), differentiable (the gradient passes straight through, into the
        dO point)."""
        from ...tensor import Float8Quantizer

        scale = self.o.last_scale.detach().reshape(1).clone()
        quantizer = Float8Quantizer(scale, torch.zeros_like(scale), self.o.dtype,
                                    rowwise=True, columnwise=False)
        return quantizer(out)


def _recipe_mode(owner: str, recipe: Any) -> str:
    if recipe.delayed():
        return "delayed"
    if recipe.float8_current_scaling():
        return "current"
    raise NotImplementedError(
        f"{owner}: FP8 attention (recipe fp8_dpa / fp8_mha = True) under "
        f"{type(recipe).__name__}: transformer_engine_lite emulates FP8 attention under "
        "DelayedScaling and Float8CurrentScaling only; set fp8_dpa / fp8_mha to False (or "
        "NVTE_DPA_FP8_RECIPE=F16) to run attention in high precision under this recipe"
    )


def fp8_attention_enabled() -> bool:
    """Whether DotProductAttention runs FP8 attention now (MultiheadAttention then takes its
    output as FP8, TE's dpa_fp8_output); an unsupported configuration answers True and is
    reported by DotProductAttention itself."""
    m = FP8GlobalStateManager
    if not m.is_fp8_enabled() or os.environ.get("NVTE_DPA_FP8_RECIPE", "") == "F16":
        return False
    recipe = m.get_fp8_recipe()
    return bool(getattr(recipe, "fp8_dpa", False) or getattr(recipe, "fp8_mha", False))


def fp8_attention_plan(module: Any, owner: str) -> FP8AttentionPlan | None:
    """The FP8 plan of this forward, or None when attention runs in the inputs' precision (no
    autocast, or a recipe without fp8_dpa / fp8_mha, or NVTE_DPA_FP8_RECIPE=F16)."""
    if not fp8_attention_enabled():
        return None
    m = FP8GlobalStateManager
    recipe = m.get_fp8_recipe()
    switch = os.environ.get("NVTE_DPA_FP8_RECIPE", "")
    if switch != "":
        raise NotImplementedError(
            f"{owner}: NVTE_DPA_FP8_RECIPE={switch!r}: TE's switch of the attention's FP8 recipe "
            "is not implemented by transformer_engine_lite (supported: unset / '' to follow the "
            "autocast recipe, 'F16' for high precision)"
        )
    mode = _recipe_mode(owner, recipe)
    bwd = os.environ.get("NVTE_FP8_DPA_BWD", "1")
    if bwd not in ("0", "1"):
        raise ValueError(f"{owner}: NVTE_FP8_DPA_BWD: expected '0' or '1', got {bwd!r}")
    qparams = {True: (False, 0.0), False: (False, 0.0)}
    if mode == "current":
        qparams = {
            True: (bool(recipe.fp8_quant_fwd_inp.power_2_scale),
                   float(recipe.fp8_quant_fwd_inp.amax_epsilon)),
            False: (bool(recipe.fp8_quant_bwd_grad.power_2_scale),
                    float(recipe.fp8_quant_bwd_grad.amax_epsilon)),
        }
    module._note_recipe(recipe)
    return FP8AttentionPlan(
        module=module,
        recipe=recipe,
        mode=mode,
        code=m.get_recipe_code(),
        fwd_dtype=get_fp8_torch_dtype(recipe.fp8_format, True),
        bwd_dtype=get_fp8_torch_dtype(recipe.fp8_format, False),
        backward_fp8=bwd == "1",
        qparams=qparams,
    )


def checkpoint_attention(plan: FP8AttentionPlan | None, fn: Any, *args: Any) -> Any:
    """checkpoint_core_attention's recompute of fn(*args) (non-reentrant: q, k, v may need no
    gradient, only softmax_offset, say). Under FP8 attention te.checkpoint, TE's choice too: the
    recompute quantizes with the forward's delayed-scaling scales and records no amax again
    (FP8AttentionPlan.scale / records). Otherwise torch's: nothing to keep, and traceable by
    torch.compile(fullgraph=True), which te.checkpoint's bookkeeping is not."""
    if plan is None:
        return torch_checkpoint.checkpoint(fn, *args, use_reentrant=False)
    return checkpoint(fn, *args, use_reentrant=False)
