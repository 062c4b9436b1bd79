"""The JAX NVFP4 GEMM in the FP4 tensor core's order (cpp_extensions/gemm_nvfp4.py, the core's
nvte_nvfp4_block_gemm): the same quantized bytes give the PyTorch front end's output bits (forward
row-wise pairs, 1D and 2D weights, bias, bf16 and fp32 outputs; the wgrad column-wise pair), the
handler equals its pure-JAX reference bit for bit, the order is the fixed K order (not the
dequantized float32 matmul's), and dense() routes through it."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.cpp_extensions.base import reference_mode
from transformer_engine_lite.jax.cpp_extensions.gemm_nvfp4 import nvfp4_block_gemm
from transformer_engine_lite.jax.quantize import QuantizeLayout, QuantizerFactory, ScalingMode

M1, M2 = ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING


def _x(shape, seed, spread=True):
    g = np.random.default_rng(seed)
    x = g.standard_normal(shape).astype(np.float32)
    if spread:  # columns of very different magnitudes: many distinct block scales
        x *= np.exp(g.standard_normal((1, shape[-1])) * 3).astype(np.float32)
    return jnp.asarray(x).astype(jnp.bfloat16)


def _q(x, mode=M1, layout=QuantizeLayout.ROWWISE, fa=-1):
    q = QuantizerFactory.create(scaling_mode=mode, q_dtype=jnp.float4_e2m1fn, q_layout=layout)
    return q.quantize(x, flatten_axis=fa)


def _bits(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32)).view(np.uint32)


def _torch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformer_engine_lite.pytorch")
    from transformer_engine_lite.pytorch import NVFP4Quantizer
    from transformer_engine_lite.pytorch.cpp_extensions import general_gemm
    return torch, NVFP4Quantizer, general_gemm


def _to_torch(torch, x):
    return torch.from_numpy(np.array(x.astype(jnp.float32))).to(torch.bfloat16)


@pytest.mark.parametrize("m,n,k", [(32, 64, 128), (48, 80, 1024), (16, 16, 16), (160, 48, 96)])
@pytest.mark.parametrize("w_mode", [M1, M2])
@pytest.mark.parametrize("out", ["float32", "bfloat16"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_forward_equals_pytorch(m, n, k, w_mode, out, with_bias):
    """y = x @ w^T: JAX (row-wise x, row-wise w) and PyTorch general_gemm(w, x, TN) on the same
    bytes (asserted), same output bits."""
    torch, Quantizer, general_gemm = _torch()
    x, w = _x((m, k), 1), _x((n, k), 2)
    bias = _x((n,), 3, spread=False) if with_bias else None
    xq, wq = _q(x), _q(w, w_mode)
    tx = Quantizer(rowwise=True, columnwise=False)(_to_torch(torch, x))
    tw = Quantizer(rowwise=True, columnwise=False,
                   with_2d_quantization=w_mode == M2)(_to_torch(torch, w))
    # the same bytes in
    np.testing.assert_array_equal(
        np.asarray(jax.lax.bitcast_convert_type(xq.data.reshape(m, k // 2, 2), jnp.uint8)),
        tx._rowwise_data.numpy())
    np.testing.assert_array_equal(
        np.asarray(jax.lax.bitcast_convert_type(wq.data.reshape(n, k // 2, 2), jnp.uint8)),
        tw._rowwise_data.numpy())
    np.testing.assert_array_equal(float(xq.amax[0]), float(tx._amax_rowwise))
    dt = jnp.dtype(out)
    got = tex.gemm(xq, wq, ((1,), (1,)), bias=bias, out_dtype=dt)
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[out]
    tb = None if bias is None else _to_torch(torch, bias)
    want = general_gemm(tw, tx, out_dtype=tdt, layout="TN", bias=tb)[0]
    assert got.dtype == dt and got.shape == (m, n)
    np.testing.assert_array_equal(_bits(got), want.float().numpy().view(np.uint32))


def test_wgrad_columnwise_pair_equals_pytorch():
    """dw = dy^T @ x over the tokens: the column-wise copies (blocks along the tokens), JAX
    contracting the leading dims, PyTorch general_gemm(x, dy, NT)."""
    torch, Quantizer, general_gemm = _torch()
    t, n, k = 96, 48, 64
    x, dy = _x((t, k), 4), _x((t, n), 5)
    xq, dyq = _q(x, layout=QuantizeLayout.COLWISE), _q(dy, layout=QuantizeLayout.COLWISE)
    got = tex.gemm(dyq, xq, ((0,), (0,)), out_dtype=jnp.float32)  # [n, k]
    tq = Quantizer(rowwise=False, columnwise=True)
    want = general_gemm(tq(_to_torch(torch, x)), tq(_to_torch(torch, dy)),
                        out_dtype=torch.float32, layout="NT")[0]
    assert got.shape == (n, k)
    np.testing.assert_array_equal(_bits(got), want.numpy().view(np.uint32))


def _packed(m, k, seed, any_scale=False):
    g = np.random.default_rng(seed)
    data = g.integers(0, 256, (m, k // 2), dtype=np.uint8)
    hi = 256 if any_scale else 0x58
    scale = g.integers(0 if any_scale else 0x28, hi, (m, -(-k // 16)), dtype=np.uint8)
    return jnp.asarray(data), jnp.asarray(scale)


@pytest.mark.parametrize("m,n,k", [(1, 1, 2), (7, 65, 40), (37, 130, 256), (3, 5, 0)])
@pytest.mark.parametrize("any_scale", [False, True])
def test_handler_equals_reference(m, n, k, any_scale):
    """The FFI handler and the pure-JAX reference (exact block terms, a sequential scan): the same
    bits, NaN scales and a partial last block included."""
    b, a = _packed(m, k, 7, any_scale), _packed(n, k, 8, any_scale)
    g = np.random.default_rng(m + n + k)
    amax = [jnp.asarray(g.uniform(0.01, 100.0, (1,)).astype(np.float32)) for _ in range(2)]
    got = jax.jit(nvfp4_block_gemm)(*b, *a, *amax)
    with reference_mode():
        want = jax.jit(nvfp4_block_gemm)(*b, *a, *amax)
    assert got.shape == (m, n) and got.dtype == jnp.float32
    np.testing.assert_array_equal(np.isnan(np.asarray(got)), np.isnan(np.asarray(want)))
    ok = ~np.isnan(np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32)[ok],
                                  np.asarray(want).view(np.uint32)[ok])


def test_factor_is_a_correctly_rounded_division():
    """The per-tensor factor (amax_b * amax_a) / 7225344 is IEEE's division (TE's reference and
    PyTorch's), not XLA's reciprocal product, under jit and in reference mode."""
    g = np.random.default_rng(11)
    ones = (jnp.asarray(np.full((1, 8), 0x22, np.uint8)),   # 16 E2M1 1.0
            jnp.asarray(np.full((1, 1), 0x38, np.uint8)))  # E4M3 1.0
    for amax_b in g.uniform(0.1, 1000.0, 40).astype(np.float32):
        ab, aa = jnp.asarray([amax_b]), jnp.asarray([np.float32(3.25)])
        part = np.float32(amax_b) * np.float32(3.25)
        want = np.float32(part / np.float32(36 * 448 * 448)) * np.float32(16.0)  # 16 terms of 1
        for ref in (False, True):
            ctx = reference_mode() if ref else contextlib.nullcontext()
            with ctx:
                y = jax.jit(nvfp4_block_gemm)(*ones, *ones, ab, aa)
            assert np.asarray(y)[0, 0] == want, (ref, amax_b)


def test_order_is_k_order():
    """A row whose block terms cancel: the K-ordered fp32 sum differs from a reordered one, and the
    GEMM gives the K-ordered value (big + small - big = 0 in fp32, not small)."""
    k = 48
    codes = np.full((1, k), 0x77, np.uint8)[:, : k // 2]  # all +6
    bd = jnp.asarray(np.concatenate([codes[:, :8], np.full((1, 8), 0x11, np.uint8),
                                     np.full((1, 8), 0xFF, np.uint8)], axis=1))  # +6, +0.5, -6
    bs = jnp.asarray(np.array([[0x7E, 0x01, 0x7E]], np.uint8))  # 448, 2^-9, 448
    ad = jnp.asarray(np.full((1, k // 2), 0x77, np.uint8))
    as_ = jnp.asarray(np.array([[0x7E, 0x01, 0x7E]], np.uint8))
    y = np.asarray(nvfp4_block_gemm(bd, bs, ad, as_))
    big = np.float32(16 * 36 * 448.0 * 448.0)
    small = np.float32(16 * 3 * 2.0**-18)
    assert y[0, 0] == np.float32(np.float32(big + small) - big) == 0.0 and small != 0.0


def test_dense_routes_through_the_block_gemm(monkeypatch):
    """te.dense under an NVFP4 quantizer set multiplies the copies in the block order (the
    forward and both backward GEMMs call it)."""
    from transformer_engine_lite.jax.cpp_extensions import gemm_nvfp4

    from transformer_engine_lite.jax.dense import dense
    calls = []
    real = gemm_nvfp4.nvfp4_gemm

    def spy(*a, **kw):
        calls.append(a[0].is_colwise)
        return real(*a, **kw)

    monkeypatch.setattr(gemm_nvfp4, "nvfp4_gemm", spy)
    x, w = _x((32, 64), 9), _x((64, 48), 10)
    qs = QuantizerFactory.create_set(scaling_mode=M1, fwd_dtype=jnp.float4_e2m1fn,
                                     bwd_dtype=jnp.float4_e2m1fn)

    def loss(x, w):
        return jnp.sum(dense(x, w, quantizer_set=qs).astype(jnp.float32))

    y = dense(x, w, quantizer_set=qs)
    want = tex.gemm(_q(x), _q(w, layout=QuantizeLayout.COLWISE), ((1,), (0,)),
                    out_dtype=jnp.bfloat16)
    np.testing.assert_array_equal(_bits(y), _bits(want))
    jax.grad(loss, argnums=(0, 1))(x, w)
    assert calls.count(False) >= 2 and True in calls  # fwd + dgrad row-wise, wgrad column-wise
