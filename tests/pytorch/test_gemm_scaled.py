"""alpha / beta of te_lite::gemm and te_lite::gemm_accumulate_ (TE's nvte_cublas_gemm_scaled)
against fp64 torch references: forward epilogues, grad-mode epilogues, autograd, FP8 operands,
the in-place accumulate with bias, rejections, and opcheck. CPU only."""

from __future__ import annotations

import math

import pytest
import torch

te_ops = pytest.importorskip(
    "transformer_engine_lite.pytorch.te_lite_ops",
    reason="PyTorch extension not built",
    exc_type=ImportError,
)
from op_helpers import HP_DTYPES, assert_close, decode, f32, ops, randn, run_opcheck

from utils import ref_activation

ALPHAS = [1.0, 2.5, -0.75, 0.0]


def _op(t, trans):
    return t.double().t() if trans else t.double()


def _gelu64(x):
    return ref_activation("gelu", x)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("dtype", HP_DTYPES, ids=str)
@pytest.mark.parametrize("epilogue", ["plain", "bias", "bias_gelu"])
def test_gemm_alpha_forward(alpha, dtype, epilogue):
    m, n, k = 40, 21, 96
    w, x = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype, seed=1)
    bias = randn(m, dtype=dtype, seed=2) if epilogue != "plain" else None
    gelu = epilogue == "bias_gelu"
    d, pre, _, _, _ = ops.gemm(w, None, True, x, None, False, dtype, bias, gelu, alpha=alpha)
    y = alpha * (x.double() @ w.double().t())  # TE: D = GELU(alpha*AB + bias)
    if bias is not None:
        y = y + bias.double()
    if gelu:
        assert_close(pre, y, dtype, "pre_gelu_out")
        y = _gelu64(y)
    assert_close(d, y, dtype, f"alpha={alpha} {epilogue}")
    if alpha == 0.0 and epilogue == "plain":
        assert torch.all(d == 0)


@pytest.mark.parametrize("alpha", [3.0, -0.5])
def test_gemm_alpha_grad_epilogues(alpha):
    # bias gradient of op(B) is a function of B alone: alpha scales dW, not db.
    x, dy, bias = randn(24, 16), randn(24, 8, seed=1), randn(8, seed=2)
    dw, _, db, _, _ = ops.gemm(
        x, None, False, dy, None, True, torch.float32, bias, False, True, alpha=alpha
    )
    assert_close(dw, alpha * (dy.double().t() @ x.double()), torch.float32, "alpha wgrad")
    assert_close(db, dy.double().sum(0), torch.float32, "bias grad of op(B), unscaled")
    # dGELU: D = (alpha dY W) * gelu'(pre); its bias gradient sums that product (alpha included).
    w, pre, b1 = randn(8, 16, seed=3), randn(24, 16, seed=4), randn(16, seed=5)
    dh, _, db1, _, _ = ops.gemm(
        w, None, False, dy, None, False, torch.float32, b1, True, True, pre, alpha=alpha
    )
    pre64 = pre.double().requires_grad_(True)
    (gelu_grad,) = torch.autograd.grad(_gelu64(pre64).sum(), pre64)
    want = alpha * (dy.double() @ w.double()) * gelu_grad
    assert_close(dh, want, torch.float32, "alpha dgelu")
    assert_close(db1, want.sum(0), torch.float32, "alpha dgelu bias grad")


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gemm_alpha_fp8_operands(out_dtype):
    a_hp, b_hp = randn(48, 160), randn(31, 160, seed=1)
    qa, _, sia = ops.quantize(a_hp, f32(100.0), torch.float8_e4m3fn)
    qb, _, sib = ops.quantize(b_hp, f32(50.0), torch.float8_e5m2)
    d = ops.gemm(qa, sia, True, qb, sib, False, out_dtype, alpha=-1.5)[0]
    ref = -1.5 * (decode(qb).double() / 50.0) @ (decode(qa).double() / 100.0).t()
    assert_close(d, ref, out_dtype, "alpha fp8 x fp8")


@pytest.mark.parametrize(
    "layout",
    [(True, False), (False, False), (False, True), (True, True)],
    ids=["TN", "NN", "NT", "TT"],
)
@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("alpha", [0.5, -2.0])
def test_gemm_alpha_autograd_matches_fp64(layout, gelu, alpha):
    transa, transb = layout
    m, n, k = 24, 10, 40
    a = randn(*((m, k) if transa else (k, m)), requires_grad=True)
    b = randn(*((k, n) if transb else (n, k)), seed=1, requires_grad=True)
    bias = randn(m, seed=2, requires_grad=True)
    d = ops.gemm(a, None, transa, b, None, transb, torch.float32, bias, gelu, alpha=alpha)[0]
    leaves64 = [t.detach().double().requires_grad_(True) for t in (a, b, bias)]
    y = alpha * (_op(leaves64[1], transb) @ _op(leaves64[0], transa)) + leaves64[2]
    d_ref = _gelu64(y) if gelu else y
    dd = randn(n, m, seed=3)
    grads = torch.autograd.grad(d, (a, b, bias), dd)
    grads_ref = torch.autograd.grad(d_ref, leaves64, dd.double())
    for name, got, want in zip(("dA", "dB", "dbias"), grads, grads_ref):
        assert_close(got, want, torch.float32, f"alpha={alpha} {layout} gelu={gelu} {name}")


