"""Flax modules against pure-Flax references with the parameters copied (fp32 / bf16 / fp16, odd
shapes), TE's parameter and fp8_metas names, FP8 under each recipe (the state advanced by TE's
gradient idiom), plain nn.Dense with make_dot_general_cls, refused fields, and a 200-step
convergence run per recipe within 5% of bf16."""

from __future__ import annotations

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from utils import assert_close, randn

import transformer_engine_lite.jax as te
import transformer_engine_lite.jax.flax as te_flax
from transformer_engine_lite.common import recipe

RECIPES = [recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling()]
HI = jax.lax.Precision.HIGHEST


def _params(vs):
    return flax.core.meta.unbox(vs["params"])


class RefMLP(nn.Module):
    """The pure-Flax equivalent of te_flax.LayerNormMLP (layernorm, gated or not)."""

    hidden: int
    inter: int
    act: tuple
    norm: str = "layernorm"
    use_bias: bool = False
    dtype: object = jnp.float32

    @nn.compact
    def __call__(self, x):
        if self.norm == "layernorm":
            h = nn.LayerNorm(epsilon=1e-6, dtype=jnp.float32, name="ln")(x)
        else:
            h = nn.RMSNorm(epsilon=1e-6, dtype=jnp.float32, name="ln")(x)
        n = len(self.act)
        h = nn.DenseGeneral((n, self.inter), use_bias=self.use_bias, precision=HI,
                            dtype=jnp.float32, name="wi")(h)
        a = te.cpp_extensions._jax_act_lu_f32(h if n == 2 else h[..., 0, :], self.act)
        return nn.Dense(self.hidden, use_bias=self.use_bias, precision=HI, dtype=jnp.float32,
                        name="wo")(a)


