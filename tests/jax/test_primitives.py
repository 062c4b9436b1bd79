"""Each primitive against its pure-JAX / fp64 reference, eagerly, under jit and under vmap; FP8
bytes bit for bit; NVTE_JAX_CUSTOM_CALLS switching."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from utils import DTYPES, FP8, assert_bytes_equal, assert_close, f64, randn

import transformer_engine_lite.jax  # noqa: F401  (registers the handlers)
from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.cpp_extensions import base
from transformer_engine_lite.jax.cpp_extensions.quantization import (
    _jax_delayed_update,
    _jax_mx,
    _jax_scale_from_amax,
)

SHAPES = [(4, 64), (3, 5, 17), (1, 1), (0, 16)]


def _special(x):
    flat = x.reshape(-1)
    if flat.size >= 6:
        flat = flat.at[:6].set(jnp.array([jnp.nan, jnp.inf, -jnp.inf, 1e6, -0.0, 1e-9], x.dtype))
    return flat.reshape(x.shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_dtype", FP8)
def test_quantize_bytes(shape, dtype, q_dtype):
    x = _special(randn(0, shape, dtype, 3.0))
    scale = jnp.array([2.5], jnp.float32)
    q, amax, si = tex.quantize(x, scale, q_dtype)
    rq, ramax, rsi = tex._jax_quantize_scaled(x, scale, q_dtype)
    assert_bytes_equal(q, rq)
    np.testing.assert_array_equal(np.asarray(amax), np.asarray(ramax))
    np.testing.assert_array_equal(np.asarray(si), np.asarray(rsi))
    jq = jax.jit(lambda a: tex.quantize(a, scale, q_dtype))(x)
    assert_bytes_equal(jq[0], q)


def test_quantize_vmap_per_example_amax():
    x = randn(1, (3, 8, 16), jnp.bfloat16, 2.0)
    q, amax, _ = jax.vmap(lambda a: tex.quantize(a, jnp.ones((1,), jnp.float32),
                                                 jnp.float8_e4m3fn))(x)
    assert q.shape == x.shape and amax.shape == (3, 1)
    want = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=(1, 2))
    np.testing.assert_array_equal(np.asarray(amax[:, 0]), np.asarray(want))


@pytest.mark.parametrize("q_dtype", FP8)
def test_dequantize(q_dtype):
    x = randn(2, (6, 32), jnp.float32)
    q, _, si = tex.quantize(x, jnp.array([4.0], jnp.float32), q_dtype)
    for out in DTYPES:
        got = tex.dequantize(q, si, out)
        want = (q.astype(jnp.float32) * si[0]).astype(out)
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("q_dtype", FP8)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("eps", [0.0, 1e-3])
def test_compute_scale_from_amax(q_dtype, pow2, eps):
    for a in [0.0, 1e-30, 1e-4, 0.37, 3.0, 448.0, 1e30, np.inf, np.nan]:
        amax = jnp.array([a], jnp.float32)
        s, si = tex.compute_scale_from_amax(amax, q_dtype, eps, pow2)
        rs, rsi = _jax_scale_from_amax(amax, q_dtype, eps, pow2)
        np.testing.assert_array_equal(np.asarray(s), np.asarray(rs), err_msg=f"amax {a}")
        np.testing.assert_array_equal(np.asarray(si), np.asarray(rsi), err_msg=f"amax {a}")


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0.0, 2.0])
@pytest.mark.parametrize("q_dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2fnuz])
def test_delayed_scaling_update(algo, margin, q_dtype):
    rng = np.random.default_rng(0)
    hist = rng.uniform(0, 10, (16, 5)).astype(np.float32)
    hist[:, 1] = 0.0  # all-zero column keeps its scale
    hist[3, 2] = np.nan
    hist[0, 3] = np.inf
    scale = rng.uniform(0.5, 2, (5,)).astype(np.float32)
    got = tex.delayed_scaling_update(jnp.asarray(hist), jnp.asarray(scale), algo, q_dtype, margin)
    want = _jax_delayed_update(jnp.asarray(hist), jnp.asarray(scale), algo, q_dtype, margin)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("shape", [(64, 64), (33, 70), (2, 40, 96)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_quantize_mxfp8(shape, dtype, q_dtype):
    x = randn(3, shape, dtype, 4.0)
    got = tex.quantize_mxfp8(x, q_dtype, True, True)
    want = _jax_mx(x, q_dtype, True, True)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))  # E8M0 scales
    np.testing.assert_array_equal(np.asarray(got[3]), np.asarray(want[3]))
    # Data: the oracle is ml_dtypes' float32 -> FP8 conversion (one rounding; XLA's CPU convert of
    # 16-bit inputs may round twice through float16 near the subnormal range).
    x2 = np.asarray(x.astype(jnp.float32)).reshape(-1, shape[-1])
    fmax = float(jnp.finfo(q_dtype).max)
    for data, scales, t in ((got[0], got[1], False), (got[2], got[3], True)):
        xv = x2.T if t else x2
        sc = np.asarray(scales).T if t else np.asarray(scales)
        inv = np.exp2(127.0 - np.repeat(sc.astype(np.float32), 32, axis=1)[:, : xv.shape[1]])
        ref = np.clip(xv * inv.astype(np.float32), -fmax, fmax).astype(q_dtype)
        ref = ref.T if t else ref
        assert_bytes_equal(np.asarray(data).reshape(ref.shape), ref)
    for col, (d, s) in ((False, got[:2]), (True, got[2:])):
        back = tex.dequantize_mxfp8(d, s, col, jnp.float32)
        assert_close(back, x.astype(jnp.float32), "fp8")


def _ln_ref(x, g, b, eps, zcg, rms):
    x = f64(x)
    g = f64(g) + (1.0 if zcg else 0.0)
    if rms:
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * g + f64(b)


@pytest.mark.parametrize("shape", [(4, 64), (3, 5, 17), (0, 8)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("zcg", [False, True])
def test_norm_fwd_bwd(shape, dtype, norm, zcg):
    x = randn(4, shape, dtype, 2.0) + 0.5
    h = shape[-1]
    g = randn(5, (h,), dtype, 0.3) + (0.0 if zcg else 1.0)
    b = randn(6, (h,), dtype, 0.3)
    rms = norm == "rmsnorm"
    z, mu, rs, amax, si = jax.jit(lambda x: tex.normalization_fwd(x, g, b, norm, 1e-5, zcg))(x)
    assert z.dtype == x.dtype and rs.shape == shape[:-1] and amax.shape == (0,)
    assert_close(z, _ln_ref(x, g, b, 1e-5, zcg, rms), dtype)

    def ref(x, g, b):
        return tex._jax_rmsnorm_f32(x, g, 1e-5, zcg)[0] if rms else tex._jax_layernorm_f32(
            x, g, b, 1e-5, zcg)[0]

    dz = randn(7, shape, dtype)
    dx, dg, db = tex.normalization_bwd(dz, x, mu, rs, g, norm, zcg)
    _, vjp = jax.vjp(ref, x.astype(jnp.float32), g.astype(jnp.float32), b.astype(jnp.float32))
    rdx, rdg, rdb = vjp(dz.astype(jnp.float32))
    assert_close(dx, rdx, dtype, 2.0)
    assert_close(dg, rdg, dtype, max(1.0, shape[0] / 2))
    if not rms:
        assert_close(db, rdb, dtype, max(1.0, shape[0] / 2))
    else:
        assert db is None


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("q_dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_norm_fp8_output_fused(norm, q_dtype):
    x = randn(8, (16, 64), jnp.bfloat16, 2.0)
    g = jnp.ones((64,), jnp.bfloat16)
    b = jnp.zeros((64,), jnp.bfloat16)
    scale = jnp.array([8.0], jnp.float32)
    zq, _, _, amax, si = tex.normalization_fwd(x, g, b, norm, 1e-6, False, q_dtype, scale)
    z, *_ = tex.normalization_fwd(x.astype(jnp.float32), g.astype(jnp.float32),
                                  b.astype(jnp.float32), norm, 1e-6, False)
    assert zq.dtype == q_dtype and float(si[0]) == 0.125
    assert_close(zq.astype(jnp.float32) / 8.0, z, "fp8")
    assert_close(amax[0], jnp.max(jnp.abs(z)), "bfloat16")


ACTS = [("gelu",), ("relu",), ("silu",), ("quick_gelu",), ("squared_relu",), ("linear",),
        ("gelu", "linear"), ("relu", "linear"), ("silu", "linear"), ("sigmoid", "linear"),
        ("quick_gelu", "linear"), ("squared_relu", "linear"), ("clamped_silu", "clamped_linear")]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_activation(act, dtype):
    gated = len(act) == 2
    shape = (6, 2, 40) if gated else (6, 40)
    x = randn(9, shape, dtype, 3.0)
    y = jax.jit(lambda x: tex.act_lu(x, act)[0])(x)
    want = tex._jax_act_lu_f32(x.astype(jnp.float32), act)
    assert y.shape == (6, 40)
    assert_close(y, want, dtype, 2.0)
    g = randn(10, (6, 40), dtype)
    dx = tex.dact_lu(g, x, act)
    _, vjp = jax.vjp(lambda v: tex._jax_act_lu_f32(v, act), x.astype(jnp.float32))
    assert_close(dx, vjp(g.astype(jnp.float32))[0], dtype, 2.0)
    # vmap over a leading dim batches natively
    yv = jax.vmap(lambda v: tex.act_lu(v, act)[0])(x)
    assert_close(yv, y, dtype)


def test_activation_fp8_output():
    x = randn(11, (8, 64), jnp.bfloat16, 2.0)
    q, amax, _ = tex.act_lu(x, ("gelu",), jnp.float8_e4m3fn, jnp.array([16.0], jnp.float32))
    y = tex.act_lu(x.astype(jnp.float32), ("gelu",))[0]
    assert_close(q.astype(jnp.float32) / 16.0, y, "fp8")
    assert_close(amax[0], jnp.max(jnp.abs(y)), "bfloat16")


@pytest.mark.parametrize("trans", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_contracting_dims(trans, dtype):
    lt, rt = trans
    m, k, n = 24, 40, 16
    lhs = randn(12, (k, m) if lt else (m, k), dtype)
    rhs = randn(13, (n, k) if rt else (k, n), dtype)
    dims = ((0,) if lt else (1,), (1,) if rt else (0,))
    bias = randn(14, (n,), dtype)
    got = jax.jit(lambda a, b: tex.gemm(a, b, dims, bias=bias))(lhs, rhs)
    want = (f64(lhs).T if lt else f64(lhs)) @ (f64(rhs).T if rt else f64(rhs)) + f64(bias)
    assert_close(got, want, dtype, 4.0)
    d, pre = tex.gemm(lhs, rhs, dims, bias=bias, fuse_gelu=True)
    assert_close(pre, want, dtype, 4.0)
    assert_close(d, jax.nn.gelu(jnp.asarray(want, jnp.float32), approximate=True), dtype, 4.0)


def test_gemm_batched_lhs_and_vmap():
    x = randn(15, (2, 3, 32), jnp.bfloat16)
    w = randn(16, (32, 8), jnp.bfloat16)
    got = tex.gemm(x, w, ((2,), (0,)))
    assert_close(got, np.einsum("bsk,kn->bsn", f64(x), f64(w)), jnp.bfloat16, 4.0)
    v = jax.vmap(lambda a: tex.gemm(a, w, ((1,), (0,))))(x)
    assert_close(v, got, jnp.bfloat16)
    w_stack = randn(17, (2, 32, 8), jnp.bfloat16)
    v2 = jax.vmap(lambda a, b: tex.gemm(a, b, ((1,), (0,))))(x, w_stack)
    assert_close(v2, np.einsum("bsk,bkn->bsn", f64(x), f64(w_stack)), jnp.bfloat16, 4.0)


@pytest.mark.parametrize("q_dtypes", [(jnp.float8_e4m3fn, jnp.float8_e4m3fn),
                                      (jnp.float8_e5m2, jnp.float8_e4m3fn)])
def test_gemm_fp8_operands(q_dtypes):
    x = randn(18, (32, 64), jnp.float32)
    w = randn(19, (64, 48), jnp.float32, 0.2)
    xq, _, xsi = tex.quantize(x, jnp.array([64.0], jnp.float32), q_dtypes[0])
    wq, _, wsi = tex.quantize(w, jnp.array([256.0], jnp.float32), q_dtypes[1])
    got = tex.gemm(xq, wq, ((1,), (0,)), xsi, wsi, out_dtype=jnp.bfloat16)
    want = (f64(xq.astype(jnp.float32)) / 64.0) @ (f64(wq.astype(jnp.float32)) / 256.0)
    assert got.dtype == jnp.bfloat16
    assert_close(got, want, jnp.bfloat16, 2.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_variants(dtype):
    x = randn(20, (2, 3, 8, 8), dtype, 2.0)
    mask = jax.random.bernoulli(jax.random.PRNGKey(1), 0.3, (2, 1, 8, 8))
    from transformer_engine_lite.jax.cpp_extensions.softmax import _jax_bwd, _jax_fwd

    cases = [
        ("scaled", lambda: tex.scaled_softmax_fwd(x, 0.5), None),
        ("scaled_masked", lambda: tex.scaled_masked_softmax_fwd(x, mask, 0.5), mask),
        ("scaled_aligned_causal_masked",
         lambda: tex.scaled_aligned_causal_masked_softmax_fwd(x, 0.5), None),
    ]
    for variant, fn, m in cases:
        got = fn()
        want = _jax_fwd(variant, x.astype(jnp.float32), m, 0.5)
        assert_close(got, want, dtype)
    y3 = tex.scaled_upper_triang_masked_softmax_fwd(x.reshape(6, 8, 8), 0.5)
    want3 = _jax_fwd("scaled_upper_triang_masked", x.reshape(6, 8, 8).astype(jnp.float32), None,
                     0.5)
    assert_close(y3, want3, dtype)
    # TE-JAX passes [b, h, sq, sq]: the same values as the [b*h, sq, sq] C API form, bit for bit.
    y4 = tex.scaled_upper_triang_masked_softmax_fwd(x, 0.5)
    assert y4.shape == x.shape
    np.testing.assert_array_equal(np.asarray(y4.reshape(6, 8, 8), np.float32),
                                  np.asarray(y3, np.float32))
    dy = randn(21, x.shape, dtype)
    y = tex.scaled_softmax_fwd(x, 0.5)
    # TE-JAX's backward arguments: (dz, softmax_out, logits[, mask], scale_factor)
    assert_close(tex.scaled_softmax_bwd(dy, y, x, 0.5), _jax_bwd(dy, y, 0.5), dtype, 2.0)
    ym = tex.scaled_masked_softmax_fwd(x, mask, 0.5)
    assert_close(tex.scaled_masked_softmax_bwd(dy, ym, x, mask, 0.5), _jax_bwd(dy, ym, 0.5),
                 dtype, 2.0)
    d4 = tex.scaled_upper_triang_masked_softmax_bwd(dy, y4, x, 0.5)
    d3 = tex.scaled_upper_triang_masked_softmax_bwd(dy.reshape(6, 8, 8), y3, None, 0.5)
    np.testing.assert_array_equal(np.asarray(d4.reshape(6, 8, 8), np.float32),
                                  np.asarray(d3, np.float32))
    assert_close(d4, _jax_bwd(dy, y4, 0.5), dtype, 2.0)
    with pytest.raises(ValueError, match="argument 'logits'"):
        tex.scaled_softmax_bwd(dy, y, x[:1], 0.5)
    with pytest.raises(ValueError, match="sq == sk"):
        tex.scaled_upper_triang_masked_softmax_fwd(x[..., :4], 0.5)


@pytest.mark.parametrize("variant", ["scaled", "scaled_masked", "scaled_upper_triang_masked"])
def test_softmax_reference_offset(variant):
    """TE-JAX's jax_scaled_* references take softmax_offset (attention sinks): the offset joins the
    row max and adds exp(offset - max) to the denominator. Checked against fp64."""
    x = randn(30, (2, 3, 5, 5), jnp.float32, 2.0)
    mask = jax.random.bernoulli(jax.random.PRNGKey(31), 0.3, (2, 1, 5, 5)).astype(jnp.uint8)
    off = randn(32, (1, 3, 1, 1), jnp.float32)
    fn = getattr(tex, f"jax_{variant}_softmax")
    args = (x, mask) if variant == "scaled_masked" else (x,)
    got = np.asarray(fn(*args, 0.5, softmax_offset=off), np.float64)
    xs = np.asarray(x, np.float64) * 0.5
    keep = np.ones(xs.shape, bool)
    if variant == "scaled_masked":
        keep = np.broadcast_to(np.asarray(mask) == 0, xs.shape)
    elif variant == "scaled_upper_triang_masked":
        keep = np.broadcast_to(np.tril(np.ones((5, 5), bool)), xs.shape)
    o = np.broadcast_to(np.asarray(off, np.float64), xs.shape[:-1] + (1,))
    m = np.maximum(np.where(keep, xs, -np.inf).max(-1, keepdims=True), o)
    e = np.where(keep, np.exp(xs - m), 0.0)
    want = e / (e.sum(-1, keepdims=True) + np.exp(o - m))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    plain = np.asarray(fn(*args, 0.5), np.float64)
    assert not np.allclose(plain, got)  # the offset changes the result


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope(fmt, interleaved):
    from transformer_engine_lite.jax.cpp_extensions.rope import _jax_rope

    shape = {"sbhd": (8, 2, 3, 16), "bshd": (2, 8, 3, 16), "thd": (12, 3, 16)}[fmt]
    t = randn(22, shape, jnp.float32)
    freqs = randn(23, (8, 1, 1, 12), jnp.float32)
    cu = jnp.array([0, 5, 10], jnp.int32) if fmt == "thd" else None
    got = tex.fused_rope_fwd(t, freqs, fmt, interleaved, cu)
    want = _jax_rope(t, freqs, cu, fmt, interleaved)
    assert_close(got, want, jnp.float32, 10.0)
    g = randn(25, shape, jnp.float32)
    back = tex.fused_rope_bwd(g, freqs, fmt, interleaved, cu)
    _, vjp = jax.vjp(lambda v: _jax_rope(v, freqs, cu, fmt, interleaved), t)
    assert_close(back, vjp(g)[0], jnp.float32, 10.0)


def test_custom_calls_switch(monkeypatch):
    x = randn(24, (4, 32), jnp.float32)
    g = jnp.ones((32,), jnp.float32)
    b = jnp.zeros((32,), jnp.float32)
    on = tex.layernorm_fwd(x, g, b)[0]
    monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", "NormFwdPrimitive=false")
    assert not base.custom_calls_enabled("NormFwdPrimitive")
    assert base.custom_calls_enabled("GemmPrimitive")
    jaxpr = str(jax.make_jaxpr(lambda x: tex.layernorm_fwd(x, g, b)[0])(x))
    assert "NormFwdPrimitive" not in jaxpr
    off = tex.layernorm_fwd(x, g, b)[0]
    assert_close(off, on, jnp.float32)
    monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", "false")
    assert not base.custom_calls_enabled("GemmPrimitive")
    monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", "true")
    assert "NormFwdPrimitive" in str(jax.make_jaxpr(lambda x: tex.layernorm_fwd(x, g, b)[0])(x))
    monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", "NormFwdPrimitive")
    with pytest.raises(ValueError, match="NVTE_JAX_CUSTOM_CALLS"):
        tex.layernorm_fwd(x, g, b)


def test_registrations():
    regs = tex.registrations()
    assert len(regs) == 34 and all("cpu" in v for v in regs.values())
    assert "te_lite_gemm_ffi" in regs and "te_lite_layernorm_fwd_ffi" in regs
    assert "te_lite_quantize_nvfp4_ffi" in regs and "te_lite_dequantize_nvfp4_ffi" in regs
    assert "te_lite_nvfp4_block_gemm_ffi" in regs  # the NVFP4 GEMM (gemm_nvfp4.py)
