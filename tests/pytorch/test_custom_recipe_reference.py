"""custom_recipes.reference_current_scaling (the pure-torch oracle of per-tensor current scaling
and of the FP8 GEMM) against hand-computed values and exact integer arithmetic, then the native
quantizer and GEMM (tex.generic_gemm) against it: bytes and scale_inv bit for bit, GEMM outputs
bit for bit in bf16/fp16 and within the FP32 accumulation bound in fp32."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
import transformer_engine_lite.pytorch.tex as tex
from transformer_engine_lite.pytorch.constants import TE_DType
from transformer_engine_lite.pytorch.custom_recipes.gemm import GEMMType, MMParams
from transformer_engine_lite.pytorch.custom_recipes.reference_current_scaling import (
    CurrentScalingQuantizerRef,
    current_scaling_ref_factory,
)
from transformer_engine_lite.pytorch.quantization import QuantizerRole

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FLT_MAX = torch.finfo(torch.float32).max


def _ref(dtype=E4M3, **kw):
    return CurrentScalingQuantizerRef(dtype, **kw)


# ----------------------------------------------------------------------------- the oracle itself
def test_reference_scale_by_hand():
    x = torch.tensor([[0.5, -2.0], [1.0, 0.25]])
    q = _ref(E4M3, columnwise=False).quantize(x)
    assert q.scale.item() == (torch.tensor(1.0) / torch.tensor(224.0)).item()
    # x * 224 = [112, -448, 224, 56]: all exact E4M3 values
    assert q.data.float().tolist() == [[112.0, -448.0], [224.0, 56.0]]
    assert q.data_t is None and q.scale_t is None
    # power-of-two: 448 / 2 = 224 -> 128; eps floors the amax
    assert _ref(pow_2_scales=True).compute_scale(torch.tensor([2.0]))[0].item() == 128.0
    assert _ref(eps=4.0).compute_scale(torch.tensor([2.0]))[0].item() == 112.0
    # E5M2: 57344 / 2
    assert _ref(E5M2).compute_scale(torch.tensor([2.0]))[0].item() == 28672.0


@pytest.mark.parametrize(
    "amax, scale",
    [(0.0, 1.0), (float("inf"), 1.0), (float("nan"), 1.0), (1e-45, FLT_MAX)],
    ids=["zero", "inf", "nan", "tiny"],
)
def test_reference_scale_edge_cases(amax, scale):
    s, s_inv = _ref().compute_scale(torch.tensor([amax]))
    assert s.item() == scale and s_inv.item() == (1.0 / torch.tensor(scale)).item()


def test_reference_saturates_and_transposes():
    x = torch.randn(8, 24, dtype=torch.bfloat16)
    q = _ref().quantize(x)
    assert q.data.float().abs().max().item() == 448.0  # the amax element maps onto fp8_max
    torch.testing.assert_close(q.data_t.float(), q.data.float().t(), rtol=0, atol=0)
    torch.testing.assert_close(q.dequantize(torch.float32), x.float(), rtol=2**-3, atol=2**-9)
    three = _ref().quantize(x.reshape(2, 4, 24))
    assert three.dequantize().shape == (2, 4, 24) and torch.equal(three.data, q.data)


def test_reference_gemm_is_exact():
    """The reference's fp64 sum of FP8 products equals exact integer arithmetic: every E4M3 value
    times 2^9 is an integer, so the products times 2^18 are, and int64 sums them exactly."""
    torch.manual_seed(3)
    qx = (torch.randn(16, 512) * 100).to(E4M3)
    qw = (torch.randn(12, 512) * 100).to(E4M3)
    one = torch.ones(1)
    y = _ref().qgemm(qx, qw, MMParams(), torch.float64, one, one)
    ix = (qx.double() * 2**9).to(torch.int64)
    iw = (qw.double() * 2**9).to(torch.int64)
    exact = (ix[:, None, :] * iw[None, :, :]).sum(-1)
    assert torch.equal(y, exact.double() / 2**18)
    # float32 matmul of the same operands rounds: the reference is not that
    assert not torch.equal(y.float(), qx.float() @ qw.float().t())


def test_reference_gemm_checks():
    q = torch.zeros(4, 8).to(E4M3)
    one = torch.ones(1)
    r = _ref()
    with pytest.raises(TypeError, match="m_params"):
        r.qgemm(q, q, None, torch.float32, one, one)
    with pytest.raises(ValueError, match="qx: expected a 2-D FP8"):
        r.qgemm(q.float(), q, MMParams(), torch.float32, one, one)
    with pytest.raises(ValueError, match="the same K"):
        r.qgemm(q, torch.zeros(4, 4).to(E4M3), MMParams(), torch.float32, one, one)
    with pytest.raises(ValueError, match="accumulate=True"):
        r.qgemm(q, q, MMParams(), torch.float32, one, one, accumulate=True)
    with pytest.raises(TypeError, match="out_dtype"):
        MMParams(out_dtype="bf16")
    with pytest.raises(ValueError, match="dtype: expected torch.float8"):
        CurrentScalingQuantizerRef(torch.bfloat16)
    with pytest.raises(ValueError, match="rowwise or columnwise"):
        CurrentScalingQuantizerRef(E4M3, rowwise=False, columnwise=False)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        r.quantize(torch.zeros(2, 2, dtype=torch.int32))
    assert current_scaling_ref_factory(QuantizerRole(tensor_type="grad_output")).dtype == E5M2
    assert current_scaling_ref_factory(None).dtype == E4M3
    assert GEMMType.WGRAD.value == "wgrad"


# ----------------------------------------------------------------------------- native vs oracle
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fp8", [E4M3, E5M2])
@pytest.mark.parametrize("pow2, eps", [(False, 0.0), (True, 0.0), (False, 8.0)])
def test_native_quantizer_matches_reference(in_dtype, fp8, pow2, eps):
    torch.manual_seed(5)
    x = (torch.randn(3, 40, 72) * 3).to(in_dtype)
    x[0, 0, 0] = 0.0
    native = te.Float8CurrentScalingQuantizer(
        te.DType.kFloat8E4M3 if fp8 == E4M3 else te.DType.kFloat8E5M2,
        force_pow_2_scales=pow2, amax_epsilon=eps)(x)
    ref = _ref(fp8, pow_2_scales=pow2, eps=eps).quantize(x)
    assert torch.equal(native._data.view(torch.uint8).reshape(-1, 72),
                       ref.data.view(torch.uint8))
    assert torch.equal(native._scale_inv.reshape(1), ref.scale)


def test_native_quantizer_matches_reference_zero_tensor():
    x = torch.zeros(16, 32, dtype=torch.bfloat16)
    native = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)(x)
    ref = _ref().quantize(x)
    assert torch.equal(native._data.view(torch.uint8), ref.data.view(torch.uint8))
    assert native._scale_inv.item() == ref.scale.item() == 1.0


def _operands(m, k, n, seed):
    torch.manual_seed(seed)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    w = torch.randn(n, k, dtype=torch.bfloat16) * 0.02
    mk = lambda: te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)  # noqa: E731
    return mk()(x), mk()(w)


def _native(qw, qx, out_dtype, out=None, bias=None, accumulate=False):
    return tex.generic_gemm(
        qw, True, qx, False, out, None, TE_DType[out_dtype], bias,
        TE_DType[bias.dtype] if bias is not None else TE_DType[torch.bfloat16],
        False, None, False, torch.empty(0, dtype=torch.uint8), 0, accumulate, False)[0]


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, k, n", [(128, 256, 96), (33, 64, 17)])
def test_native_gemm_matches_reference_low_precision_out(m, k, n, out_dtype):
    qx, qw = _operands(m, k, n, seed=m)
    y_ref = _ref().qgemm(qx._data.view(E4M3), qw._data.view(E4M3), MMParams(out_dtype), out_dtype,
                         qx._scale_inv, qw._scale_inv)
    torch.testing.assert_close(_native(qw, qx, out_dtype), y_ref, rtol=0, atol=0)


@pytest.mark.parametrize("accumulate", [False, True])
def test_native_gemm_fp32_out_within_accumulation_bound(accumulate):
    """FP32 output: the native GEMM sums in FP32 in oneDNN's order, the oracle exactly. The error
    of a K-term FP32 sum is at most K * 2^-24 * sum |terms| (plus the final roundings)."""
    m, k, n = 64, 128, 64
    qx, qw = _operands(m, k, n, seed=9)
    a, b = qx._data.view(E4M3), qw._data.view(E4M3)
    out = torch.randn(m, n) if accumulate else None
    y_ref = _ref().qgemm(a, b, MMParams(torch.float32), torch.float32, qx._scale_inv,
                         qw._scale_inv, out=out.clone() if accumulate else None,
                         accumulate=accumulate)
    y = _native(qw, qx, torch.float32, out.clone() if accumulate else None, accumulate=accumulate)
    s = (qx._scale_inv * qw._scale_inv).double()
    bound = k * 2.0**-24 * (a.double().abs() @ b.double().abs().t()) * s
    bound = bound + 2.0**-23 * y_ref.double().abs()  # the output roundings
    err = (y.double() - y_ref.double()).abs()
    assert (err <= bound).all(), (err - bound).max()


def test_generic_gemm_bias_and_checks():
    qx, qw = _operands(32, 64, 48, seed=1)
    bias = torch.randn(48, dtype=torch.bfloat16)
    y = _native(qw, qx, torch.bfloat16, bias=bias)
    ref = te.cpp_extensions.general_gemm(qw, qx, out_dtype=torch.bfloat16, bias=bias)[0]
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    with pytest.raises(ValueError, match="bias_type"):
        tex.generic_gemm(qw, True, qx, False, None, None, TE_DType[torch.bfloat16], bias,
                         TE_DType[torch.float32], False, None, False, None, 0, False, False)
    # TT is a layout TE's C++ GEMM takes (op(B) = B^T): here its shapes do not chain
    with pytest.raises(RuntimeError, match="argument 'B'.*op\\(B\\)"):
        tex.generic_gemm(qw, True, qx, True, None, None, TE_DType[torch.bfloat16], None,
                         TE_DType[torch.bfloat16], False, None, False, None, 0, False, False)
