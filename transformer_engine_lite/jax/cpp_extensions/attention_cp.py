"""Context parallelism (CP) of fused_attn: the sequence dim of q / k / v sharded over a mesh axis.

Active when the CP axis (`context_parallel_axis`, else the global MeshResource's cp_resource) is an
axis of the active mesh with more than one device; each device then holds s / cp tokens of every
sequence. The per-device work runs under `jax.shard_map` (q / k / v / out sharded
[batch: dp + fsdp resources, seq: cp axis, heads: tpsp / tp resource, -], the LSE
[batch, heads, seq]); every attention step is the core's flash kernel (the fused primitives), the
partial results of the ring are merged with their softmax LSE, and the backward is a custom_vjp of
its own (the kernels' backward from the saved global LSE and output).

Strategies (TE's CPStrategy; DEFAULT = ALL_GATHER):
- ALL_GATHER: k / v all-gathered over the CP axis; each local query chunk starting at global
  position p (length L) attends the gathered keys with a causal mask aligned bottom-right and the
  key length p + L given as a sequence length (`padding_causal_bottom_right`: one kernel call per
  chunk, no per-rank unrolling; the kernel stops at the key length). Backward: dk / dv of the
  gathered keys summed over the chunks and reduce-scattered back.
- RING: k / v travel around the ring (ppermute to rank + 1, cp steps); step t attends the block of
  rank r - t and merges out / LSE online (out = sum_i out_i exp(lse_i - lse)). Backward: the
  kernels' backward per block from the merged LSE and output (exact: P = exp(s - lse) and
  delta = rowsum(dO * O) are the global ones), dk / dv accumulated on a buffer travelling with the
  block. NVTE_FUSED_RING_ATTENTION_USE_SCAN=1 runs the steps in a fori_loop instead of unrolled.
Causal load balancing (`context_parallel_causal_load_balanced`, TE's DualChunkSwap layout): the
sequence is cut into 2 cp chunks and rank r holds chunks r and 2 cp - 1 - r (reorder the inputs
with `reorder_causal_load_balancing`, the outputs back with the inverse), so every rank has the
same causal work. Without it rank r holds chunk r.

TE's limits, kept: bshd layouts with separate or kv-packed k / v (BS3HD: ValueError), masks
no_mask and causal, no bias, no dropout, vanilla softmax, no sliding window (ValueError otherwise).
thd layouts (thd_t2hd, thd_thd_thd; padding_causal, sliding windows allowed): TE's striped
ALL_GATHER with stripe_size, in attention_cp_thd.py, and TE's striped RING (stripe_size 1; a
window not under the scan loop, as TE), in attention_cp_thd_ring.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ...common import config
from . import attention as tex_attn

__all__ = [
    "CPPlan",
    "ReorderStrategy",
    "cp_fused_attn",
    "inverse_reorder_causal_load_balancing",
    "plan_context_parallel",
    "reorder_causal_load_balancing",
]

_F32 = jnp.float32
_I32 = jnp.int32


# ------------------------------------------------------------------------------------ reorder
class ReorderStrategy(Enum):
    """Token orders for causal load balancing (TE's names): DualChunkSwap (bshd: 2 cp chunks,
    rank r holds chunks r and 2 cp - 1 - r) and Striped (thd: stripes of `stripe_size` tokens
    dealt round-robin to the ranks)."""

    DualChunkSwap = 0
    Striped = 1


def _dual_chunk_order(cp_size: int) -> list[int]:
    """Chunk index at each position of the load-balanced order: [0, 2cp-1, 1, 2cp-2, ...]."""
    return [c for r in range(cp_size) for c in (r, 2 * cp_size - 1 - r)]


def _reorder(tensor, strategy, cp_size: int, seq_dim: int, stripe_size, inverse: bool):
    op = "inverse_reorder_causal_load_balancing" if inverse else "reorder_causal_load_balancing"
    if not isinstance(strategy, ReorderStrategy):
        raise ValueError(f"{op}: argument 'strategy': expected a ReorderStrategy, got "
                         f"{strategy!r}")
    tensor = jnp.asarray(tensor)
    if not -tensor.ndim <= seq_dim < tensor.ndim:
        raise ValueError(f"{op}: argument 'seq_dim': expected a dim of the {tensor.ndim}-D "
                         f"tensor, got {seq_dim}")
    seq_dim %= tensor.ndim
    if int(cp_size) < 1:
        raise ValueError(f"{op}: argument 'cp_size': expected >= 1, got {cp_size}")
    cp_size, s, shape = int(cp_size), tensor.shape[seq_dim], tensor.shape
    if strategy is ReorderStrategy.DualChunkSwap:
        if stripe_size is not None:
            raise ValueError(f"{op}: argument 'stripe_size': expected None for DualChunkSwap, "
                             f"got {stripe_size}")
        if cp_size == 1:
            return tensor
        if cp_size % 2:  # TE's constraint (the chunk pairs are swapped between rank halves)
            raise ValueError(f"{op}: argument 'cp_size': DualChunkSwap needs an even cp_size, "
                             f"got {cp_size}")
        if s % (2 * cp_size):
            raise ValueError(f"{op}: argument 'tensor': the sequence dim ({s}) must be a "
                             f"multiple of 2 * cp_size = {2 * cp_size}")
        order = _dual_chunk_order(cp_size)
        if inverse:  # position of each chunk in the balanced order
            order = sorted(range(len(order)), key=order.__getitem__)
        chunks = tensor.reshape(*shape[:seq_dim], 2 * cp_size, s // (2 * cp_size),
                                *shape[seq_dim + 1:])
        return jnp.take(chunks, jnp.asarray(order), axis=seq_dim).reshape(shape)
    stripe = 1 if stripe_size is None else int(stripe_size)
    if stripe <= 0:
        raise ValueError(f"{op}: argument 'stripe_size': expected a positive integer, got "
                         f"{stripe_size}")
    if s % (cp_size * stripe):
        raise ValueError(f"{op}: argument 'tensor': the sequence dim ({s}) must be a multiple "
                         f"of cp_size * stripe_size = {cp_size * stripe}")
    # sequence = [rounds, cp, stripe] (stripe j of round i goes to rank j) <-> [cp, rounds, stripe]
    split = (s // (cp_size * stripe), cp_size) if not inverse else (cp_size,
                                                                    s // (cp_size * stripe))
    x = tensor.reshape(*shape[:seq_dim], *split, stripe, *shape[seq_dim + 1:])
    return jnp.swapaxes(x, seq_dim, seq_dim + 1).reshape(shape)


def reorder_causal_load_balancing(tensor, strategy: ReorderStrategy, cp_size: int, seq_dim: int,
                                  stripe_size: int | None = None):
    """Contiguous token order -> the load-balanced order of `strategy` along `seq_dim`."""
    return _reorder(tensor, strategy, cp_size, seq_dim, stripe_size, inverse=False)


def inverse_reorder_causal_load_balancing(tensor, strategy: ReorderStrategy, cp_size: int,
                                          seq_dim: int, stripe_size: int | None = None):
    """The load-balanced order of `strategy` -> contiguous, along `seq_dim`."""
    return _reorder(tensor, strategy, cp_size, seq_dim, stripe_size, inverse=True)


# ------------------------------------------------------------------------------------ plan
@dataclass(frozen=True)
class CPPlan:
    mesh: object
    axis: str
    size: int
    ring: bool
    balanced: bool
    causal: bool
    scale: float
    scan: bool
    batch: tuple | None  # mesh axes of the batch dim
    heads: str | None  # mesh axis of the heads dim
    stripe: int | None = None  # thd: the striped layout's stripe_size (attention_cp_thd.py)
    window: tuple = (-1, -1)  # thd: the sliding window (bshd CP takes none)

    @property
    def tok(self):
        return P(self.batch, self.axis, self.heads, None)

    @property
    def lse(self):
        return P(self.batch, self.heads, self.axis)


def _resource():
    from ..sharding import _GLOBAL_MESH_RESOURCE

    return _GLOBAL_MESH_RESOURCE[0]


def _check_plain_softmax(head, dropout, softmax_type):
    """Both CP plans run the kernels' plain softmax without dropout (TE refuses the rest)."""
    if dropout != 0.0:
        raise ValueError(f"{head}: argument 'dropout_probability': expected 0, got {dropout}")
    if softmax_type != "vanilla":
        raise ValueError(f"{head}: argument 'softmax_type': expected vanilla, got "
                         f"{softmax_type}")


