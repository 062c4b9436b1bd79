"""NVFP4Quantizer's 4over6 (nvfp4_use_4over6, nvfp4_4over6_err_mode MAE / MSE, nvfp4_e4m3_max 448
/ 256, NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH) and row_scaled_nvfp4 options: bytes, scales and amaxes
against an independent float64 oracle with one fp32 rounding per TE operation (TE's reference
order), dequantize with the tensor's bound and row amaxes, the python allocator, pickling and a GEMM
on a row-scaled operand."""

import math
import pickle

import pytest
import torch

from transformer_engine_lite.pytorch import NVFP4Quantizer
from transformer_engine_lite.pytorch.cpp_extensions import general_gemm

GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
FMAX = 3.4028234663852886e38


def f32(x):
    return torch.as_tensor(x, dtype=torch.float64).to(torch.float32).to(torch.float64)


def ref_codes(v):
    """Nearest E2M1 code of v (float64, clamped to 6), ties to the even code; NaN -> 0."""
    d = (v.abs().clamp(max=6.0).unsqueeze(-1) - GRID).abs()
    best = d.min(-1, keepdim=True).values
    cand = (d == best).to(torch.int64) * (torch.arange(8) + 1)
    even = torch.where(torch.arange(8) % 2 == 0, cand, torch.zeros_like(cand)).max(-1).values
    code = torch.where(even > 0, even, cand.max(-1).values) - 1
    code = torch.where(torch.isnan(v), torch.zeros_like(code), code)
    return code + 8 * (v < 0).to(torch.int64)


def value(code):
    return torch.where(code >= 8, -GRID[code % 8], GRID[code % 8])


def e4m3(d):
    return d.to(torch.float32).to(torch.float8_e4m3fn)


