"""Context parallelism of fused_attn on thd layouts with CPStrategy.RING (TE's striped ring:
stripe_size 1; attention_cp_thd.py holds the striped all-gather, attention_cp.py the plan).

Layout: token p of the packed row sits on rank p % cp at local index p // cp
(reorder_causal_load_balancing(..., ReorderStrategy.Striped, cp, 1, 1)). A sequence (a run of
equal nonzero segment ids in the contiguous order, 0 is padding) then holds contiguous local
indices on every rank, so the local tokens of each sequence are one thd segment of the local row.

Ring: k / v travel around the ring (ppermute to rank + 1, cp steps); at step t the local queries
(rank r) attend the block of rank src = r - t (mod cp), whose local index j is at global position
j cp + src. For a query run (local start a_q, n_q tokens) of a sequence starting at global g0,
that sequence's keys in the block start at a_k = ceil((g0 - src) / cp), and the query at local
index L sees the block keys up to index L - shift (shift = 1 when src > r: the key at index L lies
after the query); its visible count grows by one per query, so the pair is one kernel segment
(queries [a_q, a_q + n_q), keys [a_k, a_k + n_q + a_q - a_k - shift)) with the causal mask
aligned bottom-right ("padding_causal_bottom_right"); that key count never passes the
sequence's keys in the block. Empty rows (no visible key) come back with LSE -inf and output 0
and merge as nothing. A sliding window (W, 0) in global positions becomes the block window
floor((W + src - r) / cp) - shift, which is one of floor(W / cp) - 1 and floor(W / cp) (a switch
over the two kernel calls; -1 sees no key: the step is skipped).

g0 per query run comes from the kv segment ids all-gathered once (int32 [b, s], beside k / v
negligible): the segments are the id runs of the whole row, as in the one-device call, which no
local view can decide (a run's start may lie on any rank). Partial results are merged with their
LSE (out = sum_i out_i exp(lse_i - lse)). Backward: the kernels' backward per block from the
merged LSE and output (exact: P and delta are the global ones), dk / dv accumulated on a buffer
travelling with the block (home again after cp moves). NVTE_FUSED_RING_ATTENTION_USE_SCAN=1 runs
the steps in a fori_loop.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from . import attention as tex_attn
from .attention_cp import _merge, _ring_add_grads, _ring_loop, _ring_pass

__all__ = ["thd_ring_fused_attn"]

_F32 = jnp.float32
_I32 = jnp.int32


def _runs(plan, ids_q, ids_kv, m):
    """(q_len, q_off, g0) int32 [b, m]: the local query runs and the global start of their
    sequences (unused entries: length 0, offset -1)."""
    from ..attention import _segments_from_ids

    q_len, q_off = _segments_from_ids(ids_q, True, m)
    rank = jax.lax.axis_index(plan.axis)
    ids = jax.lax.all_gather(ids_kv, plan.axis, axis=1, tiled=True)
    # striped (rank-major) -> contiguous: [cp, n] -> [n, cp]
    b, s = ids.shape
    ids = jnp.swapaxes(ids.reshape(b, plan.size, s // plan.size), 1, 2).reshape(b, s)
    prev = jnp.pad(ids, ((0, 0), (1, 0)), constant_values=-1)[:, :-1]
    starts = jnp.where(ids != prev, jnp.arange(s, dtype=_I32), 0)
    run_start = jax.lax.cummax(starts, axis=1)  # start of the id run holding each position
    first = jnp.maximum(q_off, 0) * plan.size + rank  # global position of each run's first query
    g0 = jnp.take_along_axis(run_start, jnp.clip(first, 0, s - 1), axis=1)
    return q_len.astype(_I32), q_off.astype(_I32), g0.astype(_I32)


def _side(plan, runs, src):
    """(q_seqlens, kv_seqlens, q_offsets, kv_offsets) of the step on the block of rank src."""
    q_len, q_off, g0 = runs
    rank = jax.lax.axis_index(plan.axis)
    shift = (src > rank).astype(_I32)
    a_k = -((src - g0) // plan.size)  # ceil((g0 - src) / cp)
    used = q_len > 0
    kv_len = jnp.where(used, jnp.maximum(q_len + q_off - a_k - shift, 0), 0).astype(_I32)
    kv_off = jnp.where(kv_len > 0, a_k, -1).astype(_I32)
    return q_len, kv_len, q_off, kv_off


def _windows(plan, src):
    """(index, candidates): the block window is candidates[index] (None: no window; -1: the step
    sees no key)."""
    left = plan.window[0]
    if left < 0:
        return jnp.zeros((), _I32), (None,)
    rank = jax.lax.axis_index(plan.axis)
    base = left // plan.size
    w = (left + src - rank) // plan.size - (src > rank).astype(_I32)
    return (w - (base - 1)).astype(_I32), (base - 1, base)


def _kw(plan, window):
    return {"qkv_layout": "thd_thd_thd", "attn_bias_type": "no_bias",
            "attn_mask_type": "padding_causal_bottom_right", "scaling_factor": plan.scale,
            "dropout_probability": 0.0, "window": (-1, 0) if window is None else (window, 0)}


def _branches(plan, src, call, empty):
    """call(window) under the block's window (a switch when it depends on the rank)."""
    index, cands = _windows(plan, src)
    fns = [(lambda _, w=w: empty()) if w is not None and w < 0 else (lambda _, w=w: call(w))
           for w in cands]
    if len(fns) == 1:
        return fns[0](None)
    return jax.lax.switch(index, fns, None)


