"""TE-JAX's quantizer-taking primitive forms (issue #25, TE's test_custom_call_compute.py):
quantize / quantize_dbias / act_lu / quantize_dact_dbias / layernorm_fwd / rmsnorm_fwd with a Quantizer, the
`_jax_*` references (reference_mode), gemm with lhs/rhs quantizers, layernorm()/activation() with a
quantizer, topk, debug.experimental's array dump. Oracles: ml_dtypes encodes of float32 products
(the §5 rule), numpy float64 sums / statistics, and the primitive forms the TE forms are built
on."""

import ml_dtypes
import numpy as np
import jax
import jax.numpy as jnp
import pytest

from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.activation import activation
from transformer_engine_lite.jax.cpp_extensions.activation import _act_lu
from transformer_engine_lite.jax.cpp_extensions.misc import get_cudnn_version
from transformer_engine_lite.jax.cpp_extensions.normalization import _layernorm_fwd, _rmsnorm_fwd
from transformer_engine_lite.jax.cpp_extensions.topk import topk
from transformer_engine_lite.jax.debug.experimental import inspect_array, load_array_dump
from transformer_engine_lite.jax.layernorm import layernorm
from transformer_engine_lite.jax.quantize import (
    NoScaleTensor,
    QuantizeLayout,
    QuantizerFactory,
    ScaledTensor1x,
    ScaledTensor2x,
    ScalingMode,
)

DS, CS, MX = (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING,
              ScalingMode.MXFP8_1D_SCALING)
E4, E5 = jnp.float8_e4m3fn, jnp.float8_e5m2


def _pair(mode, q_dtype=E4, layout=QuantizeLayout.ROWWISE):
    return QuantizerFactory.create(n_quantizers=2, scaling_mode=mode, q_dtype=q_dtype,
                                   q_layout=layout)


def _bytes(t):
    return np.asarray(jax.lax.bitcast_convert_type(t.data, jnp.uint8))


def _rows(t):
    return t.rowwise_tensor if isinstance(t, ScaledTensor2x) else t


def _encode(x32, scale, q_dtype):
    """§5 per-tensor encode: float32 product, saturate, round to nearest even (ml_dtypes)."""
    np_q = {E4: ml_dtypes.float8_e4m3fn, E5: ml_dtypes.float8_e5m2}[q_dtype]
    m = float(ml_dtypes.finfo(np_q).max)
    y = np.clip(np.asarray(x32, np.float32) * np.float32(scale), -m, m)
    return y.astype(np_q).view(np.uint8)


def _x(shape, dtype, seed=0, lo=-2.0, hi=2.0):
    return jax.random.uniform(jax.random.PRNGKey(seed), shape, jnp.float32, lo, hi).astype(dtype)


# ------------------------------------------------------------------------------------ quantize
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("q_dtype", [E4, E5])
def test_quantize_current_scaling_bytes_vs_ml_dtypes(dtype, q_dtype):
    x = _x((48, 64), dtype)
    te_q, ref_q = _pair(CS, q_dtype, QuantizeLayout.ROWWISE_COLWISE)
    out = tex.quantize(x, te_q)
    ref = tex._jax_quantize(x, quantizer=ref_q)
    assert isinstance(out, ScaledTensor2x) and out.rowwise_tensor.data_layout == "N"
    x32 = np.asarray(x, np.float32)
    scale = np.float32(float(jnp.finfo(q_dtype).max)) / np.float32(np.abs(x32).max())
    want = _encode(x32, scale, q_dtype)
    for t in (out.rowwise_tensor, out.colwise_tensor, ref.rowwise_tensor):
        np.testing.assert_array_equal(_bytes(t), want)
        assert float(t.scale_inv[0]) == pytest.approx(float(1 / scale), rel=2 ** -23)


