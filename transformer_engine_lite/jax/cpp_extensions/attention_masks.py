"""The attention masks in JAX: the flash kernel's dropout keep mask (an FFI primitive drawing the
same Philox numbers, util/philox.h) and the mask rules of fused_attn.h as a broadcastable
predicate. Used by the pure-JAX attention reference and exported by cpp_extensions."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .base import FFIOp

__all__ = ["DropoutMaskPrimitive", "dropout_keep_mask", "keep_mask"]


def _err(op: str, arg: str, expected: str, got) -> ValueError:
    """The attention ops' argument error (attention.py's checks use it too)."""
    return ValueError(f"te_lite::{op}: argument '{arg}': expected {expected}, got {got}")


# ------------------------------------------------------------------------------------ dropout
def _mask_abstract(seed, *, b, h, s_q, s_kv, dropout):
    if not (seed.shape == (4,) and seed.dtype in (jnp.int32, jnp.uint32)):
        raise _err("fused_attn_dropout_mask", "seed", "int32 / uint32 [4]",
                   f"{seed.dtype} {tuple(seed.shape)}")
    return (jax.ShapeDtypeStruct((b, h, s_q, s_kv), jnp.uint8),)


def _mask_unavailable(*args, **params):
    raise NotImplementedError("te_lite::fused_attn_dropout_mask: the Philox keep mask has no "
                              "pure-JAX reference; enable FusedAttnDropoutMaskPrimitive")


DropoutMaskPrimitive = FFIOp("FusedAttnDropoutMaskPrimitive", "te_lite_fused_attn_dropout_mask_ffi",
                             _mask_abstract, _mask_unavailable)


def dropout_keep_mask(seed, b: int, h: int, s_q: int, s_kv: int, dropout: float):
    """bool [b, h, s_q, s_kv]: the logits the flash kernel keeps under dropout p with `seed`
    (int32 / uint32 [4] = {seed, offset} words): the same Philox draws (util/philox.h)."""
    (mask,) = DropoutMaskPrimitive(seed, b=int(b), h=int(h), s_q=int(s_q), s_kv=int(s_kv),
                                   dropout=float(dropout))
    return mask.astype(bool)


# ------------------------------------------------------------------------------------ masks
def keep_mask(mask_type: str, window, i, j, len_q, len_kv, same=None):
    """bool, True = key position j kept for query position i (fused_attn.h's rules), broadcast
    over the arguments: i, j positions within the sequence, len_q / len_kv the sequence lengths
    (or the padded sizes), `same` (thd) whether i and j are in the same segment. causal /
    padding_causal are top-left aligned, the other masks' windows bottom-right."""
    left, right = window
    if "causal" in mask_type:
        right = 0
    keep = (i < len_q) & (j < len_kv)
    if same is not None:
        keep = keep & same
    off = 0 if mask_type in ("causal", "padding_causal") else len_kv - len_q
    if left >= 0:
        keep = keep & (j >= i + off - left)
    if right >= 0:
        keep = keep & (j <= i + off + right)
    return keep
