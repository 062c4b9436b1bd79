"""FP8 attention (fp8_dpa / fp8_mha, DelayedScaling or Float8CurrentScaling) with context
parallelism 'p2p', 'all_gather' and 'a2a+p2p', bshd / sbhd (context_parallel.py's FP8 part; 'a2a'
runs one process's emulation per rank there). The FP8 points are fp8_attention.py's, placed where
TE's context_parallel.py quantizes:

- QKV: the rank's q, k, v once, before any communication, with one shared scale whose amax is
  the CP group's max (so the bytes are one process's). The ring and the all-gather then carry
  these FP8 values (TE sends the uint8 bytes; here their fp32 values: the same numbers).
  TE's current-scaling quantizers are not amax-reduced: each rank scales by its own q, k, v and
  reads a received chunk with its own scale_inv, correct only where the ranks' amaxes agree (TE's
  test clamps its inputs to [-1, 1]); the group amax makes that always so.
- Each attention call (a ring step, or one query chunk of the all-gather) quantizes its own
  softmax probabilities (S) -- for a ring step the step-local ones, exp(x - lse_step), as TE's
  per-step FP8 kernel does -- and, in the backward, its scaled-score gradient (dP). These
  per-step points take the rank's own amax (TE: "per_step tensors are not reduced").
- The step's output: under DelayedScaling quantized with O's scale (TE's per-step kernel writes
  FP8 O), under current scaling rounded to the input dtype (TE's kernel writes F16 O there); the
  steps are combined through their LSEs in fp32 (cp_comm.merge's formula) and rounded to the
  input dtype: the returned output (TE's out_f16). With fp8_output it is quantized by O once more
  (group amax) and returned as FP8 values (a Float8Tensor); without it, under DelayedScaling, O's
  amax is still recorded (TE quantizes out_f16 for its FP8 backward).
- Every GEMM runs through te_lite::ordered_bmm (ordered_matmul; GQA by expand_heads), the step's
  LSE, probabilities and the LSE merge through attention/_canonical_math.py (our own exp / log as
  IEEE fp32 op sequences, sums in index order): the same bytes on the CPU and on CUDA/HIP.
- Backward: dO quantized once on the output gradient (group amax), dQKV once on the rank's
  accumulated dq, dk, dv (group amax). TE's ring quantizes each step's dq / dk / dv with dQKV
  before its fp32 accumulation and recomputes each step with the global LSE and the final O;
  here the gradient flows back through the steps and the merge by autograd (the same
  mathematics; the gradients differ from TE's in rounding, not in the points of dO and dP).

Under DelayedScaling the per-step points fold their amax into the rank's history (running max)
and each history row is reduced (MAX) over the CP group at the end of the forward and of the
backward, so every rank holds the same history (TE leaves that to the autocast's
amax_reduction_group). The ring runs step by step without overlap (eager gloo on the CPU).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .. import _canonical_math as canonical
from .._attention_gemm import expand_heads, ordered_matmul
from . import cp_comm as comm
from .fp8_attention import FP8AttentionPlan, _FP8Point, _Point

__all__ = ["fp8_cp_attention"]


def _bhsd(x: torch.Tensor, fmt: str) -> torch.Tensor:
    return x.permute(0, 2, 1, 3) if fmt == "bshd" else x.permute(1, 2, 0, 3)


def _from_bhsd(x: torch.Tensor, fmt: str) -> torch.Tensor:
    return x.permute(0, 2, 1, 3) if fmt == "bshd" else x.permute(2, 0, 1, 3)


def _reduce_row(plan: FP8AttentionPlan, forward: bool) -> None:
    """All ranks' histories: row 0 (this step's amaxes) becomes the CP group's max."""
    hist = plan.module.fp8_meta_tensors(forward)[0]
    hist[0].copy_(plan.reduce_amax(hist[0]))


class _ReduceBwdHistory(torch.autograd.Function):
    """Identity on q, k, v whose backward (the last of the attention's, after dQKV) reduces the
    backward amax history over the CP group (delayed scaling)."""

    @staticmethod
    def forward(ctx: Any, plan: FP8AttentionPlan, *xs: torch.Tensor):  # noqa: ANN205
        ctx.plan = plan
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx: Any, *gs: torch.Tensor):  # noqa: ANN205
        _reduce_row(ctx.plan, False)
        return (None, *gs)


