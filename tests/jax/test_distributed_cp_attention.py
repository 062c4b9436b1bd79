"""Context parallelism of fused_attn (cpp_extensions/attention_cp.py) on 8 host devices: the
sequence sharded over a "cp" mesh axis (cp = 2, 4, 8; with dp and tp), CPStrategy ALL_GATHER /
RING / DEFAULT, with and without causal load balancing (inputs reordered with
reorder_causal_load_balancing, outputs and gradients reordered back), masks no_mask / causal,
layouts bshd_bs2hd / bshd_bshd_bshd, GQA: output and dq / dk / dv equal the one-device fused_attn
within the suites' tolerance table. Also the reorder helpers, the ring's scan-loop form, the Flax
module's CP fields, and the refusals.

Run: XLA_FLAGS=--xla_force_host_platform_device_count=8 OMP_NUM_THREADS=1 \
         python -m pytest -q tests/jax/test_distributed_cp_attention.py
"""

from __future__ import annotations

import re

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
B, S, H, D = 2, 32, 4, 16
# mesh name -> (dp, cp, tp)
MESHES = {"cp2": (1, 2, 1), "dp2_cp4": (2, 4, 1), "dp2_cp2_tp2": (2, 2, 2), "cp8": (1, 8, 1),
          "dp2_cp1_tp4": (2, 1, 4)}
RESOURCE = te.MeshResource(dp_resource="dp", cp_resource="cp", tpsp_resource="tp")


def _mesh(name):
    dp, cp, tp = MESHES[name]
    devices = np.array(jax.devices()[:dp * cp * tp]).reshape(dp, cp, tp)
    return Mesh(devices, ("dp", "cp", "tp"))


def _rand(key, shape, dtype):
    return jax.random.normal(jax.random.PRNGKey(key), shape, F32).astype(dtype)


def _inputs(h_kv, dtype, s=S):
    return (_rand(1, (B, s, H, D), dtype), _rand(2, (B, s, h_kv, D), dtype),
            _rand(3, (B, s, h_kv, D), dtype), _rand(4, (B, s, H, D), F32))


def _attn(layout, mask, **cp):
    def run(q, k, v):
        qkv = (q, k, v) if layout == "bshd_bshd_bshd" else (q, jnp.stack([k, v], axis=2))
        return A.fused_attn(qkv, None, None, None, "no_bias", mask, layout, "vanilla", 0.25, 0.0,
                            True, **cp)

    def fn(q, k, v, dy):  # output and (dq, dk, dv) of sum(out * dy)
        loss = lambda q, k, v: jnp.sum(run(q, k, v).astype(F32) * dy)
        return run(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    return fn


def _run_cp(fn, args, mesh_name, balanced, resource=RESOURCE, spec=("dp", "cp", "tp", None)):
    """fn on `args` (contiguous order) sequence-sharded over cp; results back in contiguous
    order. Returns (results, jitted fn, placed args)."""
    mesh = _mesh(mesh_name)
    cp = mesh.shape["cp"]
    fwd = (lambda x: reorder_causal_load_balancing(x, ReorderStrategy.DualChunkSwap, cp, 1)) \
        if balanced else (lambda x: x)
    back = (lambda x: inverse_reorder_causal_load_balancing(
        x, ReorderStrategy.DualChunkSwap, cp, 1)) if balanced else (lambda x: x)
    sharding = NamedSharding(mesh, P(*spec))
    f = jax.jit(fn)
    with jax.set_mesh(mesh), te.sharding.global_shard_guard(resource):
        placed = [jax.device_put(fwd(x), sharding) for x in args]
        out = f(*placed)
        hlo = f.lower(*placed).compile().as_text()
    return jax.tree.map(back, out), hlo


def _assert_close(got, want, what):
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}[{i}]: {g.dtype} {g.shape}"
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                                   err_msg=f"{what}[{i}]", **tols(w.dtype))


def _ops(hlo, name):
    return len(re.findall(rf"= \S+ {name}(?:-start)?\(", hlo))


# ----------------------------------------------------------------------------- numerics
CASES = [(s, lb, m, lay) for s in ("ALL_GATHER", "RING") for lb in (False, True)
         for m in ("causal", "no_mask") for lay in ("bshd_bs2hd", "bshd_bshd_bshd")]