@pytest.mark.parametrize("d_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("beta", [1.0, 0.0, 0.5, -2.0])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_gemm_accumulate_alpha_beta_bias(d_dtype, alpha, beta, with_bias):
    # wgrad into main_grad: D = beta * D + alpha * dY^T X + bias.
    x, dy = randn(24, 16, dtype=torch.bfloat16), randn(24, 8, dtype=torch.bfloat16, seed=1)
    main_grad = randn(8, 16, seed=2).to(d_dtype)
    if beta == 0.0:
        main_grad.fill_(math.nan)  # beta = 0 does not read D
    before = main_grad.clone()
    bias = randn(16, dtype=torch.bfloat16, seed=3) if with_bias else None
    ops.gemm_accumulate_(main_grad, x, None, False, dy, None, True, bias, alpha, beta)
    want = alpha * (dy.double().t() @ x.double())
    if beta != 0.0:
        want = want + beta * before.double()
    if with_bias:
        want = want + bias.double()
    assert_close(main_grad, want, d_dtype, f"D = {beta} D + {alpha} dY^T X (+ bias)")


def test_gemm_accumulate_defaults_are_plain_accumulate():
    x, dy = randn(24, 16, dtype=torch.bfloat16), randn(24, 8, dtype=torch.bfloat16, seed=1)
    d1, d2 = randn(8, 16, seed=2), randn(8, 16, seed=2)
    ops.gemm_accumulate_(d1, x, None, False, dy, None, True)
    ops.gemm_accumulate_(d2, x, None, False, dy, None, True, None, 1.0, 1.0)
    assert torch.equal(d1, d2)


@pytest.mark.parametrize(
    "call, pattern",
    [
        (
            lambda: ops.gemm(randn(8, 4), None, True, randn(3, 4), None, False, torch.float32,
                             alpha=math.inf),
            r"te_lite::gemm.*'alpha'.*finite",
        ),
        (
            lambda: ops.gemm(randn(8, 4), None, True, randn(3, 4), None, False, torch.float32,
                             alpha=1e300),
            r"te_lite::gemm.*'alpha'.*float32",
        ),
        (
            lambda: ops.gemm_accumulate_(randn(3, 8), randn(8, 4), None, True, randn(3, 4), None,
                                         False, None, 1.0, math.nan),
            r"gemm_accumulate_.*'beta'.*finite",
        ),
        (
            lambda: ops.gemm_accumulate_(randn(3, 8), randn(8, 4), None, True, randn(3, 4), None,
                                         False, randn(3)),
            r"gemm_accumulate_.*'bias'.*\[8\]",
        ),
        (
            lambda: ops.gemm_accumulate_(randn(3, 8), randn(8, 4), None, True, randn(3, 4), None,
                                         False, torch.zeros(8, dtype=torch.int32)),
            r"gemm_accumulate_.*'bias'",
        ),
    ],
    ids=["alpha-inf", "alpha-overflow", "beta-nan", "bias-shape", "bias-dtype"],
)
def test_scaled_gemm_rejections(call, pattern):
    with pytest.raises(RuntimeError, match=pattern):
        call()


def test_opcheck_scaled_gemm():
    run_opcheck(
        "gemm",
        (
            randn(16, 32, requires_grad=True),
            None,
            True,
            randn(8, 32, seed=1, requires_grad=True),
            None,
            False,
            torch.float32,
            randn(16, seed=2, requires_grad=True),
            False,
            False,
            None,
            None,
            -1.25,
        ),
    )
    run_opcheck(
        "gemm_accumulate_",
        (
            randn(8, 16, seed=4),
            randn(16, 32, dtype=torch.bfloat16),
            None,
            True,
            randn(8, 32, dtype=torch.bfloat16, seed=1),
            None,
            False,
            randn(16, dtype=torch.bfloat16, seed=2),
            0.5,
            2.0,
        ),
    )


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_general_gemm_alpha_beta(out_dtype):
    from transformer_engine_lite.pytorch.cpp_extensions import general_gemm

    w, x, b = randn(16, 32, dtype=out_dtype), randn(8, 32, dtype=out_dtype, seed=1), randn(16)
    prod = x.double() @ w.double().t()
    # TE: D = alpha * AB + bias (alpha does not scale the bias).
    d = general_gemm(w, x, out_dtype, alpha=-0.5, bias=b.to(out_dtype))[0]
    assert_close(d, -0.5 * prod + b.to(out_dtype).double(), out_dtype, "alpha before bias")
    # Accumulate: out = beta * out + alpha * AB + bias, in one fused GEMM.
    out = randn(8, 16, seed=2).to(out_dtype)
    before = out.double()
    r = general_gemm(w, x, out=out, accumulate=True, alpha=2.0, beta=0.25, bias=b.to(out_dtype))
    assert r[0] is out
    want = 0.25 * before + 2.0 * prod + b.to(out_dtype).double()
    assert_close(out, want, out_dtype, "general_gemm accumulate alpha/beta")
    with pytest.raises(ValueError, match="beta"):
        general_gemm(w, x, out_dtype, beta=0.5)