# -- LSE: the kernel's thd form [b, m, h, n] (row i of segment j = query q_off_j + i) <-> per
# token [b, h, n] (what the merge and the residual keep; -inf outside every run)
def _token_index(q_len, q_off, n):
    j = jnp.arange(n, dtype=_I32)[None, :, None]
    inside = (j >= q_off[:, None, :]) & (j < (q_off + q_len)[:, None, :])  # [b, n, m]
    seg = jnp.argmax(inside, axis=-1).astype(_I32)
    row = j[..., 0] - jnp.take_along_axis(q_off, seg, axis=1)
    return seg, jnp.clip(row, 0, n - 1), inside.any(-1)


def _lse_tokens(lse, where):
    seg, row, valid = where
    b = lse.shape[0]
    got = lse[jnp.arange(b)[:, None], seg, :, row]  # [b, n, h]
    return jnp.where(valid[..., None], got, -jnp.inf).transpose(0, 2, 1)


def _lse_segments(lse_tok, q_off, m):
    b, h, n = lse_tok.shape
    idx = jnp.clip(jnp.maximum(q_off, 0)[:, :, None] + jnp.arange(n, dtype=_I32), 0, n - 1)
    got = jnp.take_along_axis(lse_tok[:, None], idx[:, :, None, :], axis=3)  # [b, m, h, n]
    return jnp.where(jnp.isfinite(got), got, 0.0)


# -- the ring (its loop and moves are the bshd ring's: attention_cp.py)

def _ring_fwd(plan, m, q, k, v, ids_q, ids_kv):
    b, n, h, _ = q.shape
    rank = jax.lax.axis_index(plan.axis)
    runs = _runs(plan, ids_q, ids_kv, m)
    where = _token_index(runs[0], runs[1], n)
    neg = jnp.full((b, h, n), -jnp.inf, _F32)

    def step(t, carry):
        kv, o, lse = carry
        src = (rank - t) % plan.size
        side = _side(plan, runs, src)

        def call(w):
            o_t, l_t = tex_attn.fused_attn_fwd(q, *kv, None, *side, None, is_training=True,
                                               **_kw(plan, w))
            return o_t, _lse_tokens(l_t, where)

        o_t, l_t = _branches(plan, src, call, lambda: (jnp.zeros((b, n, h, v.shape[-1]), q.dtype),
                                                         neg))
        o, lse = _merge(o, lse, o_t, l_t)
        return _ring_pass(plan, t, kv), o, lse

    carry = _ring_loop(plan, step, ((k, v), jnp.zeros((b, n, h, v.shape[-1]), _F32), neg))
    return carry[1].astype(q.dtype), carry[2]


def _ring_bwd(plan, m, q, k, v, ids_q, ids_kv, out, lse, dout):
    rank = jax.lax.axis_index(plan.axis)
    runs = _runs(plan, ids_q, ids_kv, m)
    lse_seg = _lse_segments(lse, runs[1], m)

    def step(t, carry):
        kv, dkv, dq = carry
        src = (rank - t) % plan.size
        side = _side(plan, runs, src)

        def call(w):
            return tuple(tex_attn.fused_attn_bwd(q, *kv, None, lse_seg, out, dout, *side, None,
                                                 **_kw(plan, w))[:3])

        g = _branches(plan, src, call,
                      lambda: (jnp.zeros_like(q), jnp.zeros_like(kv[0]), jnp.zeros_like(kv[1])))
        return _ring_add_grads(plan, t, g, kv, dkv, dq)

    zeros = lambda x: jnp.zeros(x.shape, _F32)
    _, (dk, dv), dq = _ring_loop(plan, step, ((k, v), (zeros(k), zeros(v)), zeros(q)))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# ------------------------------------------------------------------------------------ API
def _smap(plan, m, fn, in_specs, out_specs):
    return jax.shard_map(partial(fn, plan, m), mesh=plan.mesh, in_specs=in_specs,
                         out_specs=out_specs, check_vma=False)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _cp(plan, m, q, k, v, ids_q, ids_kv):
    return _cp_fwd(plan, m, q, k, v, ids_q, ids_kv)[0]


def _cp_fwd(plan, m, q, k, v, ids_q, ids_kv):
    tok, ids = plan.tok, P(plan.batch, plan.axis)
    out, lse = _smap(plan, m, _ring_fwd, (tok, tok, tok, ids, ids), (tok, plan.lse))(
        q, k, v, ids_q, ids_kv)
    return out, (q, k, v, ids_q, ids_kv, out, lse)


def _cp_bwd(plan, m, res, dout):
    q, k, v, ids_q, ids_kv, out, lse = res
    tok, ids = plan.tok, P(plan.batch, plan.axis)
    dq, dk, dv = _smap(plan, m, _ring_bwd, (tok, tok, tok, ids, ids, tok, plan.lse, tok),
                       (tok,) * 3)(q, k, v, ids_q, ids_kv, out, lse, dout.astype(out.dtype))
    return dq, dk, dv, None, None


_cp.defvjp(_cp_fwd, _cp_bwd)


def thd_ring_fused_attn(plan, q, k, v, ids_q, ids_kv, max_segments: int):
    """The striped ring under `plan`: q [b, s, h, d], k / v [b, s, h_kv, d], segment ids int32
    [b, s] in the striped order; max_segments bounds the sequences per row (each gives at most
    one run per rank)."""
    m = max(1, min(int(max_segments), q.shape[1] // plan.size))
    return _cp(plan, m, q, k, v, ids_q, ids_kv)
