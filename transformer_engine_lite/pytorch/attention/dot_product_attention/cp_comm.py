"""Context-parallel communication: the ring, the all-gather, the all-to-all (context_parallel.py's
parts; cp_layout.py holds the per-chunk attention calls and where the chunks lie).

Sequence layout (TE's DualChunkSwap): the sequence is cut into 2 * cp chunks and CP rank r holds
chunks r and 2 * cp - 1 - r, in that order, so every rank gets the same share of a causal mask's
work. All collectives here are eager torch.distributed calls; on the CPU (gloo) they run on gloo's
own threads: the ring's K/V exchange is started before a step's attention and waited for after it,
the rest is synchronous. TE's cp_stream (a CUDA stream for the overlap) has no role here.

Each attention call is the library's fused op (torch.ops.te_lite.fused_attn_fwd / _bwd), which
returns the chunk's output with its fp32 softmax LSE and takes a given (global) LSE and output in
the backward: exactly what the ring needs to combine chunks and to recompute probabilities (the
backward's P = exp(x - lse) is then the global probability and delta = rowsum(dO * O) the
global one).
"""

from __future__ import annotations

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


# ------------------------------------------------------------------------------- LSE merge
def merge(
    out_acc: torch.Tensor, lse_acc: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine one chunk's (out, lse) with the running fp32 (out_acc, lse_acc), LSEs row-major
    (out's shape without d_v, cp_layout.py): lse' = log(e^lse_acc + e^lse),
    out' = out_acc e^(lse_acc - lse') + out e^(lse - lse'). A row no key reached yet (lse -inf
    on both sides) stays 0 / -inf instead of NaN."""
    new = torch.logaddexp(lse_acc, lse)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    a = torch.exp(lse_acc - safe).unsqueeze(-1)
    b = torch.exp(lse - safe).unsqueeze(-1)
    return out_acc * a + out.float() * b, new


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


def ring_step(rank: int, src: int, causal: bool) -> tuple[int | None, int | None, bool]:
    """What rank `rank` computes against the K/V chunks of rank `src` in the load-balanced layout:
    (q rows: None = all, 1 = second half; kv rows: None = all, 0 = first half; causal). Own
    chunks: causal; an earlier rank's: all of q against its first chunk (its second chunk lies
    after both of ours); a later rank's: our second chunk against both of its (our first chunk
    lies before both of its)."""
    if not causal:
        return None, None, False
    if src == rank:
        return None, None, True
    if src < rank:
        return None, 0, False
    return 1, None, False


def bias_cols(src: int, kv_which: int | None, cp: int) -> list[int]:
    """The global key chunks (each of the local half length) rank src's K/V rows are: its
    chunks src and 2 cp - 1 - src, or only the first (kv_which 0)."""
    chunks = [src, 2 * cp - 1 - src]
    return chunks[:1] if kv_which == 0 else chunks


def bias_step(bias: torch.Tensor, half: int, q_which: int | None, cols: list[int]):
    """A step's slice of a post_scale_bias [.., q rows (the rank's two chunks), all keys]: q's
    rows of the step (q_which), the key columns of `cols`."""
    if q_which is not None:
        bias = bias.narrow(-2, q_which * half, half)
    return torch.cat([bias.narrow(-1, c * half, half) for c in cols], -1).contiguous()


def bias_add(dbias: torch.Tensor, half: int, q_which: int | None, cols: list[int], d) -> None:
    """bias_step's transpose: adds a step's bias gradient into the rank's dbias."""
    if q_which is not None:
        dbias = dbias.narrow(-2, q_which * half, half)
    for j, c in enumerate(cols):
        dbias.narrow(-1, c * half, half).add_(d.narrow(-1, j * half, half))