@pytest.mark.parametrize("mode", [DS, CS, MX])
def test_quantize_jitted_te_equals_reference_bytes(mode):
    x = _x((4, 64, 32), jnp.bfloat16, seed=1)
    te_q, ref_q = _pair(mode, E4, QuantizeLayout.ROWWISE_COLWISE)
    out = jax.jit(tex.quantize, static_argnums=(2,))(x, quantizer=te_q, flatten_axis=-1)
    ref = jax.jit(tex._jax_quantize, static_argnums=(2, 3))(x, quantizer=ref_q, flatten_axis=-1)
    pairs = ((out.rowwise_tensor, ref.rowwise_tensor), (out.colwise_tensor, ref.colwise_tensor))
    for a, b in pairs:
        np.testing.assert_array_equal(_bytes(a), _bytes(b))
        np.testing.assert_array_equal(np.asarray(a.scale_inv), np.asarray(b.scale_inv))


def test_delayed_quantizer_state_same_in_both_forms():
    te_q, ref_q = _pair(DS, E4)
    for seed in range(3):
        x = _x((32, 32), jnp.float32, seed=seed)
        np.testing.assert_array_equal(_bytes(tex.quantize(x, te_q)),
                                      _bytes(tex._jax_quantize(x, ref_q)))
    np.testing.assert_array_equal(np.asarray(te_q.scale), np.asarray(ref_q.scale))
    np.testing.assert_array_equal(np.asarray(te_q.amax_history), np.asarray(ref_q.amax_history))
    assert float(te_q.scale[0]) != 1.0  # the history moved the scale


def test_quantize_none_and_bad_quantizer():
    x = _x((8, 8), jnp.float32)
    assert isinstance(tex.quantize(x, None), NoScaleTensor)
    assert isinstance(tex._jax_quantize(x), NoScaleTensor)
    with pytest.raises(TypeError, match="quantizer"):
        tex._jax_quantize(x, quantizer="e4m3")


@pytest.mark.parametrize("shape,flatten_axis", [((32, 64), -1), ((4, 8, 32), -2)])
def test_quantize_dbias(shape, flatten_axis):
    x = _x(shape, jnp.bfloat16, seed=2)
    te_q, ref_q = _pair(CS, E4)
    out, dbias = jax.jit(lambda v: tex.quantize_dbias(v, quantizer=te_q,
                                                      flatten_axis=flatten_axis))(x)
    ref, rdbias = tex._jax_quantize_dbias(x, quantizer=ref_q, flatten_axis=flatten_axis)
    np.testing.assert_array_equal(_bytes(out), _bytes(ref))
    fa = len(shape) + flatten_axis
    want = np.asarray(x, np.float64).sum(axis=tuple(range(fa)))
    # float32 accumulation of <= 32 bf16 values, then one bf16 rounding: half a bf16 ulp + slack.
    np.testing.assert_allclose(np.asarray(dbias, np.float64), want, rtol=2 ** -8, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(dbias), np.asarray(rdbias))
    assert dbias.dtype == x.dtype
    _, none = tex.quantize_dbias(x, te_q, is_dbias=False)
    assert none is None


# ---------------------------------------------------------------------------------- activation
@pytest.mark.parametrize("act", [("gelu",), ("silu", "linear")])
def test_act_lu_te_form(act):
    x = _x((16, len(act), 64), jnp.float32, seed=3)
    te_q, ref_q = _pair(DS, E4, QuantizeLayout.ROWWISE_COLWISE)
    out = tex.act_lu(x, act, te_q, None)
    xs = x if len(act) == 2 else x[:, 0, :]
    q, amax, si = _act_lu(xs, act, E4, jnp.ones((1,), jnp.float32))  # the fused primitive form
    np.testing.assert_array_equal(_bytes(out.rowwise_tensor), np.asarray(q).view(np.uint8))
    assert out.rowwise_tensor.data.shape == (16, 64)
    ref = tex._jax_act_lu(x, act, ref_q)
    assert np.mean(_bytes(ref.rowwise_tensor) == _bytes(out.rowwise_tensor)) > 0.99
    plain = tex.act_lu(x, act, None, None)
    assert isinstance(plain, NoScaleTensor) and plain.data.shape == (16, 64)
    with pytest.raises(ValueError, match="argument 'x'"):
        tex.act_lu(x[:, :1, :] if len(act) == 2 else jnp.stack([x[:, 0]] * 2, 1), act, None, None)