def ref_quantize(x, mode, em, fast, two_d, row_scaled):
    """(packed data, scale grid, amax) of the float64 matrix x (values of the input dtype)."""
    m, n = x.shape
    amax = f32(x.abs().amax(1) if row_scaled else x.abs().max().reshape(1))
    s_enc = torch.where(amax == 0, torch.full_like(amax, FMAX), f32(6.0 * em / amax))
    s_enc = s_enc.clamp(max=FMAX)
    s_enc = torch.where(s_enc == 0, torch.ones_like(s_enc), s_enc)
    s_dec = f32(1.0 / s_enc)
    nb, mp = math.ceil(n / 16), (math.ceil(m / 16) * 16 if two_d else m)
    xp = torch.nn.functional.pad(x, (0, nb * 16 - n, 0, mp - m))  # TE's zero padding
    if row_scaled:
        amax_r, enc_r, dec_r = (torch.nn.functional.pad(t, (0, mp - m)).reshape(mp, 1, 1)
                                for t in (amax, s_enc, s_dec))
    else:
        amax_r, enc_r, dec_r = (t.reshape(1, 1, 1) for t in (amax, s_enc, s_dec))
    blocks = xp.reshape(mp, nb, 16)
    if two_d:
        vmax = xp.abs().reshape(mp // 16, 16, nb, 16).amax(dim=(1, 3)).repeat_interleave(16, 0)
    else:
        vmax = blocks.abs().amax(-1)
    vmax = vmax.unsqueeze(-1)
    if mode is None:  # plain NVFP4's scale: vmax * (S_enc * (1/6)), one candidate
        ds = (f32(vmax * f32(enc_r * f32(1.0 / 6.0))),)
    else:  # 4over6: (vmax / 6) * S_enc for map-to-6, 1.5x that for map-to-4
        base = f32(f32(vmax / 6.0) * enc_r)
        ds = (base, f32(base * 1.5))
    cands = []
    for d in ds:
        sc = e4m3(d.clamp(max=448.0))
        sf = sc.to(torch.float64)
        enc = f32(1.0 / f32(sf * dec_r)).clamp(max=FMAX)
        codes = ref_codes(f32(blocks * enc).clamp(-6, 6))
        err = torch.zeros(mp, nb, dtype=torch.float64)
        for i in range(16):
            if fast:
                diff = f32(value(codes[..., i]) * sf[..., 0] - f32(blocks[..., i] * enc_r[..., 0]))
            else:
                v = f32(f32(f32(value(codes[..., i]) * sf[..., 0]) * amax_r[..., 0]) / (6.0 * em))
                diff = f32(v - blocks[..., i])
            err = f32(err + (f32(diff * diff) if mode == "MSE" else diff.abs()))
        if two_d:  # TE's warp tree over the 16 rows of a block
            e = err.reshape(mp // 16, 16, nb)
            for w in (8, 4, 2, 1):
                e = f32(e[:, :w] + e[:, w:2 * w])
            err = e[:, 0].repeat_interleave(16, 0)
        cands.append((sc, codes, err))
    if mode is None:
        cands.append(cands[0])
    pick4 = cands[1][2] < cands[0][2]
    sc = torch.where(pick4.unsqueeze(-1), cands[1][0].view(torch.uint8),
                     cands[0][0].view(torch.uint8))
    codes = torch.where(pick4.unsqueeze(-1), cands[1][1], cands[0][1])
    codes = codes.reshape(mp, nb * 16)[:m, :n].to(torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    grid = torch.zeros((math.ceil(m / 128) * 128, math.ceil(nb / 4) * 4), dtype=torch.uint8)
    grid[:m, :nb] = sc[:m, :, 0]
    return packed, grid, amax.to(torch.float32), pick4[:m]


def make_input(shape, dtype, seed=1):
    torch.manual_seed(seed)
    x = torch.randn(shape) * torch.logspace(-3, 2, shape[-1])
    return (x * torch.logspace(0, 2, shape[0]).unsqueeze(-1)).to(dtype)


@pytest.mark.parametrize("mode", ["MAE", "MSE"])
@pytest.mark.parametrize("em", [448, 256])
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("two_d", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 96), (48, 40)])
def test_4over6_matches_oracle(monkeypatch, mode, em, fast, two_d, dtype, shape):
    monkeypatch.setenv("NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH", "1" if fast else "0")
    x = make_input(shape, dtype)
    q = NVFP4Quantizer(nvfp4_use_4over6=True, nvfp4_e4m3_max=em, nvfp4_4over6_err_mode=mode,
                       with_2d_quantization=two_d)
    t = q(x)
    for data, grid, amax, mat in ((t._rowwise_data, t._rowwise_scale_inv, t._amax_rowwise,
                                   x.double()),
                                  (t._columnwise_data, t._columnwise_scale_inv,
                                   t._amax_columnwise, x.double().t().contiguous())):
        want_q, want_s, want_a, pick4 = ref_quantize(mat, mode, em, fast, two_d, False)
        assert torch.equal(data, want_q)
        assert torch.equal(grid, want_s)
        assert torch.equal(amax, want_a)
    if not two_d:
        assert pick4.any() and not pick4.all()  # both candidates win somewhere: choice tested
    # dequantize uses the tensor's bound: values = e2m1 * sf * amax / (6 * em)
    err = (t.dequantize(dtype=torch.float32) - x.float()).abs().max()
    assert err <= x.float().abs().max() / 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("four_over_six", [False, True])
@pytest.mark.parametrize("columnwise", [False, True])
def test_row_scaled_matches_oracle(dtype, four_over_six, columnwise):
    x = make_input((80, 64), dtype, seed=2)
    q = NVFP4Quantizer(row_scaled_nvfp4=True, columnwise=columnwise,
                       nvfp4_use_4over6=four_over_six)
    t = q(x)
    mode = "MAE" if four_over_six else None
    want_q, want_s, want_a, _ = ref_quantize(x.double(), mode, 448, False, False, True)
    assert t._amax_rowwise.shape == (80,)
    assert torch.equal(t._rowwise_data, want_q)
    assert torch.equal(t._rowwise_scale_inv, want_s)
    assert torch.equal(t._amax_rowwise, want_a)
    if not four_over_six:  # plain row-scaled: the block scales of the plain rule
        plain = NVFP4Quantizer(columnwise=False)(x)
        assert not torch.equal(plain._rowwise_scale_inv, t._rowwise_scale_inv)
    if columnwise:
        wq, ws, wa, _ = ref_quantize(x.double().t().contiguous(), mode, 448, False, False, True)
        assert torch.equal(t._columnwise_data, wq) and torch.equal(t._columnwise_scale_inv, ws)
        assert torch.equal(t._amax_columnwise, wa)
    # dequantize with each row's amax: every row keeps its own relative accuracy
    d = t.dequantize(dtype=torch.float32)
    rel = ((d - x.float()).abs().amax(1) / x.float().abs().amax(1))
    assert rel.max() <= 0.25, rel.max()


def test_python_allocator_pickle_and_gemm():
    x = make_input((32, 64), torch.bfloat16, seed=3)
    q = NVFP4Quantizer(row_scaled_nvfp4=True, nvfp4_use_4over6=True, nvfp4_e4m3_max=256,
                       nvfp4_4over6_err_mode="mse", columnwise=False)
    a = q(x)
    empty = q.make_empty((32, 64), dtype=torch.bfloat16)
    assert empty._amax_rowwise.shape == (32,)
    b = q.update_quantized(x, empty)
    assert torch.equal(a._rowwise_data, b._rowwise_data)
    assert torch.equal(a._amax_rowwise, b._amax_rowwise)
    c = pickle.loads(pickle.dumps(a))
    assert c._quantizer.nvfp4_e4m3_max == 256 and c._quantizer.row_scaled_nvfp4
    assert c._quantizer.nvfp4_4over6_err_mode == "MSE"
    assert torch.equal(c.dequantize(), a.dequantize())
    # a GEMM reads the row-scaled, bound-256 operand through its own dequantization
    w = torch.randn(16, 64)
    out = general_gemm(w, a, out_dtype=torch.float32)[0]
    ref = a.dequantize(dtype=torch.float32) @ w.t()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize("kw", [{"row_scaled_nvfp4": True}, {"nvfp4_use_4over6": True}])
def test_modules_take_the_options(kw):
    """A CustomRecipe handing modules a row-scaled or 4over6 quantizer: the forward GEMM reads the
    operands that quantizer makes (its own bytes, decoded), not plain NVFP4's."""
    import transformer_engine_lite.pytorch as te
    from transformer_engine_lite.common.recipe import CustomRecipe

    torch.manual_seed(0)
    m = te.Linear(64, 48, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    with te.autocast(recipe=CustomRecipe(qfactory=lambda role: NVFP4Quantizer(**kw))):
        y = m(x)
    xd, wd = (NVFP4Quantizer(columnwise=False, **kw)(t.detach()).dequantize(dtype=torch.float32)
              for t in (x, m.weight))
    torch.testing.assert_close(y.float(), (xd.double() @ wd.double().t()).bfloat16().float(),
                               rtol=1.6e-2, atol=1e-2)