class RingAttention(torch.autograd.Function):
    """Ring attention over one CP group (cp_comm_type 'p2p', and the p2p level of 'a2a+p2p');
    `layout` (cp_layout.py) says where the rank's two chunks lie (layout.for_rank(src): where
    rank src's, which differ from ours only with padding between thd sequences). Forward: K/V
    travel around the ring (cp - 1 exchanges, each overlapped with a step's attention); each
    step's (out, LSE) is merged in fp32. Backward: K/V travel again with an fp32 dK/dV
    accumulator; after the last step one more exchange brings each rank its own dK/dV. Each
    step's backward is given the global output and LSE (attn_bwd's contract), so its gradients
    are its exact share. `bias` (bshd / sbhd): the rank's rows of a post_scale_bias over all
    keys, [1 or b, 1 or h, 2c or 1, 2 cp c]; each step adds its slice (bias_step) and its
    gradient is summed in fp32 into the rank's dbias."""

    @staticmethod
    def forward(  # noqa: ANN205
        ctx, q, k, v, layout, causal, scale, group, ranks, bias=None  # noqa: ANN001
    ):
        cp, r = group_size(group), group_rank(group)
        out_acc = q.new_zeros((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)
        lse_acc = layout.lse_empty(q)
        kv = [k, v]
        half = q.shape[layout.sdim] // 2
        for i in range(cp):
            works, nxt = ring_start(kv, group, ranks) if i < cp - 1 else ([], kv)
            src = (r - i) % cp
            qw, kvw, step_causal = ring_step(r, src, causal)
            kl = layout.for_rank(src)
            mask = layout.mask(step_causal)
            window = (-1, 0 if step_causal else -1)
            ks, vs = (kl.half(t, kvw) for t in kv)
            b = None if bias is None else bias_step(bias, half, qw, bias_cols(src, kvw, cp))
            o, lse = layout.attn_fwd(
                layout.half(q, qw), ks, vs, qw, kvw, mask, window, scale, kv_layout=kl, bias=b
            )
            new_o, new_l = merge(
                layout.half(out_acc, qw), layout.half(lse_acc, qw), o, layout.lse_in(lse, qw)
            )
            layout.put(out_acc, qw, new_o)
            layout.put(lse_acc, qw, new_l)
            ring_finish(works)
            kv = nxt
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse_acc, bias)
        ctx.cfg = (layout, causal, scale, group, ranks)
        return out

    @staticmethod
    def backward(ctx, dout):  # noqa: ANN001, ANN205
        q, k, v, out, lse, bias = ctx.saved_tensors
        layout, causal, scale, group, ranks = ctx.cfg
        cp, r = group_size(group), group_rank(group)
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=torch.float32)
        dbias = None if bias is None else torch.zeros_like(bias, dtype=torch.float32)
        half = q.shape[layout.sdim] // 2
        kv = [k, v]
        dkv = [torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)]
        for i in range(cp):
            works, nxt = ring_start(kv, group, ranks) if i < cp - 1 else ([], kv)
            src = (r - i) % cp
            qw, kvw, step_causal = ring_step(r, src, causal)
            kl = layout.for_rank(src)
            qs, os_, dos = (layout.half(t, qw) for t in (q, out, dout))
            ls = layout.lse_out(layout.half(lse, qw), qw)
            ks, vs = (kl.half(t, kvw) for t in kv)
            mask = layout.mask(step_causal)
            cols = bias_cols(src, kvw, cp)
            b = None if bias is None else bias_step(bias, half, qw, cols)
            dqs, dks, dvs, dbs = layout.attn_bwd(
                qs, ks, vs, os_, dos, ls, qw, kvw, mask, scale, kv_layout=kl, bias=b
            )
            layout.add(dq, qw, dqs.float())
            kl.add(dkv[0], kvw, dks.float())
            kl.add(dkv[1], kvw, dvs.float())
            if dbs is not None:
                bias_add(dbias, half, qw, cols, dbs.float())
            ring_finish(works)
            kv = nxt
            # The accumulator follows its K/V chunk; the last exchange brings our own home.
            w, dkv = ring_start(dkv, group, ranks)
            ring_finish(w)
        db = None if dbias is None else dbias.to(bias.dtype)
        return (dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None,
                None, db)  # fmt: skip


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
def _seq_to_heads(x: torch.Tensor, sdim: int, group: Any, perm: torch.Tensor | None):
    a = group_size(group)
    send = [t.contiguous() for t in x.chunk(a, dim=-2)]
    recv = [torch.empty_like(send[0]) for _ in range(a)]
    dist.all_to_all(recv, send, group=group)
    if perm is None:
        return to_sequence_order(recv, sdim)
    return torch.cat(recv, 0).index_select(0, perm)


def _heads_to_seq(y: torch.Tensor, sdim: int, group: Any, perm: torch.Tensor | None):
    a = group_size(group)
    if perm is None:
        send = [t.contiguous() for t in to_rank_order(y, sdim, a)]
    else:
        rank_major = torch.empty_like(y).index_copy_(0, perm, y)
        send = [t.contiguous() for t in rank_major.chunk(a, 0)]
    recv = [torch.empty_like(send[0]) for _ in range(a)]
    dist.all_to_all(recv, send, group=group)
    return torch.cat(recv, dim=-2)


class SeqToHeads(torch.autograd.Function):
    """All-to-all over an a2a group of size A: [.., 2c, H, d] (this rank's two chunks, all heads)
    -> [.., 2 A c, H / A, d] (the group's chunks in sequence order, this rank's share of heads:
    heads [i H / A, (i + 1) H / A) for a2a rank i). Inside an a2a+p2p hierarchy the A ranks hold
    consecutive chunks, so the result is this p2p rank's two super-chunks in the same layout.
    thd: `perm` (cp_layout.thd_a2a_perm) orders the received tokens per sequence. The backward
    is the inverse permutation (exact)."""

    @staticmethod
    def forward(ctx, x, sdim, group, perm):  # noqa: ANN001, ANN205
        ctx.cfg = (sdim, group, perm)
        return _seq_to_heads(x, sdim, group, perm)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        sdim, group, perm = ctx.cfg
        return _heads_to_seq(g, sdim, group, perm), None, None, None


class HeadsToSeq(torch.autograd.Function):
    """Inverse of SeqToHeads (forward and backward swapped)."""

    @staticmethod
    def forward(ctx, y, sdim, group, perm):  # noqa: ANN001, ANN205
        ctx.cfg = (sdim, group, perm)
        return _heads_to_seq(y, sdim, group, perm)

    @staticmethod
    def backward(ctx, g):  # noqa: ANN001, ANN205
        sdim, group, perm = ctx.cfg
        return _seq_to_heads(g, sdim, group, perm), None, None, None
