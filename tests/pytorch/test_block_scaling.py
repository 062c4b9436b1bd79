"""Float8BlockScaling (DeepSeek-V3's recipe): Float8BlockQuantizer / Float8BlockwiseQTensor bytes and
scales against a plain-torch emulation of TE's rule, the tensor API, and the modules under
fp8_autocast against the same quantization emulated in fp64 (forward and backward)."""

from __future__ import annotations

import io
import math

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import Float8BlockScaling
from transformer_engine_lite.pytorch.tensor import Float8BlockQuantizer, Float8BlockwiseQTensor

from utils import FP8_MAX, assert_close, ref_norm

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
MAX_FINITE = {torch.float32: torch.finfo(torch.float32).max,
              torch.bfloat16: torch.finfo(torch.bfloat16).max,
              torch.float16: torch.finfo(torch.float16).max}


def emulate_tiles(x2d, dtype, dim, pow2, eps=0.0):
    """TE's block quantization of a [rows, cols] tensor in plain torch: tiles of 1x128 (dim 1) or
    128x128 (dim 2); amax ignoring NaN, floored at eps; scale = fp8_max / amax in fp32 (Inf ->
    the input dtype's max), 1 for amax 0/Inf; pow2: 2^floor(log2 scale). Returns (q [rows, cols]
    as FP8, scale_inv per element [rows, cols] fp32, scale_inv per tile [tr, tc])."""
    rows, cols = x2d.shape
    th = 1 if dim == 1 else 128
    tr, tc = -(-rows // th), -(-cols // 128)
    x = x2d.float()
    xp = torch.nn.functional.pad(x, (0, tc * 128 - cols, 0, tr * th - rows))
    tiles = xp.reshape(tr, th, tc, 128).abs().nan_to_num(nan=0.0)
    amax = tiles.amax(dim=(1, 3)).clamp_min(eps)
    scale = torch.tensor(FP8_MAX[dtype], dtype=torch.float32) / amax
    scale = torch.where(torch.isinf(scale), torch.tensor(MAX_FINITE[x2d.dtype]), scale)
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    scale = torch.where((amax == 0) | torch.isinf(amax), torch.ones_like(scale), scale)
    s_el = scale.repeat_interleave(th, 0).repeat_interleave(128, 1)[:rows, :cols]
    q = (x * s_el).clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype)
    sinv = 1.0 / scale
    return q, (1.0 / s_el), sinv