@pytest.mark.parametrize("mode", [CS, MX])
def test_quantize_dact_dbias(mode):
    act = ("gelu", "linear")
    x = _x((64, 2, 64), jnp.bfloat16, seed=4, lo=-1, hi=1)
    dz = _x((64, 64), jnp.bfloat16, seed=5, lo=-1, hi=1)
    te_q, ref_q = _pair(mode, E4)
    out, dbias = jax.jit(lambda g, v: tex.quantize_dact_dbias(g, v, act, True, te_q))(dz, x)
    # the composition is exact: the bytes of quantizing the float32 dact handler output
    dx32 = tex.dact_lu(dz.astype(jnp.float32), x.astype(jnp.float32), act)
    again = QuantizerFactory.create(scaling_mode=mode, q_dtype=E4, q_layout=QuantizeLayout.ROWWISE)
    np.testing.assert_array_equal(_bytes(out), _bytes(again.quantize(dx32, flatten_axis=-2)))
    want = np.asarray(dx32, np.float64).sum(axis=0)
    np.testing.assert_allclose(np.asarray(dbias, np.float64), want, rtol=2 ** -8, atol=1e-5)
    ref, rdbias = tex._jax_quantize_dact_dbias(dz, x, act, True, ref_q)
    np.testing.assert_allclose(np.asarray(out.dequantize(jnp.float32)),
                               np.asarray(ref.dequantize(jnp.float32)), rtol=2 ** -3, atol=2 ** -9)
    np.testing.assert_allclose(np.asarray(dbias, np.float32), np.asarray(rdbias, np.float32),
                               rtol=2 ** -7, atol=1e-2)
    with pytest.raises(ValueError, match="'dz'"):
        tex.quantize_dact_dbias(dz[:, :32], x, act)


# ------------------------------------------------------------------------------- normalization
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zcg", [False, True])
def test_norm_fwd_te_form(kind, zcg):
    x = _x((32, 128), jnp.bfloat16, seed=6)
    g = _x((128,), jnp.bfloat16, seed=7, lo=0, hi=2)
    b = _x((128,), jnp.bfloat16, seed=8)
    te_q, ref_q = _pair(DS, E4)
    scale = jnp.ones((1,), jnp.float32)
    if kind == "layernorm":
        out, mu, rs = tex.layernorm_fwd(x, g, b, zcg, 1e-5, quantizer=te_q)
        q, mu0, rs0, _, _ = _layernorm_fwd(x, g, b, 1e-5, zcg, E4, scale)
        ref, rmu, rrs = tex._jax_layernorm(x, g, b, zcg, 1e-5, ref_q)
        x64 = np.asarray(x, np.float64)
        np.testing.assert_allclose(np.asarray(mu), x64.mean(-1), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(rmu), np.asarray(mu), rtol=1e-6, atol=1e-6)
    else:
        out, rs = tex.rmsnorm_fwd(x, g, zcg, 1e-5, quantizer=te_q)
        q, rs0, _, _ = _rmsnorm_fwd(x, g, 1e-5, zcg, E4, scale)
        ref, rrs = tex._jax_rmsnorm(x, g, zcg, 1e-5, ref_q)
        x64 = np.asarray(x, np.float64)
        np.testing.assert_allclose(np.asarray(rs), 1 / np.sqrt((x64 ** 2).mean(-1) + 1e-5),
                                   rtol=1e-5)
    np.testing.assert_array_equal(_bytes(out), np.asarray(q).view(np.uint8))
    np.testing.assert_allclose(np.asarray(rrs), np.asarray(rs), rtol=1e-5)
    assert np.mean(_bytes(ref) == _bytes(out)) > 0.98  # float32 norm, ulp-level differences
    plain = tex.layernorm_fwd(x, g, b, zcg, 1e-5)[0] if kind == "layernorm" else \
        tex.rmsnorm_fwd(x, g, zcg, 1e-5, None)[0]
    assert isinstance(plain, NoScaleTensor) and plain.data.dtype == x.dtype