def _copy_mlp(p, norm, use_bias):
    ref = {"ln": {"scale": p["scale"]}, "wi": {"kernel": p["wi_kernel"]},
           "wo": {"kernel": p["wo_kernel"]}}
    if norm == "layernorm":
        ref["ln"]["bias"] = p["ln_bias"]
    if use_bias:
        ref["wi"]["bias"], ref["wo"]["bias"] = p["wi_bias"], p["wo_bias"]
    return ref


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("act", [("gelu",), ("gelu", "linear"), ("silu", "linear")])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_layernorm_mlp_matches_flax(dtype, act, norm):
    x = randn(0, (2, 5, 24), dtype)
    layer = te_flax.LayerNormMLP(intermediate_dim=40, activations=act, layernorm_type=norm,
                                 use_bias=True)
    vs = layer.init(jax.random.PRNGKey(1), x)
    p = _params(vs)
    assert p["wi_kernel"].shape == (24, len(act), 40) and p["wo_kernel"].shape == (40, 24)
    assert p["wi_bias"].shape == (len(act), 40) and p["wo_bias"].shape == (24,)
    assert ("ln_bias" in p) == (norm == "layernorm")
    ref = RefMLP(24, 40, act, norm, True)
    rp = _copy_mlp(p, norm, True)

    def loss(params, x):
        return jnp.mean(layer.apply({"params": params}, x)[0].astype(jnp.float32) ** 2)

    def rloss(params, x):
        return jnp.mean(ref.apply({"params": params}, x.astype(jnp.float32)) ** 2)

    v, g = jax.value_and_grad(loss)(p, x)
    rv, rg = jax.value_and_grad(rloss)(rp, x)
    assert_close(v, rv, dtype, 4.0)
    assert_close(g["wi_kernel"], rg["wi"]["kernel"], dtype, 8.0)
    assert_close(g["wo_kernel"], rg["wo"]["kernel"], dtype, 8.0)
    assert_close(g["scale"], rg["ln"]["scale"], dtype, 8.0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_dense_general_matches_flax(dtype):
    x = randn(2, (3, 7, 20), dtype)
    layer = te_flax.DenseGeneral(features=(2, 6), axis=(-2, -1), use_bias=True)
    vs = layer.init(jax.random.PRNGKey(0), x)
    p = _params(vs)
    assert p["kernel"].shape == (7, 20, 2, 6) and p["bias"].shape == (2, 6)
    ref = nn.DenseGeneral((2, 6), axis=(-2, -1), precision=HI, dtype=jnp.float32)
    got = layer.apply(vs, x)
    want = ref.apply({"params": p}, x.astype(jnp.float32))
    assert got.dtype == dtype
    assert_close(got, want, dtype, 4.0)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zcg", [False, True])
def test_layernorm_module(norm, zcg):
    x = randn(3, (4, 9, 33), jnp.float32, 3.0)
    layer = te_flax.LayerNorm(layernorm_type=norm, zero_centered_gamma=zcg, epsilon=1e-5)
    vs = layer.init(jax.random.PRNGKey(0), x)
    p = _params(vs)
    assert set(p) == ({"scale", "ln_bias"} if norm == "layernorm" else {"scale"})
    assert float(p["scale"][0]) == (0.0 if zcg else 1.0)
    ref_cls = nn.LayerNorm if norm == "layernorm" else nn.RMSNorm
    ref = ref_cls(epsilon=1e-5)
    rp = {"scale": p["scale"] + (1.0 if zcg else 0.0)}
    if norm == "layernorm":
        rp["bias"] = p["ln_bias"]
    assert_close(layer.apply(vs, x), ref.apply({"params": rp}, x), jnp.float32, 4.0)


def test_layernorm_dense_general_outputs():
    x = randn(4, (2, 6, 16), jnp.bfloat16)
    layer = te_flax.LayerNormDenseGeneral(features=12, return_layernorm_output=True,
                                          use_bias=True, depth_scaling=2.0)
    vs = layer.init(jax.random.PRNGKey(0), x)
    z, ln = layer.apply(vs, x)
    p = _params(vs)
    ln_ref = nn.LayerNorm(epsilon=1e-6).apply(
        {"params": {"scale": p["scale"], "bias": p["ln_bias"]}}, x.astype(jnp.float32))
    assert_close(ln, ln_ref, jnp.bfloat16, 2.0)
    want = (jnp.einsum("bsh,hn->bsn", ln_ref, p["kernel"], precision=HI) + p["bias"]) / 2.0
    assert_close(z, want, jnp.bfloat16, 4.0)


def test_lora_starts_at_zero_and_trains():
    x = randn(5, (4, 16), jnp.float32)
    layer = te_flax.DenseGeneral(8, enable_low_rank_adaptation=True, low_rank_adaptation_dim=4,
                                 low_rank_adaptation_alpha=8.0)
    vs = layer.init(jax.random.PRNGKey(0), x)
    p = _params(vs)
    assert p["lora_a_kernel"].shape == (16, 4) and p["lora_b_kernel"].shape == (4, 8)
    base = x @ p["kernel"] + p["bias"]
    assert_close(layer.apply(vs, x), base, jnp.float32, 4.0)
    g = jax.grad(lambda p: jnp.sum(layer.apply({"params": p}, x) ** 2))(p)
    assert float(jnp.max(jnp.abs(g["lora_b_kernel"]))) > 0


@pytest.mark.parametrize("rc", RECIPES, ids=lambda r: type(r).__name__)
def test_fp8_state_names_and_update(rc):
    x = randn(6, (2, 8, 32), jnp.bfloat16)
    layer = te_flax.LayerNormMLP(intermediate_dim=64, activations=("gelu", "linear"))
    with te.autocast(enabled=True, recipe=rc):
        vs = layer.init(jax.random.PRNGKey(0), x)
        metas = vs.get(te.NVTE_FP8_COLLECTION_NAME, {})
        if isinstance(rc, recipe.DelayedScaling):
            names = {f"{q}_{i}_{k}" for q in ("x", "kernel", "grad") for i in (0, 1)
                     for k in ("scale", "amax_history")}
            assert set(metas) == names
            assert metas["x_0_amax_history"].shape == (rc.amax_history_len,)
        else:
            assert not metas

        def loss(vs):
            return jnp.mean(layer.apply(vs, x)[0].astype(jnp.float32) ** 2)

        grads = jax.jit(jax.grad(loss))(vs)
    others, _ = flax.core.pop(grads, "params")
    new = te.update_collections(others, vs)
    if isinstance(rc, recipe.DelayedScaling):
        # x_0 quantizes the GEMM input: the layernorm output (scale 1, bias 0 at init).
        z = te.cpp_extensions._jax_layernorm_f32(x, jnp.ones(32), jnp.zeros(32), 1e-6, False)[0]
        m = new[te.NVTE_FP8_COLLECTION_NAME]
        amax = float(m["x_0_amax_history"][-1])
        np.testing.assert_allclose(amax, float(jnp.max(jnp.abs(z))), rtol=1e-5)
        assert float(m["x_0_scale"][0]) == np.float32(448.0) / np.float32(amax)
        assert float(m["grad_1_amax_history"][-1]) > 0


def test_fp8_autocast_deprecated_alias():
    with pytest.warns(DeprecationWarning):
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe.Float8CurrentScaling()):
            assert te.quantize.get_global_quantize_recipe() is not None
    assert te.quantize.get_global_quantize_recipe() is None


def test_make_dot_general_cls():
    x = randn(7, (4, 32), jnp.bfloat16)
    cls = te_flax.make_dot_general_cls(recipe.DelayedScaling(amax_history_len=8))
    dense = nn.Dense(16, dot_general=cls())
    vs = dense.init(jax.random.PRNGKey(0), x)
    assert "_overwrite_with_gradient" in vs
    y = dense.apply(vs, x)
    ref = x.astype(jnp.float32) @ vs["params"]["kernel"] + vs["params"]["bias"]
    assert_close(y, ref, "fp8")