def plan_context_parallel(strategy, load_balanced, axis, layout, mask, bias_type, dropout,
                          softmax_type, window, scale, dims, stripe_size=None) -> CPPlan | None:
    """The CP plan of a fused_attn call, or None when context parallelism is not active (no CP
    axis, no mesh, or a CP axis of one device). Refuses what TE refuses (ValueError).
    strategy: "DEFAULT" / "ALL_GATHER" / "RING" (CPStrategy names)."""
    from ..sharding import _active_mesh

    resource = _resource()
    explicit = bool(axis)
    axis = axis or (resource.cp_resource if resource is not None else None)
    mesh = _active_mesh()
    if not axis or mesh is None:
        return None
    if axis not in mesh.axis_names:
        if not explicit:
            return None
        raise ValueError(f"fused_attn: argument 'context_parallel_axis': expected an axis of the "
                         f"active mesh {tuple(mesh.axis_names)}, got {axis!r}")
    size = int(mesh.shape[axis])
    if size == 1:
        return None
    head = "fused_attn (context parallel)"
    if layout.startswith("t"):
        return _plan_thd(head, strategy, load_balanced, axis, mesh, size, resource, layout, mask,
                         bias_type, dropout, softmax_type, window, scale, dims, stripe_size)
    if stripe_size is not None:
        raise ValueError(f"{head}: argument 'stripe_size': the striped layout is for thd layouts, "
                         f"got {stripe_size} with {layout}")
    if layout not in ("bshd_bs2hd", "bshd_bshd_bshd"):
        raise ValueError(f"{head}: argument 'qkv_layout': expected bshd_bs2hd or "
                         f"bshd_bshd_bshd, got {layout}")
    if bias_type != "no_bias":
        raise ValueError(f"{head}: argument 'attn_bias_type': expected no_bias, got {bias_type}")
    if mask not in ("no_mask", "causal"):
        raise ValueError(f"{head}: argument 'attn_mask_type': expected no_mask or causal, got "
                         f"{mask}")
    _check_plain_softmax(head, dropout, softmax_type)
    if window[0] != -1 or window[1] not in (-1, 0):
        raise ValueError(f"{head}: argument 'window_size': sliding windows are not supported, "
                         f"got {window}")
    causal = mask == "causal"
    balanced = bool(load_balanced)
    if causal and dims.s_q != dims.s_kv:
        raise NotImplementedError(f"{head}: a causal mask needs s_q == s_kv, got {dims.s_q} and "
                                  f"{dims.s_kv}")
    chunks = 2 * size if balanced else size
    if balanced and size % 2:
        raise ValueError(f"{head}: argument 'context_parallel_causal_load_balanced': the dual "
                         f"chunk layout needs an even CP size, got {size}")
    for name, s in (("s_q", dims.s_q), ("s_kv", dims.s_kv)):
        if s % chunks:
            raise ValueError(f"{head}: {name} = {s} must be a multiple of {chunks} (CP size "
                             f"{size}{', x2 for load balancing' if balanced else ''})")
    batch, heads = _mesh_dims(resource, mesh, axis, dims)
    scan = config.get("NVTE_FUSED_RING_ATTENTION_USE_SCAN") == "1"
    return CPPlan(mesh, axis, size, strategy == "RING", balanced, causal, float(scale), scan,
                  batch, heads)