@pytest.mark.parametrize("mode", [DS, CS, MX])
def test_layernorm_and_activation_with_quantizer_differentiate(mode):
    x = _x((32, 64), jnp.float32, seed=9)
    g = jnp.ones((64,), jnp.float32)
    q = QuantizerFactory.create(scaling_mode=mode, q_dtype=E4, q_layout=QuantizeLayout.ROWWISE)

    def loss(v, qq):
        return jnp.sum(layernorm(v, g, None, "rmsnorm", False, 1e-6, qq) ** 2)

    y = layernorm(x, g, None, "rmsnorm", False, 1e-6, q)
    y0 = layernorm(x, g, None, "rmsnorm", False, 1e-6)
    q2 = QuantizerFactory.create(scaling_mode=mode, q_dtype=E4, q_layout=QuantizeLayout.ROWWISE)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(q2.quantize(y0).dequantize(x.dtype)))
    assert not np.array_equal(np.asarray(y), np.asarray(y0))  # it was quantized
    gq = jax.grad(loss)(x, q)
    # the backward is the unquantized norm's, fed the cotangent of the quantized output
    _, vjp = jax.vjp(lambda v: layernorm(v, g, None, "rmsnorm", False, 1e-6), x)
    np.testing.assert_allclose(np.asarray(gq), np.asarray(vjp(2 * y)[0]), rtol=1e-6, atol=1e-6)
    xa = _x((32, 2, 64), jnp.float32, seed=10)
    q3 = QuantizerFactory.create(scaling_mode=mode, q_dtype=E4, q_layout=QuantizeLayout.ROWWISE)
    ga = jax.grad(lambda v: jnp.sum(activation(v, ("gelu", "linear"), q3)))(xa)
    ga0 = jax.grad(lambda v: jnp.sum(activation(v, ("gelu", "linear"))))(xa)
    np.testing.assert_array_equal(np.asarray(ga), np.asarray(ga0))


