"""custom_recipes.reference_nvfp4.NVFP4QuantizerRef (the pure-torch NVFP4 oracle) against the
format's definition (hand values, all 16 E2M1 codes, fp64 re-derivations) and against the native
NVFP4Quantizer bit for bit (data, E4M3 scales, amaxes; 1x16 / 16x16, RHT, 4over6, row-scaled);
its qgemm against an fp64 dequantize-then-matmul oracle, and its refusals."""

from __future__ import annotations

import itertools

import pytest
import torch

from transformer_engine_lite.pytorch import NVFP4Quantizer
from transformer_engine_lite.pytorch.custom_recipes import reference_utils as ru
from transformer_engine_lite.pytorch.custom_recipes._reference_nvfp4_math import (
    E2M1_VALUES,
    rht16_matrix,
    unpack_e2m1,
)
from transformer_engine_lite.pytorch.custom_recipes.gemm import GEMMType, MMParams
from transformer_engine_lite.pytorch.custom_recipes.reference_nvfp4 import (
    NVFP4QuantizerRef,
    NVFP4TensorRef,
)
from transformer_engine_lite.pytorch.tensor.utils import is_custom

E2M1 = ru.Fp4Formats.E2M1
GRID = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float64)


def _ref(**kw):
    return NVFP4QuantizerRef(E2M1, **kw)


def _native_and_ref(x, monkeypatch, two_d=False, rht=False, rs=False, fos=False, emax=448,
                    mode="MAE", fast=False, col=True):
    monkeypatch.setenv("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1" if fast else "0")
    nat = NVFP4Quantizer(rowwise=True, columnwise=col, with_2d_quantization=two_d, with_rht=rht,
                         with_post_rht_amax=rht, row_scaled_nvfp4=rs, nvfp4_use_4over6=fos,
                         nvfp4_e4m3_max=emax, nvfp4_4over6_err_mode=mode)(x)
    ref = _ref(columnwise=col, quant_tile_shape=(16, 16) if two_d else (1, 16), with_rht=rht,
               row_scaled_nvfp4=rs, nvfp4_use_4over6=fos, nvfp4_e4m3_max=emax,
               nvfp4_4over6_err_mode=mode, nvfp4_4over6_err_use_fast_math=fast).quantize(x)
    return nat, ref