def _mesh_dims(resource, mesh, axis, dims):
    """(mesh axes of the batch dim, mesh axis of the heads dim) the per-device work keeps."""
    batch, heads = None, None
    if resource is not None:
        found = tuple(a for a in (resource.dp_resource, resource.fsdp_resource)
                      if a and a in mesh.axis_names and a != axis)
        n = 1
        for a in found:
            n *= int(mesh.shape[a])
        batch = found if found and dims.b % n == 0 else None
        h_ax = resource.tpsp_resource or resource.tp_resource
        if h_ax and h_ax in mesh.axis_names and h_ax != axis and \
                dims.h % mesh.shape[h_ax] == 0 and dims.h_kv % mesh.shape[h_ax] == 0:
            heads = h_ax
    return batch, heads


def _plan_thd(head, strategy, load_balanced, axis, mesh, size, resource, layout, mask,
              bias_type, dropout, softmax_type, window, scale, dims, stripe_size):
    """The plan of thd CP: TE's striped all-gather (attention_cp_thd.py) or striped ring
    (stripe_size 1, attention_cp_thd_ring.py)."""
    ring = strategy == "RING"
    if ring and stripe_size is None:  # TE's ring reads no stripe_size: its layout is stripes of 1
        stripe_size = 1
    if layout not in ("thd_t2hd", "thd_thd_thd"):
        raise ValueError(f"{head}: argument 'qkv_layout': expected thd_t2hd or thd_thd_thd, got "
                         f"{layout}")
    if not load_balanced:  # TE: thd CP is the striped (load-balanced) layout only
        raise ValueError(f"{head}: argument 'context_parallel_causal_load_balanced': thd layouts "
                         "need the striped load-balanced layout (True), got False")
    if stripe_size is None or isinstance(stripe_size, bool) or int(stripe_size) <= 0:
        raise ValueError(f"{head}: argument 'stripe_size': expected a positive integer for thd "
                         f"layouts, got {stripe_size}")
    if bias_type != "no_bias":
        raise ValueError(f"{head}: argument 'attn_bias_type': expected no_bias, got {bias_type}")
    if mask != "padding_causal":
        raise NotImplementedError(f"{head}: argument 'attn_mask_type': thd context parallelism "
                                  f"runs padding_causal, got {mask}")
    _check_plain_softmax(head, dropout, softmax_type)
    if window[1] not in (-1, 0):
        raise ValueError(f"{head}: argument 'window_size': expected a causal window (left, 0), "
                         f"got {window}")
    if dims.s_q != dims.s_kv:
        raise NotImplementedError(f"{head}: a causal mask needs s_q == s_kv, got {dims.s_q} and "
                                  f"{dims.s_kv}")
    stripe = int(stripe_size)
    if ring and stripe != 1:  # TE: "For Ring P2P, stripe_size=1 only"
        raise ValueError(f"{head}: argument 'stripe_size': CPStrategy.RING on thd layouts takes "
                         f"stripes of 1 token, got {stripe}")
    scan = ring and config.get("NVTE_FUSED_RING_ATTENTION_USE_SCAN") == "1"
    if scan and window[0] != -1:  # TE refuses it too (its window shift needs host values)
        raise ValueError(f"{head}: argument 'window_size': thd ring attention takes no sliding "
                         f"window under NVTE_FUSED_RING_ATTENTION_USE_SCAN=1, got {tuple(window)}")
    if dims.s_q % (size * stripe):
        raise ValueError(f"{head}: s = {dims.s_q} must be a multiple of cp_size * stripe_size = "
                         f"{size} * {stripe}")
    batch, heads = _mesh_dims(resource, mesh, axis, dims)
    return CPPlan(mesh, axis, size, ring, True, True, float(scale), scan, batch, heads,
                  stripe=stripe, window=(int(window[0]), 0))