# ---------------------------------------------------------------------------------------- gemm
@pytest.mark.parametrize("layout", ["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("mode", [DS, CS, MX])
def test_gemm_with_quantizers(layout, mode):
    x = _x((64, 64), jnp.bfloat16, seed=11, lo=0, hi=1)
    w = _x((64, 32), jnp.bfloat16, seed=12, lo=0, hi=1)
    a = x if layout[0] == "N" else x.T
    b = w if layout[1] == "N" else w.T
    cd = ((1,) if layout[0] == "N" else (0,), (0,) if layout[1] == "N" else (1,))
    mk = lambda: QuantizerFactory.create(scaling_mode=mode, q_dtype=E4,  # noqa: E731
                                         q_layout=QuantizeLayout.ROWWISE_COLWISE)
    out = tex.gemm(a, b, contracting_dims=cd, lhs_quantizer=mk(), rhs_quantizer=mk())
    assert out.dtype == jnp.bfloat16 and out.shape == (64, 32)
    # oracle: float64 product of the dequantized operands (what the FP8 GEMM multiplies)
    ql, qr = mk().quantize(a), mk().quantize(b)
    lcol, rcol = layout[0] == "T", layout[1] == "N"
    da = np.asarray(ql.get_tensor(lcol).dequantize(jnp.float32), np.float64)
    db = np.asarray(qr.get_tensor(rcol).dequantize(jnp.float32), np.float64)
    want = (da if layout[0] == "N" else da.T) @ (db if layout[1] == "N" else db.T)
    # float32 accumulation of 64 terms, one bf16 rounding of the result
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=2 ** -7, atol=1e-4)


# ---------------------------------------------------------------------------------------- topk
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_topk_matches_float64_sort(dtype):
    x = jax.random.permutation(jax.random.PRNGKey(0), jnp.arange(300, dtype=jnp.float32))
    x = (x.reshape(3, 100) / 4).astype(dtype)  # distinct, exact in bf16
    vals, idx = jax.jit(topk, static_argnums=(1,))(x, 7)
    x64 = np.asarray(x, np.float64)
    want = np.argsort(-x64, axis=-1, kind="stable")[:, :7]
    np.testing.assert_array_equal(np.asarray(idx), want)
    np.testing.assert_array_equal(np.asarray(vals, np.float64), np.take_along_axis(x64, want, -1))
    assert idx.dtype == jnp.int32
    with pytest.raises(ValueError, match="'k'"):
        topk(x, 101)
    with pytest.raises(TypeError, match="'x'"):
        topk(x.astype(jnp.int32), 2)


# ------------------------------------------------------------------------------- debug / misc
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, E5])
def test_inspect_array_dump(dtype, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x = _x((16, 8), jnp.float32, seed=13).astype(dtype)
    y = jax.jit(lambda v: inspect_array(v, "probe"))(x)
    np.testing.assert_array_equal(np.asarray(y).view(np.uint8), np.asarray(x).view(np.uint8))
    back = load_array_dump("my_tensor_gpu0_probe.bin", (16, 8), dtype)
    np.testing.assert_array_equal(np.asarray(back).view(np.uint8), np.asarray(x).view(np.uint8))
    with pytest.raises(ValueError, match="bytes"):
        load_array_dump("my_tensor_gpu0_probe.bin", (16, 9), dtype)
    with pytest.raises(ValueError, match="name"):
        inspect_array(x, "")


def test_cudnn_version_and_zero_centered_gamma_flags():
    assert get_cudnn_version() == (0, 0, 0)  # no cuDNN linked
    assert tex.is_norm_zero_centered_gamma_in_weight_dtype(MX) is False
    t = tex.quantize(_x((8, 32), jnp.float32), QuantizerFactory.create(
        scaling_mode=MX, q_dtype=E4, q_layout=QuantizeLayout.ROWWISE))
    assert isinstance(t, ScaledTensor1x) and t.data_layout == "N"


def test_clamped_swiglu_glu_linear_offset():
    x = _x((4, 2, 16), jnp.float32, seed=14)
    act = ("clamped_silu", "clamped_linear")
    p1 = tex.ActivationParams.create(act, limit=0.75, alpha=1.702, glu_linear_offset=1.0)
    assert p1 == tex.ActivationParams.create(act, limit=0.75, alpha=1.702)  # TE's default is 1
    assert tex.act_lu(x, act, None, p1).data.shape == (4, 16)
    # another offset (nvte_clamped_swiglu_v2): forward and gradient vs the fp32 JAX formula
    p2 = tex.ActivationParams.create(act, limit=0.75, alpha=1.702, glu_linear_offset=0.5)

    def ref(v):
        a, b = v[..., 0, :], v[..., 1, :]
        ac = jnp.minimum(a, 0.75)
        return ac * jax.nn.sigmoid(1.702 * ac) * (jnp.clip(b, -0.75, 0.75) + 0.5)

    y = tex.act_lu(x, act, None, p2).data
    assert jnp.allclose(y, ref(x), rtol=1e-6, atol=1e-6)
    assert not jnp.allclose(y, tex.act_lu(x, act, None, p1).data)
    g = _x((4, 16), jnp.float32, seed=15)
    dx = tex.dact_lu(g, x, act, p2)
    dx_ref = jax.vjp(ref, x)[1](g)[0]
    assert jnp.allclose(dx, dx_ref, rtol=1e-5, atol=1e-6)
