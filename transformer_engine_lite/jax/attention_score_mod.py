"""TE-JAX's argument rules for `fused_attn(..., score_mod=...)`.

TE runs score_mod through a cuDNN-frontend graph that this library does not have, so a valid
score_mod call ends in NotImplementedError (attention.py). The combinations TE itself refuses are
refused first, as TE does, with ValueError: a caller (or TE's test
test_fused_attn_score_mod_rejects_masks_before_cudnn_frontend) then learns that the call is wrong,
not merely unsupported here. The rules, in TE's order: the BSHD_BSHD_BSHD layout with separate
rank-4 FP16/BF16 q, k, v of matching batch / key-value shapes, and none of bias, sequence
descriptor, dropout seed, mask, non-vanilla softmax, dropout, packed sequences, sliding window or
context parallelism.
"""

from __future__ import annotations

from enum import Enum

import jax.numpy as jnp

__all__ = ["check_score_mod_args"]

_HEADER = "fused_attn: score_mod"


def _name(value) -> str:
    """Enum member name, or the string as given (TE's API takes either)."""
    return value.name if isinstance(value, Enum) else str(value)


def _refuse(what: str) -> None:
    raise ValueError(f"{_HEADER}: {what}")


def check_score_mod_args(qkv, bias, sequence_descriptor, seed, attn_bias_type, attn_mask_type,
                         qkv_layout, softmax_type, dropout_probability, max_segments_per_seq,
                         window_size, context_parallel_strategy,
                         context_parallel_causal_load_balanced, context_parallel_axis,
                         softmax_offset, stripe_size) -> None:
    """ValueError naming the first argument TE's score_mod path refuses; None when TE accepts."""
    if _name(qkv_layout).upper() != "BSHD_BSHD_BSHD":
        _refuse(f"expected qkv_layout BSHD_BSHD_BSHD, got {_name(qkv_layout)}")
    qkv = tuple(qkv) if isinstance(qkv, (tuple, list)) else (qkv,)
    if len(qkv) != 3:
        _refuse(f"expected separate query, key and value tensors, got {len(qkv)} array(s)")
    if any(len(t.shape) != 4 for t in qkv):
        _refuse(f"expected rank-4 BSHD query/key/value, got shapes {[tuple(t.shape) for t in qkv]}")
    q, k, v = qkv
    if not q.dtype == k.dtype == v.dtype:
        _refuse(f"expected query, key and value of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in (jnp.float16, jnp.bfloat16):
        _refuse(f"expected FP16/BF16 query, key and value, got {q.dtype}")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        _refuse(f"expected matching batch dimensions, got {q.shape[0]}, {k.shape[0]}, "
                f"{v.shape[0]}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        _refuse(f"expected key and value of matching sequence length and head count, got "
                f"{tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[3] != k.shape[3]:
        _refuse(f"expected query/key head dimensions to match, got {q.shape[3]} and {k.shape[3]}")
    # The phrases "is mutually exclusive with ..." are TE's: its tests match them.
    if bias is not None or _name(attn_bias_type).upper() != "NO_BIAS":
        _refuse("is mutually exclusive with attention bias")
    if sequence_descriptor is not None:
        _refuse("is mutually exclusive with padding/sequence descriptors")
    if seed is not None:
        _refuse("is mutually exclusive with dropout seed")
    if _name(attn_mask_type).upper() != "NO_MASK":
        _refuse(f"is mutually exclusive with attention masks (got {_name(attn_mask_type)})")
    if _name(softmax_type).upper() not in ("VANILLA_SOFTMAX", "VANILLA") or \
            softmax_offset is not None:
        _refuse("only supports vanilla softmax without softmax_offset")
    if float(dropout_probability) != 0.0:
        _refuse(f"is mutually exclusive with dropout (got {dropout_probability})")
    if max_segments_per_seq != 1:
        _refuse(f"is mutually exclusive with packed/ragged sequence metadata "
                f"(max_segments_per_seq={max_segments_per_seq})")
    if window_size is not None and tuple(window_size) != (-1, -1):
        _refuse(f"is mutually exclusive with sliding-window attention (got {window_size})")
    if _name(context_parallel_strategy).upper() != "DEFAULT" or \
            context_parallel_causal_load_balanced or context_parallel_axis:
        _refuse("is mutually exclusive with context parallelism")
    if stripe_size is not None:
        _refuse("is mutually exclusive with striped context parallelism")