def _spread(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    # magnitudes differ per region so neighbouring tiles get different scales
    ramp = torch.exp2(torch.arange(shape[-1]) // 40 % 9 - 4.0)
    return (x * ramp).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fp8", [E4, E5])
@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("pow2", [True, False])
@pytest.mark.parametrize("shape", [(3, 130), (257, 300), (2, 3, 200)])
def test_quantize_bytes_and_scales(dtype, fp8, dim, pow2, shape):
    x = _spread(shape, dtype, 1)
    q = Float8BlockQuantizer(fp8, rowwise=True, columnwise=True, block_scaling_dim=dim,
                             force_pow_2_scales=pow2, amax_epsilon=1e-3)(x)
    x2 = x.reshape(-1, shape[-1])
    rows, cols = x2.shape
    ref_q, _, ref_s = emulate_tiles(x2, fp8, dim, pow2, 1e-3)
    assert torch.equal(q._rowwise_data.view(fp8).reshape(rows, cols).view(torch.uint8),
                       ref_q.view(torch.uint8))
    # GEMM_READY grids: 1D row-wise [tiles, rows] (transposed), 2D [row blocks, col blocks];
    # inner dim padded to a multiple of 4 with zeros
    grid = ref_s.t() if dim == 1 else ref_s
    s = q._rowwise_scale_inv
    assert s.shape == (grid.shape[0], math.ceil(grid.shape[1] / 4) * 4)
    assert torch.equal(s[:, : grid.shape[1]], grid)
    assert not s[:, grid.shape[1]:].any()
    # column-wise: the transposed tensor, tiles along the original rows
    ref_qt, _, ref_st = emulate_tiles(x2.t().contiguous(), fp8, dim, pow2, 1e-3)
    assert q._columnwise_data.shape == (cols, *shape[:-1])
    assert torch.equal(q._columnwise_data.reshape(cols, rows), ref_qt.view(torch.uint8))
    gt = ref_st.t() if dim == 1 else ref_st
    assert torch.equal(q._columnwise_scale_inv[:, : gt.shape[1]], gt)


def test_extreme_tiles():
    """Zero tile -> scale 1; subnormal-only tile -> the input dtype's max as scale; Inf -> 1
    (saturated bytes); NaN elements do not set the scale and encode as NaN."""
    x = torch.zeros(2, 512)
    x[:, 128] = 1e-42
    x[:, 256], x[:, 257] = math.inf, 3.0
    x[:, 384], x[:, 385] = math.nan, -0.75
    q = Float8BlockQuantizer(E4, rowwise=True, columnwise=False, block_scaling_dim=1,
                             force_pow_2_scales=False)(x)
    s = q._rowwise_scale_inv[:, :2]
    assert torch.equal(s[0], torch.ones(2))
    assert torch.equal(s[1], torch.full((2,), 1.0 / torch.finfo(torch.float32).max))
    assert torch.equal(s[2], torch.ones(2))
    assert torch.equal(s[3], torch.full((2,), 0.75 / 448.0, dtype=torch.float32))
    d = q._rowwise_data.view(E4).float()
    assert d[0, 256] == 448.0 and d[0, 257] == 3.0 and d[0, 384].isnan() and d[0, 385] == -448.0


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("shape", [(), (311,), (250, 500), (2, 3, 5, 3)])
def test_dequantize_each_copy(dim, shape):
    x = _spread(shape if shape else (1,), torch.float32, 2).reshape(shape)
    quant = Float8BlockQuantizer(E4, rowwise=True, columnwise=True, block_scaling_dim=dim)
    q = quant(x)
    x2 = x.reshape(-1, shape[-1] if shape else 1)
    _, s_el, _ = emulate_tiles(x2, E4, dim, True)
    ref = (emulate_tiles(x2, E4, dim, True)[0].float() * s_el).reshape(shape)
    assert torch.equal(q.dequantize(), ref)
    q.update_usage(rowwise_usage=False)
    _, st_el, _ = emulate_tiles(x2.t().contiguous(), E4, dim, True)
    ref_t = (emulate_tiles(x2.t().contiguous(), E4, dim, True)[0].float() * st_el)
    assert torch.equal(q.dequantize(), ref_t.t().reshape(shape))
    assert q.size() == torch.Size(shape)


def test_update_usage_rules():
    x = _spread((256, 384), torch.bfloat16, 3)
    q1 = Float8BlockQuantizer(E4, rowwise=True, columnwise=False, block_scaling_dim=1)(x)
    with pytest.raises(RuntimeError, match="columnwise"):
        q1.update_usage(columnwise_usage=True)
    with pytest.raises(ValueError, match="neither"):
        q1.update_usage(rowwise_usage=False, columnwise_usage=False)
    # 2D blocks are square: the column-wise copy made from the row-wise one equals a quantized one
    q2 = Float8BlockQuantizer(E4, rowwise=True, columnwise=False, block_scaling_dim=2)(x)
    q2.update_usage(columnwise_usage=True)
    full = Float8BlockQuantizer(E4, rowwise=True, columnwise=True, block_scaling_dim=2)(x)
    assert torch.equal(q2._columnwise_data, full._columnwise_data)
    assert torch.equal(q2._columnwise_scale_inv, full._columnwise_scale_inv)


def test_bad_arguments():
    with pytest.raises(ValueError, match="float8_e4m3fn or float8_e5m2"):
        Float8BlockQuantizer(torch.float8_e4m3fnuz, rowwise=True, columnwise=True)
    with pytest.raises(ValueError, match="block_scaling_dim"):
        Float8BlockQuantizer(E4, rowwise=True, columnwise=True, block_scaling_dim=3)
    with pytest.raises(RuntimeError, match="expected 1 or 2"):
        torch.ops.te_lite.quantize_fp8_block(torch.ones(4, 4), E4, 0, True, False, True, 0.0)
    with pytest.raises(RuntimeError, match="scale_inv"):
        torch.ops.te_lite.dequantize_fp8_block(torch.ones(4, 4).to(E4), torch.ones(1, 1), 1,
                                               False, torch.float32)


def test_serialization_and_views():
    x = _spread((4, 64, 256), torch.bfloat16, 4)
    q = Float8BlockQuantizer(E5, rowwise=True, columnwise=True, block_scaling_dim=1)(x)
    buf = io.BytesIO()
    torch.save(q, buf)
    buf.seek(0)
    r = torch.load(buf, weights_only=True)
    assert isinstance(r, Float8BlockwiseQTensor) and torch.equal(r.dequantize(), q.dequantize())
    assert r._quantizer.block_scaling_dim == 1
    v = q.view(256, 256)
    assert isinstance(v, Float8BlockwiseQTensor)
    assert torch.equal(v.dequantize(), q.dequantize().view(256, 256))


def test_availability_and_recipe_state():
    assert te.is_fp8_block_scaling_available(return_reason=True) == (True, "")
    from transformer_engine_lite.pytorch.quantization import RecipeState

    st = RecipeState.create(Float8BlockScaling(), mode="forward", num_quantizers=3)
    dims = [q.block_scaling_dim for q in st.make_quantizers()]
    assert dims == [1, 2, 1]


# ------------------------------------------------------------------------------- modules
def _blk(t2d, spec_dtype, dim, columnwise=False):
    """fp64 values of t2d after the recipe's quantization (pow2 scales: TE's default)."""
    x = t2d.t().contiguous() if columnwise else t2d
    q, s_el, _ = emulate_tiles(x, spec_dtype, dim, True)
    v = q.double() * s_el.double()
    return v.t() if columnwise else v


def _init(w):
    with torch.no_grad():
        w.normal_()


def test_linear_matches_emulation():
    """Forward y = Q1(x) Q2(W)^T + b; dgrad = Q1(dy) Q2c(W); wgrad = Q1c(dy)^T Q1c(x): 1x128
    tiles for activations and gradients (column-wise tiles along tokens for wgrad), 128x128
    blocks for the weight."""
    torch.manual_seed(5)
    m = te.Linear(256, 160, init_method=_init)
    x = torch.randn(200, 256)
    dy = torch.randn(200, 160)
    xg = x.clone().requires_grad_(True)
    with te.fp8_autocast(fp8_recipe=Float8BlockScaling()):
        y = m(xg)
    y.backward(dy)
    w, b = m.weight.detach(), m.bias.detach()
    y_ref = _blk(x, E4, 1) @ _blk(w, E4, 2).t() + b.double()
    dgrad = _blk(dy, E4, 1) @ _blk(w, E4, 2, columnwise=True)
    wgrad = _blk(dy, E4, 1, columnwise=True).t() @ _blk(x, E4, 1, columnwise=True)
    assert_close(y, y_ref, "fp8_emulated", "output")
    assert_close(xg.grad, dgrad, "fp8_emulated", "dgrad")
    assert_close(m.weight.grad, wgrad, "fp8_emulated", "wgrad")
    assert_close(m.bias.grad, dy.double().sum(0), "fp8_emulated", "dbias")


@pytest.mark.parametrize("module", ["LayerNormLinear", "LayerNormMLP", "GroupedLinear"])
def test_modules_vs_fp64(module):
    torch.manual_seed(6)
    recipe = Float8BlockScaling()
    x = torch.randn(256, 128)
    if module == "LayerNormLinear":
        m = te.LayerNormLinear(128, 192)
        ln = ref_norm("LayerNorm", x, m.layer_norm_weight, m.layer_norm_bias, m.eps)
        ref = ln @ m.weight.double().t() + m.bias.double()
        kind = "fp8"
    elif module == "LayerNormMLP":
        m = te.LayerNormMLP(128, 256)
        ln = ref_norm("LayerNorm", x, m.layer_norm_weight, m.layer_norm_bias, m.eps)
        h = torch.nn.functional.gelu(ln @ m.fc1_weight.double().t() + m.fc1_bias.double(),
                                     approximate="tanh")
        ref = h @ m.fc2_weight.double().t() + m.fc2_bias.double()
        kind = "fp8_2gemm"
    else:
        m = te.GroupedLinear(2, 128, 96)
        ref = torch.cat([x[:128].double() @ m.weight0.double().t() + m.bias0.double(),
                         x[128:].double() @ m.weight1.double().t() + m.bias1.double()])
        kind = "fp8"
    xg = x.clone().requires_grad_(True)
    with te.fp8_autocast(fp8_recipe=recipe):
        y = m(xg, [128, 128]) if module == "GroupedLinear" else m(xg)
    assert_close(y, ref, kind, f"{module} output")
    y.sum().backward()
    assert xg.grad is not None and torch.isfinite(xg.grad).all()
    # the backward against fp64 autograd of the reference
    xr = x.double().clone().requires_grad_(True)
    params = {n: p.detach().double() for n, p in m.named_parameters()}
    if module == "GroupedLinear":
        yr = torch.cat([xr[:128] @ params["weight0"].t() + params["bias0"],
                        xr[128:] @ params["weight1"].t() + params["bias1"]])
    elif module == "LayerNormLinear":
        yr = ref_norm("LayerNorm", xr, params["layer_norm_weight"], params["layer_norm_bias"],
                      m.eps) @ params["weight"].t() + params["bias"]
    else:
        lnr = ref_norm("LayerNorm", xr, params["layer_norm_weight"], params["layer_norm_bias"],
                       m.eps)
        hr = torch.nn.functional.gelu(lnr @ params["fc1_weight"].t() + params["fc1_bias"],
                                      approximate="tanh")
        yr = hr @ params["fc2_weight"].t() + params["fc2_bias"]
    yr.sum().backward()
    assert_close(xg.grad, xr.grad, kind, f"{module} dgrad")


def test_custom_recipe_factory_and_model_init():
    from transformer_engine_lite.common.recipe import CustomRecipe
    from transformer_engine_lite.pytorch.custom_recipes.quantizer_factories import (
        float8_block_scaling_factory,
    )

    torch.manual_seed(7)
    m = te.Linear(256, 128, init_method=_init)
    x = torch.randn(130, 256)
    with te.fp8_autocast(fp8_recipe=Float8BlockScaling()):
        y_builtin = m(x)
    with te.fp8_autocast(fp8_recipe=CustomRecipe(qfactory=float8_block_scaling_factory)):
        y_custom = m(x)
    assert torch.equal(y_builtin, y_custom)
    with te.quantized_model_init(recipe=Float8BlockScaling()):
        mq = te.Linear(256, 128)
    assert isinstance(mq.weight, Float8BlockwiseQTensor) and mq.weight._is_2D_scaled
    with torch.no_grad():
        wref = mq.weight.dequantize()
    with te.fp8_autocast(fp8_recipe=Float8BlockScaling()):
        yq = mq(x)
    ref = _blk(x, E4, 1) @ wref.double().t() + mq.bias.double()
    assert_close(yq, ref, "fp8_emulated", "FP8-parameter Linear")


@pytest.mark.parametrize("x_dim, w_dim", [(1, 1), (1, 2), (2, 1)])
@pytest.mark.parametrize("layout", ["TN", "NN"])
def test_general_gemm_block_operands(x_dim, w_dim, layout):
    """general_gemm of two block-scaled tensors (TE's per-K-block scaled accumulation) equals the
    fp64 product of the dequantized operands within fp32 accumulation error."""
    from transformer_engine_lite.pytorch.cpp_extensions import general_gemm

    torch.manual_seed(8)
    m, k, n = 200, 384, 136
    x = torch.randn(m, k)
    w = torch.randn(n, k) if layout == "TN" else torch.randn(k, n)
    qx = Float8BlockQuantizer(E4, rowwise=True, columnwise=True, block_scaling_dim=x_dim)(x)
    qw = Float8BlockQuantizer(E4, rowwise=True, columnwise=True, block_scaling_dim=w_dim)(w)
    bias = torch.randn(n)
    y = general_gemm(qw, qx, out_dtype=torch.float32, layout=layout, bias=bias)[0]
    wd = qw.dequantize().double()
    ref = qx.dequantize().double() @ (wd.t() if layout == "TN" else wd) + bias.double()
    if layout == "NN":  # the column-wise copy of w holds other (1x128-along-K) tiles
        wc = qw._shallow_copy()
        wc.update_usage(rowwise_usage=False)
        ref = qx.dequantize().double() @ wc.dequantize().double() + bias.double()
    assert_close(y, ref, "fp8_emulated", f"{layout} {x_dim}Dx{w_dim}D")


def test_torch_compile():
    """A block-scaled tensor through a compiled function, and a compiled Linear under the
    recipe: the same results as eager (same kernels)."""
    torch.manual_seed(9)
    q = Float8BlockQuantizer(E4, rowwise=True, columnwise=True, block_scaling_dim=1)
    x = torch.randn(256, 256)
    qx = q(x)
    f = torch.compile(lambda t: t.dequantize() * 2)
    assert_close(f(qx), qx.dequantize() * 2, "compiled", "compiled dequantize")
    m = te.Linear(256, 128)

    def g(inp):
        with te.fp8_autocast(fp8_recipe=Float8BlockScaling()):
            return m(inp)

    assert_close(torch.compile(g)(x), g(x), "compiled", "compiled Linear")


def test_general_gemm_block_tt_layout():
    """TT: B given as [K, M] enters through its column-wise (transposed) copy."""
    from transformer_engine_lite.pytorch.cpp_extensions import general_gemm

    torch.manual_seed(10)
    xt, w = torch.randn(256, 72), torch.randn(136, 256)
    qx = Float8BlockQuantizer(E4, rowwise=True, columnwise=True, block_scaling_dim=1)(xt)
    qw = Float8BlockQuantizer(E4, rowwise=True, columnwise=True, block_scaling_dim=2)(w)
    y = general_gemm(qw, qx, out_dtype=torch.float32, layout="TT")[0]
    xc = qx._shallow_copy()
    xc.update_usage(rowwise_usage=False)
    ref = xc.dequantize().double().t() @ qw.dequantize().double().t()
    assert_close(y, ref, "fp8_emulated", "TT")
    with pytest.raises(ValueError, match="layout"):
        general_gemm(w, xt.t().contiguous(), layout="TT")


def test_te_ops_basic_linear():
    """te.ops.BasicLinear under the recipe: its quantizers are the recipe's block quantizers and
    its output is the same block-scaled GEMM as te.Linear's."""
    torch.manual_seed(11)
    op = te.ops.BasicLinear(256, 128)
    x = torch.randn(130, 256)
    with te.fp8_autocast(fp8_recipe=Float8BlockScaling()):
        y = op(x)
    q = op.get_quantizer("forward", 1)
    assert isinstance(q, Float8BlockQuantizer) and q.block_scaling_dim == 2
    assert op.get_quantizer("backward", 0).block_scaling_dim == 1
    ref = _blk(x, E4, 1) @ _blk(op.weight.detach(), E4, 2).t()
    assert_close(y, ref, "fp8_emulated", "BasicLinear")


def test_te_ops_quantize():
    """te.ops.Quantize under the recipe gives a 1x128-tiled Float8BlockwiseQTensor."""
    x = _spread((130, 256), torch.float32, 12)
    with te.fp8_autocast(fp8_recipe=Float8BlockScaling()):
        y = te.ops.Quantize()(x)
    assert isinstance(y, Float8BlockwiseQTensor) and not y._is_2D_scaled
    q, s_el, _ = emulate_tiles(x, E4, 1, True)
    assert torch.equal(y.dequantize(), q.float() * s_el)
