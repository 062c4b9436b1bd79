"""The op fuser (TE's ops.Sequential internals): its forward and backward op lists
(_module_groups[i]._forward_ops / _backward_ops) and each fused op against the same ops run one
by one and against fp64 references: ForwardLinearBiasActivation, ForwardLinearBiasAdd,
ForwardLinearScaleAdd, BackwardLinearAdd, BackwardAddRMSNorm, BackwardLinearScale; in-place
residual adds; BasicLinear.get_quantizer under delayed scaling."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
)
from utils import assert_close

ops = te.ops
RECIPES = {
    "delayed": DelayedScaling,
    "current": Float8CurrentScaling,
    "mxfp8": MXFP8BlockScaling,
}


def _rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).requires_grad_()


def test_fused_equals_unfused():
    """BasicLinear+Bias fuse into one GEMM (bias in the epilogue); an Identity between them
    blocks the fusion: the fp32 results must agree to the last bit."""
    torch.manual_seed(0)
    lin, bias = ops.BasicLinear(33, 17), ops.Bias(17)
    with torch.no_grad():
        bias.bias.normal_()
    fused, unfused = ops.Sequential(lin, bias), ops.Sequential(lin, ops.Identity(), bias)
    x = _rand(9, 33, seed=16)
    y1 = fused(x)
    assert type(fused._module_groups[0].fused_ops[0]).__name__ == "ForwardLinearBiasActivation"
    g1 = torch.autograd.grad(y1.sum(), (x, lin.weight, bias.bias))
    y2 = unfused(x)
    assert [type(o).__name__ for o in unfused._module_groups[0].fused_ops] == [
        "BasicLinear", "Identity", "Bias"]
    g2 = torch.autograd.grad(y2.sum(), (x, lin.weight, bias.bias))
    assert torch.equal(y1, y2)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_in_place_residual_add_fuses_into_gemm(dtype, bias):
    """Linear [+ bias] + AddExtraInput(in_place=True) -> ForwardLinearBiasAdd: the GEMM adds its
    product and the bias into the extra input's storage (TE's in-place semantics) with one
    rounding, so it equals the unfused sum computed in fp32 and rounded once."""
    torch.manual_seed(3)
    seq = ops.Sequential(ops.Linear(40, 24, bias=bias, dtype=dtype), ops.AddExtraInput(in_place=True))
    x = torch.randn(6, 40, dtype=dtype, requires_grad=True)
    res = torch.randn(6, 24, dtype=dtype, requires_grad=True)
    res_value = res.detach().clone()
    y = seq(x, res)
    fuser = seq._module_groups[0]
    assert [(type(o).__name__, i) for o, i in fuser._forward_ops] == [
        ("ForwardLinearBiasAdd", [0, 1, 2] if bias else [0, 1])]
    assert [type(o).__name__ for o, _ in fuser._backward_ops] == ["ForwardLinearBiasAdd"]
    assert y.data_ptr() == res.data_ptr()  # the output is the residual's own buffer
    w = seq[0].weight.detach().double()
    ref = x.detach().double() @ w.t() + res_value.double()
    if bias:
        ref = ref + seq[0].bias.detach().double()
    assert_close(y, ref, dtype, "fused add")
    dy = torch.randn(6, 24, dtype=dtype)
    y.backward(dy)
    assert torch.equal(res.grad, dy)
    assert_close(x.grad, dy.double() @ w, dtype, "dx")
    # unfused path (an Identity in between) gives the same values
    seq2 = ops.Sequential(seq[0], ops.Identity(), ops.AddExtraInput(in_place=True))
    res2 = res_value.clone().requires_grad_()
    y2 = seq2(x.detach(), res2)
    assert_close(y2, ref, dtype, "unfused in-place add")
    assert [type(o).__name__ for o, _ in seq2._module_groups[0]._forward_ops] == [
        "ForwardLinearBiasActivation" if bias else "BasicLinear", "Identity", "AddExtraInput"]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("recipe", [None, *RECIPES])
def test_backward_linear_add(bias, recipe):
    """MakeExtraOutput(in_place=True) + Linear -> BackwardLinearAdd: the dgrad GEMM accumulates into
    the residual gradient; equal to the unfused backward (an Identity in between blocks it)."""
    lins = []
    for _ in range(2):  # the same weights; each its own delayed-scaling state
        torch.manual_seed(6)
        lins.append(ops.Linear(32, 48, bias=bias))
    fused = ops.Sequential(ops.MakeExtraOutput(in_place=True), lins[0])
    unfused = ops.Sequential(ops.MakeExtraOutput(in_place=True), ops.Identity(), lins[1])
    x = _rand(16, 32, seed=17)
    dy, de = _rand(16, 48, seed=18), _rand(16, 32, seed=19)
    results = []
    for seq, lin in zip((fused, unfused), lins):
        xi = x.detach().clone().requires_grad_()
        with te.fp8_autocast(enabled=recipe is not None,
                             fp8_recipe=RECIPES[recipe]() if recipe else None):
            y, e = seq(xi)
        torch.autograd.backward((y, e), (dy.detach(), de.detach().clone()))
        results.append((y.detach(), xi.grad, lin.weight.grad))
    plan = [type(o).__name__ for o, _ in fused._module_groups[0]._backward_ops]
    assert plan == ["BackwardLinearAdd"]
    assert [type(o).__name__ for o, _ in unfused._module_groups[0]._backward_ops][-1] == (
        "MakeExtraOutput")
    (y1, dx1, dw1), (y2, dx2, dw2) = results
    assert torch.equal(y1, y2) and torch.equal(dw1, dw2)
    if recipe is None:  # dx = de + dy W: one rounding fused, two unfused
        w = lins[0].weight.detach().double()
        assert_close(dx1, de.double() + dy.double() @ w, torch.float32, "fused dx")
    assert_close(dx1, dx2.double(), torch.float32, "fused vs unfused dx")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_backward_add_rmsnorm(dtype, zero_centered):
    """MakeExtraOutput + RMSNorm -> BackwardAddRMSNorm: the norm's backward kernel adds the residual
    gradient into dx; fp32 equals the unfused sum to the last bit."""
    norm = ops.RMSNorm(40, dtype=dtype, zero_centered_gamma=zero_centered)
    with torch.no_grad():
        norm.weight.normal_(0.0 if zero_centered else 1.0, 0.2)
    fused = ops.Sequential(ops.MakeExtraOutput(), norm)
    unfused = ops.Sequential(ops.MakeExtraOutput(), ops.Identity(), norm)
    x = torch.randn(9, 40, dtype=dtype, generator=torch.Generator().manual_seed(20))
    dy = torch.randn(9, 40, dtype=dtype, generator=torch.Generator().manual_seed(21))
    de = torch.randn(9, 40, dtype=dtype, generator=torch.Generator().manual_seed(22))
    res = []
    for seq in (fused, unfused):
        norm.weight.grad = None
        xi = x.clone().requires_grad_()
        y, e = seq(xi)
        torch.autograd.backward((y, e), (dy, de))
        res.append((y.detach(), xi.grad, norm.weight.grad))
    assert [type(o).__name__ for o, _ in fused._module_groups[0]._backward_ops] == [
        "BackwardAddRMSNorm"]
    (y1, dx1, dw1), (y2, dx2, dw2) = res
    assert torch.equal(y1, y2) and torch.equal(dw1, dw2)
    if dtype == torch.float32:
        assert torch.equal(dx1, dx2)
    x64 = x.double().requires_grad_()
    g = norm.weight.detach().double() + (1.0 if zero_centered else 0.0)
    z = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * g
    want = torch.autograd.grad(z, x64, dy.double())[0] + de.double()
    assert_close(dx1, want, dtype, "dx + residual gradient")


@pytest.mark.parametrize("recipe", [None, *RECIPES])
def test_linear_scale_fusions(recipe):
    """BasicLinear + ConstantScale [+ AddExtraInput(in_place=True)]: the scale is the GEMMs' alpha
    (ForwardLinearScaleAdd forward and backward; BackwardLinearScale backward), equal to the ops
    run one by one (an Identity in between blocks the fusions)."""
    scale = -0.375
    lins = []
    for _ in range(2):  # same weights, own delayed-scaling state each
        torch.manual_seed(8)
        lins.append(ops.BasicLinear(32, 48))
    fused = ops.Sequential(lins[0], ops.ConstantScale(scale), ops.AddExtraInput(in_place=True))
    unfused = ops.Sequential(lins[1], ops.Identity(), ops.ConstantScale(scale),
                             ops.AddExtraInput(in_place=True))
    x, res = _rand(16, 32, seed=23), _rand(16, 48, seed=24)
    dy = _rand(16, 48, seed=25)
    out = []
    for seq, lin in zip((fused, unfused), lins):
        xi, ri = x.detach().clone().requires_grad_(), res.detach().clone().requires_grad_()
        with te.fp8_autocast(enabled=recipe is not None,
                             fp8_recipe=RECIPES[recipe]() if recipe else None):
            y = seq(xi, ri)
        y.backward(dy.detach())
        out.append((y.detach(), xi.grad, ri.grad, lin.weight.grad))
    assert [type(o).__name__ for o, _ in fused._module_groups[0]._forward_ops] == [
        "ForwardLinearScaleAdd"]
    # FP8: the fused GEMMs quantize dy and apply the scale after, the unfused ops quantize the
    # scaled dy: the same values up to one FP8 rounding (E5M2 gradients under HYBRID)
    tol = torch.float32 if recipe is None else "fp8_2gemm"
    for a, b, what in zip(out[0], out[1], ("y", "dx", "dres", "dw")):
        assert_close(a, b.double(), tol, f"fused vs unfused {what}")
    if recipe is None:
        w = lins[0].weight.detach().double()
        assert_close(out[0][0], res.double() + scale * (x.double() @ w.t()), torch.float32, "y")
        assert_close(out[0][1], scale * (dy.double() @ w), torch.float32, "dx")
    # backward-only fusion: no residual add after the scale
    seq = ops.Sequential(lins[0], ops.ConstantScale(scale))
    xi = x.detach().clone().requires_grad_()
    lins[0].weight.grad = None
    seq(xi).backward(dy.detach())
    assert [type(o).__name__ for o, _ in seq._module_groups[0]._backward_ops] == [
        "BackwardLinearScale"]
    if recipe is None:
        w = lins[0].weight.detach().double()
        assert_close(xi.grad, scale * (dy.double() @ w), torch.float32, "dx (backward fusion)")
        assert_close(lins[0].weight.grad, scale * (dy.double().t() @ x.double()), torch.float32,
                     "dw (backward fusion)")


def test_in_place_add_into_quantized_or_mismatched_extra_input():
    """A residual the GEMM cannot accumulate into (other dtype, FP8) still gets the sum written into
    it (AddExtraInput's in-place semantics), computed unfused."""
    torch.manual_seed(4)
    seq = ops.Sequential(ops.Linear(32, 32, bias=False), ops.AddExtraInput(in_place=True))
    x = torch.randn(4, 32)
    res = torch.randn(4, 32, dtype=torch.bfloat16)
    ref = (x.double() @ seq[0].weight.detach().double().t() + res.double())
    y = seq(x, res)
    assert y.data_ptr() == res.data_ptr() and y.dtype == torch.bfloat16
    assert_close(y, ref, torch.bfloat16, "bf16 residual")
    with pytest.raises(ValueError, match="in_place"):
        ops.AddExtraInput(in_place=True)(torch.randn(4, 3), torch.randn(4, 4))


def test_basic_linear_get_quantizer_follows_delayed_scaling():
    """get_quantizer (TE's BasicOperation API): under DelayedScaling a view of the op's own scales,
    which the recipe updates after each step: scale = fp8_max / amax_history_max / 2^margin."""
    recipe = DelayedScaling(margin=1, amax_history_len=4, amax_compute_algo="max")
    op = ops.BasicLinear(32, 32)
    assert op.get_quantizer("forward", 0) is None  # before any FP8 forward
    with torch.no_grad():
        op.weight.fill_(3.0)
    for step, xv in enumerate((7.0, 2.0)):
        x = torch.full((32, 32), xv, requires_grad=True)
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
            y = op(x)
        y.backward(torch.full_like(y, 2.0))
        assert op.get_quantizer("forward", 0).scale.item() == pytest.approx(448.0 / 7.0 / 2, rel=1e-6)
        assert op.get_quantizer("forward", 1).scale.item() == pytest.approx(448.0 / 3.0 / 2, rel=1e-6)
        assert op.get_quantizer("backward", 0).scale.item() == pytest.approx(57344.0 / 4, rel=1e-6)
    with te.fp8_autocast(enabled=True, fp8_recipe=MXFP8BlockScaling()):
        op(torch.randn(32, 32))
    assert type(op.get_quantizer("forward", 1)).__name__ == "MXFP8Quantizer"
    with pytest.raises(ValueError, match="index"):
        op.get_quantizer("backward", 1)