def _exchange(xs: list[torch.Tensor], group: Any, to: int, frm: int) -> list[torch.Tensor]:
    recv = [torch.empty_like(x, memory_format=torch.contiguous_format) for x in xs]
    ops = [dist.P2POp(dist.isend, x.contiguous(), to, group) for x in xs]
    ops += [dist.P2POp(dist.irecv, t, frm, group) for t in recv]
    comm.ring_finish(dist.batch_isend_irecv(ops))
    return recv


class _RingShift(torch.autograd.Function):
    """K, V to the next rank of the ring, the previous rank's in return; the backward sends the
    gradients the other way."""

    @staticmethod
    def forward(ctx: Any, group: Any, ranks: list[int], *xs: torch.Tensor):  # noqa: ANN205
        cp, r = comm.group_size(group), comm.group_rank(group)
        ctx.cfg = (group, ranks[(r - 1) % cp], ranks[(r + 1) % cp])
        return tuple(_exchange(list(xs), group, ranks[(r + 1) % cp], ranks[(r - 1) % cp]))

    @staticmethod
    def backward(ctx: Any, *gs: torch.Tensor):  # noqa: ANN205
        group, prv, nxt = ctx.cfg
        return (None, None, *_exchange(list(gs), group, prv, nxt))


class _StepPoints:
    """The per-step points (S, per-step O, dP): the plan's scales, the rank's own amax."""

    def __init__(self, plan: FP8AttentionPlan) -> None:
        self.s = _Point(plan, True, plan.s.slot, local=True)
        self.o = _Point(plan, True, plan.o.slot, local=True) if plan.mode == "delayed" else None
        self.dp = _Point(plan, False, plan.dp.slot, local=True) if plan.dp is not None else None


def _attend(pts: _StepPoints, q, k, v, scale: float, keep, out_dtype):  # noqa: ANN001, ANN202
    """One FP8 attention call in fp32 (q, k, v: FP8 values, [b, h, s, d]): scores, dP, softmax
    over the kept keys (keep: bool [sq, skv] or None), S, P V, the step's O rounding. Returns
    (o fp32, lse [b, h, sq] fp32). Every row keeps at least one key in the CP layouts."""
    g = q.shape[1] // k.shape[1]
    if g > 1:  # GQA: the KV heads' gradients summed over each group in index order
        k, v = expand_heads(k, g), expand_heads(v, g)
    x = ordered_matmul(q, k, transb=True) * scale
    if pts.dp is not None:
        x = _FP8Point.apply(None, pts.dp, None, x)[0]
    if keep is not None:
        x = x.masked_fill(~keep, float("-inf"))
    # The step's LSE and probabilities by the canonical exp / log / ordered sums; the LSE
    # broadcast along the row by row_expand, so its gradient (the row sum of dP * P) is an
    # ordered sum too. The subtraction's and the masking's backward are elementwise.
    lse = canonical.logsumexp(x)
    p = canonical.exp(x - canonical.row_expand(lse, x.shape[-1]))
    p = _FP8Point.apply(pts.s, None, torch.float32, p)[0]
    o = ordered_matmul(p, v)
    if pts.o is not None:  # delayed: the step's FP8 output
        o = _FP8Point.apply(pts.o, None, torch.float32, o)[0]
    else:  # current scaling: the step's output in the input dtype
        o = o.to(out_dtype).float()
    return o, lse


def _causal_keep(sq: int, skv: int, left: int, device: torch.device) -> torch.Tensor:
    """Bottom-right causal (the query chunk ends where the keys end), optionally a left window."""
    i = torch.arange(sq, device=device).unsqueeze(1) + (skv - sq)
    j = torch.arange(skv, device=device).unsqueeze(0)
    keep = j <= i
    if left >= 0:
        keep &= j >= i - left
    return keep


def _ring(pts, q, k, v, causal, scale, group, ranks, dtype):  # noqa: ANN001, ANN202
    """TE's p2p ring on [b, h, 2c, d] FP8 values: cp steps, each against the K / V chunks that
    arrived; causal steps per cp_comm.ring_step; (out, lse) merged in fp32."""
    cp, r = comm.group_size(group), comm.group_rank(group)
    c = q.shape[2] // 2
    out = lse = None
    kv = (k, v)
    for i in range(cp):
        if i > 0:
            kv = _RingShift.apply(group, ranks, *kv)
        qw, kvw, step_causal = comm.ring_step(r, (r - i) % cp, causal)
        qs = q if qw is None else q.narrow(2, qw * c, c)
        ks, vs = kv if kvw is None else (t.narrow(2, kvw * c, c) for t in kv)
        keep = _causal_keep(2 * c, 2 * c, -1, q.device) if step_causal else None
        o, l_ = _attend(pts, qs, ks, vs, scale, keep, dtype)
        if out is None:  # step 0 (the rank's own chunks) covers every row
            out, lse = o, l_
        elif qw is None:
            out, lse = canonical.merge(out, lse, o, l_)
        else:  # only the second half of q's rows
            o2, l2 = canonical.merge(out.narrow(2, c, c), lse.narrow(2, c, c), o, l_)
            out = torch.cat((out.narrow(2, 0, c), o2), 2)
            lse = torch.cat((lse.narrow(2, 0, c), l2), 2)
    return out