def check_stripe_size(stripe_size, layout: str):
    """fused_attn's stripe_size without an active CP axis: a thd call takes it (striped over one
    rank is the contiguous order); bshd refuses it (TE's striped layout is thd only)."""
    if stripe_size is None:
        return
    if not layout.startswith("t"):
        raise NotImplementedError(f"fused_attn: argument 'stripe_size' (the striped thd context-"
                                  f"parallel layout) needs a thd layout, got {layout}")
    if isinstance(stripe_size, bool) or not isinstance(stripe_size, (int, np.integer)) or \
            stripe_size <= 0:
        raise ValueError(f"fused_attn: argument 'stripe_size': expected a positive integer, got "
                         f"{stripe_size!r}")


# ------------------------------------------------------------------------------------ steps
def _kw(plan: CPPlan, mask: str) -> dict:
    return {"qkv_layout": "bshd_bshd_bshd", "attn_bias_type": "no_bias",
            "attn_mask_type": mask, "scaling_factor": plan.scale, "dropout_probability": 0.0,
            "window": (-1, 0) if "causal" in mask else (-1, -1)}


def _lens(q, kv_len):
    """(q_seqlens, kv_seqlens) int32 [b]: every query row, kv_len keys (bottom-right causal)."""
    b = q.shape[0]
    return jnp.full((b,), q.shape[1], _I32), jnp.broadcast_to(jnp.asarray(kv_len, _I32), (b,))