@pytest.mark.parametrize("mesh_name", ["cp2", "dp2_cp4", "dp2_cp2_tp2"])
@pytest.mark.parametrize("strategy,balanced,mask,layout", CASES,
                         ids=["-".join(map(str, c)) for c in CASES])
def test_cp_equals_one_device(mesh_name, strategy, balanced, mask, layout):
    """fp32, GQA (2 kv heads for 4 query heads): every strategy x balancing x mask x layout."""
    args = _inputs(2, F32)
    ref = jax.jit(_attn(layout, mask))(*args)
    fn = _attn(layout, mask, context_parallel_strategy=getattr(CPStrategy, strategy),
               context_parallel_causal_load_balanced=balanced)
    got, hlo = _run_cp(fn, args, mesh_name, balanced)
    _assert_close(got, ref, f"{strategy} lb={balanced} {mask} {layout} {mesh_name}")
    # the CP form ran: ring moves kv blocks, all-gather gathers them
    if strategy == "RING":
        assert _ops(hlo, "collective-permute") > 0, "ring attention without collective-permute"
    else:
        assert _ops(hlo, "all-gather") > 0 and _ops(hlo, "reduce-scatter") > 0


@pytest.mark.parametrize("strategy", ["DEFAULT", "RING"])
@pytest.mark.parametrize("balanced", [False, True])
def test_cp_bf16_cp8(strategy, balanced):
    """TE's dtype (bf16), cp = 8, MQA (1 kv head), causal: within the bf16 tolerances."""
    args = _inputs(1, BF16, s=64)
    ref = jax.jit(_attn("bshd_bshd_bshd", "causal"))(*args)
    fn = _attn("bshd_bshd_bshd", "causal", context_parallel_strategy=strategy,
               context_parallel_causal_load_balanced=balanced)
    got, _ = _run_cp(fn, args, "cp8", balanced)
    _assert_close(got, ref, f"bf16 {strategy} lb={balanced}")


@pytest.mark.parametrize("balanced", [False, True])
def test_ring_scan_loop(balanced, monkeypatch):
    """NVTE_FUSED_RING_ATTENTION_USE_SCAN=1: the ring steps in a fori_loop, same results."""
    monkeypatch.setenv("NVTE_FUSED_RING_ATTENTION_USE_SCAN", "1")
    args = _inputs(2, F32)
    ref = jax.jit(_attn("bshd_bshd_bshd", "causal"))(*args)
    fn = _attn("bshd_bshd_bshd", "causal", context_parallel_strategy=CPStrategy.RING,
               context_parallel_causal_load_balanced=balanced)
    got, hlo = _run_cp(fn, args, "dp2_cp4", balanced)
    _assert_close(got, ref, f"scan lb={balanced}")
    assert "while" in hlo, "the scan form compiled without a loop"


def test_explicit_axis_without_mesh_resource():
    """context_parallel_axis names the axis when no MeshResource is set (batch and heads are
    then replicated inside the CP region)."""
    args = _inputs(4, F32)
    ref = jax.jit(_attn("bshd_bs2hd", "causal"))(*args)
    fn = _attn("bshd_bs2hd", "causal", context_parallel_strategy="RING",
               context_parallel_causal_load_balanced=True, context_parallel_axis="cp")
    got, hlo = _run_cp(fn, args, "dp2_cp4", True, resource=None)
    _assert_close(got, ref, "explicit axis")
    assert _ops(hlo, "collective-permute") > 0


def test_no_mesh_or_cp1_is_plain_attention():
    """Without a mesh, or with a cp axis of one device, the CP options change nothing (TE)."""
    args = _inputs(2, F32)
    ref = jax.jit(_attn("bshd_bshd_bshd", "causal"))(*args)
    fn = _attn("bshd_bshd_bshd", "causal", context_parallel_strategy=CPStrategy.RING,
               context_parallel_causal_load_balanced=True, context_parallel_axis="cp")
    _assert_close(jax.jit(fn)(*args), ref, "no mesh")
    got, hlo = _run_cp(fn, args, "dp2_cp1_tp4", False, spec=("dp", None, None, None))
    _assert_close(got, ref, "cp = 1")
    assert _ops(hlo, "collective-permute") == 0


