"""Context parallelism of fused_attn on thd layouts: TE's striped all-gather (CPStrategy
ALL_GATHER with `stripe_size`; attention_cp.py holds the bshd strategies and the plan).

Layout: the packed rows [b, s] are cut into stripes of `stripe_size` tokens dealt round-robin to
the cp ranks (reorder_causal_load_balancing(..., ReorderStrategy.Striped, cp, 1, stripe_size)),
so rank r holds R = s / (cp * stripe) stripes, its stripe i being the global stripe g = i cp + r.
Sequences are given by segment ids (SequenceDescriptor.from_segment_ids_and_pos; in the striped
order, sharded like the tokens): a sequence is a run of equal nonzero ids in the contiguous
order, 0 is padding.

Per rank: k / v and the kv segment ids are all-gathered and put back in contiguous order. The
mask a query at global position p needs is "keys of its own sequence at positions <= p" (and the
sliding window), which no single thd call over [local queries] x [gathered keys] expresses: the
local queries of one sequence are not contiguous and their key prefixes overlap, while the
kernel's segments pair one contiguous query run with one contiguous key run and must not
overlap. Each local stripe therefore becomes a thd row of its own (batch b * R): its queries
split into the runs of one sequence (at most `stripe` of them), the run starting at global p0
with n tokens paired with the keys [start of its sequence, p0 + n) of the gathered row, causal
aligned bottom-right ("padding_causal_bottom_right"): query p0 + j then sees exactly the keys of
its sequence up to p0 + j, the window counted from there. Within a row the runs belong to
different sequences, so their key ranges are disjoint, as the kernel requires. The key rows are
the gathered ones repeated R times (memory R x the gathered k / v: small for TE's stripe sizes,
s / cp for stripe_size 1). Backward: the kernel's backward on the same rows from the saved LSE;
dk / dv summed over the R rows, put back in striped order and reduce-scattered.

The kv sequence of a query is the kv run at its own position (self-attention: q and kv share the
token order, s_q == s_kv, which the causal mask requires anyway).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from . import attention as tex_attn

__all__ = ["thd_cp_fused_attn"]

_F32 = jnp.float32
_I32 = jnp.int32


def _unstripe(plan, x):
    """Local shards (striped order) -> the whole row in contiguous order (all-gather)."""
    from .attention_cp import ReorderStrategy, _reorder

    x = jax.lax.all_gather(x, plan.axis, axis=1, tiled=True)
    return _reorder(x, ReorderStrategy.Striped, plan.size, 1, plan.stripe, inverse=True)


def _rows(plan, ids_q, ids_kv_full):
    """The thd side arrays of the b * R stripe rows: (q_seqlens, kv_seqlens, q_offsets,
    kv_offsets), int32 [b * R, stripe] each (unused entries: length 0, offset -1)."""
    from ..attention import _segments_from_ids

    b, n_local = ids_q.shape
    stripe = plan.stripe
    rounds = n_local // stripe
    m = stripe  # a stripe holds at most one run per token
    q_len, q_off = _segments_from_ids(ids_q.reshape(b * rounds, stripe), True, m)
    rank = jax.lax.axis_index(plan.axis)
    first = (jnp.arange(rounds, dtype=_I32) * plan.size + rank) * stripe  # stripe i's position
    p0 = jnp.tile(first, b)[:, None] + jnp.maximum(q_off, 0)  # [b R, m] global run starts
    # start of the kv run holding each position of the gathered row (a running max of the
    # positions where the id changes)
    n = ids_kv_full.shape[1]
    prev = jnp.pad(ids_kv_full, ((0, 0), (1, 0)), constant_values=-1)[:, :-1]
    starts = jnp.where(ids_kv_full != prev, jnp.arange(n, dtype=_I32), 0)
    run_start = jnp.repeat(jax.lax.cummax(starts, axis=1), rounds, axis=0)
    kv_off = jnp.take_along_axis(run_start, jnp.clip(p0, 0, n - 1), axis=1)
    used = q_len > 0
    kv_len = jnp.where(used, p0 + q_len - kv_off, 0).astype(_I32)
    kv_off = jnp.where(used, kv_off, -1).astype(_I32)
    return q_len.astype(_I32), kv_len, q_off.astype(_I32), kv_off


def _kw(plan):
    return {"qkv_layout": "thd_thd_thd", "attn_bias_type": "no_bias",
            "attn_mask_type": "padding_causal_bottom_right", "scaling_factor": plan.scale,
            "dropout_probability": 0.0, "window": plan.window}


def _setup(plan, q, k, v, ids_q, ids_kv):
    """(q rows [b R, stripe, h, d], k / v rows [b R, s, h_kv, d], side arrays)."""
    b, n_local, h, d = q.shape
    rounds = n_local // plan.stripe
    kg, vg, idg = _unstripe(plan, k), _unstripe(plan, v), _unstripe(plan, ids_kv)
    rep = lambda x: jnp.repeat(x, rounds, axis=0)
    side = _rows(plan, ids_q, idg)
    return q.reshape(b * rounds, plan.stripe, h, d), rep(kg), rep(vg), side


def _thd_fwd(plan, q, k, v, ids_q, ids_kv):
    b, n_local, h, _ = q.shape
    qr, kr, vr, side = _setup(plan, q, k, v, ids_q, ids_kv)
    out, lse = tex_attn.fused_attn_fwd(qr, kr, vr, None, *side, None, is_training=True,
                                       **_kw(plan))
    # LSE [b R, m, h, stripe] -> [b, R, m, h, stripe]: the R dim is the one sharded over cp
    rounds = n_local // plan.stripe
    return out.reshape(b, n_local, h, -1), lse.reshape(b, rounds, *lse.shape[1:])


def _thd_bwd(plan, q, k, v, ids_q, ids_kv, out, lse, dout):
    from .attention_cp import ReorderStrategy, _reorder

    b, n_local, h, _ = q.shape
    qr, kr, vr, side = _setup(plan, q, k, v, ids_q, ids_kv)
    rows = lambda x: x.reshape(qr.shape[0], plan.stripe, *x.shape[2:])
    dq, dk, dv = tex_attn.fused_attn_bwd(qr, kr, vr, None, lse.reshape(-1, *lse.shape[2:]),
                                         rows(out), rows(dout), *side, None, **_kw(plan))[:3]
    rounds = n_local // plan.stripe

    def scatter(x, like):  # sum over the stripe rows, back to striped order, to the key owners
        x = x.reshape(b, rounds, *x.shape[1:]).astype(_F32).sum(axis=1)
        x = _reorder(x, ReorderStrategy.Striped, plan.size, 1, plan.stripe, inverse=False)
        return jax.lax.psum_scatter(x, plan.axis, scatter_dimension=1,
                                    tiled=True).astype(like.dtype)

    return dq.reshape(q.shape), scatter(dk, k), scatter(dv, v)


def _specs(plan):
    tok, ids = plan.tok, P(plan.batch, plan.axis)
    lse = P(plan.batch, plan.axis, None, plan.heads, None)
    return tok, ids, lse


def _smap(plan, fn, in_specs, out_specs):
    return jax.shard_map(partial(fn, plan), mesh=plan.mesh, in_specs=in_specs,
                         out_specs=out_specs, check_vma=False)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _cp(plan, q, k, v, ids_q, ids_kv):
    return _cp_fwd(plan, q, k, v, ids_q, ids_kv)[0]


def _cp_fwd(plan, q, k, v, ids_q, ids_kv):
    tok, ids, lse_spec = _specs(plan)
    out, lse = _smap(plan, _thd_fwd, (tok, tok, tok, ids, ids), (tok, lse_spec))(
        q, k, v, ids_q, ids_kv)
    return out, (q, k, v, ids_q, ids_kv, out, lse)


def _cp_bwd(plan, res, dout):
    q, k, v, ids_q, ids_kv, out, lse = res
    tok, ids, lse_spec = _specs(plan)
    dq, dk, dv = _smap(plan, _thd_bwd, (tok, tok, tok, ids, ids, tok, lse_spec, tok),
                       (tok,) * 3)(q, k, v, ids_q, ids_kv, out, lse, dout.astype(out.dtype))
    return dq, dk, dv, None, None


_cp.defvjp(_cp_fwd, _cp_bwd)


def thd_cp_fused_attn(plan, layout: str, q, k, v, segment_ids, max_segments: int):
    """fused_attn on a thd layout under `plan` (striped all-gather, or the striped ring of
    attention_cp_thd_ring.py when plan.ring): q [b, s, h, d]; k / v [b, s, h_kv, d]
    (thd_thd_thd) or k the packed kv [b, s, 2, h_kv, d] and v None (thd_t2hd); segment_ids (q
    ids, kv ids) int [b, s], in the striped order as the tokens; max_segments: the call's
    max_segments_per_seq."""
    from .attention_cp_thd_ring import thd_ring_fused_attn

    if layout == "thd_t2hd":
        k, v = k[:, :, 0], k[:, :, 1]
    ids_q, ids_kv = (jnp.asarray(x).astype(_I32) for x in segment_ids)
    if plan.ring:
        return thd_ring_fused_attn(plan, q, k, v, ids_q, ids_kv, max_segments)
    return _cp(plan, q, k, v, ids_q, ids_kv)