def _assert_same_bytes(nat, ref, shape, col=True):
    m, n = shape
    u8 = lambda t: t.view(torch.uint8)  # noqa: E731
    assert torch.equal(nat._rowwise_data, ref.data)
    assert torch.equal(u8(nat._rowwise_scale_inv[:m, : -(-n // 16)]), u8(ref.scale[:m]))
    assert torch.equal(nat._amax_rowwise.reshape(-1), ref.global_amax_row.reshape(-1))
    if col:
        assert torch.equal(nat._columnwise_data, ref.data_t)
        assert torch.equal(u8(nat._columnwise_scale_inv[:n, : -(-m // 16)]), u8(ref.scale_t[:n]))
        assert torch.equal(nat._amax_columnwise.reshape(-1), ref.global_amax_col.reshape(-1))


# ----------------------------------------------------------------------------- the oracle itself
def test_all_e2m1_codes_round_trip_and_midpoints():
    # The 16 grid values / 448: amax 6 / 448 gives S_enc = 448 * 448 and an E4M3 block scale of
    # exactly 448, so each element is multiplied by 448 and lands on its own grid value.
    x = GRID.float().reshape(1, 16) / 448.0
    q = _ref(columnwise=False).quantize(x)
    assert q.scale.float().item() == 448.0
    codes = unpack_e2m1(q.data).reshape(-1)
    # every code in order, but -0.0 encodes as +0 (code 0), as the kernels do
    expect = torch.tensor(list(range(8)) + [0] + list(range(9, 16)), dtype=torch.uint8)
    assert torch.equal(codes, expect)
    # midpoints round to the even neighbour; just past them, away
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    for sign in (1.0, -1.0):
        y = torch.zeros(1, 16)
        y[0, :8] = sign * mids
        y[0, 8:] = sign * (mids + torch.tensor([1e-3] * 7 + [0.0]))
        got = GRID[unpack_e2m1(_ref(columnwise=False).quantize(y).data).long()].reshape(-1)
        even = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0])
        away = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 6.0])
        assert torch.equal(got[:8].abs().float(), even)
        assert torch.equal(got[8:].abs().float(), away)


def test_scales_by_definition():
    torch.manual_seed(3)
    x = torch.randn(16, 64) * 3
    q = _ref(columnwise=False).quantize(x)
    amax = x.abs().max()
    assert q.global_amax_row.item() == amax.item()
    s_enc = torch.tensor(2688.0) / amax
    block = x.reshape(16, 4, 16).abs().amax(-1)
    expect = (block * (s_enc * torch.reciprocal(torch.tensor(6.0)))).to(torch.float8_e4m3fn)
    assert torch.equal(q.scale.view(torch.uint8), expect.view(torch.uint8))
    # dequantized values within half an E2M1 step of x (relative to the block scale)
    err = (q.dequantize(torch.float64) - x.double()).abs()
    step = (q.scale.float().double() * amax.double() / 2688.0).repeat_interleave(16, 1)
    assert bool((err <= 1.0 * step + 1e-12).all())


def test_rht_is_orthogonal_and_signed():
    h = rht16_matrix(True).double() / 4
    torch.testing.assert_close(h @ h.t(), torch.eye(16, dtype=torch.float64), rtol=0, atol=0)
    assert rht16_matrix(True)[:, 0].tolist() == [float(s) for s in
                                                 (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1,
                                                  1, -1, -1)]
    x = torch.randn(32, 16, dtype=torch.bfloat16)
    got = _ref(with_rht=True)._apply_rht(x)
    want = (x.double() @ h).to(torch.bfloat16)  # exact sum of 16 bf16/4 terms, then rounded
    assert got.dtype == torch.bfloat16
    assert (got.float() - want.float()).abs().max().item() <= 2 ** -7 * x.float().abs().max()
    assert torch.equal(_ref(with_rht=False)._apply_rht(x), x)


# ----------------------------------------------------------------------------- native vs oracle
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(64, 64), (128, 256), (48, 80), (32, 34)], ids=str)
@pytest.mark.parametrize("two_d", [False, True], ids=["1x16", "16x16"])
@pytest.mark.parametrize("rht", [False, True], ids=["no_rht", "rht"])
def test_native_matches_reference(dtype, shape, two_d, rht, monkeypatch):
    m, _ = shape
    if rht and m % 16:
        pytest.skip("the RHT needs rows divisible by 16")
    torch.manual_seed(hash((shape, two_d, rht)) % 1000)
    x = (torch.randn(*shape) * torch.exp(torch.randn(shape[0], 1) * 3)).to(dtype)
    nat, ref = _native_and_ref(x, monkeypatch, two_d=two_d, rht=rht)
    _assert_same_bytes(nat, ref, shape)


@pytest.mark.parametrize(
    "two_d, rs, emax, mode, fast",
    [c for c in itertools.product((False, True), (False, True), (448, 256), ("MAE", "MSE"),
                                  (False, True)) if not (c[0] and c[1])],
)
def test_native_matches_reference_4over6(two_d, rs, emax, mode, fast, monkeypatch):
    torch.manual_seed(7)
    x = (torch.randn(64, 96) * torch.exp(torch.randn(64, 1) * 2)).to(torch.bfloat16)
    nat, ref = _native_and_ref(x, monkeypatch, two_d=two_d, rs=rs, fos=True, emax=emax,
                               mode=mode, fast=fast)
    _assert_same_bytes(nat, ref, (64, 96))


@pytest.mark.parametrize("rht", [False, True], ids=["no_rht", "rht"])
def test_native_matches_reference_row_scaled(rht, monkeypatch):
    torch.manual_seed(11)
    x = (torch.randn(64, 128) * torch.exp(torch.randn(64, 1) * 4)).to(torch.bfloat16)
    nat, ref = _native_and_ref(x, monkeypatch, rs=True, rht=rht)
    _assert_same_bytes(nat, ref, (64, 128))
    assert ref.global_amax_row.shape == (64,) and ref.global_amax_col.shape == (128,)


def test_native_matches_reference_exhaustive_small_values(monkeypatch):
    # every E2M1 code times every E4M3-representable power of two in range, in one tensor
    vals = GRID.float().repeat(2)
    x = torch.stack([vals * 2.0 ** e for e in range(-8, 9)]).repeat(2, 1)  # [34, 32]
    nat, ref = _native_and_ref(x, monkeypatch)
    _assert_same_bytes(nat, ref, tuple(x.shape))


def test_native_matches_reference_specials(monkeypatch):
    x = torch.randn(32, 32)
    x[0, 0], x[1, 3], x[5, 17] = 0.0, -0.0, 1e-30
    x[2] = 0.0  # an all-zero block row: scale 0, factor FLT_MAX
    nat, ref = _native_and_ref(x, monkeypatch)
    _assert_same_bytes(nat, ref, (32, 32))
    z = torch.zeros(32, 32)
    nat, ref = _native_and_ref(z, monkeypatch)
    _assert_same_bytes(nat, ref, (32, 32))


# ----------------------------------------------------------------------------- the tensor
def test_tensor_fields_usage_and_3d():
    x = torch.randn(2, 16, 64)
    q = _ref(with_rht=True).quantize(x)
    assert isinstance(q, NVFP4TensorRef) and is_custom(q) and is_custom(q._quantizer)
    assert q.size() == torch.Size((2, 16, 64)) and q.data.shape == (32, 32)
    assert q.data_t.shape == (64, 16) and q.scale_t.shape == (64, 2)
    # the column-wise copy dequantizes back through the inverse RHT
    only_col = _ref(rowwise=True, columnwise=True, with_rht=True).quantize(x)
    only_col.update_usage(rowwise_usage=False)
    assert only_col.data is None
    back = only_col.dequantize(torch.float64)
    assert back.shape == x.shape and (back - x.double()).abs().max() < 0.6 * x.abs().max()
    with pytest.raises(RuntimeError, match="row-wise data"):
        only_col.update_usage(rowwise_usage=True)
    tensors, obj = q.prepare_for_saving()
    assert q.data is None and obj.restore_from_saved(tensors) == []
    assert q.data is not None
    dst = _ref().make_empty((32, 64))
    _ref().update_quantized(x.reshape(32, 64), dst)
    assert torch.equal(dst.data, _ref().quantize(x.reshape(32, 64)).data)
    skipped = _ref().update_quantized(torch.ones(32, 64), dst, noop_flag=torch.ones(1))
    assert torch.equal(skipped.data, _ref().quantize(x.reshape(32, 64)).data)


def test_quantizer_refusals():
    with pytest.raises(ValueError, match="Fp4Formats.E2M1"):
        NVFP4QuantizerRef("e2m1")
    with pytest.raises(ValueError, match="requires rowwise usage"):
        _ref(rowwise=False, row_scaled_nvfp4=True)
    with pytest.raises(ValueError, match="1x16 tile shape"):
        _ref(row_scaled_nvfp4=True, quant_tile_shape=(16, 16))
    with pytest.raises(ValueError, match="4over6 error mode"):
        _ref(nvfp4_use_4over6=True, nvfp4_4over6_err_mode="max")
    with pytest.raises(ValueError, match="448 or 256"):
        _ref(nvfp4_use_4over6=True, nvfp4_e4m3_max=300)
    with pytest.raises(ValueError, match="quant_tile_shape"):
        _ref(quant_tile_shape=(1, 8))
    with pytest.raises(ValueError, match=r"\(1, 32\)"):
        _ref(pow_2_scales=True)
    with pytest.raises(NotImplementedError, match="eps"):
        _ref(eps=1e-3)
    with pytest.raises(TypeError, match="Unsupported input dtype"):
        _ref().quantize(torch.zeros(16, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="rows divisible by 16"):
        _ref(with_rht=True).quantize(torch.zeros(8, 16))


# ----------------------------------------------------------------------------- qgemm
def _dequant_fp64(q, col=False):
    data, scale = (q.data_t, q.scale_t) if col else (q.data, q.scale)
    amax = q.global_amax_col if col else q.global_amax_row
    vals = GRID[unpack_e2m1(data).long()]
    rows = vals.shape[0]
    s = scale[:rows].float().double().repeat_interleave(16, 1)[:, : vals.shape[1]]
    a = amax.double().reshape(-1, 1) if amax.numel() > 1 else amax.double()
    return vals * s * a / (6.0 * q.nvfp4_e4m3_max)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("row_scaled", [False, True], ids=["per_tensor", "row_scaled"])
def test_qgemm_matches_fp64_dequantized_matmul(out_dtype, row_scaled):
    torch.manual_seed(5)
    x, w = torch.randn(48, 128), torch.randn(64, 128)
    qx = _ref(row_scaled_nvfp4=row_scaled, columnwise=False).quantize(x)
    qw = _ref().quantize(w)
    y = _ref().qgemm(qx.data, qw.data, MMParams(), out_dtype, qx.scale, qw.scale,
                     qresult_x=qx, qresult_w=qw)
    want = _dequant_fp64(qx) @ _dequant_fp64(qw).t()
    # fp32 block accumulation: a few fp32 roundings of the partial sums
    tol = 2 ** -20 * (_dequant_fp64(qx).abs() @ _dequant_fp64(qw).abs().t()) + 1e-30
    if out_dtype == torch.bfloat16:
        tol = tol + 2 ** -8 * want.abs()
    assert y.dtype == out_dtype and bool(((y.double() - want).abs() <= tol).all())
    # accumulate adds out in fp32 before the one rounding
    out = torch.randn(48, 64).to(out_dtype)
    y2 = _ref().qgemm(qx.data, qw.data, None, out_dtype, qx.scale, qw.scale, out=out.clone(),
                      accumulate=True, qresult_x=qx, qresult_w=qw)
    plain = _ref().qgemm(qx.data, qw.data, None, torch.float32, qx.scale, qw.scale,
                         qresult_x=qx, qresult_w=qw)
    assert torch.equal(y2, (plain + out.float()).to(out_dtype))


def test_qgemm_wgrad_uses_column_amaxes_and_cancels_rht():
    torch.manual_seed(9)
    dy, x = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(64, 48, dtype=torch.bfloat16)
    q = _ref(with_rht=True)
    qdy, qx = q.quantize(dy), q.quantize(x)
    dw = q.qgemm(qdy.data_t, qx.data_t, None, torch.float32, qdy.scale_t, qx.scale_t,
                 gemm_type=GEMMType.WGRAD, qresult_x=qdy, qresult_w=qx)
    want = _dequant_fp64(qdy, col=True) @ _dequant_fp64(qx, col=True).t()
    torch.testing.assert_close(dw.double(), want, rtol=2 ** -18, atol=1e-6)
    # the transforms cancel: close to the unquantized dW up to FP4's error
    exact = dy.double().t() @ x.double()
    assert (dw.double() - exact).norm() / exact.norm() < 0.2


def test_qgemm_refusals():
    q = _ref()
    qx, qw = q.quantize(torch.randn(16, 32)), q.quantize(torch.randn(16, 32))
    args = (qx.data, qw.data, None, torch.float32, qx.scale, qw.scale)
    with pytest.raises(ValueError, match="Bias is not supported"):
        q.qgemm(*args, bias=torch.zeros(16), qresult_x=qx, qresult_w=qw)
    with pytest.raises(ValueError, match="qresult_x is required"):
        q.qgemm(*args)
    with pytest.raises(ValueError, match="Output tensor must be provided"):
        q.qgemm(*args, accumulate=True, qresult_x=qx, qresult_w=qw)
    with pytest.raises(ValueError, match="should be None"):
        q.qgemm(*args, out=torch.zeros(16, 16), qresult_x=qx, qresult_w=qw)
    with pytest.raises(TypeError, match="m_params"):
        q.qgemm(qx.data, qw.data, "x", torch.float32, qx.scale, qw.scale, qresult_x=qx,
                qresult_w=qw)
    small = q.quantize(torch.randn(16, 16))
    with pytest.raises(ValueError, match="divisible by 32"):
        q.qgemm(small.data, small.data, None, torch.float32, small.scale, small.scale,
                qresult_x=small, qresult_w=small)


def test_mxfp4_pow2_scales():
    q = _ref(pow_2_scales=True, quant_tile_shape=(1, 32))
    x = torch.randn(16, 64) * 10
    t = q.quantize(x)
    assert t.global_amax_row is None and t.scale.dtype == torch.float32
    # power-of-two scales at 2^ceil(log2(block_amax / 6))
    blk = x.reshape(16, 2, 32).abs().amax(-1) / 6.0
    assert torch.equal(t.scale, torch.pow(2.0, torch.ceil(torch.log2(blk))))
    y = q.qgemm(t.data, t.data, None, torch.float64, t.scale, t.scale)
    vals = GRID[unpack_e2m1(t.data).long()] * t.scale.double().repeat_interleave(32, 1)
    torch.testing.assert_close(y, vals @ vals.t(), rtol=2 ** -20, atol=1e-9)


# ----------------------------------------------------------------------------- stochastic rounding
def test_stochastic_rounding_is_unbiased_and_between_neighbours():
    # The block of the first sixteen values fixes the scales: amax 6 / 448, so x * 448 * 448 ...
    # is quantized as the value itself (see test_all_e2m1_codes_round_trip_and_midpoints).
    torch.manual_seed(13)
    vals = torch.tensor([0.1, 0.3, 0.74, 1.1, 1.6, 2.2, 2.9, 3.3, 4.5, 5.5, -0.2, -1.3, -2.6,
                         -3.9, -5.1, 6.0])
    x = (vals / 448.0).repeat(4096, 1)
    q = _ref(columnwise=False, stochastic_rounding=True).quantize(x)
    got = GRID[unpack_e2m1(q.data).long()].float()  # [4096, 16], the E2M1 values themselves
    # only the two neighbours of each value
    lo = torch.tensor([0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 2.0, 3.0, 4.0, 4.0, -0.0, -1.0, -2.0,
                       -3.0, -4.0, 6.0])
    hi = torch.tensor([0.5, 0.5, 1.0, 1.5, 2.0, 3.0, 3.0, 4.0, 6.0, 6.0, -0.5, -1.5, -3.0,
                       -4.0, -6.0, 6.0])
    assert bool(((got == lo) | (got == hi)).all())
    # unbiased: the mean is the value within 4.5 standard errors of a two-point draw
    p = ((vals - lo) / (hi - lo)).nan_to_num(0.0)
    se = (hi - lo).abs() * torch.sqrt(p * (1 - p) / 4096)
    assert bool(((got.mean(0) - vals).abs() <= 4.5 * se + 1e-6).all())
    # the draws differ between calls; the exact values stay put
    again = _ref(columnwise=False, stochastic_rounding=True).quantize(x)
    assert not torch.equal(again.data, q.data)
    exact = _ref(columnwise=False, stochastic_rounding=True).quantize(
        (GRID.float() / 448.0).reshape(1, 16))
    assert torch.equal(unpack_e2m1(exact.data).reshape(-1)[[0, 1, 7, 9, 15]],
                       torch.tensor([0, 1, 7, 9, 15], dtype=torch.uint8))


def test_stochastic_rounding_refusals():
    with pytest.raises(ValueError, match="stochastic_rounding"):
        _ref(stochastic_rounding=True, nvfp4_use_4over6=True)
    with pytest.raises(ValueError, match="stochastic_rounding"):
        _ref(stochastic_rounding=True, pow_2_scales=True, quant_tile_shape=(1, 32))
