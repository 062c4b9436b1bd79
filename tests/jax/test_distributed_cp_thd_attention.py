"""Context parallelism of fused_attn on thd layouts (cpp_extensions/attention_cp_thd.py, TE's
striped all-gather; attention_cp_thd_ring.py, TE's striped ring) on 8 host devices: packed rows
of several sequences with padding inside and after them (segment ids, 0 = padding), put in the
striped order with
reorder_causal_load_balancing(..., Striped, cp, 1, stripe_size) and sequence-sharded over a "cp"
mesh axis (cp = 2, 4, 8; with dp and tp): output and dq / dk / dv equal the one-device thd
fused_attn (padding_causal, with and without a sliding window, GQA / MQA, thd_thd_thd and
thd_t2hd, stripe sizes 1 to 8 for the all-gather, 1 for the ring, unrolled and scanned) within
the suites' tolerance table. Also the refusals.

Run: XLA_FLAGS=--xla_force_host_platform_device_count=8 OMP_NUM_THREADS=1 \
         python -m pytest -q tests/jax/test_distributed_cp_thd_attention.py
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
from utils import require_host_devices  # noqa: E402

require_host_devices(8)

import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from utils import tols

import transformer_engine_lite.jax as te
from transformer_engine_lite.jax import attention as A
from transformer_engine_lite.jax.attention import (CPStrategy, ReorderStrategy,
                                                   inverse_reorder_causal_load_balancing,
                                                   reorder_causal_load_balancing)

F32, BF16 = jnp.float32, jnp.bfloat16
B, H, D = 2, 4, 16
MESHES = {"cp2": (1, 2, 1), "dp2_cp4": (2, 4, 1), "dp2_cp2_tp2": (2, 2, 2), "cp8": (1, 8, 1)}
RESOURCE = te.MeshResource(dp_resource="dp", cp_resource="cp", tpsp_resource="tp")


def _mesh(name):
    dp, cp, tp = MESHES[name]
    return Mesh(np.array(jax.devices()[:dp * cp * tp]).reshape(dp, cp, tp), ("dp", "cp", "tp"))


def _segments(s, seed):
    """(ids, pos) int32 [B, s]: up to 6 sequences per row of random lengths, each with a padded
    tail inside its slot (ids 0, positions running on, as TE's test generator), then padding."""
    rng = np.random.default_rng(seed)
    ids, pos = np.zeros((B, s), np.int32), np.zeros((B, s), np.int32)
    for b in range(B):
        cur, sid = 0, 1
        while cur < s and sid <= 6:
            n = min(int(rng.integers(1, s // 3 + 1)), s - cur)
            ids[b, cur:cur + int(rng.integers(1, n + 1))] = sid
            pos[b, cur:cur + n] = np.arange(n)
            cur, sid = cur + n, sid + 1
    return jnp.asarray(ids), jnp.asarray(pos)


def _attn(layout, window, **cp):
    def run(q, k, v, ids, pos):
        qkv = (q, k, v) if layout == "thd_thd_thd" else (q, jnp.stack([k, v], axis=2))
        desc = A.SequenceDescriptor.from_segment_ids_and_pos((ids, ids), (pos, pos))
        return A.fused_attn(qkv, None, desc, None, "no_bias", "padding_causal", layout,
                            "vanilla", 0.25, 0.0, True, max_segments_per_seq=8,
                            window_size=window, **cp)

    def fn(q, k, v, dy, ids, pos):  # output and (dq, dk, dv) of sum(out * dy)
        loss = lambda q, k, v: jnp.sum(run(q, k, v, ids, pos).astype(F32) * dy)
        return run(q, k, v, ids, pos), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    return fn


def _case(mesh_name, stripe, h_kv, dtype, s, layout="thd_thd_thd", window=None,
          strategy=CPStrategy.ALL_GATHER):
    mesh = _mesh(mesh_name)
    cp = mesh.shape["cp"]
    key = iter(jax.random.split(jax.random.PRNGKey(s + stripe), 4))
    rand = lambda shape: jax.random.normal(next(key), shape, F32).astype(dtype)
    args = (rand((B, s, H, D)), rand((B, s, h_kv, D)), rand((B, s, h_kv, D)),
            rand((B, s, H, D)).astype(F32), *_segments(s, s + stripe))
    ref = jax.jit(_attn(layout, window))(*args)
    fwd = lambda x: reorder_causal_load_balancing(x, ReorderStrategy.Striped, cp, 1, stripe)
    back = lambda x: inverse_reorder_causal_load_balancing(x, ReorderStrategy.Striped, cp, 1,
                                                           stripe)
    fn = jax.jit(_attn(layout, window, context_parallel_strategy=strategy,
                       context_parallel_causal_load_balanced=True, stripe_size=stripe))
    with jax.set_mesh(mesh), te.sharding.global_shard_guard(RESOURCE):
        spec = lambda x: P("dp", "cp") if x.ndim == 2 else P("dp", "cp", "tp")  # ids / tokens
        placed = [jax.device_put(fwd(x), NamedSharding(mesh, spec(x))) for x in args]
        got = fn(*placed)
        hlo = fn.lower(*placed).compile().as_text()
    got = jax.tree.map(back, got)
    what = (f"{strategy.name} {mesh_name} stripe={stripe} h_kv={h_kv} {dtype.__name__} {layout} "
            f"{window}")
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(ref))):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}[{i}]: {g.dtype} {g.shape}"
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   err_msg=f"{what}[{i}]", **tols(w.dtype))
    if strategy is CPStrategy.RING:  # k / v and their gradients went around the ring
        assert "collective-permute" in hlo and "reduce-scatter" not in hlo
    else:  # k / v gathered, their gradients reduce-scattered
        assert "all-gather" in hlo and "reduce-scatter" in hlo


