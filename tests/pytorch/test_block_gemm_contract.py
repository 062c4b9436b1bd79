"""TE's contract for GEMMs of two Float8BlockwiseQTensors (common/gemm/cublaslt_gemm.cu and what
cuBLAS refuses): each refusal through tex.generic_gemm and general_gemm, with TE's message text,
as RuntimeError (TE's class, which its tests match) and ValueError (ours for a rejected value);
each accepted configuration exact against an fp64 oracle (operands whose FP8 values are small
integers: every product and block sum is exact in fp32, so the block-scaled arithmetic must give
the fp64 product bit for bit)."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch.tex as tex
from transformer_engine_lite.pytorch.cpp_extensions import general_gemm
from transformer_engine_lite.pytorch.tensor import Float8BlockQuantizer

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
BF16 = tex.DType.kBFloat16


def _int_tensor(shape, seed):
    # integers in [-8, 8]: exact in E4M3 (and E5M2) after a power-of-two scale
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, shape, generator=g).float()


def _q(t, dim, dtype=E4):
    return Float8BlockQuantizer(dtype, rowwise=True, columnwise=True, force_pow_2_scales=True,
                                block_scaling_dim=dim)(t)


def _operands(m, k, n, x_dim, w_dim, x_dtype=E4, w_dtype=E4, x_col=False, w_col=False):
    x = _int_tensor((k, m) if x_col else (m, k), 1)
    w = _int_tensor((k, n) if w_col else (n, k), 2)
    return x, w, _q(x, x_dim, x_dtype), _q(w, w_dim, w_dtype)


def _generic(qw, qx, out_dtype, *, transa=True, transb=False, out=None, bias=None, gelu=False,
             gelu_in=None, grad=False, accumulate=False, split=True):
    ws = torch.empty(0, dtype=torch.uint8)
    return tex.generic_gemm(qw, transa, qx, transb, out, None, tex.torch_to_dtype(out_dtype),
                            bias, BF16 if bias is None else tex.torch_to_dtype(bias.dtype), gelu,
                            gelu_in, grad, ws, 0, accumulate, split)[0]


def _refused(match, qw, qx, out_dtype=torch.bfloat16, **kw):
    for cls in (RuntimeError, ValueError):
        with pytest.raises(cls, match=match):
            _generic(qw, qx, out_dtype, **kw)


PAIRS = [(1, 2), (1, 1), (2, 1)]  # (x, w) scaling dims TE serves


def test_2d_by_2d_refused():
    _, _, qx, qw = _operands(256, 128, 256, 2, 2)
    _refused("Only 1D by 1D, 1D by 2D, and 2D by 1D block scaling GEMM is supported, but got 2D "
             "by 2D", qw, qx)
    with pytest.raises(RuntimeError, match="but got 2D by 2D"):
        general_gemm(qw, qx, out_dtype=torch.bfloat16)


@pytest.mark.parametrize("x_dim, w_dim", PAIRS)
def test_alignment(x_dim, w_dim):
    _, _, qx, qw = _operands(256, 120, 256, x_dim, w_dim)
    _refused("Leading dimension requirement on NVTE_BLOCK_SCALING GEMM. Caller must pad", qw, qx)
    _, _, qx, qw = _operands(256, 128, 252, x_dim, w_dim)
    _refused("Outer dimension requirement on A for NVTE_BLOCK_SCALING GEMM", qw, qx)
    x, w, qx, qw = _operands(255, 128, 256, x_dim, w_dim)
    if x_dim == 1:  # only a 1D-scaled B needs its outer dim (the output's rows) aligned
        _refused("Outer dimension requirement on B for NVTE_BLOCK_SCALING GEMM", qw, qx)
    else:
        y = _generic(qw, qx, torch.float32)
        assert torch.equal(y, (x.double() @ w.double().t()).float())


@pytest.mark.parametrize("x_dim, w_dim", PAIRS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_epilogues_outside_cublas_functionality(x_dim, w_dim, out_dtype):
    _, _, qx, qw = _operands(256, 128, 256, x_dim, w_dim)
    bias = torch.ones(256, dtype=torch.bfloat16)
    gelu_in = torch.randn(256, 256).to(out_dtype)
    msg = "Epilogue requested outside of the available and tested cuBLAS functionality"
    _refused(msg + r".*CUBLASLT_EPILOGUE_BGRADB", qw, qx, out_dtype, bias=bias, grad=True)
    _refused(msg + r".*CUBLASLT_EPILOGUE_GELU_AUX;", qw, qx, out_dtype, gelu=True,
             gelu_in=gelu_in)
    _refused(msg + r".*GELU_AUX_BIAS", qw, qx, out_dtype, gelu=True, gelu_in=gelu_in, bias=bias)
    _refused(msg + r".*DGELU_BGRAD", qw, qx, out_dtype, gelu=True, gelu_in=gelu_in, bias=bias,
             grad=True)
    if out_dtype == torch.float32:  # cuBLAS's own refusal of DGELU into fp32
        _refused("an unsupported value or parameter was passed", qw, qx, out_dtype, gelu=True,
                 gelu_in=gelu_in, grad=True)


@pytest.mark.parametrize("x_dim, w_dim", PAIRS)
def test_cublas_not_supported(x_dim, w_dim):
    _, _, qx, qw = _operands(256, 128, 256, x_dim, w_dim, E5, E5)
    _refused(r"E5M2 x E5M2 operands are not supported \(cuBLAS returns "
             r"CUBLAS_STATUS_NOT_SUPPORTED", qw, qx)
    x, w, qx, qw = _operands(256, 128, 256, x_dim, w_dim)
    _refused(r"use_split_accumulator=False .*CUBLAS_STATUS_NOT_SUPPORTED", qw, qx, split=False)
    # TE's general_gemm forces the split accumulator for block-scaled operands: never refused
    y = general_gemm(qw, qx, out_dtype=torch.float32, use_split_accumulator=False)[0]
    assert torch.equal(y, (x.double() @ w.double().t()).float())


def test_missing_usage_and_dims():
    x, w, qx, qw = _operands(256, 128, 256, 1, 2)
    qw.update_usage(rowwise_usage=False)
    _refused("Input A is missing row-wise usage", qw, qx)
    qxt = _q(x.t().contiguous(), 1)  # [K, M]: transb reads its column-wise copy
    qxt.update_usage(columnwise_usage=False)
    _refused("Input B is missing column-wise usage", _q(w, 2), qxt, transb=True)
    _refused("GEMM inputs have incompatible dimensions", _q(w[:, :64], 2), _q(x, 1))


@pytest.mark.parametrize("x_dim, w_dim", PAIRS)
@pytest.mark.parametrize("x_dtype, w_dtype", [(E4, E4), (E4, E5), (E5, E4)], ids=str)
@pytest.mark.parametrize("x_col, w_col", [(False, False), (True, False), (False, True),
                                          (True, True)], ids=["rr", "cr", "rc", "cc"])
@pytest.mark.parametrize("m, k, n", [(256, 384, 136), (72, 64, 256)])
def test_accepted_cases_exact(x_dim, w_dim, x_dtype, w_dtype, x_col, w_col, m, k, n):
    x, w, qx, qw = _operands(m, k, n, x_dim, w_dim, x_dtype, w_dtype, x_col, w_col)
    xm = x.t() if x_col else x
    wm = w.t() if w_col else w
    want = xm.double() @ wm.double().t()
    y = _generic(qw, qx, torch.float32, transa=not w_col, transb=x_col)
    assert torch.equal(y, want.float())
    bias = _int_tensor((n,), 3).bfloat16()
    y = _generic(qw, qx, torch.bfloat16, transa=not w_col, transb=x_col, bias=bias)
    assert torch.equal(y, (want + bias.double()).bfloat16())
    out = torch.randn(m, n)
    y = _generic(qw, qx, torch.float32, transa=not w_col, transb=x_col, out=out.clone(),
                 accumulate=True)
    assert torch.equal(y, want.float() + out)  # cuBLAS: the product in D's dtype, then + C


@pytest.mark.parametrize("x_dim, w_dim", PAIRS)
@pytest.mark.parametrize("accumulate", [False, True])
def test_dgelu_epilogue(x_dim, w_dim, accumulate):
    """gelu=True, grad=True into bfloat16: D = dgelu(product [+ C], gelu_in), which is
    tex.dgelu of the plain GEMM's output, and within bf16 rounding of the fp64 formula."""
    x, w, qx, qw = _operands(256, 256, 128, x_dim, w_dim)
    gelu_in = torch.randn(256, 128).bfloat16()
    out = torch.randn(256, 128).bfloat16() if accumulate else None
    plain = _generic(qw, qx, torch.bfloat16, out=None if out is None else out.clone(),
                     accumulate=accumulate)
    d = _generic(qw, qx, torch.bfloat16, out=None if out is None else out.clone(), gelu=True,
                 gelu_in=gelu_in, grad=True, accumulate=accumulate)
    assert torch.equal(d, tex.dgelu(plain, gelu_in, None))
    g = gelu_in.double().requires_grad_(True)
    c = 0.7978845608028654
    gelu = 0.5 * g * (1 + torch.tanh(c * (g + 0.044715 * g**3)))
    (dg,) = torch.autograd.grad(gelu, g, plain.double())
    torch.testing.assert_close(d.double(), dg, atol=2e-2, rtol=1e-2)
    with pytest.raises(ValueError, match="gelu_in: expected the GELU input"):
        general_gemm(qw, qx, out_dtype=torch.bfloat16, gelu=True, grad=True)


def test_empty_gemm_is_not_checked():
    """m or n zero: TE returns before any check (an unaligned K is not refused)."""
    qx = _q(torch.ones(0, 120), 1)
    qw = _q(torch.ones(8, 120), 2)
    y = _generic(qw, qx, torch.float32)
    assert y.shape == (0, 8)