def _fwd(plan, q, k, v, mask, kv_len=None):
    """(out, lse) of one kernel call; kv_len: the key prefix length (with
    padding_causal_bottom_right)."""
    lens = (None, None) if kv_len is None else _lens(q, kv_len)
    return tex_attn.fused_attn_fwd(q, k, v, None, *lens, None, None, None, is_training=True,
                                   **_kw(plan, mask))


def _bwd(plan, q, k, v, out, lse, dout, mask, kv_len=None):
    lens = (None, None) if kv_len is None else _lens(q, kv_len)
    return tex_attn.fused_attn_bwd(q, k, v, None, lse, out, dout, *lens, None, None, None,
                                   **_kw(plan, mask))[:3]


def _chunks(plan: CPPlan, s_local: int, rank):
    """[(start, length, global chunk start)] of the local sequence (traced rank)."""
    if not plan.balanced:
        return [(0, s_local, rank * s_local)]
    c = s_local // 2
    return [(0, c, rank * c), (c, c, (2 * plan.size - 1 - rank) * c)]


def _merge(o1, l1, o2, l2):
    """Two partial attentions over disjoint key sets -> theirs over the union (fp32 out)."""
    m = jnp.maximum(l1, l2)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    w1, w2 = jnp.exp(l1 - m), jnp.exp(l2 - m)
    tot = w1 + w2
    lse = jnp.where(tot > 0, m + jnp.log(jnp.where(tot > 0, tot, 1.0)), -jnp.inf)
    t = lambda w: jnp.swapaxes(w / jnp.where(tot > 0, tot, 1.0), 1, 2)[..., None]  # [b,s,h,1]
    return o1 * t(w1) + o2.astype(_F32) * t(w2), lse


# -- all-gather
def _gather(plan, x):
    x = jax.lax.all_gather(x, plan.axis, axis=1, tiled=True)
    if plan.balanced:  # the ranks' chunks back in sequence order
        x = _reorder(x, ReorderStrategy.DualChunkSwap, plan.size, 1, None, inverse=True)
    return x


def _ag_fwd(plan, q, k, v):
    kg, vg = _gather(plan, k), _gather(plan, v)
    if not plan.causal:
        return _fwd(plan, q, kg, vg, "no_mask")
    outs, lses = [], []
    for start, n, pos in _chunks(plan, q.shape[1], jax.lax.axis_index(plan.axis)):
        o, lse = _fwd(plan, q[:, start:start + n], kg, vg, "padding_causal_bottom_right", pos + n)
        outs.append(o)
        lses.append(lse)
    return jnp.concatenate(outs, axis=1), jnp.concatenate(lses, axis=2)