# (mesh, stripe, h_kv, layout, window): fp32, s = 4 stripes per rank
CASES = [("cp2", 1, 2, "thd_thd_thd", None), ("cp2", 4, 4, "thd_t2hd", (3, 0)),
         ("dp2_cp4", 2, 2, "thd_thd_thd", (5, 0)), ("dp2_cp4", 8, 1, "thd_t2hd", None),
         ("dp2_cp2_tp2", 4, 2, "thd_thd_thd", None), ("dp2_cp2_tp2", 1, 2, "thd_t2hd", (2, 0))]


@pytest.mark.parametrize("mesh_name,stripe,h_kv,layout,window", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_thd_striped_allgather_equals_one_device(mesh_name, stripe, h_kv, layout, window):
    _case(mesh_name, stripe, h_kv, F32, 4 * MESHES[mesh_name][1] * stripe, layout, window)


@pytest.mark.parametrize("window", [None, (5, 0)])
def test_thd_striped_allgather_bf16_cp8(window):
    """TE's dtype (bf16), cp = 8, MQA, stripes of 4 (TE tests 64 / 128 at larger s)."""
    _case("cp8", 4, 1, BF16, 128, window=window)


# -- RING (TE's striped ring, stripe_size 1): (mesh, h_kv, layout, window), fp32, 16 tokens per
# rank; windows below cp make the block window -1 on some steps (those steps are skipped)
RING_CASES = [("cp2", 2, "thd_thd_thd", None), ("cp2", 4, "thd_t2hd", (3, 0)),
              ("dp2_cp4", 2, "thd_thd_thd", (2, 0)), ("dp2_cp4", 1, "thd_t2hd", None),
              ("dp2_cp2_tp2", 2, "thd_thd_thd", (9, 0)), ("cp8", 2, "thd_t2hd", (5, 0)),
              ("cp8", 4, "thd_thd_thd", (20, 0))]


@pytest.mark.parametrize("mesh_name,h_kv,layout,window", RING_CASES,
                         ids=["-".join(map(str, c)) for c in RING_CASES])
def test_thd_striped_ring_equals_one_device(mesh_name, h_kv, layout, window):
    _case(mesh_name, 1, h_kv, F32, 16 * MESHES[mesh_name][1], layout, window, CPStrategy.RING)


@pytest.mark.parametrize("window", [None, (20, 0)])
def test_thd_striped_ring_bf16_cp8(window):
    """TE's dtype (bf16), cp = 8, MQA, TE's window (20, 0)."""
    _case("cp8", 1, 1, BF16, 128, window=window, strategy=CPStrategy.RING)


@pytest.mark.parametrize("mesh_name", ["cp2", "dp2_cp4"])
def test_thd_striped_ring_scan(monkeypatch, mesh_name):
    """NVTE_FUSED_RING_ATTENTION_USE_SCAN=1: the ring steps in a fori_loop, same results."""
    monkeypatch.setenv("NVTE_FUSED_RING_ATTENTION_USE_SCAN", "1")
    _case(mesh_name, 1, 2, F32, 16 * MESHES[mesh_name][1], strategy=CPStrategy.RING)


def test_thd_striped_ring_scan_refuses_window(monkeypatch):
    """TE refuses a sliding window under the scan loop (ValueError), so do we."""
    monkeypatch.setenv("NVTE_FUSED_RING_ATTENTION_USE_SCAN", "1")
    with pytest.raises(ValueError, match="'window_size'.*USE_SCAN=1, got \\(4, 0\\)"):
        _call(context_parallel_strategy="RING", stripe_size=1, window_size=(4, 0))


# ----------------------------------------------------------------------------- refusals
def _call(mesh_name="cp2", layout="thd_thd_thd", s=16, desc="ids", **kw):
    q = jnp.ones((B, s, H, D), BF16)
    ids, pos = _segments(s, 0)
    desc = {"ids": A.SequenceDescriptor.from_segment_ids_and_pos(ids, pos),
            "offsets": A.SequenceDescriptor.from_seqlens_and_offsets(
                jnp.full((B, 1), s, jnp.int32), jnp.zeros((B, 2), jnp.int32))}[desc]
    mask = "padding_causal" if layout.startswith("t") else "causal"
    call = {"context_parallel_strategy": "ALL_GATHER",
            "context_parallel_causal_load_balanced": True, "stripe_size": 4, **kw}
    with jax.set_mesh(_mesh(mesh_name)), te.sharding.global_shard_guard(RESOURCE):
        return A.fused_attn((q, q, q), None, desc, None, "no_bias", mask, layout,
                            "vanilla", 0.25, 0.0, True, max_segments_per_seq=4, **call)


REFUSALS = [
    ("ring-stripe", ValueError, "'stripe_size': CPStrategy.RING on thd layouts takes stripes "
     "of 1", {"context_parallel_strategy": "RING"}),
    ("ring-unbalanced", ValueError, "'context_parallel_causal_load_balanced'",
     {"context_parallel_strategy": "RING", "context_parallel_causal_load_balanced": False,
      "stripe_size": 1}),
    ("unbalanced", ValueError, "'context_parallel_causal_load_balanced'",
     {"context_parallel_causal_load_balanced": False}),
    ("no-stripe", ValueError, "'stripe_size': expected a positive integer", {"stripe_size": None}),
    ("stripe-zero", ValueError, "'stripe_size'", {"stripe_size": 0}),
    ("not-divisible", ValueError, "cp_size \\* stripe_size = 2 \\* 16", {"stripe_size": 16}),
    ("bshd-stripe", ValueError, "'stripe_size': the striped layout is for thd",
     {"layout": "bshd_bshd_bshd"}),
    ("no-segment-ids", NotImplementedError, "from_segment_ids_and_pos", {"desc": "offsets"}),
]


@pytest.mark.parametrize("exc,match,kw", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_thd_cp_refusals(exc, match, kw):
    with pytest.raises(exc, match=match):
        _call(**kw)


def test_stripe_size_without_cp():
    """Without a CP axis: a thd call takes stripe_size (striped over one rank is the contiguous
    order: the same result), a bshd call refuses it, a bad value is a ValueError."""
    q = jax.random.normal(jax.random.PRNGKey(0), (B, 16, H, D), F32)
    ids, pos = _segments(16, 1)
    desc = A.SequenceDescriptor.from_segment_ids_and_pos(ids, pos)
    run = lambda layout, mask, d, **kw: A.fused_attn((q, q, q), None, d, None, "no_bias", mask,
                                                     layout, "vanilla", 0.25, 0.0, True,
                                                     max_segments_per_seq=8, **kw)
    np.testing.assert_array_equal(run("thd_thd_thd", "padding_causal", desc, stripe_size=4),
                                  run("thd_thd_thd", "padding_causal", desc))
    with pytest.raises(NotImplementedError, match="'stripe_size'.*needs a thd layout"):
        run("bshd_bshd_bshd", "causal", None, stripe_size=4)
    with pytest.raises(ValueError, match="'stripe_size': expected a positive integer"):
        run("thd_thd_thd", "padding_causal", desc, stripe_size=-2)