def _all_gather(pts, q, k, v, causal, window, scale, group, dtype):  # noqa: ANN001, ANN202
    """TE's all-gather: K / V gathered into sequence order ([b, h, S, d]); each of q's two
    chunks attends to the keys up to its end (causal, bottom-right, a left window counted from
    the diagonal), or q to every key (no mask)."""
    kf, vf = (comm.GatherSequence.apply(t, 2, group) for t in (k, v))
    if not causal:
        if window != (-1, -1):
            raise NotImplementedError(
                f"attn_forward_func_with_cp: window_size={window!r} without a causal mask with "
                "'all_gather' is not supported with context parallelism"
            )
        return _attend(pts, q, kf, vf, scale, None, dtype)[0]
    cp, r = comm.group_size(group), comm.group_rank(group)
    c = q.shape[2] // 2
    outs = []
    for which, chunk in ((0, r), (1, 2 * cp - 1 - r)):
        n = (chunk + 1) * c
        keep = _causal_keep(c, n, window[0], q.device)
        ks, vs = (t.narrow(2, 0, n) for t in (kf, vf))
        outs.append(_attend(pts, q.narrow(2, which * c, c), ks, vs, scale, keep, dtype)[0])
    return torch.cat(outs, 2)


def fp8_cp_attention(q, k, v, fmt, causal, window, scale, comm_type, cp_group, cp_global_ranks,
                     plan: FP8AttentionPlan) -> torch.Tensor:  # noqa: ANN001
    """FP8 attention of this rank's q rows (the module docstring) for comm_type 'p2p',
    'all_gather' or 'a2a+p2p'; q, k, v [b, 2c, h, d] / [2c, b, h, d]; returns [.., h, d_v] in
    q's dtype (FP8 values under plan.fp8_output). plan.amax_group: the CP group (a2a+p2p: both
    of its groups)."""
    dtype = q.dtype
    sdim = 1 if fmt == "bshd" else 0
    if plan.mode == "delayed" and torch.is_grad_enabled() and plan.backward_fp8:
        q, k, v = _ReduceBwdHistory.apply(plan, q, k, v)
    q, k, v = plan.inputs(q, k, v)  # QKV (group amax); dQKV in the backward
    pts = _StepPoints(plan)
    if comm_type == "a2a+p2p":
        a2a, p2p = cp_group
        q, k, v = (comm.SeqToHeads.apply(t, sdim, a2a, None) for t in (q, k, v))
        ranks = comm.global_ranks(p2p, None)
        o = _ring(pts, *(_bhsd(t, fmt) for t in (q, k, v)), causal, scale, p2p, ranks, dtype)
        o = comm.HeadsToSeq.apply(_from_bhsd(o, fmt), sdim, a2a, None)
    else:
        qb, kb, vb = (_bhsd(t, fmt) for t in (q, k, v))
        if comm_type == "p2p":
            ranks = comm.global_ranks(cp_group, cp_global_ranks)
            o = _ring(pts, qb, kb, vb, causal, scale, cp_group, ranks, dtype)
        else:
            o = _all_gather(pts, qb, kb, vb, causal, window, scale, cp_group, dtype)
        o = _from_bhsd(o, fmt)
    # The merged output in the input dtype (TE's out_f16), quantized by O (group amax) into the
    # returned FP8 values only under fp8_output; under DelayedScaling TE quantizes it anyway for
    # its FP8 backward (O's amax is recorded, the values stay). dO in the backward either way.
    out = o.to(dtype)
    if plan.fp8_output:
        out = plan.output(out, dtype)
    else:
        if plan.mode == "delayed" and plan.backward_fp8 and plan.records(True):
            with torch.no_grad():
                plan.o.round_trip(out)
        out = _FP8Point.apply(None, plan.do, None, out)[0]
    if plan.mode == "delayed" and plan.records(True):  # not again in a recompute
        _reduce_row(plan, True)
    return out
