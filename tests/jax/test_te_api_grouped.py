"""TE-JAX's grouped (MoE) API (issue #25): QuantizerFactory.create(n_groups=...), grouped_quantize
(ragged group sizes on device, one scale per group), grouped_gemm (masked per-group core GEMMs),
grouped_gemm_copy_group_sizes, dense.grouped_dense (forward + VJP, FP8 under grouped quantizer
sets). Oracles: ml_dtypes encodes of the float32 per-group products, numpy float64 GEMMs."""

import ml_dtypes
import numpy as np
import jax
import jax.numpy as jnp
import pytest

from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.dense import grouped_dense
from transformer_engine_lite.jax.quantize import (
    GroupedNoScaleTensor,
    GroupedQuantizer,
    GroupedScaledTensor1x,
    QuantizeLayout,
    QuantizerFactory,
    ScaledTensor2x,
    ScalingMode,
    noop_quantizer_set,
)

DS, CS, MX = (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING,
              ScalingMode.MXFP8_1D_SCALING)
E4, E5 = jnp.float8_e4m3fn, jnp.float8_e5m2
SIZES = np.array([64, 0, 96, 96], np.int32)  # an empty group on purpose


def _x(shape, dtype=jnp.bfloat16, seed=0, lo=-2.0, hi=2.0):
    return jax.random.uniform(jax.random.PRNGKey(seed), shape, jnp.float32, lo, hi).astype(dtype)


def _gid(sizes, m):
    return np.repeat(np.arange(len(sizes)), sizes)[:m]


def test_factory_n_groups():
    q = QuantizerFactory.create(scaling_mode=DS, q_dtype=E4, n_groups=3)
    assert isinstance(q, GroupedQuantizer) and len(q.quantizers) == 3 and q.n_groups == 3
    assert q.quantizers[0] is not q.quantizers[1]  # each group keeps its own delayed state
    qs = QuantizerFactory.create_set(scaling_mode=CS, fwd_dtype=E4, bwd_dtype=E5, n_groups=2)
    assert qs.dgrad.quantizers[1].q_dtype == E5 and isinstance(qs.x, GroupedQuantizer)
    assert QuantizerFactory.create(scaling_mode=ScalingMode.NO_SCALING, n_groups=2) is None
    with pytest.raises(ValueError, match="n_groups"):
        QuantizerFactory.create(scaling_mode=DS, q_dtype=E4, n_groups=0)


@pytest.mark.parametrize("q_dtype", [E4, E5])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_grouped_quantize_current_scaling_bytes(q_dtype, dtype):
    x = _x((256, 64), dtype)
    q = QuantizerFactory.create(scaling_mode=CS, q_dtype=q_dtype,
                                q_layout=QuantizeLayout.ROWWISE_COLWISE, n_groups=4)
    out = jax.jit(lambda v, s: tex.grouped_quantize(v, q, s))(x, jnp.asarray(SIZES))
    assert isinstance(out, ScaledTensor2x)
    t = out.rowwise_tensor
    assert isinstance(t, GroupedScaledTensor1x) and t.data_layout == "N"
    np_q = {E4: ml_dtypes.float8_e4m3fn, E5: ml_dtypes.float8_e5m2}[q_dtype]
    fmax = np.float32(ml_dtypes.finfo(np_q).max)
    x32 = np.asarray(x, np.float32)
    got = np.asarray(jax.lax.bitcast_convert_type(t.data, jnp.uint8))
    start = 0
    for g, n in enumerate(SIZES):
        rows = slice(start, start + n)
        start += n
        if n == 0:
            assert float(t.scale_inv[g]) == 1.0  # an empty group keeps scale 1 (amax 0)
            continue
        scale = fmax / np.float32(np.abs(x32[rows]).max())
        want = np.clip(x32[rows] * scale, -fmax, fmax).astype(np_q).view(np.uint8)
        np.testing.assert_array_equal(got[rows], want)
        assert float(t.scale_inv[g]) == pytest.approx(float(1 / scale), rel=2 ** -23)
    parts = t.dequantize(jnp.float32)
    assert [p.shape[0] for p in parts] == list(SIZES)


def test_grouped_quantize_delayed_updates_each_group():
    x = _x((256, 32), jnp.float32, seed=1)
    q = QuantizerFactory.create(scaling_mode=DS, q_dtype=E4, n_groups=4)
    tex.grouped_quantize(x, q, jnp.asarray(SIZES))
    x32 = np.asarray(x)
    start = 0
    for g, n in enumerate(SIZES):
        amax = np.abs(x32[start:start + n]).max() if n else 0.0
        start += n
        # the delayed update rolled the history: this step's amax is now its last entry
        assert float(q.quantizers[g].amax_history[-1]) == pytest.approx(float(amax))


