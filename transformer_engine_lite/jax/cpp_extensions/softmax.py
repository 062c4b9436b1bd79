"""Fused softmax primitives (TE's scaled / scaled_masked / scaled_upper_triang_masked /
scaled_aligned_causal_masked), forward and backward, and their pure-JAX references.

x is [b, h, sq, sk] (upper_triang: that, or TE's C API [b*h, sq, sq]); the mask (bool/uint8, nonzero = masked) is
[b or 1, 1, sq, sk]. Sharding: batch and heads keep theirs, (sq, sk) are gathered.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .base import FFIOp
from .misc import HIGH_PRECISION, check_dtype
from .partitioning import RowRule

__all__ = [
    "is_softmax_kernel_available",
    "jax_scaled_masked_softmax",
    "jax_scaled_softmax",
    "jax_scaled_upper_triang_masked_softmax",
    "scaled_aligned_causal_masked_softmax_bwd",
    "scaled_aligned_causal_masked_softmax_fwd",
    "scaled_masked_softmax_bwd",
    "scaled_masked_softmax_fwd",
    "scaled_softmax_bwd",
    "scaled_softmax_fwd",
    "scaled_upper_triang_masked_softmax_bwd",
    "scaled_upper_triang_masked_softmax_fwd",
]

_F32 = jnp.float32
_RANK = {"scaled": 4, "scaled_masked": 4, "scaled_upper_triang_masked": 3,
         "scaled_aligned_causal_masked": 4}


def _causal_keep(sq, sk, aligned):
    i = jnp.arange(sq)[:, None]
    j = jnp.arange(sk)[None, :]
    return j <= i + (sk - sq) if aligned else j <= i


def _softmax32(logits, keep, offset=None):
    """Softmax over the kept positions; `offset` (a sink: TE's softmax_offset, broadcast to
    [..., 1]) joins the row max and adds exp(offset - max) to the denominator only."""
    m = jnp.max(jnp.where(keep, logits, -jnp.inf), axis=-1, keepdims=True)
    if offset is not None:
        m = jnp.maximum(m, offset)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.where(keep, jnp.exp(logits - m), 0.0)
    s = jnp.sum(e, axis=-1, keepdims=True)
    if offset is not None:
        s = s + jnp.exp(offset - m)
    return jnp.where(s > 0, e / jnp.where(s > 0, s, 1.0), 0.0)


def _jax_fwd(variant, x, mask, scale, offset=None):
    logits = x.astype(_F32) * jnp.float32(scale)
    sq, sk = x.shape[-2], x.shape[-1]
    if variant == "scaled":
        keep = jnp.ones_like(logits, dtype=bool)
    elif variant == "scaled_masked":
        keep = jnp.broadcast_to(mask == 0, logits.shape)
    else:
        keep = jnp.broadcast_to(
            _causal_keep(sq, sk, variant == "scaled_aligned_causal_masked"), logits.shape)
    if offset is not None:
        offset = jnp.asarray(offset, _F32)
    return _softmax32(logits, keep, offset).astype(x.dtype)


def _jax_bwd(dy, y, scale):
    dy32, y32 = dy.astype(_F32), y.astype(_F32)
    dx = y32 * (dy32 - jnp.sum(dy32 * y32, axis=-1, keepdims=True)) * jnp.float32(scale)
    return dx.astype(y.dtype)


# TE-JAX's pure-JAX references (its tests compare the kernels with them). softmax_offset: the
# attention-sink term (a scalar or an array broadcastable to [..., 1], e.g. [1, h, 1, 1]).
def jax_scaled_softmax(logits, scale_factor, softmax_offset=None):
    return _jax_fwd("scaled", logits, None, scale_factor, softmax_offset)


def jax_scaled_masked_softmax(logits, mask, scale_factor, softmax_offset=None):
    return _jax_fwd("scaled_masked", logits, mask, scale_factor, softmax_offset)


def jax_scaled_upper_triang_masked_softmax(logits, scale_factor, softmax_offset=None):
    return _jax_fwd("scaled_upper_triang_masked", logits, None, scale_factor, softmax_offset)


def _check_x(op, variant, x):
    check_dtype(op, "x", x.dtype, (jnp.float16, jnp.bfloat16, jnp.float32))
    if len(x.shape) != _RANK[variant]:
        raise ValueError(f"te_lite::{op}: argument 'x': expected a {_RANK[variant]}-D array, got "
                         f"shape {tuple(x.shape)}")
    if variant == "scaled_upper_triang_masked" and x.shape[-1] != x.shape[-2]:
        raise ValueError(f"te_lite::{op}: argument 'x': expected sq == sk, got shape "
                         f"{tuple(x.shape)}")


def _make(variant):
    fwd_name, bwd_name = f"{variant}_softmax_fwd", f"{variant}_softmax_bwd"
    masked = variant == "scaled_masked"

    def fwd_abstract(x, *rest, scale):
        _check_x(fwd_name, variant, x)
        if masked:
            (mask,) = rest
            check_dtype(fwd_name, "mask", mask.dtype, (jnp.bool_, jnp.uint8))
            b, _, sq, sk = x.shape
            if (len(mask.shape) != 4 or mask.shape[0] not in (1, b) or mask.shape[1] != 1
                    or tuple(mask.shape[2:]) != (sq, sk)):
                raise ValueError(f"te_lite::{fwd_name}: argument 'mask': expected shape "
                                 f"[{b} or 1, 1, {sq}, {sk}], got {tuple(mask.shape)}")
        return (jax.ShapeDtypeStruct(x.shape, x.dtype),)

    def bwd_abstract(dy, y, *, scale):
        _check_x(bwd_name, variant, y)
        if tuple(dy.shape) != tuple(y.shape) or np.dtype(dy.dtype) != np.dtype(y.dtype):
            raise ValueError(f"te_lite::{bwd_name}: argument 'dy': expected {tuple(y.shape)} "
                             f"{np.dtype(y.dtype).name} (y's), got {tuple(dy.shape)} "
                             f"{np.dtype(dy.dtype).name}")
        return (jax.ShapeDtypeStruct(y.shape, y.dtype),)

    if masked:
        ref = lambda x, mask, scale: (_jax_fwd(variant, x, mask, scale),)
        roles = ("x", "lead0")
    else:
        ref = lambda x, scale: (_jax_fwd(variant, x, None, scale),)
        roles = ("x",)
    camel = "".join(p.capitalize() for p in variant.split("_"))
    fwd = FFIOp(f"{camel}SoftmaxFwdPrimitive", f"te_lite_{fwd_name}_ffi", fwd_abstract, ref,
                row_args=(0,) if not masked else (), partition=RowRule(roles, ("x",), trailing=2),
                fold_rows=True)
    bwd = FFIOp(f"{camel}SoftmaxBwdPrimitive", f"te_lite_{bwd_name}_ffi", bwd_abstract,
                lambda dy, y, scale: (_jax_bwd(dy, y, scale),), row_args=(0, 1),
                partition=RowRule(("x", "x"), ("x",), trailing=2), fold_rows=True)
    return fwd, bwd


_PRIMS = {v: _make(v) for v in _RANK}


def scaled_softmax_fwd(logits, scale_factor):
    return _PRIMS["scaled"][0](logits, scale=float(scale_factor))[0]


# The backward wrappers take TE-JAX's arguments (dz, softmax_out, logits[, mask], scale_factor). TE
# reads `logits` (and `mask`) only in its unfused fallback; the kernels here always run, and the
# gradient needs only dz and softmax_out (masked positions have softmax_out == 0), so they are
# checked for shape and otherwise unused.
def _check_logits(op, logits, softmax_out):
    if logits is not None and tuple(logits.shape) != tuple(softmax_out.shape):
        raise ValueError(f"te_lite::{op}: argument 'logits': expected shape "
                         f"{tuple(softmax_out.shape)} (softmax_out's), got {tuple(logits.shape)}")


def scaled_softmax_bwd(dz, softmax_out, logits, scale_factor):
    _check_logits("scaled_softmax_bwd", logits, softmax_out)
    return _PRIMS["scaled"][1](dz, softmax_out, scale=float(scale_factor))[0]


def scaled_masked_softmax_fwd(logits, mask, scale_factor):
    return _PRIMS["scaled_masked"][0](logits, mask, scale=float(scale_factor))[0]


def scaled_masked_softmax_bwd(dz, softmax_out, logits, mask, scale_factor):
    del mask  # softmax_out is 0 where the mask was set: the formula gives 0 there
    _check_logits("scaled_masked_softmax_bwd", logits, softmax_out)
    return _PRIMS["scaled_masked"][1](dz, softmax_out, scale=float(scale_factor))[0]


# Upper-triangular (causal, sq == sk): TE's C API shape is [attn_batches, sq, sq]; TE-JAX passes
# [b, h, sq, sq]. A 4-D input runs the aligned-causal kernel, which keeps the same prefix j <= i when
# sq == sk (the same row routine, so the same bits) and shards over b and h. Folding to [b*h, ...]
# instead would make XLA gather head-sharded inputs.
def _upper_triang_prim(op, x, fwd):
    if x.ndim == 4:
        if x.shape[-1] != x.shape[-2]:
            raise ValueError(f"te_lite::{op}: argument 'logits': expected sq == sk, got shape "
                             f"{tuple(x.shape)}")
        return _PRIMS["scaled_aligned_causal_masked"][0 if fwd else 1]
    return _PRIMS["scaled_upper_triang_masked"][0 if fwd else 1]


def scaled_upper_triang_masked_softmax_fwd(logits, scale_factor):
    prim = _upper_triang_prim("scaled_upper_triang_masked_softmax_fwd", logits, True)
    return prim(logits, scale=float(scale_factor))[0]


def scaled_upper_triang_masked_softmax_bwd(dz, softmax_out, logits, scale_factor):
    op = "scaled_upper_triang_masked_softmax_bwd"
    _check_logits(op, logits, softmax_out)
    prim = _upper_triang_prim(op, softmax_out, False)
    return prim(dz, softmax_out, scale=float(scale_factor))[0]


def scaled_aligned_causal_masked_softmax_fwd(logits, scale_factor):
    return _PRIMS["scaled_aligned_causal_masked"][0](logits, scale=float(scale_factor))[0]


def scaled_aligned_causal_masked_softmax_bwd(dz, softmax_out, logits, scale_factor):
    _check_logits("scaled_aligned_causal_masked_softmax_bwd", logits, softmax_out)
    return _PRIMS["scaled_aligned_causal_masked"][1](dz, softmax_out, scale=float(scale_factor))[0]


def is_softmax_kernel_available(softmax_fusion_type, *args):
    """TE-JAX's query, in TE's current form (softmax_fusion_type, softmax_type, batch, heads,
    q_seqlen, k_seqlen, dtype) or TE 2.8's without softmax_type. The CPU kernels take any shape and
    fp32/fp16/bf16; only the vanilla softmax is fused (off-by-one / learnable sinks are not), as in TE.
    """
    from .attention import AttnSoftmaxType

    if len(args) == 6:
        softmax_type, _, _, q_seqlen, k_seqlen, dtype = args
    elif len(args) == 5:
        softmax_type, (_, _, q_seqlen, k_seqlen, dtype) = AttnSoftmaxType.VANILLA_SOFTMAX, args
    else:
        raise TypeError("is_softmax_kernel_available: expected (softmax_fusion_type, softmax_type, "
                        f"batch, heads, q_seqlen, k_seqlen, dtype), got {1 + len(args)} arguments")
    if isinstance(softmax_type, str):
        softmax_type = AttnSoftmaxType.from_str(softmax_type)
    if softmax_type is not AttnSoftmaxType.VANILLA_SOFTMAX:
        return False
    # The causal (upper-triangular) kernel is square: query i sees keys 0..i of the same length.
    if getattr(softmax_fusion_type, "name", None) == "SCALED_UPPER_TRIANG_MASKED" \
            and q_seqlen != k_seqlen:
        return False
    return np.dtype(dtype) in (np.dtype(d) for d in HIGH_PRECISION)
