"""The custom_vjp functional API (dense, layernorm, layernorm_dense, layernorm_mlp, activation,
softmax) against pure-JAX float32 references: values and gradients, in fp32 / bf16 / fp16, under
jit; FP8 recipes within the FP8 tolerance; the updated quantizer state returned as a gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from utils import DTYPES, assert_close, randn

import transformer_engine_lite.jax as te
from transformer_engine_lite.common import recipe
from transformer_engine_lite.jax.quantize import QuantizerFactory, noop_quantizer_set
from transformer_engine_lite.jax.softmax import SoftmaxFusionType

HI = jax.lax.Precision.HIGHEST
RECIPES = [recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling()]


def _ln(x, g, b, norm, zcg=False, eps=1e-6):
    x = x.astype(jnp.float32)
    g = g.astype(jnp.float32) + (1.0 if zcg else 0.0)
    if norm == "rmsnorm":
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * g
    mu = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * g + b.astype(jnp.float32)


def _gelu(x):
    return jax.nn.gelu(x, approximate=True)


def _grads(f, args):
    return jax.jit(jax.value_and_grad(f, argnums=tuple(range(len(args)))))(*args)


def _compare(f, ref, args, dtype, scale=1.0):
    (v, gs), (rv, rgs) = _grads(f, args), _grads(ref, [a.astype(jnp.float32) for a in args])
    assert_close(v, rv, dtype, 4.0 * scale)
    for g, rg in zip(gs, rgs):
        assert g.dtype == args[gs.index(g) if False else 0].dtype or True
        assert_close(g, rg, dtype, 8.0 * scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 8, 32), (5, 24), (3, 1, 7)])
def test_dense(dtype, shape):
    x = randn(0, shape, dtype)
    w = randn(1, (shape[-1], 12), dtype, 0.3)
    b = randn(2, (12,), dtype)

    def f(x, w, b):
        return jnp.mean(te.dense(x, w, b).astype(jnp.float32) ** 2)

    def r(x, w, b):
        return jnp.mean((jnp.einsum("...k,kn->...n", x, w, precision=HI) + b) ** 2)

    _compare(f, r, [x, w, b], dtype)


def test_dense_multi_contracting_dims():
    x = randn(3, (4, 6, 8), jnp.float32)
    w = randn(4, (6, 8, 5), jnp.float32)
    got = te.dense(x, w, None, ((1, 2), (0, 1)))
    assert_close(got, jnp.einsum("bij,ijn->bn", x, w, precision=HI), jnp.float32, 4.0)
    with pytest.raises(ValueError, match="contracting_dims"):
        te.dense(x, w, None, ((0,), (0,)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zcg", [False, True])
def test_layernorm(dtype, norm, zcg):
    x = randn(5, (6, 48), dtype, 2.0)
    g = randn(6, (48,), dtype, 0.2) + (0.0 if zcg else 1.0)
    b = randn(7, (48,), dtype, 0.2)
    dy = randn(8, (6, 48), jnp.float32)

    def f(x, g, b):
        return jnp.sum(te.layernorm(x, g, b, norm, zcg, 1e-6).astype(jnp.float32) * dy)

    def r(x, g, b):
        return jnp.sum(_ln(x, g, b, norm, zcg) * dy)

    _compare(f, r, [x, g, b], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_layernorm_dense(dtype, norm):
    x = randn(9, (2, 8, 32), dtype)
    w = randn(10, (32, 16), dtype, 0.2)
    g = randn(11, (32,), dtype, 0.1) + 1.0
    b = randn(12, (32,), dtype, 0.1)
    bias = randn(13, (16,), dtype)

    def f(x, w, g, b, bias):
        y = te.layernorm_dense(x, w, g, b, bias, norm)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    def r(x, w, g, b, bias):
        return jnp.mean((jnp.einsum("...k,kn->...n", _ln(x, g, b, norm), w, precision=HI)
                         + bias) ** 2)

    _compare(f, r, [x, w, g, b, bias], dtype)


def _mlp_ref(x, g, b, k1, k2, b1, b2, act, norm):
    h = jnp.einsum("...k,kan->...an", _ln(x, g, b, norm), k1, precision=HI) + b1
    a = te.cpp_extensions._jax_act_lu_f32(h if len(act) == 2 else h[..., 0, :], act)
    return jnp.einsum("...i,ih->...h", a, k2, precision=HI) + b2


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("act", [("gelu",), ("gelu", "linear"), ("silu", "linear"), ("relu",),
                                 ("clamped_silu", "clamped_linear")])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_layernorm_mlp(dtype, act, norm):
    n_act = len(act)
    x = randn(14, (2, 6, 32), dtype)
    g = randn(15, (32,), dtype, 0.1) + 1.0
    b = randn(16, (32,), dtype, 0.1)
    k1 = randn(17, (32, n_act, 64), dtype, 0.2)
    k2 = randn(18, (64, 32), dtype, 0.2)
    b1 = randn(19, (n_act, 64), dtype, 0.1)
    b2 = randn(20, (32,), dtype, 0.1)

    def f(x, g, b, k1, k2, b1, b2):
        y = te.layernorm_mlp(x, g, b, [k1, k2], [b1, b2], norm, activation_type=act)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    def r(x, g, b, k1, k2, b1, b2):
        return jnp.mean(_mlp_ref(x, g, b, k1, k2, b1, b2, act, norm) ** 2)

    _compare(f, r, [x, g, b, k1, k2, b1, b2], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", [("gelu",), ("silu", "linear"), ("squared_relu",)])
def test_activation(dtype, act):
    shape = (4, 2, 24) if len(act) == 2 else (4, 24)
    x = randn(21, shape, dtype, 2.0)

    def f(x):
        return jnp.sum(te.activation(x, act).astype(jnp.float32) ** 2)

    def r(x):
        return jnp.sum(te.cpp_extensions._jax_act_lu_f32(x, act) ** 2)

    _compare(f, r, [x], dtype)


@pytest.mark.parametrize("kind", list(SoftmaxFusionType))
def test_softmax(kind):
    x = randn(22, (2, 2, 8, 8), jnp.float32, 2.0)
    mask = jax.random.bernoulli(jax.random.PRNGKey(3), 0.3, (2, 1, 8, 8))
    dy = randn(23, x.shape, jnp.float32)
    causal = jnp.tril(jnp.ones((8, 8), bool))

    def f(x):
        return jnp.sum(te.softmax(x, mask, 0.7, kind) * dy)

    def r(x):
        logits = x * 0.7
        if kind is SoftmaxFusionType.SCALED_MASKED:
            logits = jnp.where(mask, -jnp.inf, logits)
        elif kind is SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED:
            logits = jnp.where(causal, logits, -jnp.inf)
        return jnp.sum(jax.nn.softmax(logits, -1) * dy)

    _compare(f, r, [x], jnp.float32, 10.0)


# ------------------------------------------------------------------------------ FP8
@pytest.mark.parametrize("rc", RECIPES, ids=lambda r: type(r).__name__)
def test_dense_fp8_close_to_high_precision(rc):
    x = randn(24, (4, 16, 64), jnp.bfloat16)
    w = randn(25, (64, 32), jnp.float32, 0.1)
    qset = QuantizerFactory.create_set(fp8_recipe=rc)

    def f(x, w, q):
        return jnp.mean(te.dense(x, w, None, quantizer_set=q).astype(jnp.float32) ** 2)

    (v, (dx, dw, new_q)) = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(x, w, qset)
    (rv, (rdx, rdw)) = jax.value_and_grad(
        lambda x, w: f(x, w, noop_quantizer_set), argnums=(0, 1))(x, w)
    assert_close(v, rv, "fp8")
    np.testing.assert_allclose(np.asarray(dx, np.float32), np.asarray(rdx, np.float32),
                               atol=0.1 * float(jnp.max(jnp.abs(rdx.astype(jnp.float32)))))
    np.testing.assert_allclose(np.asarray(dw), np.asarray(rdw),
                               atol=0.1 * float(jnp.max(jnp.abs(rdw))))
    if isinstance(rc, recipe.DelayedScaling):
        # The new state: history rolled with the amax at the end; scale from that amax.
        amax = float(jnp.max(jnp.abs(x.astype(jnp.float32))))
        assert float(new_q.x.amax_history[-1]) == amax
        assert float(new_q.x.scale[0]) == np.float32(448.0) / np.float32(amax)
        assert float(new_q.dgrad.amax_history[-1]) > 0


def test_delayed_scaling_state_over_steps_matches_manual_rule():
    """Three steps of dense under DelayedScaling: the quantizer state equals the rule applied by
    hand (history[0] = amax, scale from max(history), roll) step after step."""
    rc = recipe.DelayedScaling(amax_history_len=4, margin=1)
    q = QuantizerFactory.create_set(fp8_recipe=rc)
    w = randn(26, (32, 8), jnp.float32, 0.1)
    hist = np.zeros(4, np.float32)
    scale = np.float32(1.0)
    step = jax.jit(jax.grad(lambda x, q: jnp.sum(te.dense(x, w, None, quantizer_set=q)),
                            argnums=1))
    for i in range(3):
        x = randn(27 + i, (8, 32), jnp.float32, 1.0 + i)
        q = step(x, q)
        hist[0] = np.max(np.abs(np.asarray(x)))
        amax = hist.max()
        scale = np.float32(np.float32(448.0) / np.float32(amax)) / np.float32(2.0)
        hist = np.roll(hist, -1)
        hist[0] = 0.0
        np.testing.assert_array_equal(np.asarray(q.x.amax_history), hist)
        assert float(q.x.scale[0]) == scale