def _ag_bwd(plan, q, k, v, out, lse, dout):
    kg, vg = _gather(plan, k), _gather(plan, v)
    if not plan.causal:
        dq, dk, dv = _bwd(plan, q, kg, vg, out, lse, dout, "no_mask")
    else:
        dqs, dk, dv = [], 0.0, 0.0
        for start, n, pos in _chunks(plan, q.shape[1], jax.lax.axis_index(plan.axis)):
            sl = slice(start, start + n)
            g = _bwd(plan, q[:, sl], kg, vg, out[:, sl], lse[:, :, sl], dout[:, sl],
                     "padding_causal_bottom_right", pos + n)
            dqs.append(g[0])
            dk, dv = dk + g[1].astype(_F32), dv + g[2].astype(_F32)
        dq = jnp.concatenate(dqs, axis=1)

    def scatter(x):  # each rank's keys get the sum over the ranks' queries
        if plan.balanced:
            x = _reorder(x, ReorderStrategy.DualChunkSwap, plan.size, 1, None, inverse=False)
        return jax.lax.psum_scatter(x.astype(_F32), plan.axis, scatter_dimension=1,
                                    tiled=True).astype(k.dtype)

    return dq, scatter(dk), scatter(dv)


# -- ring
def _perm(plan):
    return [(i, (i + 1) % plan.size) for i in range(plan.size)]


def _ring_loop(plan, step, carry):
    """step(t, carry) for t in 0..cp-1: unrolled, or a fori_loop under
    NVTE_FUSED_RING_ATTENTION_USE_SCAN (t is then traced)."""
    if plan.scan:
        return jax.lax.fori_loop(0, plan.size, step, carry)
    for t in range(plan.size):
        carry = step(t, carry)
    return carry


def _ring_pass(plan, t, kv):
    """The K/V block on to the next rank, except after the last unrolled step (nothing reads it)."""
    last = isinstance(t, int) and t == plan.size - 1
    return kv if last else jax.lax.ppermute(kv, plan.axis, _perm(plan))


def _ring_add_grads(plan, t, g, kv, dkv, dq):
    """One block's (dq, dk, dv) added in fp32, then the ring moved on. The key gradients travel
    with their block, every step (in the loop the block moves every step too): after cp moves
    both are back home."""
    dq = dq + g[0].astype(_F32)
    dkv = (dkv[0] + g[1].astype(_F32), dkv[1] + g[2].astype(_F32))
    return _ring_pass(plan, t, kv), jax.lax.ppermute(dkv, plan.axis, _perm(plan)), dq


def _switch(t, rank, branches, kv):
    """branches[i](kv) for the block of rank (rank - t) the local queries see: 0 the diagonal
    block (causal), 1 an earlier rank's block, 2 a later rank's block (t: int when unrolled)."""
    if isinstance(t, int) and t == 0:
        return branches[0](kv)
    return jax.lax.switch(jnp.where(t == 0, 0, jnp.where(t <= rank, 1, 2)).astype(_I32),
                          branches, kv)


def _ring_fwd(plan, q, k, v):
    b, s, h, _ = q.shape
    rank = jax.lax.axis_index(plan.axis)
    half = s // 2
    neg = jnp.full((b, h, s), -jnp.inf, _F32)

    def diag(kv):
        return _fwd(plan, q, *kv, "causal")

    def earlier(kv):  # balanced: its first chunk precedes both local chunks, its second follows
        if plan.balanced:
            return _fwd(plan, q, kv[0][:, :half], kv[1][:, :half], "no_mask")
        return _fwd(plan, q, *kv, "no_mask")

    def later(kv):  # balanced: only the local second chunk sees it (whole); else nothing
        if not plan.balanced:
            return jnp.zeros((b, s, h, v.shape[-1]), q.dtype), neg
        o, lse = _fwd(plan, q[:, half:], *kv, "no_mask")
        return (jnp.concatenate([jnp.zeros_like(o), o], axis=1),
                jnp.concatenate([neg[:, :, :half], lse], axis=2))

    def step(t, carry):
        kv, o, lse = carry
        if plan.causal:
            o_t, l_t = _switch(t, rank, [diag, earlier, later], kv)
        else:
            o_t, l_t = _fwd(plan, q, *kv, "no_mask")
        o, lse = _merge(o, lse, o_t, l_t)
        return _ring_pass(plan, t, kv), o, lse

    carry = _ring_loop(plan, step, ((k, v), jnp.zeros((b, s, h, v.shape[-1]), _F32), neg))
    return carry[1].astype(q.dtype), carry[2]