# ----------------------------------------------------------------------------- flax
@pytest.mark.parametrize("strategy", ["all_gather", "ring"])
def test_flax_dot_product_attention_cp(strategy):
    """te_flax.DotProductAttention's context_parallel_* fields reach fused_attn."""
    import transformer_engine_lite.jax.flax as te_flax

    dpa = te_flax.DotProductAttention(head_dim=D, num_attention_heads=H, num_gqa_groups=2,
                                      attn_mask_type="causal", transpose_batch_sequence=False,
                                      context_parallel_strategy=strategy,
                                      context_parallel_causal_load_balanced=True)
    plain = te_flax.DotProductAttention(head_dim=D, num_attention_heads=H, num_gqa_groups=2,
                                        attn_mask_type="causal", transpose_batch_sequence=False)

    def fn(module):
        def f(q, k, v, dy):
            loss = lambda q, k, v: jnp.sum(module.apply({}, q, k, v).astype(F32) * dy)
            return module.apply({}, q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
        return f

    args = _inputs(2, F32)
    ref = jax.jit(fn(plain))(*args)
    got, hlo = _run_cp(fn(dpa), args, "dp2_cp4", True)
    _assert_close(got, ref, f"flax {strategy}")
    assert _ops(hlo, "collective-permute" if strategy == "ring" else "all-gather") > 0


# ----------------------------------------------------------------------------- reorder
@pytest.mark.parametrize("cp", [1, 2, 4, 8])
@pytest.mark.parametrize("seq_dim", [0, 1])
@pytest.mark.parametrize("strategy,stripe", [(ReorderStrategy.DualChunkSwap, None),
                                             (ReorderStrategy.Striped, None),
                                             (ReorderStrategy.Striped, 2)])
def test_reorder_round_trip(cp, seq_dim, strategy, stripe):
    x = _rand(5, (3, 32, 2, 4), BF16)
    x = jnp.swapaxes(x, 0, 1) if seq_dim == 0 else x
    y = jax.jit(reorder_causal_load_balancing, static_argnums=(1, 2, 3, 4))(
        x, strategy, cp, seq_dim, stripe)
    back = jax.jit(inverse_reorder_causal_load_balancing, static_argnums=(1, 2, 3, 4))(
        y, strategy, cp, seq_dim, stripe)
    np.testing.assert_array_equal(np.asarray(back, np.float32), np.asarray(x, np.float32))


def test_reorder_layouts():
    """DualChunkSwap: 2 cp chunks, rank r holds chunks r and 2cp-1-r; Striped: round robin."""
    t = jnp.arange(16)
    got = reorder_causal_load_balancing(t, ReorderStrategy.DualChunkSwap, 4, 0)
    assert got.tolist() == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    got = reorder_causal_load_balancing(t, ReorderStrategy.Striped, 4, 0)
    assert got.tolist() == [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15]
    got = reorder_causal_load_balancing(t, ReorderStrategy.Striped, 2, 0, 2)
    assert got.tolist() == [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]


@pytest.mark.parametrize("args,match", [
    ((ReorderStrategy.DualChunkSwap, 3, 1, None), "even cp_size"),
    ((ReorderStrategy.DualChunkSwap, 4, 1, None), "multiple of 2 \\* cp_size = 8"),
    ((ReorderStrategy.DualChunkSwap, 2, 1, 4), "'stripe_size'"),
    ((ReorderStrategy.Striped, 2, 1, 0), "'stripe_size'"),
    ((ReorderStrategy.Striped, 4, 1, 4), "cp_size \\* stripe_size = 16"),
    (("dual", 2, 1, None), "'strategy'"),
    ((ReorderStrategy.Striped, 2, 3, None), "'seq_dim'"),
])
def test_reorder_errors(args, match):
    with pytest.raises(ValueError, match=match):
        reorder_causal_load_balancing(jnp.zeros((2, 12, 2)), *args)


# ----------------------------------------------------------------------------- refusals
def _refused(mesh_name="dp2_cp4", layout="bshd_bshd_bshd", mask="causal", s=S, **kw):
    q, k, v, _ = _inputs(2, BF16, s=s)
    qkv = {"bshd_bshd_bshd": (q, k, v), "bshd_bs2hd": (q, jnp.stack([k, v], 2)),
           "bs3hd": (jnp.stack([q, q, q], 2),), "thd_thd_thd": (q, k, v)}[layout]
    call = dict(bias=None, desc=None, seed=None, bias_type="no_bias", softmax="vanilla",
                dropout=0.0)
    call.update({n: kw.pop(n) for n in list(call) if n in kw})
    with jax.set_mesh(_mesh(mesh_name)), te.sharding.global_shard_guard(RESOURCE):
        return A.fused_attn(qkv, call["bias"], call["desc"], call["seed"], call["bias_type"],
                            mask, layout, call["softmax"], 0.25, call["dropout"], True,
                            **{"context_parallel_strategy": "RING", **kw})


def _ids(s):
    return jnp.ones((B, s), jnp.int32)


REFUSALS = [
    ("bs3hd", ValueError, "'qkv_layout'.*bs3hd", {"layout": "bs3hd"}),
    ("thd-ring-stripe", ValueError, "'stripe_size': CPStrategy.RING on thd layouts", {
        "layout": "thd_thd_thd", "mask": "padding_causal", "stripe_size": 4,
        "context_parallel_causal_load_balanced": True,
        "desc": A.SequenceDescriptor.from_segment_ids_and_pos(_ids(S), jnp.zeros((B, S),
                                                                                  jnp.int32))}),
    ("bias", ValueError, "'attn_bias_type'", {"bias_type": "post_scale_bias",
                                               "bias": jnp.zeros((1, H, S, S), BF16)}),
    ("padding", ValueError, "'attn_mask_type'", {
        "mask": "padding", "desc": A.SequenceDescriptor.from_seqlens(jnp.full((B,), S))}),
    ("bottom-right", ValueError, "'attn_mask_type'", {"mask": "causal_bottom_right"}),
    ("dropout", ValueError, "'dropout_probability'", {"dropout": 0.1,
                                                       "seed": jax.random.PRNGKey(0)}),
    ("sink", ValueError, "'softmax_type'", {"softmax": "off_by_one"}),
    ("window", ValueError, "'window_size'", {"window_size": (4, 0)}),
    ("seq-not-divisible", ValueError, "s_q = 20 must be a multiple of 8", {
        "s": 20, "context_parallel_causal_load_balanced": True}),
    ("axis-not-in-mesh", ValueError, "'context_parallel_axis'", {"context_parallel_axis": "sp"}),
    ("strategy-unknown", ValueError, "'context_parallel_strategy'",
     {"context_parallel_strategy": "spiral"}),
]


@pytest.mark.parametrize("exc,match,kw", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_cp_refusals(exc, match, kw):
    with pytest.raises(exc, match=match):
        _refused(**kw)


def test_cp_odd_size_load_balanced_refused():
    mesh = Mesh(np.array(jax.devices()[:3]).reshape(1, 3, 1), ("dp", "cp", "tp"))
    q = _rand(1, (B, 24, H, D), BF16)
    with jax.set_mesh(mesh), te.sharding.global_shard_guard(RESOURCE):
        with pytest.raises(ValueError, match="even CP size, got 3"):
            A.fused_attn((q, q, q), None, None, None, "no_bias", "causal", "bshd_bshd_bshd",
                         "vanilla", 0.25, 0.0, True, context_parallel_causal_load_balanced=True)


def test_cp_needs_flash(monkeypatch):
    """Every CP step is a flash kernel: with flash switched off, NotImplementedError; and
    unfused_attn has no CP form."""
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")
    with pytest.raises(NotImplementedError, match="unfused"):
        _refused()
    monkeypatch.delenv("NVTE_FLASH_ATTN")
    q = _rand(1, (B, S, H, D), BF16)
    with jax.set_mesh(_mesh("cp2")), te.sharding.global_shard_guard(RESOURCE):
        with pytest.raises(NotImplementedError, match="unfused_attn"):
            A.unfused_attn((q, q, q), None, None, None, "no_bias", "causal", "bshd_bshd_bshd",
                           "vanilla", 0.25, 0.0, True, context_parallel_strategy="RING")
