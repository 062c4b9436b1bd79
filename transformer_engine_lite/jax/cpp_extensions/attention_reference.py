"""Attention as plain JAX math over the primitives' arguments (see .attention): the problem in one
padded form (`Problem`), the pure-JAX reference of the fused primitives (used when
NVTE_JAX_CUSTOM_CALLS disables them), and the pieces the unfused backend shares with it.

Dropout draws the flash kernel's own Philox keep mask (the dropout-mask primitive), indexed as the
kernel indexes it: [b, h, s_q, s_kv] for bshd; for thd, [sequence, h, i, j] with positions inside
each packed sequence, so every backend drops the same logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from .attention import LAYOUTS, dropout_keep_mask, keep_mask, layout_dims

_F32 = jnp.float32


@dataclass
class Problem:
    """q [b, s_q, h, d], k / v [b, s_kv, h, d] (GQA heads repeated), keep bool [b, 1, s_q, s_kv]
    or None (nothing masked), thd segment info (segment index n of each token, position)."""

    q: Any
    k: Any
    v: Any
    keep: Any
    seq_q: Any = None  # thd: [b, s_q] packed-sequence index of each token (-1: none)
    pos_q: Any = None
    seq_kv: Any = None
    pos_kv: Any = None
    m: int = 1  # thd: segments per row


def _unpack(layout, q, k, v):
    pack = LAYOUTS[layout][1]
    if pack == "qkv":
        return q[:, :, 0], q[:, :, 1], q[:, :, 2]
    if pack == "kv":
        return q, k[:, :, 0], k[:, :, 1]
    return q, k, v


def _segment_of(seqlens, offsets, s):
    """(packed sequence index n = row * m + segment or -1, position in the segment, its length),
    each [b, s]."""
    b, m = seqlens.shape
    starts = offsets[:, :m]
    j = jnp.arange(s)[None, :, None]
    inside = (j >= starts[:, None, :]) & (j < (starts + seqlens)[:, None, :])
    seg = jnp.argmax(inside, axis=-1)
    valid = inside.any(-1)
    n = jnp.where(valid, jnp.arange(b)[:, None] * m + seg, -1)
    pos = j[..., 0] - jnp.take_along_axis(starts, seg, axis=1)
    length = jnp.take_along_axis(seqlens, seg, axis=1)
    return n, jnp.where(valid, pos, 0), jnp.where(valid, length, 0)


def problem(layout, q, k, v, q_seqlens, kv_seqlens, q_offsets, kv_offsets, mask_type, window):
    """The attention problem of the primitives' arguments in padded bshd form."""
    dims = layout_dims("attention", layout, q, k, v)
    q, k, v = _unpack(layout, q, k, v)
    if dims.h != dims.h_kv:  # GQA / MQA: each KV head serves h / h_kv query heads
        k = jnp.repeat(k, dims.h // dims.h_kv, axis=2)
        v = jnp.repeat(v, dims.h // dims.h_kv, axis=2)
    i = jnp.arange(dims.s_q)[:, None]
    j = jnp.arange(dims.s_kv)[None, :]
    if LAYOUTS[layout][0] == "thd":
        nq, pq, lq = _segment_of(q_seqlens, q_offsets, dims.s_q)
        nkv, pkv, lkv = _segment_of(kv_seqlens, kv_offsets, dims.s_kv)
        same = (nq[:, :, None] == nkv[:, None, :]) & (nq[:, :, None] >= 0)
        keep = keep_mask(mask_type, window, pq[:, :, None], pkv[:, None, :], lq[:, :, None],
                         lkv[:, None, :], same)
        return Problem(q, k, v, keep[:, None], nq, pq, nkv, pkv, q_seqlens.shape[1])
    if "padding" in mask_type:
        lq, lkv = q_seqlens[:, None, None], kv_seqlens[:, None, None]
        keep = keep_mask(mask_type, window, i[None], j[None], lq, lkv)[:, None]
    elif mask_type == "no_mask" and window == (-1, -1):
        keep = None
    else:
        keep = keep_mask(mask_type, window, i, j, dims.s_q, dims.s_kv)[None, None]
    return Problem(q, k, v, keep)


def dropout_keep(p: Problem, seed, dropout: float):
    """bool [b, h, s_q, s_kv]: the logits the flash kernel keeps (see the module docstring)."""
    b, s_q, h, _ = p.q.shape
    s_kv = p.k.shape[1]
    if p.seq_q is None:
        return dropout_keep_mask(seed, b, h, s_q, s_kv, dropout)
    full = dropout_keep_mask(seed, b * p.m, h, s_q, s_kv, dropout)  # [n, h, i, j]
    n = jnp.maximum(p.seq_q, 0)  # [b, s_q]
    got = full[n[:, :, None, None], jnp.arange(h)[None, None, :, None],
               p.pos_q[:, :, None, None], p.pos_kv[:, None, None, :]]  # [b, s_q, h, s_kv]
    return jnp.transpose(got, (0, 2, 1, 3))


def logits(p: Problem, scale: float, bias_type: str, bias):
    """fp32 [b, h, s_q, s_kv] scores with the bias applied and the scale folded in when the bias
    comes after it; returns (x, scale still to apply)."""
    x = jnp.einsum("bqhd,bkhd->bhqk", p.q, p.k, preferred_element_type=_F32)
    if bias_type == "pre_scale_bias":
        return x + bias.astype(_F32), scale
    if bias_type == "post_scale_bias":
        return x * scale + bias.astype(_F32), 1.0
    return x, scale


def reference_fwd(q, k, v, bias, q_seqlens, kv_seqlens, q_offsets, kv_offsets, seed, *,
                  qkv_layout, attn_bias_type, attn_mask_type, scaling_factor, dropout_probability,
                  is_training, window):
    p = problem(qkv_layout, q, k, v, q_seqlens, kv_seqlens, q_offsets, kv_offsets,
                attn_mask_type, window)
    x, scale = logits(p, scaling_factor, attn_bias_type, bias)
    x = x * scale
    if p.keep is not None:
        x = jnp.where(p.keep, x, -jnp.inf)
    lse = jax.nn.logsumexp(x, axis=-1)  # [b, h, s_q]
    live = jnp.isfinite(lse)
    probs = jnp.where(live[..., None], jnp.exp(x - jnp.where(live, lse, 0.0)[..., None]), 0.0)
    if dropout_probability > 0:
        kept = dropout_keep(p, seed, dropout_probability)
        probs = probs * kept * (1.0 / (1.0 - dropout_probability))
    out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(q.dtype), p.v, preferred_element_type=_F32)
    out = out.astype(q.dtype)
    if not is_training:
        return out, jnp.zeros((0,), _F32)
    if p.seq_q is not None:  # [b, m, h, s_q]: row r's token i is position pos of sequence n
        b, h, s_q = lse.shape
        n = jnp.where(p.seq_q >= 0, p.seq_q, b * p.m)  # tokens in no sequence: dropped
        seq = jnp.zeros((b * p.m, s_q, h), _F32).at[n, p.pos_q].set(
            jnp.transpose(lse, (0, 2, 1)), mode="drop")
        lse = jnp.transpose(seq, (0, 2, 1)).reshape(b, p.m, h, s_q)
    return out, lse


def reference_bwd(q, k, v, bias, lse, out, d_out, q_seqlens, kv_seqlens, q_offsets, kv_offsets,
                  seed, *, qkv_layout, attn_bias_type, attn_mask_type, scaling_factor,
                  dropout_probability, window, deterministic):
    del lse, out, deterministic

    def f(q, k, v, bias):
        return reference_fwd(q, k, v, bias, q_seqlens, kv_seqlens, q_offsets, kv_offsets, seed,
                             qkv_layout=qkv_layout, attn_bias_type=attn_bias_type,
                             attn_mask_type=attn_mask_type, scaling_factor=scaling_factor,
                             dropout_probability=dropout_probability, is_training=False,
                             window=window)[0]

    _, vjp = jax.vjp(f, q, k, v, bias)
    dq, dk, dv, dbias = vjp(d_out)
    if attn_bias_type != "post_scale_bias":
        dbias = jnp.zeros((0,), q.dtype)
    return dq, dk, dv, dbias
