"""A bias with TE-JAX's THD layouts, in the core's per-sequence form.

TE-JAX's THD tensors are [b, s, h, d] rows holding up to m packed segments, and a bias
[1 or b, 1 or h, s_q, s_kv] is indexed by positions in the row (TE's test reference adds it to the
row's [s_q, s_kv] logits before the segment mask). The core's thd kernel indexes its bias by
(sequence, head, position in the sequence). So each of the b * m segments gets its own slice of
the row bias, starting at the segment's offsets: bias_seq[n, :, i, j] = bias[row(n), :, q_off(n) + i,
kv_off(n) + j]. The backward scatters the per-sequence dbias back to those row positions, summing
where segments share them (a bias broadcast over the batch). Cost: b * m * h_bias * s_q * s_kv
elements (m times a [b, h, s_q, s_kv] bias), the price of the core's per-sequence indexing.
"""

from __future__ import annotations

import jax.numpy as jnp

_I32 = jnp.int32


def _index(bias_shape, q_seqlens, q_offsets, kv_offsets):
    """Advanced indices (row, head, i, j) of bias_seq's elements into the row bias, each
    broadcastable to [b * m, h_bias, s_q, s_kv]; positions past the row's end are clipped (the
    core reads only i < seqlen_q, j < seqlen_kv of each sequence)."""
    bb, hb, s_q, s_kv = bias_shape
    b, m = q_seqlens.shape
    n = b * m
    row = (jnp.arange(n, dtype=_I32) // m) if bb != 1 else jnp.zeros((n,), _I32)
    iq = jnp.clip(q_offsets[:, :m].reshape(-1, 1) + jnp.arange(s_q, dtype=_I32), 0, s_q - 1)
    ikv = jnp.clip(kv_offsets[:, :m].reshape(-1, 1) + jnp.arange(s_kv, dtype=_I32), 0, s_kv - 1)
    head = jnp.arange(hb, dtype=_I32)
    return (row[:, None, None, None], head[None, :, None, None], iq[:, None, :, None],
            ikv[:, None, None, :])


def gather(bias, q_seqlens, q_offsets, kv_offsets):
    """Row bias [1|b, h_b, s_q, s_kv] -> the core's per-sequence bias [b * m, h_b, s_q, s_kv]."""
    return bias[_index(bias.shape, q_seqlens, q_offsets, kv_offsets)]


def scatter(dbias_seq, bias_shape, bias_dtype, q_seqlens, kv_seqlens, q_offsets, kv_offsets):
    """Per-sequence dbias [b * m, h_b, s_q, s_kv] -> the row bias's gradient (bias_shape), summed
    in fp32 where segments map to the same row position (a batch-broadcast bias)."""
    _, _, s_q, s_kv = bias_shape
    lq = jnp.clip(q_seqlens.reshape(-1), 0, s_q)
    lkv = jnp.clip(kv_seqlens.reshape(-1), 0, s_kv)
    # only the positions inside each sequence have a gradient (the core's values past them are
    # not ours to add: clipped indices would pile them onto the row's last position)
    inside = ((jnp.arange(s_q)[None, :, None] < lq[:, None, None])
              & (jnp.arange(s_kv)[None, None, :] < lkv[:, None, None]))[:, None]
    vals = jnp.where(inside, dbias_seq.astype(jnp.float32), 0.0)
    out = jnp.zeros(bias_shape, jnp.float32)
    out = out.at[_index(bias_shape, q_seqlens, q_offsets, kv_offsets)].add(vals)
    return out.astype(bias_dtype)