def test_grouped_quantize_leading_group_axis_and_mxfp8():
    x = _x((4, 64, 64), seed=2)
    q = QuantizerFactory.create(scaling_mode=CS, q_dtype=E4, q_layout=QuantizeLayout.ROWWISE,
                                n_groups=4)
    t = tex.grouped_quantize(x, q)  # group axis = axis 0
    for g, part in enumerate(t.dequantize(jnp.float32)):
        x32 = np.asarray(x[g], np.float32)
        np.testing.assert_allclose(np.asarray(part)[0], x32, rtol=2 ** -4, atol=0)
    qm = QuantizerFactory.create(scaling_mode=MX, q_dtype=E4,
                                 q_layout=QuantizeLayout.ROWWISE_COLWISE, n_groups=4)
    sizes = jnp.asarray(np.array([128, 0, 64, 64], np.int32))
    xm = _x((256, 64), seed=3)
    tm = tex.grouped_quantize(xm, qm, sizes)
    whole = QuantizerFactory.create(scaling_mode=MX, q_dtype=E4).quantize(xm)
    for a, b in ((tm.rowwise_tensor, whole.rowwise_tensor), (tm.colwise_tensor,
                                                             whole.colwise_tensor)):
        np.testing.assert_array_equal(np.asarray(a.data).view(np.uint8),
                                      np.asarray(b.data).view(np.uint8))
    with pytest.raises(TypeError, match="GroupedQuantizer"):
        tex.grouped_quantize(xm, QuantizerFactory.create(scaling_mode=CS, q_dtype=E4), sizes)
    with pytest.raises(ValueError, match="group_sizes"):
        tex.grouped_quantize(xm, qm, sizes[:3])


@pytest.mark.parametrize("rc", [1, 2])
@pytest.mark.parametrize("mode", [None, DS, CS, MX])
def test_grouped_gemm_vs_float64(mode, rc):
    x = _x((256, 64), seed=4, lo=0, hi=1)
    w = _x((4, 64, 32) if rc == 1 else (4, 32, 64), seed=5, lo=0, hi=1)
    sizes = jnp.asarray(SIZES)
    qs = noop_quantizer_set if mode is None else QuantizerFactory.create_set(
        scaling_mode=mode, fwd_dtype=E4, bwd_dtype=E5, is_2x2x=False, n_groups=4)
    np.testing.assert_array_equal(np.asarray(tex.grouped_gemm_copy_group_sizes(sizes, 4)), SIZES)
    out = jax.jit(tex.grouped_gemm, static_argnames=("contracting_dims",))(
        GroupedNoScaleTensor(x, None, sizes, None, x.shape),
        GroupedNoScaleTensor(w, None, None, None, w.shape),
        contracting_dims=((1,), (rc,)), quantizer_set=qs)
    assert out.shape == (256, 32) and out.dtype == jnp.bfloat16
    w64 = np.asarray(w, np.float64)
    w64 = w64 if rc == 1 else np.swapaxes(w64, 1, 2)
    want = np.einsum("mk,mkn->mn", np.asarray(x, np.float64), w64[_gid(SIZES, 256)])
    # bf16 operands: float32 accumulation + one bf16 rounding; FP8: two E4M3 roundings (2^-4 each)
    rtol = 2 ** -7 if mode is None else 2 ** -3
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=rtol, atol=1e-3)


@pytest.mark.parametrize("mode", [None, DS, CS, MX])
def test_grouped_dense_value_and_grad(mode):
    x = _x((256, 64), seed=6)
    w = _x((4, 64, 32), seed=7)
    b = _x((4, 32), seed=8)
    sizes = jnp.asarray(SIZES)
    qs = noop_quantizer_set if mode is None else QuantizerFactory.create_set(
        scaling_mode=mode, fwd_dtype=E4, bwd_dtype=E5, is_2x2x=True, n_groups=4)
    dy = _x((256, 32), jnp.bfloat16, seed=9)  # the cotangent of a bf16 output is bf16

    def f(x_, w_, b_):
        return jnp.sum(grouped_dense(x_, w_, sizes, bias=b_, quantizer_set=qs)
                       .astype(jnp.float32) * dy.astype(jnp.float32))

    val, (dx, dw, db) = jax.jit(jax.value_and_grad(f, (0, 1, 2)))(x, w, b)
    gid = _gid(SIZES, 256)
    x64, w64, b64, dy64 = (np.asarray(v, np.float64) for v in (x, w, b, dy))
    y = np.einsum("mk,mkn->mn", x64, w64[gid]) + b64[gid]
    want_dx = np.einsum("mn,mkn->mk", dy64, w64[gid])
    want_dw = np.stack([x64[gid == g].T @ dy64[gid == g] for g in range(4)])
    want_db = np.stack([dy64[gid == g].sum(0) for g in range(4)])
    # per product term: bf16 operands 2^-8 each; FP8: E5M2 gradient 2^-3 + E4M3 operand 2^-4 (half
    # ulps); sums of random-sign terms stay well under the per-term bound relative to their max.
    rtol = 2 ** -6 if mode is None else 2 ** -2
    scale = lambda a: np.abs(a).max()  # noqa: E731
    assert abs(float(val) - float((y * dy64).sum())) <= rtol * np.abs(y * dy64).sum()
    for got, want in ((dx, want_dx), (dw, want_dw)):
        err = np.abs(np.asarray(got, np.float64) - want).max() / scale(want)
        assert err < rtol / 2, err
    np.testing.assert_allclose(np.asarray(db, np.float64), want_db, rtol=2 ** -7, atol=2e-2)
    assert float(np.abs(np.asarray(dw[1], np.float64)).max()) == 0.0  # the empty group
    with pytest.raises(NotImplementedError, match="group_offset"):
        grouped_dense(x, w, sizes, group_offset=jnp.zeros(4, jnp.int32))
