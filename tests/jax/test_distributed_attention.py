"""Sharded == unsharded for attention (the fused primitives' custom_partitioning rule and the
functional fused_attn with its gradients) on 8 host devices: batch sharded (dp), heads sharded
(tp), both (dp x tp); every layout family, GQA, padding, thd, a broadcast bias (its gradient summed
over the batch shards). The HLO of the dp and tp cases has no all-gather: each device attends to
its own rows / heads.

Run: XLA_FLAGS=--xla_force_host_platform_device_count=8 OMP_NUM_THREADS=1 \
         python -m pytest -q tests/jax/test_distributed_attention.py
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
from utils import require_host_devices  # noqa: E402

require_host_devices(8)

import jax.numpy as jnp
from test_distributed import F32, RECIPES, all_gathers, assert_same, check, mesh_of, put, rand

from transformer_engine_lite.jax import attention as attn

BF16 = jnp.bfloat16
B, S, H, D = 8, 16, 8, 16
# (layout, h_kv, mask): h_kv = 4 is GQA (and still divides the 4-way tp axis)
CASES = [
    ("bshd_bshd_bshd", 4, "causal"),
    ("bshd_bshd_bshd", 8, "padding_causal"),
    ("bs3hd", 8, "causal"),
    ("bshd_bs2hd", 4, "padding"),
    ("thd_thd_thd", 8, "padding_causal"),
]
SPECS = {"dp": ("dp", None, None, None), "tp": (None, None, "tp", None),
         "dp_tp": ("dp", None, "tp", None)}


def _inputs(layout, h_kv, dtype=BF16):
    q = rand(1, (B, S, H, D), dtype)
    k, v = rand(2, (B, S, h_kv, D), dtype), rand(3, (B, S, h_kv, D), dtype)
    if layout == "bs3hd":
        return (jnp.stack([q, k, v], axis=2),)
    if layout == "bshd_bs2hd":
        return (q, jnp.stack([k, v], axis=2))
    return (q, k, v)


def _descriptor(layout):
    if layout.startswith("thd"):  # 2 segments and a gap in odd rows, one full segment in even
        ids = np.where(np.arange(B)[:, None] % 2 == 1,
                       np.array([1] * 5 + [2] * 7 + [0] * 4), np.ones(S, np.int64))
        ids = jnp.asarray(ids, jnp.int32)
        return attn.SequenceDescriptor.from_segment_ids_and_pos(ids, jnp.zeros_like(ids))
    lens = jnp.asarray([S, 3, 9, S, 1, 12, 16, 7], jnp.int32)
    return attn.SequenceDescriptor.from_seqlens((lens, lens[::-1]))


def _fn(layout, mask, bias_type="no_bias", dropout=0.0):
    sd = _descriptor(layout) if ("padding" in mask or layout.startswith("thd")) else None

    def loss(qkv, bias, dy):
        out = attn.fused_attn(qkv, bias, sd, jax.random.PRNGKey(7), bias_type, mask, layout,
                              "vanilla", 0.25, dropout, True, max_segments_per_seq=2)
        return jnp.sum(out.astype(F32) * dy), out

    def fn(*args):  # (*qkv, bias, dy): flat, so that each array gets its own sharding
        qkv, bias, dy = args[:-2], args[-2], args[-1]
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(qkv, bias, dy)
        return out, grads

    return fn


def _specs(qkv, spec):
    """Specs of the packed arrays: the pack dim (2) unsharded."""
    return [spec[:2] + (None,) + spec[2:] if x.ndim == 5 else spec for x in qkv]


@pytest.mark.parametrize("mesh_name", ["dp", "tp", "dp_tp"])
@pytest.mark.parametrize("layout,h_kv,mask", CASES)
def test_fused_attn_sharded(mesh_name, layout, h_kv, mask):
    if mesh_name == "tp" and h_kv % 8:
        pytest.skip("8-way head sharding needs h_kv divisible by 8")
    mesh = mesh_of(mesh_name)
    qkv = _inputs(layout, h_kv)
    dy = rand(4, (B, S, H, D), F32)
    spec = SPECS[mesh_name]
    f, args = check(_fn(layout, mask), (*qkv, None, dy), (*_specs(qkv, spec), None, spec),
                    mesh, f"{layout} {mask}")
    if mesh_name in ("dp", "tp"):
        gathers = all_gathers(f, args)
        assert not gathers, f"{layout} {mask} on {mesh_name}: all-gathers {gathers}"
    out = f(*args)[0]
    got = tuple(out.sharding.spec) + (None,) * 4
    assert (got[0], got[2]) == (spec[0], spec[2]), f"out stays sharded: {out.sharding.spec}"


@pytest.mark.parametrize("bias_shape", [(1, H, S, S), (B, 1, S, S), (B, H, S, S)])
def test_fused_attn_bias_sharded(bias_shape):
    """dbias of a bias broadcast over the sharded batch / heads is the sum over the shards."""
    mesh = mesh_of("dp_tp")
    qkv = _inputs("bshd_bshd_bshd", 8)
    bias = rand(5, bias_shape, BF16)
    dy = rand(4, (B, S, H, D), F32)
    spec = SPECS["dp_tp"]
    bias_spec = ("dp" if bias_shape[0] == B else None, "tp" if bias_shape[1] == H else None,
                 None, None)
    check(_fn("bshd_bshd_bshd", "causal", "post_scale_bias"), (*qkv, bias, dy),
          (*_specs(qkv, spec), bias_spec, spec), mesh, f"bias {bias_shape}")


def test_dropout_sharded_draws_per_shard():
    """Each batch shard folds its index into the Philox offset: identical rows on different
    shards get different masks; the same shard layout reproduces bit for bit."""
    mesh = mesh_of("dp")
    row = rand(1, (1, S, H, D), BF16)
    q = jnp.broadcast_to(row, (B, S, H, D))
    dy = jnp.ones((B, S, H, D), F32)
    f = jax.jit(_fn("bshd_bshd_bshd", "causal", dropout=0.3))
    args = (*(put(mesh, q, SPECS["dp"]),) * 3, None, put(mesh, dy, SPECS["dp"]))
    out1, _ = f(*args)
    out2, _ = f(*args)
    np.testing.assert_array_equal(np.asarray(out1, np.float32), np.asarray(out2, np.float32))
    o = np.asarray(out1, np.float32)
    assert not np.array_equal(o[0], o[1]), "two batch shards drew the same dropout mask"


# ----------------------------------------------------------------------------- Flax
@pytest.mark.parametrize("recipe", ["bf16", "current"])
def test_flax_transformer_layer(recipe):
    """te_flax.TransformerLayer (GQA self-attention, gated MLP) with TE's logical axes under
    MeshResource(dp, tp) on a 2 x 4 mesh: parameters TP-sharded by the rules, values and every
    gradient equal to the one-device run. Current scaling takes TE-JAX's AmaxScopes, so each
    dp / tp shard quantizes with its own scale: there the mesh is dp alone (8 shards, kernels
    replicated) and the one-device reference runs each batch shard on its own (loss and gradients
    summed over the shards)."""
    import flax.linen as nn

    import transformer_engine_lite.jax as te
    import transformer_engine_lite.jax.flax as te_flax

    mesh = mesh_of("dp" if recipe == "current" else "dp_tp")
    resource = te.MeshResource(dp_resource="dp",
                               tp_resource="tp" if "tp" in mesh.axis_names else None)
    r = RECIPES[recipe]
    layer = te_flax.TransformerLayer(
        hidden_size=64, mlp_hidden_size=128, num_attention_heads=8, num_gqa_groups=4,
        mlp_activations=("silu", "linear"), hidden_dropout=0.0, attention_dropout=0.0,
        self_attn_mask_type="causal", enable_relative_embedding=False, dtype=BF16)
    x = rand(40, (8, 16, 64), BF16)
    cot = rand(41, (8, 16, 64), F32)

    def step(variables, x, cot):
        def loss(v):
            return jnp.sum(layer.apply(v, x, deterministic=True).astype(F32) * cot)
        return jax.value_and_grad(loss)(variables)

    def run(sharded):
        with te.autocast(r is not None, r() if r else None, mesh_resource=resource):
            init = lambda key, x: layer.init(key, x, deterministic=True)
            if not sharded:
                v = jax.jit(init)(jax.random.PRNGKey(0), x)
                if recipe != "current":
                    return v, jax.jit(step)(v, x, cot)
                n = mesh.shape["dp"]
                b = x.shape[0] // n
                parts = [jax.jit(step)(v, x[k * b:(k + 1) * b], cot[k * b:(k + 1) * b])
                         for k in range(n)]
                # summed in float64, rounded once to each gradient's dtype
                return v, jax.tree.map(
                    lambda *a: np.sum([np.asarray(t, np.float64) for t in a], axis=0).astype(
                        np.asarray(a[0]).dtype), *parts)
            with jax.set_mesh(mesh):
                rules = te_flax.extend_logical_axis_rules(())
                with nn.logical_axis_rules(rules):
                    abstract = jax.eval_shape(init, jax.random.PRNGKey(0), x)
                    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract),
                                                            mesh, rules)
                    xs = put(mesh, x, ("dp",))
                    v = jax.jit(init, out_shardings=shardings)(jax.random.PRNGKey(0), xs)
                    return v, jax.jit(step)(v, xs, cot)

    v_ref, out_ref = run(False)
    v, out = run(True)
    assert_same(v, v_ref, "init")
    wi = v["params"]["mlp"]["wi_kernel"]
    if "tp" in mesh.axis_names:
        assert "tp" in tuple(getattr(wi, "value", wi).sharding.spec), "wi_kernel not TP-sharded"
    # the loss sums 8192 bf16 outputs; partial sums rounded once per shard move it by ~1e-3
    np.testing.assert_allclose(float(out[0]), float(out_ref[0]), rtol=2e-3)
    # The LayerNorm weight gradients (ln_bias, scale) are dp-sharded row sums rounded to bf16 per
    # shard before the all-reduce (TE-JAX's rule, test_distributed.assert_same), one per dp shard.
    norm_grad = lambda path: path.endswith(("['ln_bias'].value", "['scale'].value"))
    if recipe == "current":  # the reference sums per-shard bf16 gradients: one rounding a shard
        norm_grad = lambda path: True
    assert_same(out[1], out_ref[1], f"TransformerLayer {recipe} gradients", norm_grad,
                mesh.shape["dp"])
