"""TE-JAX's public mask helpers of `transformer_engine.jax.attention` (re-exported there):
`make_swa_mask` and `run_length_fill`, pure JAX over segment ids and positions. Kept apart so the
attention entry points' module stays small."""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["make_swa_mask", "run_length_fill"]


def _run_lengths(segment_ids):
    """Per token, the length of the run of equal consecutive segment ids it sits in."""
    ids = jnp.asarray(segment_ids)
    starts = jnp.concatenate([jnp.ones_like(ids[..., :1], bool), ids[..., 1:] != ids[..., :-1]], -1)
    run = jnp.cumsum(starts, axis=-1)
    return jnp.sum(run[..., :, None] == run[..., None, :], axis=-1)


def run_length_fill(segment_ids) -> jnp.ndarray:
    """TE-JAX's helper: per token, the length of its run of equal consecutive segment ids, 0 on
    padding (id 0); the shape is kept ([[1 1 2 2 2 0 3]] -> [[2 2 3 3 3 0 1]])."""
    ids = jnp.asarray(segment_ids)
    return jnp.where(ids == 0, 0, _run_lengths(ids)).astype(ids.dtype)


def make_swa_mask(segment_pos_q, segment_pos_kv, window_size=None, dtype=jnp.float32,
                  segment_ids_q=None, segment_ids_kv=None):
    """Sliding-window mask [..., 1, sq, skv] (1 = attend), TE-JAX's helper.

    Query at position i attends keys j with i - left <= j <= i + right (a negative or absent bound
    is unbounded). With both segment-id arrays, positions are aligned bottom-right per segment
    (query i of a run of length Lq against key j of a run of length Lkv sits on the diagonal
    j = i + Lkv - Lq), the alignment of the *_bottom_right causal masks."""
    if window_size is None:
        left = right = -1
    else:
        if len(window_size) != 2:
            raise ValueError(f"make_swa_mask: window_size: expected (left, right), got "
                             f"{window_size!r}")
        left, right = int(window_size[0]), int(window_size[1])
    if (segment_ids_q is None) != (segment_ids_kv is None):
        raise ValueError("make_swa_mask: segment_ids_q and segment_ids_kv: expected both or "
                         "neither, got only one")
    pos_q = jnp.asarray(segment_pos_q)[..., :, None]
    pos_kv = jnp.asarray(segment_pos_kv)[..., None, :]
    if segment_ids_q is not None:
        # Shift the query onto the bottom-right diagonal of its segment pair.
        pos_q = pos_q + (_run_lengths(segment_ids_kv)[..., None, :]
                         - _run_lengths(segment_ids_q)[..., :, None])
    ok = jnp.ones(jnp.broadcast_shapes(pos_q.shape, pos_kv.shape), bool)
    if left >= 0:
        ok = ok & (pos_kv >= pos_q - left)
    if right >= 0:
        ok = ok & (pos_kv <= pos_q + right)
    return ok[..., None, :, :].astype(dtype)
