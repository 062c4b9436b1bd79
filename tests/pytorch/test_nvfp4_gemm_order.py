"""The native NVFP4 GEMM sums like the FP4 tensor core (cpp_extensions/nvfp4_gemm.py): exact
16-element block terms added in fp32 in K order, then the per-tensor factor, then the epilogue
(+ beta * out, + bias) in fp32 and one rounding. Checked bit for bit against a per-block loop
written here from the bytes (general_gemm, generic_gemm and the grouped GEMM, the three layouts,
row-scaled, 4over6, RHT, accumulate, bias, alpha, bf16 / fp32 out), and the modules (Linear,
LayerNormLinear, LayerNormMLP) under NVFP4BlockScaling against the same modules under a
CustomRecipe of reference quantizers (NVFP4QuantizerRef, whose qgemm has this order)."""

from __future__ import annotations

import functools

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe
from transformer_engine_lite.pytorch.cpp_extensions import general_gemm, general_grouped_gemm
from transformer_engine_lite.pytorch.custom_recipes import reference_utils as ru
from transformer_engine_lite.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef
from transformer_engine_lite.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


# ----------------------------------------------------------------------------- the oracle
def _decode(t, columnwise):
    """(e2m1 values [rows, K], E4M3 block scales [rows, K / 16], amax [1 | rows]) of one copy,
    from the bytes: low nibble first, sign bit 3; the scale grid's bytes as E4M3."""
    data = t._columnwise_data if columnwise else t._rowwise_data
    shape = t._logical_shape()
    cols = shape[-1]
    rows = shape.numel() // cols
    if columnwise:
        rows, cols = cols, rows
    b = data.reshape(rows, cols // 2).long()
    codes = torch.stack((b & 15, b >> 4), dim=-1).reshape(rows, cols)
    mag = torch.tensor(_E2M1)[codes & 7]
    vals = torch.where(codes >= 8, -mag, mag)
    grid = t._scale_grid(columnwise)[:rows, : cols // 16].contiguous()
    amax = (t._amax_columnwise if columnwise else t._amax_rowwise).float().reshape(-1)
    return vals, grid.view(torch.float8_e4m3fn).float(), amax


def _oracle(A, transa, B, transb, emax=448.0, alpha=1.0, out=None, bias=None, dtype=None):
    """y = 0; y += outer(sB, sA) * (16-term dot) per block in K order; y = factor * y; then
    + out, + bias in fp32; one rounding to dtype."""
    qa, sa, aa = _decode(A, not transa)
    qb, sb, ab = _decode(B, transb)
    y = torch.zeros(qb.shape[0], qa.shape[0])
    for k in range(qb.shape[1] // 16):
        sl = slice(16 * k, 16 * k + 16)
        y = y + torch.outer(sb[:, k], sa[:, k]) * (qb[:, sl] @ qa[:, sl].t())
    factor = (ab.reshape(-1, 1) * aa.reshape(1, -1)) / (36.0 * emax * emax)
    if alpha != 1.0:
        factor = factor * alpha
    y = factor * y
    if out is not None:
        y = y + out.reshape(y.shape).float()
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype or torch.float32)


def _data(shape, seed):
    g = torch.Generator().manual_seed(seed)
    # rows of widely different magnitudes: many scales, and cancellation in the sums
    return (torch.randn(*shape, generator=g) *
            torch.exp(torch.randn(shape[0], 1, generator=g) * 2)).to(torch.bfloat16)


def _q(**kw):
    return NVFP4Quantizer(rowwise=True, columnwise=True, **kw)


_LAYOUTS = {"fprop": ("TN", False), "dgrad": ("NN", False), "wgrad": ("NT", True)}


def _operands(gemm, qx, qw, qg, m=64, n=96, k=128):
    """(A, B) of a linear layer's GEMM (TE's naming, D = op(B) @ op(A))."""
    x, w, dy = _data((m, k), 1), _data((n, k), 2), _data((m, n), 3)
    if gemm == "fprop":
        return qw(w), qx(x)
    if gemm == "dgrad":
        return qw(w), qg(dy)
    return qx(x), qg(dy)


# ----------------------------------------------------------------------------- general_gemm
@pytest.mark.parametrize("gemm", list(_LAYOUTS))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", ["plain", "rht", "4over6", "row_scaled", "2d"])
def test_general_gemm_equals_sequential_oracle(gemm, out_dtype, variant):
    layout, _ = _LAYOUTS[gemm]
    kw = {"plain": {}, "rht": {"with_rht": True, "with_post_rht_amax": True},
          "4over6": {"nvfp4_use_4over6": True, "nvfp4_e4m3_max": 256},
          "row_scaled": {}, "2d": {"with_2d_quantization": True}}[variant]
    qx = _q(**kw, row_scaled_nvfp4=variant == "row_scaled")
    qw = _q(**kw)
    A, B = _operands(gemm, qx, qw, _q(**kw))
    emax = 256.0 if variant == "4over6" else 448.0
    d = general_gemm(A, B, out_dtype=out_dtype, layout=layout)[0]
    want = _oracle(A, layout[0] == "T", B, layout[1] == "T", emax, dtype=out_dtype)
    assert d.dtype == out_dtype
    assert torch.equal(d, want)


@pytest.mark.parametrize("gemm", list(_LAYOUTS))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_accumulate_bias_alpha_beta(gemm, out_dtype):
    layout, _ = _LAYOUTS[gemm]
    A, B = _operands(gemm, _q(), _q(), _q())
    ta, tb = layout[0] == "T", layout[1] == "T"
    base = _oracle(A, ta, B, tb)
    out0 = torch.randn(base.shape).to(out_dtype)
    # accumulate: D = product + out, one rounding
    out = out0.clone()
    general_gemm(A, B, out_dtype=out_dtype, layout=layout, out=out, accumulate=True)
    assert torch.equal(out, _oracle(A, ta, B, tb, out=out0, dtype=out_dtype))
    # alpha and beta: alpha folds into the per-tensor factor, beta scales out
    out = out0.clone()
    general_gemm(A, B, out_dtype=out_dtype, layout=layout, out=out, accumulate=True,
                 alpha=0.75, beta=0.5)
    assert torch.equal(out, _oracle(A, ta, B, tb, alpha=0.75, out=out0.float() * 0.5,
                                    dtype=out_dtype))
    if gemm == "fprop":  # bias after alpha * product and beta * out, before the rounding
        bias = torch.randn(base.shape[1]).to(out_dtype)
        d = general_gemm(A, B, out_dtype=out_dtype, layout=layout, bias=bias)[0]
        assert torch.equal(d, _oracle(A, ta, B, tb, bias=bias, dtype=out_dtype))
        out = out0.clone()
        general_gemm(A, B, out_dtype=out_dtype, layout=layout, bias=bias, out=out,
                     accumulate=True)
        assert torch.equal(out, _oracle(A, ta, B, tb, out=out0, bias=bias, dtype=out_dtype))


def test_order_matters_and_is_followed():
    """On this data the block order changes the fp32 sums (reversed K order gives other bits),
    and the GEMM follows K order."""
    q = _q()
    g = torch.Generator().manual_seed(11)
    # magnitudes varying along K: block terms of many exponents, so fp32 sums round
    col = torch.exp(torch.randn(1, 1024, generator=g) * 3)
    X = q((torch.randn(64, 1024, generator=g) * col).to(torch.bfloat16))
    W = q((torch.randn(64, 1024, generator=g) * col).to(torch.bfloat16))
    d = general_gemm(W, X, out_dtype=torch.float32, layout="TN")[0]
    assert torch.equal(d, _oracle(W, True, X, False))
    qa, sa, _ = _decode(W, False)
    qb, sb, _ = _decode(X, False)
    fwd = torch.zeros(64, 64)
    rev = torch.zeros(64, 64)
    terms = [torch.outer(sb[:, k], sa[:, k]) * (qb[:, 16 * k:16 * k + 16] @
                                                  qa[:, 16 * k:16 * k + 16].t())
             for k in range(64)]
    for t in terms:
        fwd = fwd + t
    for t in reversed(terms):
        rev = rev + t
    assert not torch.equal(fwd, rev)


@pytest.mark.parametrize("m, n, k", [(37, 70, 1024), (8, 64, 16), (130, 200, 48), (1, 1, 32)])
def test_cpu_kernel_equals_torch_blocked_sum(m, n, k):
    """te_lite::nvfp4_block_gemm (the core's nvte_nvfp4_block_gemm, on packed codes) and the
    batched-matmul path (other devices, on decoded values) give the same bits, and both the
    oracle's."""
    from transformer_engine_lite.pytorch.cpp_extensions import nvfp4_gemm

    g = torch.Generator().manual_seed(m + n + k)
    col = torch.exp(torch.randn(1, k, generator=g) * 3)
    rows = NVFP4Quantizer(rowwise=True, columnwise=False)  # odd row counts: no column-wise copy
    X = rows((torch.randn(m, k, generator=g) * col).to(torch.bfloat16))
    W = rows((torch.randn(n, k, generator=g) * col).to(torch.bfloat16))
    p = nvfp4_gemm.nvfp4_k_operand(X, False)
    q = nvfp4_gemm.nvfp4_k_operand(W, False)
    y = torch.ops.te_lite.nvfp4_block_gemm(p.data, p.scales, q.data, q.scales)
    assert torch.equal(y, nvfp4_gemm._blocked_sum(p.values, q.values, m, n, k // 16))
    d = general_gemm(W, X, out_dtype=torch.float32, layout="TN")[0]
    assert torch.equal(d, _oracle(W, True, X, False))


def test_cpu_kernel_refusals():
    op = torch.ops.te_lite.nvfp4_block_gemm
    u8 = functools.partial(torch.zeros, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="arguments 'B' and 'A': expected the same K"):
        op(u8(2, 16), u8(2, 2), u8(3, 8), u8(3, 1))
    with pytest.raises(RuntimeError, match="argument 'A': expected an E4M3 scale_inv grid of at "
                                           "least \\[3, 2\\]"):
        op(u8(2, 16), u8(2, 2), u8(3, 16), u8(3, 1))
    with pytest.raises(RuntimeError, match="argument 'a_data': expected a 2-D uint8 tensor"):
        op(u8(2, 16), u8(2, 2), torch.zeros(3, 16), u8(3, 2))
    with pytest.raises(RuntimeError, match="argument 'b_scale': expected a 2-D uint8 or "
                                           "float8_e4m3fn"):
        op(u8(2, 16), torch.zeros(2, 2), u8(3, 16), u8(3, 2))


def test_generic_gemm_and_grouped_gemm_follow_the_order():
    from transformer_engine_lite.pytorch import tex

    A, B = _operands("fprop", _q(), _q(), _q())
    want = _oracle(A, True, B, False, dtype=torch.bfloat16)
    d = tex.generic_gemm(A, True, B, False, None, None, tex.DType.kBFloat16, None,
                         tex.DType.kBFloat16, False, None, False, None, 0, False, False)[0]
    assert torch.equal(d, want)
    As = [A, _operands("fprop", _q(), _q(), _q(), m=32)[0]]
    Bs = [B, _q()(_data((32, 128), 9))]
    outs = [torch.empty(64, 96, dtype=torch.bfloat16), torch.empty(32, 96, dtype=torch.bfloat16)]
    general_grouped_gemm(As, Bs, outs, [None, None], torch.bfloat16)
    for a, b, o in zip(As, Bs, outs):
        assert torch.equal(o, _oracle(a, True, b, False, dtype=torch.bfloat16))


def test_shape_mismatch_is_refused():
    A = _q()(_data((32, 64), 1))
    B = _q()(_data((32, 128), 2))
    with pytest.raises(ValueError, match="K"):
        general_gemm(A, B, out_dtype=torch.float32, layout="TN")


# ----------------------------------------------------------------------------- modules
def _ref_factory(rht, two_d, row_scaled):
    def make(role):
        kind = None if role is None else role.tensor_type
        if kind == "weight":
            return NVFP4QuantizerRef(ru.Fp4Formats.E2M1,
                                     quant_tile_shape=(16, 16) if two_d else (1, 16))
        return NVFP4QuantizerRef(ru.Fp4Formats.E2M1, with_rht=rht,
                                 row_scaled_nvfp4=row_scaled and kind == "input")
    return make


def _native_recipe(rht, two_d, row_scaled):
    r = recipe.NVFP4BlockScaling()
    r.fp4_quant_fwd_inp = recipe.QParams(random_hadamard_transform=rht)
    r.fp4_quant_fwd_weight = recipe.QParams(fp4_2d_quantization=two_d)
    r.fp4_quant_bwd_grad = recipe.QParams(random_hadamard_transform=rht)
    if row_scaled:
        r.row_scaled_activation = True
    return r


def _step(module, rec, x, dy):
    x = x.clone().requires_grad_()
    with te.autocast(enabled=True, recipe=rec):
        y = module(x)
    y.backward(dy)
    grads = [p.grad.clone() for p in module.parameters() if p.grad is not None]
    module.zero_grad(set_to_none=True)
    return [y.detach(), x.grad, *grads]


@pytest.mark.parametrize("kind", ["Linear", "LayerNormLinear", "LayerNormMLP"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rht, two_d, row_scaled",
                         [(False, False, False), (True, True, False), (False, False, True)],
                         ids=["plain", "rht_2d", "row_scaled"])
def test_modules_equal_reference_quantizer_modules(kind, dtype, rht, two_d, row_scaled,
                                                   monkeypatch):
    if row_scaled and kind != "Linear":
        pytest.skip("row-scaled activations: checked on Linear")
    from transformer_engine_lite.pytorch.cpp_extensions import nvfp4_gemm

    calls = []
    seq = nvfp4_gemm.nvfp4_sequential_gemm
    monkeypatch.setattr(nvfp4_gemm, "nvfp4_sequential_gemm",
                        lambda *a, **k: calls.append(1) or seq(*a, **k))
    torch.manual_seed(5)
    make = {"Linear": lambda: te.Linear(128, 64, bias=False, params_dtype=dtype),
            "LayerNormLinear": lambda: te.LayerNormLinear(128, 64, bias=False,
                                                          params_dtype=dtype),
            "LayerNormMLP": lambda: te.LayerNormMLP(128, 64, bias=False, params_dtype=dtype)}
    native = make[kind]()
    ref = make[kind]()
    ref.load_state_dict(native.state_dict())
    x = torch.randn(32, 128, dtype=dtype)
    dy = torch.randn(32, 64 if kind != "LayerNormMLP" else 128, dtype=dtype)
    got = _step(native, _native_recipe(rht, two_d, row_scaled), x, dy)
    want = _step(ref, recipe.CustomRecipe(qfactory=_ref_factory(rht, two_d, row_scaled)), x, dy)
    # every GEMM of the native module ran in the tensor core's order (none fell back)
    assert len(calls) == (6 if kind == "LayerNormMLP" else 3)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)  # TE's tolerance
