"""TE-JAX's rotary position embedding for the Flax attention modules: the angles laid out for the
fused RoPE primitive and `rotary_pos_emb` (TE-JAX's name, exported from flax.transformer)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from .. import cpp_extensions as tex

__all__ = ["rotary_pos_emb"]


def _rope_freqs(seqlen: int, dim: int, windows, interleaved: bool):
    """TE's angles pos / (min * (max/min)^(2i/d)), i < d/2, laid out for the fused primitive:
    pairs (2i, 2i+1) ("consecutive": interleaved) or (i, i + d/2) ("alternate")."""
    lo, hi = windows
    fraction = 2 * jnp.arange(dim // 2) / dim
    timescale = lo * (hi / lo) ** fraction
    ang = jnp.arange(seqlen)[:, None] / timescale[None, :]
    f = jnp.repeat(ang, 2, axis=-1) if interleaved else jnp.concatenate([ang, ang], axis=-1)
    return f.astype(jnp.float32)[:, None, None, :]


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _rope(x, windows, interleaved, fmt):
    seqlen = x.shape[0 if fmt == "sbhd" else 1]
    return tex.fused_rope_fwd(x, _rope_freqs(seqlen, x.shape[-1], windows, interleaved), fmt,
                              interleaved)


def _rope_fwd(x, windows, interleaved, fmt):
    return _rope(x, windows, interleaved, fmt), None


def _rope_bwd(windows, interleaved, fmt, _, g):
    seqlen = g.shape[0 if fmt == "sbhd" else 1]
    return (tex.fused_rope_bwd(g, _rope_freqs(seqlen, g.shape[-1], windows, interleaved), fmt,
                               interleaved),)


_rope.defvjp(_rope_fwd, _rope_bwd)


def rotary_pos_emb(x, windows, transpose_batch_sequence: bool, group_method="consecutive"):
    """TE's rotary embedding of x [b, s, h, d] ([s, b, h, d] transposed), positions 0..s-1."""
    gm = str(group_method).lower().strip().replace("-", "").replace("_", "")
    if gm not in ("consecutive", "alternate"):
        raise ValueError("rotary_pos_emb: field 'rotary_pos_emb_group_method': expected "
                         f"'consecutive' or 'alternate', got {group_method!r}")
    if x.ndim != 4 or x.shape[-1] % 2:
        raise ValueError(f"rotary_pos_emb: expected [b, s, h, d] with even d, got {x.shape}")
    fmt = "sbhd" if transpose_batch_sequence else "bshd"
    return _rope(x, tuple(float(w) for w in windows), gm == "consecutive", fmt)