def test_refused_fields():
    x = jnp.ones((2, 4, 8))
    with pytest.raises(NotImplementedError, match="axis"):
        te_flax.LayerNormMLP(intermediate_dim=8, axis=-2).init(jax.random.PRNGKey(0), x)
    with pytest.raises(NotImplementedError, match="activations"):
        te_flax.LayerNormMLP(intermediate_dim=8, activations=(jax.nn.relu,)).init(
            jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match="'no_such_activation'"):  # ("tanh",) composes, as in TE
        te_flax.LayerNormMLP(intermediate_dim=8, activations=("no_such_activation",)).init(
            jax.random.PRNGKey(0), x)
    with pytest.raises(ValueError, match="recipe"), te.autocast(enabled=True, recipe=object()):
        pass


def test_dropout_path_and_layernorm_output():
    x = randn(8, (2, 4, 16), jnp.float32)
    layer = te_flax.LayerNormMLP(intermediate_dim=32, intermediate_dropout_rate=0.5,
                                 return_layernorm_output=True)
    vs = layer.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}, x)
    det, ln = layer.apply(vs, x, deterministic=True)
    drop, _ = layer.apply(vs, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(2)})
    assert ln.shape == x.shape and not np.allclose(np.asarray(det), np.asarray(drop))
    fused = te_flax.LayerNormMLP(intermediate_dim=32).apply(vs, x)[0]
    assert_close(det, fused, jnp.float32, 4.0)


# ------------------------------------------------------------------------------ convergence
def _train(rc, steps=200):
    """A 2-block regression model (LayerNormMLP + DenseGeneral), SGD with momentum, on a noisy
    target (noise variance 0.09: the loss floor, so FP8 noise is measured against a real loss)."""
    x, y = _data()

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            h, _ = te_flax.LayerNormMLP(intermediate_dim=64, activations=("gelu", "linear"),
                                        dtype=jnp.float32)(x.astype(jnp.bfloat16))
            return te_flax.DenseGeneral(16, dtype=jnp.float32)(h)

    model = Model()
    with te.autocast(enabled=rc is not None, recipe=rc):
        vs = model.init(jax.random.PRNGKey(2), x)
        params, state = vs["params"], {k: v for k, v in vs.items() if k != "params"}

        @jax.jit
        def step(params, state, mom):
            def loss(p, s):
                out = model.apply({"params": p, **s}, x)
                return jnp.mean((out.astype(jnp.float32) - y) ** 2)

            l, (gp, gs) = jax.value_and_grad(loss, argnums=(0, 1))(params, state)
            mom = jax.tree_util.tree_map(lambda m, g: 0.9 * m + g, mom, gp)
            params = jax.tree_util.tree_map(lambda p, m: p - 0.05 * m, params, mom)
            return params, gs, mom, l

        mom = jax.tree_util.tree_map(jnp.zeros_like, params)
        for _ in range(steps):
            params, state, mom, loss = step(params, state, mom)
    return float(loss)


def _data():
    x = jax.random.normal(jax.random.PRNGKey(0), (512, 32), jnp.float32)
    w_true = jax.random.normal(jax.random.PRNGKey(1), (32, 16)) / np.sqrt(32)
    noise = 0.3 * jax.random.normal(jax.random.PRNGKey(3), (512, 16))
    return x, jnp.tanh(x @ w_true) + noise


def test_convergence_fp8_within_5_percent_of_bf16():
    base = _train(None)
    _, y = _data()
    assert base < 0.6 * float(jnp.mean(y ** 2))  # it learned
    for rc in RECIPES:
        got = _train(rc)
        assert abs(got - base) <= 0.05 * base + 1e-4, (type(rc).__name__, got, base)


def test_module_fields_match_te():
    """TE-JAX's field counts and the defaults users rely on (te_jax_api.md §5)."""
    import dataclasses

    def fields(cls):
        return {f.name: f for f in dataclasses.fields(cls) if f.name not in ("parent", "name")}

    counts = {te_flax.DenseGeneral: 14, te_flax.LayerNorm: 8,
              te_flax.LayerNormDenseGeneral: 25, te_flax.LayerNormMLP: 34}
    for cls, n in counts.items():
        assert len(fields(cls)) == n, (cls.__name__, sorted(fields(cls)))
    mlp = fields(te_flax.LayerNormMLP)
    assert mlp["activations"].default == ("gelu",)
    assert mlp["intermediate_dropout_rate"].default == 0.0
    assert mlp["kernel_axes_1"].default == ("embed", "act", "mlp")
    assert fields(te_flax.LayerNormDenseGeneral)["return_layernorm_output"].default is False
    assert fields(te_flax.DenseGeneral)["features"].default is dataclasses.MISSING
