"""Context-parallel communication and the per-chunk attention calls (context_parallel.py's parts).

Sequence layout (TE's DualChunkSwap): the sequence is cut into 2 * cp chunks and CP rank r holds
chunks r and 2 * cp - 1 - r, in that order, so every rank gets the same share of a causal mask's
work. All collectives here are eager torch.distributed calls; on the CPU (gloo) they run on gloo's
own threads: the ring's K/V exchange is started before a step's attention and waited for after it,
the rest is synchronous. TE's cp_stream (a CUDA stream for the overlap) has no role here.

Each attention call is the library's fused op (torch.ops.te_lite.fused_attn_fwd / _bwd), which
returns the chunk's output with its fp32 softmax LSE and takes a given (global) LSE and output in
the backward: exactly what the ring needs to combine chunks and to recompute probabilities.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

_ops = torch.ops.te_lite


# ------------------------------------------------------------------------------- groups
def group_size(group: Any) -> int:
    return dist.get_world_size(group)


def group_rank(group: Any) -> int:
    return dist.get_rank(group)


def global_ranks(group: Any, given: list[int] | None) -> list[int]:
    """The global rank of each rank of `group` (send / recv address global ranks); `given` is TE's
    cp_global_ranks, checked against the group when both exist."""
    ranks = [dist.get_global_rank(group, i) for i in range(group_size(group))]
    if given is not None and list(given) != ranks:
        raise ValueError(
            f"cp_global_ranks: expected the global ranks of cp_group's members {ranks}, got "
            f"{list(given)!r}"
        )
    return ranks


# ------------------------------------------------------------------------------- sequence chunks
def half(x: torch.Tensor, sdim: int, which: int) -> torch.Tensor:
    """The first (0) or second (1) half of x's sequence dim, contiguous (the fused op's input)."""
    n = x.shape[sdim] // 2
    return x.narrow(sdim, which * n, n).contiguous()


def lse_weight(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """[b, h, s] -> broadcastable against an output [b, s, h, d] (bshd) / [s, b, h, d] (sbhd)."""
    w = w.transpose(1, 2) if fmt == "bshd" else w.permute(2, 0, 1)
    return w.unsqueeze(-1)


def merge_into(
    out_acc: torch.Tensor, lse_acc: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, fmt: str
) -> None:
    """Combine one chunk's (out, lse) into the running fp32 (out_acc, lse_acc) in place:
    lse' = log(e^lse_acc + e^lse), out' = out_acc e^(lse_acc - lse') + out e^(lse - lse').
    A row no key reached yet (lse -inf on both sides) stays 0 / -inf instead of NaN."""
    new = torch.logaddexp(lse_acc, lse)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    a = torch.exp(lse_acc - safe)
    b = torch.exp(lse - safe)
    out_acc.mul_(lse_weight(a, fmt)).add_(out.float() * lse_weight(b, fmt))
    lse_acc.copy_(new)


# ------------------------------------------------------------------------------- fused op calls
def attn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    fmt: str,
    mask: str,
    window: tuple[int, int],
    scale: float,
    softmax_type: str = "vanilla",
    softmax_offset: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [q's shape with d_v], lse fp32 [b, h, s_q]); differentiable in q, k, v (and a
    learnable softmax_offset) through the op's registered autograd."""
    sdim = 1 if fmt == "bshd" else 0
    return _ops.fused_attn_fwd(
        q,
        k,
        v,
        f"{fmt}_{fmt}_{fmt}",
        None,
        None,
        None,
        q.shape[sdim],
        k.shape[sdim],
        scale,
        0.0,
        None,
        "no_bias",
        mask,
        window[0],
        window[1],
        True,
        softmax_type,
        softmax_offset,
    )