def _ring_bwd(plan, q, k, v, out, lse, dout):
    s = q.shape[1]
    rank = jax.lax.axis_index(plan.axis)
    half = s // 2

    def diag(kv):
        return _bwd(plan, q, *kv, out, lse, dout, "causal")

    def earlier(kv):
        if not plan.balanced:
            return _bwd(plan, q, *kv, out, lse, dout, "no_mask")
        dq, dk, dv = _bwd(plan, q, kv[0][:, :half], kv[1][:, :half], out, lse, dout, "no_mask")
        pad = lambda x: jnp.concatenate([x, jnp.zeros_like(x)], axis=1)
        return dq, pad(dk), pad(dv)

    def later(kv):
        if not plan.balanced:
            return jnp.zeros_like(q), jnp.zeros_like(kv[0]), jnp.zeros_like(kv[1])
        sl = slice(half, s)
        dq, dk, dv = _bwd(plan, q[:, sl], *kv, out[:, sl], lse[:, :, sl], dout[:, sl], "no_mask")
        return jnp.concatenate([jnp.zeros_like(dq), dq], axis=1), dk, dv

    def step(t, carry):
        kv, dkv, dq = carry
        if plan.causal:
            g = _switch(t, rank, [diag, earlier, later], kv)
        else:
            g = _bwd(plan, q, *kv, out, lse, dout, "no_mask")
        return _ring_add_grads(plan, t, g, kv, dkv, dq)

    zeros = lambda x: jnp.zeros(x.shape, _F32)
    _, (dk, dv), dq = _ring_loop(plan, step, ((k, v), (zeros(k), zeros(v)), zeros(q)))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# ------------------------------------------------------------------------------------ API
def _smap(plan, fn, in_specs, out_specs):
    return jax.shard_map(partial(fn, plan), mesh=plan.mesh, in_specs=in_specs,
                         out_specs=out_specs, check_vma=False)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _cp(plan, q, k, v):
    return _cp_fwd(plan, q, k, v)[0]


def _cp_fwd(plan, q, k, v):
    fn = _ring_fwd if plan.ring else _ag_fwd
    out, lse = _smap(plan, fn, (plan.tok,) * 3, (plan.tok, plan.lse))(q, k, v)
    return out, (q, k, v, out, lse)


def _cp_bwd(plan, res, dout):
    q, k, v, out, lse = res
    fn = _ring_bwd if plan.ring else _ag_bwd
    specs = (plan.tok, plan.tok, plan.tok, plan.tok, plan.lse, plan.tok)
    return _smap(plan, fn, specs, (plan.tok,) * 3)(q, k, v, out, lse, dout.astype(out.dtype))


_cp.defvjp(_cp_fwd, _cp_bwd)


def cp_fused_attn(plan: CPPlan, layout: str, q, k, v):
    """fused_attn under `plan`: q [b, s, h, d]; k [b, s, h_kv, d] and v, or (bshd_bs2hd) k the
    packed kv [b, s, 2, h_kv, d] and v None. Returns out [b, s, h, d_v] sharded as q."""
    if layout == "bshd_bs2hd":  # the steps take k and v apart; autodiff packs dk / dv back
        k, v = k[:, :, 0], k[:, :, 1]
    return _cp(plan, q, k, v)
