"""general_grouped_gemm (TE's grouped GEMM entry) and GroupedLinear's caller buffers (out /
dgrad_out): each group vs an fp64 reference of its GEMM, and the grouped call vs per-group
general_gemm calls bit for bit (the grouped entry promises the same numerics)."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch.cpp_extensions import general_gemm, general_grouped_gemm
from transformer_engine_lite.pytorch.tensor import Float8CurrentScalingQuantizer

SPLITS = [5, 0, 17, 10]


def _ref(layout, a, b):
    a, b = a.double(), b.double()
    if layout == "TN":
        return b @ a.t()
    return b @ a if layout == "NN" else b.t() @ a


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grouped_gemm_matches_per_group_and_fp64(layout, accumulate, dtype):
    torch.manual_seed(0)
    m, k, n, z = sum(SPLITS), 48, 40, len(SPLITS)
    if layout == "NT":  # wgrad: A = inputs, B = output gradients, one [n, k] output per group
        A = list(torch.randn(m, k, dtype=dtype).split(SPLITS))
        B = list(torch.randn(m, n, dtype=dtype).split(SPLITS))
        out = [torch.randn(n, k, dtype=dtype) for _ in range(z)]
        single = False
    else:
        A = [torch.randn(n, k, dtype=dtype) for _ in range(z)]
        B = list(torch.randn(m, k if layout == "TN" else n, dtype=dtype).split(SPLITS))
        out = [torch.randn(m, n if layout == "TN" else k, dtype=dtype)]
        single = True
    before = [o.clone() for o in out]
    ref_out = [o.clone() for o in (out if not single else out[0].split(SPLITS))]
    for i in range(z):
        general_gemm(A[i], B[i], dtype, layout=layout, grad=layout != "TN",
                     accumulate=accumulate, out=ref_out[i])
    res, _, _ = general_grouped_gemm(A, B, out, [None] * z, dtype, layout=layout,
                                     m_splits=SPLITS, grad=layout != "TN",
                                     accumulate=accumulate, single_output=single)
    assert res[0] is out[0]
    got = out if not single else list(out[0].split(SPLITS))
    base = before if not single else list(before[0].split(SPLITS))
    for i in range(z):
        assert torch.equal(got[i], ref_out[i])  # bit for bit vs the per-group call
        exp = _ref(layout, A[i], B[i]) + (base[i].double() if accumulate else 0)
        tol = 1e-5 if dtype == torch.float32 else 2e-2  # one rounding to the output dtype
        torch.testing.assert_close(got[i].double(), exp, rtol=tol, atol=tol)


def test_grouped_gemm_fp8_bias_grad_and_errors():
    torch.manual_seed(1)
    q = Float8CurrentScalingQuantizer(torch.float8_e4m3fn)
    A = [q(torch.randn(16, 32)) for _ in range(2)]
    B = [q(torch.randn(8, 32)) for _ in range(2)]
    out = [torch.empty(16, 16)]
    general_grouped_gemm(A, B, out, [None, None], torch.float32, m_splits=[8, 8],
                         single_output=True)
    for i in range(2):
        ref = B[i].dequantize().double() @ A[i].dequantize().double().t()
        torch.testing.assert_close(out[0][8 * i: 8 * i + 8].double(), ref, rtol=1e-5, atol=1e-5)
    # grad + use_bias: the bias gradients are B's column sums (zeros for an empty group)
    dy = [torch.randn(4, 6), torch.zeros(0, 6)]
    x = [torch.randn(4, 5), torch.zeros(0, 5)]
    wg = [torch.empty(6, 5), torch.empty(6, 5)]
    _, db, _ = general_grouped_gemm(x, dy, wg, [None, None], torch.float32, layout="NT",
                                   grad=True, use_bias=True)
    torch.testing.assert_close(db[0], dy[0].sum(0))
    assert torch.equal(db[1], torch.zeros(6)) and torch.equal(wg[1], torch.zeros(6, 5))
    with pytest.raises(ValueError, match="quantization_params"):
        general_grouped_gemm(A, B, out, [None], torch.float32, m_splits=[8, 8],
                             single_output=True)
    with pytest.raises(ValueError, match="m_splits"):
        general_grouped_gemm(A, B, out, [None, None], torch.float32, single_output=True)
    with pytest.raises(ValueError, match="layout"):
        general_grouped_gemm(A, B, out, [None, None], torch.float32, layout="TT",
                             m_splits=[8, 8], single_output=True)


@pytest.mark.parametrize("give", ["out", "dgrad_out", "both"])
def test_grouped_linear_caller_buffers(give):
    torch.manual_seed(2)
    m = te.GroupedLinear(3, 32, 24, device="cpu")
    splits = [7, 0, 9]
    x = torch.randn(16, 32)
    dy = torch.randn(16, 24)
    xr = x.clone().requires_grad_(True)
    yr = m(xr, splits)
    yr.backward(dy)
    out = torch.full((16, 24), 7.0) if give != "dgrad_out" else None
    dgo = torch.full((16, 32), 7.0) if give != "out" else None
    xt = x.clone().requires_grad_(True)
    y = m(xt, splits, out=out, dgrad_out=dgo)
    if out is not None:
        assert y.data_ptr() == out.data_ptr()
    assert torch.equal(y, yr)
    y.backward(dy)
    if dgo is not None:
        assert torch.equal(dgo, xr.grad)
    assert torch.equal(xt.grad, xr.grad)
    with pytest.raises(ValueError, match="out: expected"):
        m(x, splits, out=torch.empty(17, 24))
    with pytest.raises(ValueError, match="dgrad_out: expected"):
        m(x, splits, dgrad_out=torch.empty(16, 32, dtype=torch.bfloat16))
