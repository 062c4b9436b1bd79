"""Fused rotary position embedding primitives (pytorch/te_lite_ops.py documents the op): t [s, b, h, d]
("sbhd"), [b, s, h, d] ("bshd") or [t, h, d] ("thd", with cu_seqlens int32 [b + 1]); freqs float32
[s_max, 1, 1, d2]. Sharding: batch and heads keep theirs, the sequence and head dims are gathered.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .base import FFIOp
from .misc import HIGH_PRECISION, check_dtype

__all__ = ["_jax_rope", "fused_rope_bwd", "fused_rope_fwd"]

_F32 = jnp.float32


def _abstract(op):
    def abstract(t, freqs, cu_seqlens, *, tensor_format, interleaved):
        check_dtype(op, "t", t.dtype, HIGH_PRECISION)
        check_dtype(op, "freqs", freqs.dtype, (_F32,))
        nd = 3 if tensor_format == "thd" else 4
        if tensor_format not in ("sbhd", "bshd", "thd"):
            raise ValueError(f"te_lite::{op}: argument 'tensor_format': expected 'sbhd', 'bshd' or "
                             f"'thd', got {tensor_format!r}")
        if len(t.shape) != nd:
            raise ValueError(f"te_lite::{op}: argument 't': expected a {nd}-D array for "
                             f"{tensor_format}, got shape {tuple(t.shape)}")
        if len(freqs.shape) != 4 or freqs.shape[-1] > t.shape[-1] or freqs.shape[-1] % 2:
            raise ValueError(f"te_lite::{op}: argument 'freqs': expected [s, 1, 1, d2] with even "
                             f"d2 <= {t.shape[-1]}, got shape {tuple(freqs.shape)}")
        if tensor_format == "thd":
            check_dtype(op, "cu_seqlens", cu_seqlens.dtype, (jnp.int32,))
        return (jax.ShapeDtypeStruct(t.shape, t.dtype),)

    return abstract


def _rotate(x32, f, interleaved, sign):
    d2 = f.shape[-1]
    xr, rest = x32[..., :d2], x32[..., d2:]
    cos, sin = jnp.cos(f), jnp.sin(f) * sign
    if interleaved:
        a, b = xr[..., 0::2], xr[..., 1::2]
        rot = jnp.stack([-b, a], axis=-1).reshape(xr.shape)
    else:
        a, b = jnp.split(xr, 2, axis=-1)
        rot = jnp.concatenate([-b, a], axis=-1)
    return jnp.concatenate([xr * cos + rot * sin, rest], axis=-1)


def _jax_rope(t, freqs, cu_seqlens, tensor_format, interleaved, sign=1.0):
    """Reference of the forward (float32 math, t's dtype)."""
    x32 = t.astype(_F32)
    f = freqs.astype(_F32)[:, 0, 0, :]
    if tensor_format == "sbhd":
        out = _rotate(x32, f[: t.shape[0], None, None, :], interleaved, sign)
    elif tensor_format == "bshd":
        out = _rotate(x32, f[None, : t.shape[1], None, :], interleaved, sign)
    else:
        tok = jnp.arange(t.shape[0])
        seq = jnp.searchsorted(cu_seqlens, tok, side="right") - 1
        valid = tok < cu_seqlens[-1]
        pos = jnp.where(valid, tok - cu_seqlens[jnp.clip(seq, 0, cu_seqlens.shape[0] - 1)], 0)
        rot = _rotate(x32, f[pos][:, None, :], interleaved, sign)
        out = jnp.where(valid[:, None, None], rot, x32)
    return out.astype(t.dtype)


def _jax_rope_bwd(g, freqs, cu_seqlens, tensor_format, interleaved):
    """The transpose of the forward (freqs need not pair up, so it is not the inverse rotation)."""
    _, vjp = jax.vjp(lambda t: _jax_rope(t, freqs, cu_seqlens, tensor_format, interleaved), g)
    return vjp(g)[0]


RopeFwdPrimitive = FFIOp(
    "FusedRopeFwdPrimitive", "te_lite_fused_rope_fwd_ffi", _abstract("fused_rope_fwd"),
    lambda t, f, cu, tensor_format, interleaved: (_jax_rope(t, f, cu, tensor_format, interleaved),))
RopeBwdPrimitive = FFIOp(
    "FusedRopeBwdPrimitive", "te_lite_fused_rope_bwd_ffi", _abstract("fused_rope_bwd"),
    lambda g, f, cu, tensor_format, interleaved: (_jax_rope_bwd(g, f, cu, tensor_format,
                                                                 interleaved),))


def _cu(cu_seqlens):
    return jnp.zeros((0,), jnp.int32) if cu_seqlens is None else cu_seqlens


def fused_rope_fwd(t, freqs, tensor_format="sbhd", interleaved=False, cu_seqlens=None):
    return RopeFwdPrimitive(t, freqs, _cu(cu_seqlens), tensor_format=tensor_format,
                            interleaved=bool(interleaved))[0]


def fused_rope_bwd(grad, freqs, tensor_format="sbhd", interleaved=False, cu_seqlens=None):
    return RopeBwdPrimitive(grad, freqs, _cu(cu_seqlens), tensor_format=tensor_format,
                            interleaved=bool(interleaved))[0]