def attn_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    fmt: str,
    mask: str,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of one chunk pair given the *global* out and LSE of q's rows: the kernel's
    P = exp(x - lse) is then the global probability and delta = rowsum(dO * O) the global one, so
    the chunk's gradients are its exact share of the full attention's."""
    sdim = 1 if fmt == "bshd" else 0
    dq, dk, dv, _, _ = _ops.fused_attn_bwd(
        q,
        k,
        v,
        out,
        dout,
        lse,
        f"{fmt}_{fmt}_{fmt}",
        None,
        None,
        None,
        q.shape[sdim],
        k.shape[sdim],
        scale,
        0.0,
        None,
        "no_bias",
        mask,
        -1,
        0 if "causal" in mask else -1,
        torch.are_deterministic_algorithms_enabled(),
    )
    return dq, dk, dv


# ------------------------------------------------------------------------------- ring (p2p)
def ring_start(
    tensors: list[torch.Tensor], group: Any, ranks: list[int]
) -> tuple[list[Any], list[torch.Tensor]]:
    """Send `tensors` to the next rank of the ring and receive the previous rank's into new
    buffers; returns (works to wait on, the receive buffers)."""
    cp, r = group_size(group), group_rank(group)
    nxt, prv = ranks[(r + 1) % cp], ranks[(r - 1) % cp]
    recv = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, prv, group) for t in recv]
    return dist.batch_isend_irecv(ops), recv


def ring_finish(works: list[Any]) -> None:
    for w in works:
        w.wait()


def ring_step(rank: int, src: int, causal: bool) -> tuple[bool, bool, str]:
    """What rank `rank` computes against the K/V chunks of rank `src` in the load-balanced layout:
    (q second half only, kv first half only, mask). Own chunks: causal; an earlier rank's: all of
    q against its first chunk (its second chunk lies after both of ours); a later rank's: our
    second chunk against both of its (our first chunk lies before both of its)."""
    if not causal:
        return False, False, "no_mask"
    if src == rank:
        return False, False, "causal"
    if src < rank:
        return False, True, "no_mask"
    return True, False, "no_mask"


class RingAttention(torch.autograd.Function):
    """Ring attention over one CP group (cp_comm_type 'p2p', and the p2p level of 'a2a+p2p').
    Forward: K/V travel around the ring (cp - 1 exchanges, each overlapped with a step's
    attention); each step's (out, LSE) is merged in fp32. Backward: K/V travel again with an fp32
    dK/dV accumulator; after the last step one more exchange brings each rank its own dK/dV."""

    @staticmethod
    def forward(ctx, q, k, v, fmt, causal, scale, group, ranks):  # noqa: ANN001, ANN205
        cp, r = group_size(group), group_rank(group)
        sdim = 1 if fmt == "bshd" else 0
        b, h, s = q.shape[1 - sdim], q.shape[-2], q.shape[sdim]
        out_acc = q.new_zeros((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)
        lse_acc = torch.full((b, h, s), -math.inf, dtype=torch.float32, device=q.device)
        kv = [k, v]
        for i in range(cp):
            works, nxt = ring_start(kv, group, ranks) if i < cp - 1 else ([], kv)
            q_half, kv_half, mask = ring_step(r, (r - i) % cp, causal)
            qs = half(q, sdim, 1) if q_half else q
            ks, vs = (half(t, sdim, 0) for t in kv) if kv_half else kv
            o, lse = attn_fwd(qs, ks, vs, fmt, mask, (-1, 0 if mask == "causal" else -1), scale)
            if q_half:
                oa, la = out_acc.narrow(sdim, s // 2, s // 2), lse_acc[..., s // 2 :]
            else:
                oa, la = out_acc, lse_acc
            merge_into(oa, la, o, lse, fmt)
            ring_finish(works)
            kv = nxt
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse_acc)
        ctx.cfg = (fmt, causal, scale, group, ranks)
        return out

    @staticmethod
    def backward(ctx, dout):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        fmt, causal, scale, group, ranks = ctx.cfg
        cp, r = group_size(group), group_rank(group)
        sdim = 1 if fmt == "bshd" else 0
        s = q.shape[sdim]
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=torch.float32)
        kv = [k, v]
        dkv = [torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)]
        for i in range(cp):
            works, nxt = ring_start(kv, group, ranks) if i < cp - 1 else ([], kv)
            q_half, kv_half, mask = ring_step(r, (r - i) % cp, causal)
            if q_half:
                qs, os_, dos = (half(t, sdim, 1) for t in (q, out, dout))
                ls = lse[..., s // 2 :].contiguous()
            else:
                qs, os_, dos, ls = q, out, dout, lse
            ks, vs = (half(t, sdim, 0) for t in kv) if kv_half else kv
            dqs, dks, dvs = attn_bwd(qs, ks, vs, os_, dos, ls, fmt, mask, scale)
            (dq.narrow(sdim, s // 2, s // 2) if q_half else dq).add_(dqs)
            for acc, g in zip(dkv, (dks, dvs)):
                (acc.narrow(sdim, 0, s // 2) if kv_half else acc).add_(g)
            ring_finish(works)
            kv = nxt
            # The accumulator follows its K/V chunk; the last exchange brings our own home.
            w, dkv = ring_start(dkv, group, ranks)
            ring_finish(w)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None


# ------------------------------------------------------------------------------- all-gather
def to_sequence_order(parts: list[torch.Tensor], sdim: int) -> torch.Tensor:
    """The whole sequence from every rank's two chunks (rank j: chunks j, 2 cp - 1 - j)."""
    firsts = [p.narrow(sdim, 0, p.shape[sdim] // 2) for p in parts]
    seconds = [p.narrow(sdim, p.shape[sdim] // 2, p.shape[sdim] // 2) for p in reversed(parts)]
    return torch.cat(firsts + seconds, sdim)


def to_rank_order(x: torch.Tensor, sdim: int, cp: int) -> list[torch.Tensor]:
    """Inverse of to_sequence_order: rank j's two chunks of the whole sequence x."""
    chunks = x.chunk(2 * cp, sdim)
    return [torch.cat((chunks[j], chunks[2 * cp - 1 - j]), sdim) for j in range(cp)]


class GatherSequence(torch.autograd.Function):
    """All-gather of K or V along the sequence into sequence order (forward); the backward sums
    every rank's gradient of the whole sequence in fp32 and scatters each rank its chunks."""

    @staticmethod
    def forward(ctx, x, sdim, group):  # noqa: ANN001, ANN205
        parts = [torch.empty_like(x) for _ in range(group_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        ctx.cfg = (sdim, group)
        return to_sequence_order(parts, sdim)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        sdim, group = ctx.cfg
        cp = group_size(group)
        parts = to_rank_order(g.float(), sdim, cp)
        flat = torch.cat(parts, 0)  # gloo: dim 0 of the input is world x the output's
        mine = torch.empty_like(parts[0])
        dist.reduce_scatter_tensor(mine, flat, group=group)
        return mine.to(g.dtype), None, None


# ------------------------------------------------------------------------------- all-to-all
def _seq_to_heads(x: torch.Tensor, sdim: int, group: Any) -> torch.Tensor:
    a = group_size(group)
    send = [t.contiguous() for t in x.chunk(a, dim=-2)]
    recv = [torch.empty_like(send[0]) for _ in range(a)]
    dist.all_to_all(recv, send, group=group)
    return to_sequence_order(recv, sdim)


def _heads_to_seq(y: torch.Tensor, sdim: int, group: Any) -> torch.Tensor:
    a = group_size(group)
    send = [t.contiguous() for t in to_rank_order(y, sdim, a)]
    recv = [torch.empty_like(send[0]) for _ in range(a)]
    dist.all_to_all(recv, send, group=group)
    return torch.cat(recv, dim=-2)


class SeqToHeads(torch.autograd.Function):
    """All-to-all over an a2a group of size A: [.., 2c, H, d] (this rank's two chunks, all heads)
    -> [.., 2 A c, H / A, d] (the group's chunks in sequence order, this rank's share of heads:
    heads [i H / A, (i + 1) H / A) for a2a rank i). Inside an a2a+p2p hierarchy the A ranks hold
    consecutive chunks, so the result is this p2p rank's two super-chunks in the same layout.
    The backward is the inverse permutation (exact)."""

    @staticmethod
    def forward(ctx, x, sdim, group):  # noqa: ANN001, ANN205
        ctx.cfg = (sdim, group)
        return _seq_to_heads(x, sdim, group)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        sdim, group = ctx.cfg
        return _heads_to_seq(g, sdim, group), None, None


class HeadsToSeq(torch.autograd.Function):
    """Inverse of SeqToHeads (forward and backward swapped)."""

    @staticmethod
    def forward(ctx, y, sdim, group):  # noqa: ANN001, ANN205
        ctx.cfg = (sdim, group)
        return _heads_to_seq(y, sdim, group)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        sdim, group = ctx.cfg
        return _seq_to_heads(g, sdim, group), None, None
