"""NVFP4 in the JAX front end (TE-JAX's NVFP4_1D_SCALING / NVFP4_2D_SCALING): scale shapes and
layouts, the handler's bytes vs the pure-JAX reference (_jax_quantize, nvfp4_math.h in JAX) and vs
the PyTorch front end's op for the same input (stochastic rounding included: the same state words
are the same (seed, offset)), dequantization vs a numpy decode, stochastic-rounding determinism and
bias, and dense / Flax modules training under NVFP4BlockScaling within FP4's tolerance."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_engine_lite.jax as te
import transformer_engine_lite.jax.flax as te_flax
from transformer_engine_lite.common import recipe
from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.cpp_extensions import _jax_quantize
from transformer_engine_lite.jax.quantize import (
    NVFP4Quantizer,
    QuantizeConfig,
    QuantizeLayout,
    QuantizeMeta,
    QuantizeMetaSet,
    QuantizerFactory,
    ScaledTensor1x,
    ScaledTensor2x,
    ScalingMode,
    TensorSource,
    is_scaling_mode_supported,
)
from transformer_engine_lite.jax.quantize.hadamard import (
    apply_rht,
    get_sign_from_vector,
    get_wgrad_sign_vector,
)

M1, M2 = ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float64)
LAYOUTS = [QuantizeLayout.ROWWISE, QuantizeLayout.COLWISE, QuantizeLayout.ROWWISE_COLWISE]
# (shape, flatten_axis): scale grids padded in both directions, unpadded, 3-D views split at
# each axis, and tall / wide 2-D.
SHAPES = [((32, 64), -1), ((256, 128), -1), ((48, 80), -1), ((4, 32, 48), -1), ((32, 16, 48), 1),
          ((2, 16, 64), 2), ((160, 16), -1)]


def _x(shape, dtype=jnp.bfloat16, seed=0, scale=10.0):
    x = jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32) * scale
    return x.astype(dtype)


def _copies(t):
    return [t] if isinstance(t, ScaledTensor1x) else [t.rowwise_tensor, t.colwise_tensor]


def _codes(t):
    return np.asarray(t.data).view(np.uint8)


def _assert_same(a, b):
    for p, q in zip(_copies(a), _copies(b)):
        assert (p.is_colwise, p.data.shape, p.scale_inv.shape) == (q.is_colwise, q.data.shape,
                                                                    q.scale_inv.shape)
        np.testing.assert_array_equal(_codes(p), _codes(q))
        np.testing.assert_array_equal(np.asarray(p.scale_inv).view(np.uint8),
                                      np.asarray(q.scale_inv).view(np.uint8))
        np.testing.assert_array_equal(np.asarray(p.amax), np.asarray(q.amax))


# ------------------------------------------------------------------------------ shapes, layouts
def test_scaling_mode_rules():
    assert is_scaling_mode_supported(M1) == (True, "") and is_scaling_mode_supported(M2) == (True,
                                                                                             "")
    assert M1.get_scale_dtype() == jnp.float8_e4m3fn and M1.get_data_layout() == "NT"
    # TE-JAX's shapes: padded to 128 x 4 blocks, "T" column-wise copies given transposed.
    assert M1.get_scale_shape_2x((256, 128)) == ((256, 8), (128, 16))
    assert M1.get_scale_shape_2x((32, 64), is_padded=False) == ((32, 4), (64, 2))
    assert M1.get_scale_shape_2x((32, 64)) == ((128, 4), (128, 4))
    assert M2.get_scale_shape_2x((256, 128), is_padded=False) == ((16, 8), (8, 16))
    assert M2.get_scale_shape_2x((256, 128), is_padded=False,
                                 broadcast_2d_scale_shape_to_1d=True) == ((256, 8), (128, 16))
    assert M1.get_scale_shape_2x((4, 32, 48), is_padded=False) == ((4, 32, 3), (48, 4, 2))
    assert M1.get_scale_shape_2x((32, 16, 48), is_padded=False, flatten_axis=1) == \
        ((32, 16, 3), (16, 48, 2))
    with pytest.raises(ValueError, match="data_layout"):
        M1.get_scale_shape((32, 64), "N", is_colwise=True)
    with pytest.raises(ValueError, match="divisible"):
        M1.get_scale_shape((32, 40))
    with pytest.raises(ValueError, match="divisible"):
        M2.get_scale_shape((8, 64))


@pytest.mark.parametrize("mode", [M1, M2])
@pytest.mark.parametrize("shape,fa", SHAPES)
def test_layout_of_scaled_tensors(mode, shape, fa):
    x = _x(shape)
    t = QuantizerFactory.create(scaling_mode=mode, q_dtype=jnp.float4_e2m1fn).quantize(
        x, flatten_axis=fa)
    assert isinstance(t, ScaledTensor2x)
    r, c = t.rowwise_tensor, t.colwise_tensor
    f = fa % len(shape)
    assert r.data.dtype == jnp.float4_e2m1fn and r.data.shape == shape and r.data_layout == "N"
    assert c.data.shape == shape[f:] + shape[:f] and c.data_layout == "T" and c.is_colwise
    # flatten_axis in each copy's own layout (TE-JAX's): the transposed copy's is ndim - f.
    assert r.scale_inv.dtype == jnp.float8_e4m3fn and (r.flatten_axis, c.flatten_axis) == (
        f, len(shape) - f)
    want = mode.get_scale_shape_2x(shape, is_padded=False, flatten_axis=fa,
                                   broadcast_2d_scale_shape_to_1d=True)
    assert (r.scale_inv.shape, c.scale_inv.shape) == want
    amax = float(jnp.max(jnp.abs(x.astype(jnp.float32))))
    assert float(r.amax[0]) == amax == float(c.amax[0])  # no RHT: the same global amax


# ------------------------------------------------------------------------------ bytes
@pytest.mark.parametrize("mode", [M1, M2])
@pytest.mark.parametrize("shape,fa", SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rht", [False, True])
def test_handler_bytes_equal_reference(mode, shape, fa, layout, rht):
    """tex.quantize (the core) and _jax_quantize (the pure-JAX reference) give the same bytes."""
    f = fa % len(shape)
    rows = int(np.prod(shape[:f]))
    if rht and (mode == M2 or rows % 16):
        pytest.skip("RHT: NVFP4_1D column-wise copies of 16-row multiples only")
    x = _x(shape)
    x = x.at[(0,) * len(shape)].set(jnp.bfloat16(1e-3))  # a tiny value: negative-zero codes
    q1, q2 = QuantizerFactory.create(2, scaling_mode=mode, q_dtype=jnp.float4_e2m1fn,
                                     q_layout=layout, use_rht=rht)
    got = jax.jit(lambda x: tex.quantize(x, q1, fa))(x)
    _assert_same(got, _jax_quantize(x, q2, flatten_axis=fa))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_handler_bytes_special_values(dtype):
    """Zeros, a zero block, NaN-free extremes, each input dtype."""
    x = np.array(_x((32, 64), jnp.float32, 3))
    x[0, :16] = 0.0
    x[1, :16] = [1e-30] * 8 + [-1e-30] * 8
    x[2, 0] = 3e4
    q = QuantizerFactory.create(scaling_mode=M1, q_dtype=jnp.float4_e2m1fn, use_rht=True)
    xj = jnp.asarray(x).astype(dtype)
    _assert_same(tex.quantize(xj, q), _jax_quantize(xj, q))


def _torch_op(x, two_d, rht, sr=False, seed=0, offset=0):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformer_engine_lite.pytorch")
    tx = torch.from_numpy(np.array(x.astype(jnp.float32)))
    if x.dtype == jnp.bfloat16:
        tx = tx.to(torch.bfloat16)
    mask = get_sign_from_vector(get_wgrad_sign_vector()) if rht else 0
    return [t.numpy() for t in torch.ops.te_lite.quantize_nvfp4(tx, True, True, two_d, rht, mask,
                                                                sr, seed, offset)]


def _as_core_buffers(t, rows, cols):
    """A JAX copy as the core's buffers: packed uint8 data, the zero-padded uint8 scale grid."""
    packed = np.asarray(jax.lax.bitcast_convert_type(
        t.data.reshape(rows, cols // 2, 2), jnp.uint8))
    sc = np.asarray(t.scale_inv).view(np.uint8).reshape(rows, cols // 16)
    grid = np.zeros((-(-rows // 128) * 128, -(-(cols // 16) // 4) * 4), np.uint8)
    grid[:rows, : cols // 16] = sc
    return packed, grid, np.asarray(t.amax)


@pytest.mark.parametrize("mode,rht", [(M1, False), (M1, True), (M2, False)])
@pytest.mark.parametrize("shape,dtype", [((64, 128), jnp.bfloat16), ((48, 80), jnp.float32),
                                         ((160, 32), jnp.bfloat16)])
def test_bytes_equal_pytorch(mode, rht, shape, dtype):
    """The JAX quantizer's bytes are the PyTorch front end's op's for the same input."""
    x = _x(shape, dtype, 5)
    t = QuantizerFactory.create(scaling_mode=mode, q_dtype=jnp.float4_e2m1fn,
                                use_rht=rht).quantize(x)
    want = _torch_op(x, mode == M2, rht)
    rows, cols = shape
    got = (*_as_core_buffers(t.rowwise_tensor, rows, cols),
           *_as_core_buffers(t.colwise_tensor, cols, rows))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_stochastic_rounding_bytes_equal_pytorch():
    """TE-JAX's state words are the core's (seed, offset): state[0] | state[1] << 32, ..."""
    x = _x((64, 128), jnp.bfloat16, 7, 1.0)
    words = np.array([[0x89ABCDEF, 0x01234567, 0x00000005, 0x00000002]], np.uint32)
    seed = int(words[0, 0]) | int(words[0, 1]) << 32
    offset = int(words[0, 2]) | int(words[0, 3]) << 32
    q = QuantizerFactory.create(scaling_mode=M1, q_dtype=jnp.float4_e2m1fn, use_rht=True,
                                stochastic_rounding_rng_state=jnp.asarray(words))
    t = jax.jit(lambda x, q: q.quantize(x))(x, q)
    want = _torch_op(x, False, True, True, seed, offset)
    got = (*_as_core_buffers(t.rowwise_tensor, 64, 128),
           *_as_core_buffers(t.colwise_tensor, 128, 64))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


# ------------------------------------------------------------------------------ dequantize
def _decode(t):
    """numpy oracle of a stored copy: E2M1 value x E4M3 scale x amax / 2688, in float64."""
    v = E2M1[_codes(t).astype(np.int64)]
    s = np.asarray(t.scale_inv.astype(jnp.float32), np.float64)
    s = np.repeat(s, 16, axis=-1).reshape(v.shape)
    return v * s * float(t.amax[0]) / 2688.0


@pytest.mark.parametrize("mode", [M1, M2])
@pytest.mark.parametrize("shape,fa", [((32, 64), -1), ((4, 32, 48), -1), ((32, 16, 48), 1)])
def test_dequantize_matches_decode(mode, shape, fa):
    x = _x(shape, jnp.float32, 2)
    t = QuantizerFactory.create(scaling_mode=mode, q_dtype=jnp.float4_e2m1fn).quantize(
        x, flatten_axis=fa)
    for c in _copies(t):
        d = np.asarray(c.dequantize(jnp.float32), np.float64)
        np.testing.assert_allclose(d, _decode(c), rtol=1e-6, atol=0)
    f = fa % len(shape)
    col = np.asarray(t.colwise_tensor.dequantize(jnp.float32))
    nd, k = len(shape), len(shape) - f
    col = np.transpose(col, (*range(k, nd), *range(k)))
    np.testing.assert_array_equal(col, np.asarray(t.rowwise_tensor.dequantize(jnp.float32))) \
        if mode == M2 else None  # 2D blocks: both copies hold the same values
    err = np.abs(np.asarray(t.rowwise_tensor.dequantize(jnp.float32)) - np.asarray(x))
    assert err.max() <= np.abs(np.asarray(x)).max() / 6 * 1.01  # half an E2M1 step at most


def test_dequantize_inverts_rht():
    x = _x((64, 32), jnp.float32, 4, 1.0)
    t = QuantizerFactory.create(scaling_mode=M1, q_dtype=jnp.float4_e2m1fn, use_rht=True,
                                q_layout=QuantizeLayout.COLWISE).quantize(x)
    assert t.has_rht_applied and t.data_layout == "T"
    stored = apply_rht(jnp.asarray(_decode(t), jnp.float32), inverse=True)
    np.testing.assert_allclose(np.asarray(t.dequantize(jnp.float32)), np.asarray(stored),
                               rtol=1e-5, atol=1e-6)
    rel = np.linalg.norm(np.asarray(t.dequantize(jnp.float32)).T - np.asarray(x)) / \
        np.linalg.norm(np.asarray(x))
    assert rel < 0.15
    np.testing.assert_allclose(np.asarray(apply_rht(apply_rht(x), inverse=True)), np.asarray(x),
                               rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------ SR
def _sr(x, words, ref=False):
    q = QuantizerFactory.create(scaling_mode=M1, q_dtype=jnp.float4_e2m1fn,
                                stochastic_rounding_rng_state=jnp.asarray(words, jnp.uint32))
    return _jax_quantize(x, q) if ref else tex.quantize(x, q)


@pytest.mark.parametrize("ref", [False, True])
def test_stochastic_rounding_determinism_and_bias(ref):
    x = _x((32, 64), jnp.float32, 9, 1.0)
    a, b = _sr(x, [[1, 2, 3, 4]], ref), _sr(x, [[1, 2, 3, 4]], ref)
    _assert_same(a, b)  # same state, same bytes
    c = _sr(x, [[1, 2, 3, 5]], ref)
    assert not np.array_equal(_codes(a.rowwise_tensor), _codes(c.rowwise_tensor))
    rn = QuantizerFactory.create(scaling_mode=M1, q_dtype=jnp.float4_e2m1fn).quantize(x)
    rn_err = np.abs(np.asarray(rn.rowwise_tensor.dequantize(jnp.float32)) - np.asarray(x)).mean()
    mean = np.mean([np.asarray(_sr(x, [[7, i, 0, 1]], ref).rowwise_tensor.dequantize(jnp.float32))
                    for i in range(24)], axis=0)
    assert np.abs(mean - np.asarray(x)).mean() < rn_err  # unbiased: the mean converges


# ------------------------------------------------------------------------------ recipe, errors
def test_recipe_config():
    cfg = QuantizeConfig(recipe.NVFP4BlockScaling())
    assert cfg.get_scaling_mode(TensorSource.KERNEL) == M2
    assert cfg.get_scaling_mode(TensorSource.X) == cfg.get_scaling_mode(TensorSource.DGRAD) == M1
    assert cfg.FWD_DTYPE == cfg.BWD_DTYPE == jnp.float4_e2m1fn
    no2d = QuantizeConfig(recipe.NVFP4BlockScaling(disable_2d_quantization=True))
    assert no2d.get_scaling_mode(TensorSource.KERNEL) == M1 and no2d.DISABLE_2D_QUANTIZATION
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qs = QuantizerFactory.create_set(fp8_recipe=recipe.NVFP4BlockScaling())
    assert isinstance(qs.x, NVFP4Quantizer) and qs.x.use_rht and qs.dgrad.use_rht
    assert qs.kernel.scaling_mode == M2 and not qs.kernel.use_rht
    qs = QuantizerFactory.create_set(fp8_recipe=recipe.NVFP4BlockScaling(
        disable_rht=True, disable_stochastic_rounding=True))
    assert not qs.x.use_rht and qs.dgrad.stochastic_rounding_rng_state is None


def test_errors():
    with pytest.raises(ValueError, match="q_dtype"):
        NVFP4Quantizer(q_dtype=jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="stochastic_rounding_rng_state"):
        NVFP4Quantizer(stochastic_rounding_rng_state=jnp.zeros((4,), jnp.int32))
    with pytest.raises(TypeError, match="use_rht"):
        QuantizerFactory.create(scaling_mode=ScalingMode.MXFP8_1D_SCALING, use_rht=True)
    with pytest.raises(ValueError, match="divisible"):
        NVFP4Quantizer().quantize(jnp.ones((32, 40), jnp.float32))
    with pytest.raises(ValueError, match="16 rows"):
        tex.quantize_nvfp4(jnp.ones((24, 32), jnp.float32), rht=True)
    for bad in (recipe.NVFP4BlockScaling(nvfp4_4over6="all"),
                recipe.NVFP4BlockScaling(row_scaled_activation=True)):
        with pytest.raises(NotImplementedError):
            with te.autocast(enabled=True, recipe=bad):
                pass


# ------------------------------------------------------------------------------ training
def _qdq(t):
    return t.dequantize(jnp.float32)


def test_dense_forward_is_exact_dequantized_gemm_and_trains():
    x = _x((32, 64), jnp.bfloat16, 11, 1.0)
    k = _x((64, 48), jnp.bfloat16, 12, 0.1)
    state = jnp.asarray([[1, 2, 3, 4]], jnp.uint32)
    qs = QuantizerFactory.create_set(fp8_recipe=recipe.NVFP4BlockScaling(), quantize_meta_set=
                                     QuantizeMetaSet(grad=QuantizeMeta(
                                         stochastic_rounding_rng_state=state)))
    assert qs.dgrad.use_rht and qs.dgrad.stochastic_rounding_rng_state is state

    def loss(x, k, qs):
        return jnp.sum(te.dense(x, k, quantizer_set=qs).astype(jnp.float32) ** 2)

    y = te.dense(x, k, quantizer_set=qs)
    xq = QuantizerFactory.create(scaling_mode=M1, q_layout=QuantizeLayout.ROWWISE).quantize(x)
    kq = QuantizerFactory.create(scaling_mode=M2, q_layout=QuantizeLayout.COLWISE).quantize(k)
    want = np.asarray(_qdq(xq), np.float64) @ np.asarray(_qdq(kq), np.float64).T
    np.testing.assert_allclose(np.asarray(y, np.float64), want, rtol=2e-2, atol=2e-2)
    ref = np.asarray(x, np.float64) @ np.asarray(k, np.float64)
    assert np.linalg.norm(np.asarray(y, np.float64) - ref) / np.linalg.norm(ref) < 0.2
    gx, gk = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, k, qs)
    rx, rk = jax.grad(lambda x, k: jnp.sum((x.astype(jnp.float32) @ k.astype(jnp.float32)) ** 2),
                      argnums=(0, 1))(x, k)
    for g, r in ((gx, rx), (gk, rk)):
        assert g.dtype == jnp.bfloat16
        assert np.linalg.norm(np.asarray(g, np.float64) - np.asarray(r)) / \
            np.linalg.norm(np.asarray(r)) < 0.3


@pytest.mark.parametrize("module", ["DenseGeneral", "LayerNormDenseGeneral", "LayerNormMLP"])
def test_flax_modules_train_under_nvfp4(module):
    make = {"DenseGeneral": lambda: te_flax.DenseGeneral(32),
            "LayerNormDenseGeneral": lambda: te_flax.LayerNormDenseGeneral(32),
            "LayerNormMLP": lambda: te_flax.LayerNormMLP(intermediate_dim=64)}[module]
    x = _x((4, 16, 32), jnp.bfloat16, 13, 1.0)
    layer = make()
    rngs = {"params": jax.random.PRNGKey(0), "sr_rng": jax.random.PRNGKey(1)}
    with te.autocast(enabled=True, recipe=recipe.NVFP4BlockScaling()):
        variables = layer.init(rngs, x)
        params = variables["params"]

        def loss(p, key):
            y = layer.apply({"params": p}, x, rngs={"sr_rng": key})
            y = y[0] if isinstance(y, tuple) else y
            return jnp.mean(y.astype(jnp.float32) ** 2)

        step = jax.jit(jax.value_and_grad(loss))
        l0, _ = step(params, jax.random.PRNGKey(2))
        for i in range(5):
            _, g = step(params, jax.random.PRNGKey(3 + i))
            params = jax.tree_util.tree_map(lambda p, g: p - 0.5 * g.astype(p.dtype), params, g)
        l1, _ = step(params, jax.random.PRNGKey(9))
    with te.autocast(enabled=False):
        lref = loss(variables["params"], jax.random.PRNGKey(2))
    assert np.isfinite(float(l1)) and float(l1) < float(l0)
    np.testing.assert_allclose(float(l0), float(lref), rtol=0.25)


def test_flax_sr_state_from_sr_rng():
    cfg = QuantizeConfig(recipe.NVFP4BlockScaling())

    class Probe:
        def make_rng(self, name):
            assert name == "sr_rng"
            return jax.random.PRNGKey(0)

    meta = cfg.get_quantize_flax_meta(Probe(), "fp8_metas", "", TensorSource.DGRAD, "grad")
    assert meta.stochastic_rounding_rng_state.shape == (1, 4)
    assert meta.stochastic_rounding_rng_state.dtype == jnp.uint32 and meta.use_rht
    other = cfg.get_quantize_flax_meta(Probe(), "fp8_metas", "", TensorSource.DGRAD, "grad2")
    assert not np.array_equal(other.stochastic_rounding_rng_state,
                              meta.stochastic_rounding_rng_state)
    x_meta = cfg.get_quantize_flax_meta(Probe(), "fp8_metas", "", TensorSource.X, "x")
    assert x_meta == QuantizeMeta(use_rht=True)


@pytest.mark.parametrize("layout", ["NN", "TN", "NT"])
def test_te_gemm_with_nvfp4_quantizers(layout):
    """tex.gemm(x, w, quantizers): the exact dequantized product; RHT on both operands cancels
    (the operands whose contracted dim is their first are quantized column-wise, transformed)."""
    m, n, k = 64, 32, 64
    x = _x((m, k) if layout[0] == "N" else (k, m), jnp.bfloat16, 21, 0.5)
    w = _x((k, n) if layout[1] == "N" else (n, k), jnp.bfloat16, 22, 0.5)
    dims = ((1,) if layout[0] == "N" else (0,), (0,) if layout[1] == "N" else (1,))
    rht = layout in ("TN",)  # both operands column-wise: x^T (T) and w (N)
    lq, rq = (QuantizerFactory.create(scaling_mode=M1, use_rht=rht) for _ in range(2))
    out = tex.gemm(x, w, dims, lhs_quantizer=lq, rhs_quantizer=rq)
    xs = x.T if layout[0] == "T" else x
    ws = w.T if layout[1] == "T" else w
    ref = np.asarray(xs, np.float64) @ np.asarray(ws, np.float64)
    assert out.shape == (m, n) and out.dtype == jnp.bfloat16
    assert np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref) < 0.2
    if layout == "TN":
        with pytest.raises(ValueError, match="RHT"):
            tex.gemm(x, w, dims, lhs_quantizer=QuantizerFactory.create(scaling_mode=M1),
                     rhs_quantizer=rq)
