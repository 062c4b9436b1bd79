"""Numerics of torch.ops.te_lite against fp64 torch references and independent FP8 oracles
(ml_dtypes bytes, E8M0 scales), autograd of the differentiable ops included. CPU only."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

te_ops = pytest.importorskip(
    "transformer_engine_lite.pytorch.te_lite_ops",
    reason="PyTorch extension not built",
    exc_type=ImportError,
)
from op_helpers import (
    FP8,
    FP8_IDS,
    HP_DTYPES,
    assert_bytes_equal,
    assert_close,
    decode,
    encode_oracle,
    f32,
    ops,
    randn,
)

from transformer_engine_lite.common import capi
from utils import ref_activation


# ===================================================================================== cast
@pytest.mark.parametrize("fp8_dtype", list(FP8), ids=FP8_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_quantize_bytes_amax_scale_inv(fp8_dtype, dtype):
    x = randn(37, 129, dtype=dtype, scale=40.0)
    x[0, :3] = torch.tensor([1e6, -1e6, 0.0])  # saturation and zero
    s = 1.7
    q, amax, scale_inv = ops.quantize(x, f32(s), fp8_dtype)
    assert q.dtype == fp8_dtype and q.shape == x.shape
    v = (x.float() * np.float32(s)).numpy()  # x * scale in fp32, as the spec says
    assert_bytes_equal(q, encode_oracle(v, fp8_dtype), f"quantize {dtype} -> {fp8_dtype}")
    assert amax.item() == x.abs().max().float().item()
    assert scale_inv.item() == np.float32(1) / np.float32(s)


def test_quantize_matches_ctypes_path_and_amax_propagates_nan():
    x = randn(8, 100, dtype=torch.bfloat16, scale=10.0)
    q, amax, scale_inv = ops.quantize(x, f32(3.0), torch.float8_e5m2)
    q_ref = torch.empty(x.shape, dtype=torch.float8_e5m2)
    amax_ref, si_ref = f32(0), f32(0)
    capi.call(
        "nvte_quantize",
        capi.Tensor(x),
        capi.Tensor(q_ref, scale=f32(3.0), amax=amax_ref, scale_inv=si_ref),
        None,
    )
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(amax, amax_ref) and torch.equal(scale_inv, si_ref)
    x[3, 7] = float("nan")
    assert math.isnan(ops.quantize(x, f32(1.0), torch.float8_e4m3fn)[1].item())
    assert math.isnan(ops.compute_amax(x).item())


def test_quantize_non_contiguous_input():
    x = randn(64, 48).t()  # [48, 64], non-contiguous
    q, _, _ = ops.quantize(x, f32(1.0), torch.float8_e4m3fn)
    assert_bytes_equal(q, encode_oracle(x.contiguous().numpy(), torch.float8_e4m3fn), "t()")


def _e8m0_oracle(block_amax: np.ndarray, fmax: float) -> np.ndarray:
    e = np.array([math.ceil(math.log2(a / fmax)) if a > 0 else -127 for a in block_amax.ravel()])
    return np.clip(e + 127, 0, 254).astype(np.uint8).reshape(block_amax.shape)


@pytest.mark.parametrize("shape", [(64, 96), (2, 20, 70)], ids=str)
def test_quantize_mxfp8_and_dequantize(shape):
    x = randn(*shape) * torch.logspace(-3, 3, shape[-2]).unsqueeze(1)
    row, row_s, col, col_s = ops.quantize_mxfp8(x, torch.float8_e4m3fn, True, True)
    x2 = x.reshape(-1, shape[-1]).numpy()
    rows, cols = x2.shape
    rb, cb = math.ceil(rows / 32), math.ceil(cols / 32)
    assert row_s.shape == (rows, cb) and col_s.shape == (rb, cols) and row_s.dtype == torch.uint8
    a = np.abs(x2)
    want_row = _e8m0_oracle(
        np.pad(a, ((0, 0), (0, cb * 32 - cols))).reshape(rows, cb, 32).max(-1), 448.0
    )
    want_col = _e8m0_oracle(
        np.pad(a, ((0, rb * 32 - rows), (0, 0))).reshape(rb, 32, cols).max(1), 448.0
    )
    np.testing.assert_array_equal(row_s.numpy(), want_row)
    np.testing.assert_array_equal(col_s.numpy(), want_col)
    inv_row = np.exp2(127.0 - np.repeat(want_row, 32, 1)[:, :cols]).astype(np.float32)
    inv_col = np.exp2(127.0 - np.repeat(want_col, 32, 0)[:rows]).astype(np.float32)
    assert_bytes_equal(row, encode_oracle(x2 * inv_row, torch.float8_e4m3fn), "row-wise")
    assert_bytes_equal(col, encode_oracle(x2 * inv_col, torch.float8_e4m3fn), "column-wise")
    for data, scales, colwise, inv in ((row, row_s, False, inv_row), (col, col_s, True, inv_col)):
        out = ops.dequantize_mxfp8(data, scales, colwise, torch.float32)
        want = decode(data).reshape(rows, cols) / torch.from_numpy(inv)
        assert torch.equal(out.reshape(rows, cols), want), f"dequantize_mxfp8 columnwise={colwise}"
    only_row = ops.quantize_mxfp8(x, torch.float8_e4m3fn, True, False)
    assert torch.equal(only_row[0].view(torch.uint8), row.view(torch.uint8))
    assert only_row[2].numel() == 0 and only_row[3].numel() == 0


@pytest.mark.parametrize("fp8_dtype", list(FP8), ids=FP8_IDS)
def test_dequantize_all_codes(fp8_dtype):
    q = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8_dtype)
    out = ops.dequantize(q, f32(0.375), torch.float32)
    want = decode(q) * np.float32(0.375)
    assert torch.equal(out, want) or torch.allclose(out, want, rtol=0, atol=0, equal_nan=True)
    assert ops.dequantize(q, f32(0.375), torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2fnuz], ids=str)
@pytest.mark.parametrize("pow2", [False, True])
def test_compute_scale_from_amax(fp8_dtype, pow2):
    fmax = FP8[fp8_dtype][1]
    for amax_in, eps in ((3.0, 0.0), (0.1337, 0.0), (0.0, 0.0), (1e-6, 1e-3), (math.inf, 0.0)):
        scale, scale_inv = ops.compute_scale_from_amax(f32(amax_in), fp8_dtype, eps, pow2)
        a = max(np.float32(amax_in), np.float32(eps))
        want = 1.0 if a == 0 or not np.isfinite(a) else float(np.float32(fmax) / np.float32(a))
        if pow2:
            want = 2.0 ** math.floor(math.log2(want))
        assert scale.item() == want, f"amax {amax_in}, eps {eps}: {scale.item()} != {want}"
        assert scale_inv.item() == np.float32(1) / np.float32(want)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_update_functional_and_in_place(algo):
    hist = torch.rand(5, 4, generator=torch.Generator().manual_seed(0)) * 10 + 0.5
    hist[:, 3] = 0.0  # amax 0: previous scale kept
    scale = torch.tensor([1.0, 2.0, 0.5, 7.0])
    new_hist, new_scale = ops.delayed_scaling_update(hist, scale, algo, torch.float8_e4m3fn, 1.0)
    amax = hist.max(0).values if algo == "max" else hist[0]
    want = torch.where(amax > 0, (448.0 / amax) / 2.0, scale)
    torch.testing.assert_close(new_scale, want, rtol=2e-7, atol=0)
    assert torch.equal(new_hist[1:-1], hist[2:]) and torch.equal(new_hist[-1], hist[0])
    assert (new_hist[0] == 0).all()
    h, s = hist.clone(), scale.clone()
    assert ops.delayed_scaling_update_(h, s, algo, torch.float8_e4m3fn, 1.0) is None
    assert torch.equal(h, new_hist) and torch.equal(s, new_scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8], ids=str)
def test_transpose_and_cast_transpose(dtype):
    x = randn(33, 70, scale=20).to(dtype)
    assert torch.equal(ops.transpose(x), x.t())
    if dtype == torch.uint8:
        return
    data, data_t, amax, scale_inv = ops.cast_transpose(x, f32(0.5), torch.float8_e4m3fn)
    q, amax_q, _ = ops.quantize(x, f32(0.5), torch.float8_e4m3fn)
    assert torch.equal(data.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(data_t.view(torch.uint8), q.view(torch.uint8).t())
    assert torch.equal(amax, amax_q) and scale_inv.item() == 2.0


# ===================================================================================== norms
def _norm_ref(kind, x, gamma, beta, eps, zero_centered):
    x64 = x.double()
    g = gamma.double() + (1.0 if zero_centered else 0.0)
    if kind == "layernorm":
        return torch.nn.functional.layer_norm(x64, x64.shape[-1:], g, beta.double(), eps)
    return x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + eps) * g


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(5, 123), (3, 7, 257)], ids=str)
@pytest.mark.parametrize("zero_centered", [False, True])
def test_norm_fwd_bwd_match_fp64(kind, dtype, shape, zero_centered):
    hidden, eps = shape[-1], 1e-5
    x = randn(*shape, dtype=dtype, scale=3.0, requires_grad=True)
    gamma = (randn(hidden, seed=1) * 0.2 + (0.0 if zero_centered else 1.0)).to(dtype)
    gamma.requires_grad_(True)
    beta = randn(hidden, dtype=dtype, seed=2, scale=0.5, requires_grad=True)
    if kind == "layernorm":
        z = ops.layernorm_fwd(x, gamma, beta, eps, zero_centered)[0]
    else:
        z = ops.rmsnorm_fwd(x, gamma, eps, zero_centered)[0]
    leaves = [x, gamma] + ([beta] if kind == "layernorm" else [])
    leaves64 = [t.detach().double().requires_grad_(True) for t in leaves]
    z_ref = _norm_ref(
        kind,
        leaves64[0],
        leaves64[1],
        leaves64[2] if kind == "layernorm" else None,
        eps,
        zero_centered,
    )
    assert z.dtype == dtype
    assert_close(z, z_ref, dtype, f"{kind} z")
    dz = randn(*shape, seed=5)
    grads = torch.autograd.grad(z, leaves, dz.to(dtype))
    grads_ref = torch.autograd.grad(z_ref, leaves64, dz.double())
    # dgamma/dbeta sum over rows: one rounding of the result in `dtype` plus fp32 accumulation.
    for name, got, want in zip(("dx", "dgamma", "dbeta"), grads, grads_ref):
        assert got.dtype == dtype
        scale = max(1.0, want.abs().max().item())
        assert_close(got / scale, want / scale, dtype, f"{kind} {name}")


@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
@pytest.mark.parametrize("add_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rmsnorm_bwd_add(dtype, add_dtype):
    """rmsnorm_bwd_add: dx = rmsnorm_bwd's dx + add, added in fp32 before dx's one rounding (so in
    fp32 it equals the separate sum to the last bit), dgamma unchanged."""
    x = randn(7, 96, dtype=dtype, scale=2.0)
    gamma = (randn(96, seed=1) * 0.2 + 1.0).to(dtype)
    rsigma = ops.rmsnorm_fwd(x, gamma, 1e-5, False)[1]
    dz, add = randn(7, 96, dtype=dtype, seed=2), randn(7, 96, dtype=add_dtype, seed=3)
    dx, dgamma = ops.rmsnorm_bwd_add(dz, x, add, rsigma, gamma, False)
    dx0, dgamma0 = ops.rmsnorm_bwd(dz, x, rsigma, gamma, False)
    assert dx.dtype == dtype and torch.equal(dgamma, dgamma0)
    x64 = x.double().requires_grad_()
    g64 = gamma.double()
    z64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * g64
    want = torch.autograd.grad(z64, x64, dz.double())[0] + add.double()
    assert_close(dx, want, dtype, "dx + add")
    if dtype == torch.float32:
        assert torch.equal(dx, dx0 + add.float())
    with pytest.raises(RuntimeError, match="add"):
        ops.rmsnorm_bwd_add(dz, x, randn(7, 95), rsigma, gamma, False)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_norm_fp8_output(kind, fp8_dtype):
    x, gamma, beta = randn(33, 320, dtype=torch.bfloat16), randn(320, seed=1), randn(320, seed=2)
    gamma = gamma.to(torch.bfloat16)
    beta = beta.to(torch.bfloat16)
    if kind == "layernorm":
        z_hp = ops.layernorm_fwd(x, gamma, beta, 1e-5, False, torch.float32)[0]
        zq, _, _, amax, scale_inv = ops.layernorm_fwd(
            x, gamma, beta, 1e-5, False, fp8_dtype, f32(4.0)
        )
    else:
        z_hp = ops.rmsnorm_fwd(x, gamma, 1e-5, False, torch.float32)[0]
        zq, _, amax, scale_inv = ops.rmsnorm_fwd(x, gamma, 1e-5, False, fp8_dtype, f32(4.0))
    assert zq.dtype == fp8_dtype and amax.shape == (1,) and scale_inv.item() == 0.25
    assert_bytes_equal(zq, encode_oracle((z_hp * 4.0).numpy(), fp8_dtype), f"{kind} fp8 z")
    assert amax.item() == z_hp.abs().max().item()


# ===================================================================================== activations
@pytest.mark.parametrize("name", te_ops.ACTIVATIONS)
@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
def test_activation_fwd_bwd_match_fp64(name, dtype):
    x = randn(3, 5, 66, dtype=dtype, scale=2.0, requires_grad=True)
    y, amax, scale_inv = ops.activation_fwd(x, name)
    x64 = x.detach().double().requires_grad_(True)
    y_ref = ref_activation(name, x64)
    assert y.dtype == dtype and amax.numel() == 0 and scale_inv.numel() == 0
    assert_close(y, y_ref, dtype, f"{name} fwd")
    dy = randn(*y.shape, seed=3)
    (dx,) = torch.autograd.grad(y, x, dy.to(dtype))
    (dx_ref,) = torch.autograd.grad(y_ref, x64, dy.double())
    assert_close(dx, dx_ref, dtype, f"{name} bwd")


@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
def test_clamped_swiglu_matches_fp64(dtype):
    """TE's clamped SwiGLU; inputs straddle the limit so both clamps and their zero gradients
    are exercised."""
    limit, alpha = 2.5, 1.702
    x = randn(3, 5, 66, dtype=dtype, scale=3.0, requires_grad=True)
    y = ops.clamped_swiglu_fwd(x, limit, alpha)[0]
    x64 = x.detach().double().requires_grad_(True)
    y_ref = ref_activation("clamped_swiglu", x64, limit, alpha)
    assert_close(y, y_ref, dtype, "clamped_swiglu fwd")
    dy = randn(*y.shape, seed=3)
    (dx,) = torch.autograd.grad(y, x, dy.to(dtype))
    (dx_ref,) = torch.autograd.grad(y_ref, x64, dy.double())
    assert_close(dx, dx_ref, dtype, "clamped_swiglu bwd")
    yq, amax, scale_inv = ops.clamped_swiglu_fwd(x.detach().float(), limit, alpha,
                                                  torch.float8_e4m3fn, f32(8.0))
    y32 = ops.clamped_swiglu_fwd(x.detach().float(), limit, alpha)[0]
    assert_bytes_equal(yq, encode_oracle((y32 * 8.0).numpy(), torch.float8_e4m3fn), "fp8 out")
    with pytest.raises(RuntimeError, match="'limit'"):
        ops.clamped_swiglu_fwd(x, 0.0, alpha)
    # TE's glu_linear_offset (nvte_clamped_swiglu_v2): forward and backward
    for offset in (0.0, 0.5):
        y = ops.clamped_swiglu_fwd(x, limit, alpha, glu_linear_offset=offset)[0]
        y_ref = ref_activation("clamped_swiglu", x64, limit, alpha, offset)
        assert_close(y, y_ref, dtype, f"clamped_swiglu fwd offset {offset}")
        (dx,) = torch.autograd.grad(y, x, dy.to(dtype))
        (dx_ref,) = torch.autograd.grad(y_ref, x64, dy.double())
        assert_close(dx, dx_ref, dtype, f"clamped_swiglu bwd offset {offset}")
    with pytest.raises(RuntimeError, match="'glu_linear_offset'"):
        ops.clamped_swiglu_fwd(x, limit, alpha, glu_linear_offset=float("nan"))


def test_activation_fp8_output_and_dtype_change():
    x = randn(17, 64, scale=3.0)
    y_hp = ops.activation_fwd(x, "geglu")[0]
    yq, amax, scale_inv = ops.activation_fwd(x, "geglu", torch.float8_e4m3fn, f32(8.0))
    assert yq.shape == (17, 32) and scale_inv.item() == 0.125
    assert_bytes_equal(yq, encode_oracle((y_hp * 8.0).numpy(), torch.float8_e4m3fn), "geglu fp8")
    assert amax.item() == y_hp.abs().max().item()
    xg = x.clone().requires_grad_(True)
    y16 = ops.activation_fwd(xg, "silu", torch.bfloat16)[0]
    assert y16.dtype == torch.bfloat16
    y16.float().sum().backward()
    assert xg.grad.dtype == torch.float32


# ===================================================================================== GEMM
def _op(t, trans):
    return t.double().t() if trans else t.double()


@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
@pytest.mark.parametrize(
    "layout", [(True, False), (False, False), (False, True)], ids=["TN", "NN", "NT"]
)
def test_gemm_matches_fp64(dtype, layout):
    transa, transb = layout
    m, n, k = 47, 33, 65
    a = randn(*((m, k) if transa else (k, m)), dtype=dtype)
    b = randn(*((k, n) if transb else (n, k)), dtype=dtype, seed=1)
    d, pre, bias_grad, amax, scale_inv = ops.gemm(a, None, transa, b, None, transb, dtype)
    assert d.dtype == dtype and d.shape == (n, m)
    assert pre.numel() == bias_grad.numel() == amax.numel() == scale_inv.numel() == 0
    assert_close(d, _op(b, transb) @ _op(a, transa), dtype, f"gemm {layout}")


def _gelu64(x):
    return ref_activation("gelu", x)


def test_gemm_bias_gelu_forward_and_3d_input():
    w, x, bias = randn(40, 96), randn(2, 12, 96, seed=1), randn(40, seed=2)
    d, pre, _, _, _ = ops.gemm(w, None, True, x, None, False, torch.float32, bias, True)
    assert d.shape == (2, 12, 40) and pre.shape == (2, 12, 40) and pre.dtype == torch.float32
    pre_ref = x.double() @ w.double().t() + bias.double()
    assert_close(pre, pre_ref, torch.float32, "pre_gelu_out")
    assert_close(d, _gelu64(pre_ref), torch.float32, "gelu(D)")


def test_gemm_grad_modes():
    # wgrad + bias grad: dW = dY^T X (A = X, B = dY, transb), bias_grad = dY summed over tokens.
    x, dy, bias = randn(24, 16), randn(24, 8, seed=1), randn(8, seed=2)
    dw, _, db, _, _ = ops.gemm(x, None, False, dy, None, True, torch.float32, bias, False, True)
    assert_close(dw, dy.double().t() @ x.double(), torch.float32, "wgrad")
    assert_close(db, dy.double().sum(0), torch.float32, "bias grad of op(B)")
    # dgrad through GELU: dH = (dY W) * gelu'(pre), bias grad = its column sums.
    w, pre = randn(8, 16, seed=3), randn(24, 16, seed=4)
    b1 = randn(16, seed=5)
    dh, _, db1, _, _ = ops.gemm(w, None, False, dy, None, False, torch.float32, b1, True, True, pre)
    pre64 = pre.double().requires_grad_(True)
    (gelu_grad,) = torch.autograd.grad(_gelu64(pre64).sum(), pre64)
    want = (dy.double() @ w.double()) * gelu_grad
    assert_close(dh, want, torch.float32, "dgelu")
    assert_close(db1, want.sum(0), torch.float32, "dgelu bias grad")


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
def test_fp8_gemm(out_dtype):
    a_hp, b_hp = randn(48, 160), randn(31, 160, seed=1)
    qa, _, sia = ops.quantize(a_hp, f32(100.0), torch.float8_e4m3fn)
    qb, _, sib = ops.quantize(b_hp, f32(50.0), torch.float8_e5m2)
    fp8_out = out_dtype in FP8
    d, _, _, amax, scale_inv = ops.gemm(
        qa,
        sia,
        True,
        qb,
        sib,
        False,
        out_dtype,
        None,
        False,
        False,
        None,
        f32(2.0) if fp8_out else None,
    )
    ref = (decode(qb).double() / 50.0) @ (decode(qa).double() / 100.0).t()
    if not fp8_out:
        assert_close(d, ref, out_dtype, "fp8 x fp8 -> bf16")
        return
    assert amax.item() == pytest.approx(ref.abs().max().item(), rel=1e-5)
    assert scale_inv.item() == 0.5
    # Each code is the encode of 2 * (fp32 product): at most one code off from the fp64 oracle.
    got = d.view(torch.uint8).numpy().astype(np.int16)
    want = encode_oracle((ref * 2.0).float().numpy(), out_dtype).astype(np.int16)
    ordinal = lambda c: np.where(c >= 128, 128 - c, c)
    assert np.abs(ordinal(got) - ordinal(want)).max() <= 1


@pytest.mark.parametrize(
    "layout",
    [(True, False), (False, False), (False, True), (True, True)],
    ids=["TN", "NN", "NT", "TT"],
)
@pytest.mark.parametrize("gelu", [False, True])
def test_gemm_autograd_matches_fp64(layout, gelu):
    transa, transb = layout
    m, n, k = 24, 10, 40
    a = randn(*((m, k) if transa else (k, m)), requires_grad=True)
    b = randn(*((k, n) if transb else (n, k)), seed=1, requires_grad=True)
    bias = randn(m, seed=2, requires_grad=True)
    d = ops.gemm(a, None, transa, b, None, transb, torch.float32, bias, gelu)[0]
    leaves64 = [t.detach().double().requires_grad_(True) for t in (a, b, bias)]
    y = _op(leaves64[1], transb) @ _op(leaves64[0], transa) + leaves64[2]
    d_ref = _gelu64(y) if gelu else y
    dd = randn(n, m, seed=3)
    grads = torch.autograd.grad(d, (a, b, bias), dd)
    grads_ref = torch.autograd.grad(d_ref, leaves64, dd.double())
    for name, got, want in zip(("dA", "dB", "dbias"), grads, grads_ref):
        assert_close(got, want, torch.float32, f"gemm {layout} gelu={gelu} {name}")


def test_gemm_fp8_and_grad_mode_outputs_do_not_require_grad():
    x = randn(8, 16, requires_grad=True)
    q, amax, _ = ops.quantize(x, f32(1.0), torch.float8_e4m3fn)
    assert not q.requires_grad and not amax.requires_grad
    dy = randn(8, 4, requires_grad=True)
    dw = ops.gemm(x, None, False, dy, None, True, torch.float32, None, False, True)[0]
    assert dw.shape == (4, 16) and not dw.requires_grad
    xt = ops.transpose(x)
    xt.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_gemm_accumulate_in_place():
    x, dy = randn(24, 16, dtype=torch.bfloat16), randn(24, 8, dtype=torch.bfloat16, seed=1)
    main_grad = randn(8, 16, seed=2)
    before = main_grad.clone()
    assert ops.gemm_accumulate_(main_grad, x, None, False, dy, None, True) is None
    want = before.double() + dy.double().t() @ x.double()
    assert_close(main_grad, want, torch.float32, "D += dY^T X")


@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
def test_gemm_accumulate_with_bias(dtype):
    """D += X W^T + bias (forward epilogue into an existing output: ForwardLinearBiasAdd)."""
    x, w = randn(12, 16, dtype=dtype), randn(8, 16, dtype=dtype, seed=3)
    bias, d = randn(8, dtype=dtype, seed=4), randn(12, 8, dtype=dtype, seed=5)
    want = d.double() + x.double() @ w.double().t() + bias.double()
    ops.gemm_accumulate_(d, w, None, True, x, None, False, bias)
    assert_close(d, want, dtype, "D += X W^T + b")
    with pytest.raises(RuntimeError, match="bias"):
        ops.gemm_accumulate_(d, w, None, True, x, None, False, randn(9, dtype=dtype))


# ===================================================================================== softmax
def _softmax_ref(variant, x64, scale, mask=None):
    logits = x64 * scale
    sq, sk = x64.shape[-2], x64.shape[-1]
    if variant == "scaled_masked":
        logits = torch.where(mask.bool(), torch.full_like(logits, -10000.0), logits)
    if variant in ("scaled_upper_triang_masked", "scaled_aligned_causal_masked"):
        i = torch.arange(sq).unsqueeze(1)
        j = torch.arange(sk).unsqueeze(0)
        keep = j <= i + (sk - sq)
        y = torch.softmax(logits.masked_fill(~keep, -math.inf), -1)
        return torch.nan_to_num(y, nan=0.0)  # a row with nothing kept is all zeros
    return torch.softmax(logits, -1)


@pytest.mark.parametrize("variant", te_ops.SOFTMAX_VARIANTS)
@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
def test_softmax_fwd_bwd_match_fp64(variant, dtype):
    shape = (6, 33, 33) if variant == "scaled_upper_triang_masked" else (2, 3, 17, 40)
    if variant == "scaled_aligned_causal_masked":
        shape = (2, 3, 40, 17)  # sq > sk: the first rows keep nothing
    x = randn(*shape, dtype=dtype, scale=3.0, requires_grad=True)
    mask = None
    extra = ()
    if variant == "scaled_masked":
        mask = torch.rand(2, 1, 17, 40, generator=torch.Generator().manual_seed(1)) > 0.6
        mask[0, 0, 3] = True  # a fully masked row is uniform, as in TE
        extra = (mask,)
    y = getattr(ops, f"{variant}_softmax_fwd")(x, *extra, 0.37)
    x64 = x.detach().double().requires_grad_(True)
    y_ref = _softmax_ref(variant, x64, 0.37, mask)
    assert_close(y, y_ref, dtype, f"{variant} fwd")
    dy = randn(*shape, seed=2)
    (dx,) = torch.autograd.grad(y, x, dy.to(dtype))
    if variant == "scaled_masked":
        # TE's backward ignores the mask: scale * y * (dy - sum(dy * y)), which differs from the
        # true gradient (0) only on fully masked rows, where y is uniform.
        y64 = y_ref.detach()
        dx_ref = 0.37 * y64 * (dy.double() - (dy.double() * y64).sum(-1, keepdim=True))
    else:
        (dx_ref,) = torch.autograd.grad(y_ref, x64, dy.double())
    assert_close(dx, dx_ref, dtype, f"{variant} bwd")
