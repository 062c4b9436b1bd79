"""CustomRecipe (TE's recipe built from a quantizer factory): the recipe's checks, QuantizerRole,
the alignment contract, the modules honouring a factory (bit for bit equal to the built-in recipe
each factory in custom_recipes.quantizer_factories mirrors), the roles the modules pass, and the
clear errors for what is not implemented (mixed kinds in one GEMM, delayed-scaling requests,
NVFP4 / block scaling: issue #24)."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
import transformer_engine_lite.pytorch.ops as te_ops
from transformer_engine_lite.common.recipe import (
    CustomRecipe,
    DelayedScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    QParams,
)
from transformer_engine_lite.pytorch.constants import FP8BwdTensorIdx, FP8FwdTensorIdx
from transformer_engine_lite.pytorch.custom_recipes.quantizer_factories import (
    current_scaling_factory,
    delayed_scaling_factory,
    float8_block_scaling_factory,
    high_precision_factory,
    mxfp8_factory,
    nvfp4_factory,
)
from transformer_engine_lite.pytorch.custom_recipes.quantizer_factory_zoo import (
    mxfp8_fwd_nvfp4_bwd_factory,
)
from transformer_engine_lite.pytorch.custom_recipes.reference_nvfp4 import nvfp4_ref_rht_2d_factory
from transformer_engine_lite.pytorch.quantization import (
    DelayedScalingRequest,
    QuantizerRole,
    get_align_size_for_quantization,
    get_fp8_torch_dtype,
)
from transformer_engine_lite.pytorch.tensor import (
    Float8CurrentScalingQuantizer,
    HybridQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from transformer_engine_lite.pytorch.tensor.identity_tensor import IdentityQuantizer

BF16 = torch.bfloat16


# ----------------------------------------------------------------------------- recipe and roles
def test_recipe_checks():
    r = CustomRecipe(qfactory=current_scaling_factory)
    assert r.custom() and not (r.delayed() or r.float8_current_scaling() or r.mxfp8())
    assert r.quantization_alignment == 128 and r.backward_override is None
    assert "quantization_alignment=128" in repr(r)
    assert r.to_dict()["qfactory"] == "current_scaling_factory"
    assert not Float8CurrentScaling().custom()
    with pytest.raises(TypeError, match="qfactory: expected a callable"):
        CustomRecipe(qfactory=3)
    with pytest.raises(TypeError, match="qfactory: expected a callable"):
        CustomRecipe()
    with pytest.raises(ValueError, match="quantization_alignment must be positive"):
        CustomRecipe(qfactory=current_scaling_factory, quantization_alignment=-16)
    with pytest.raises(TypeError, match="quantization_alignment: expected an int"):
        CustomRecipe(qfactory=current_scaling_factory, quantization_alignment=True)
    with pytest.raises(ValueError, match="backward_override"):
        CustomRecipe(qfactory=current_scaling_factory, backward_override="fp8")
    with pytest.raises(NotImplementedError, match="fp8_dpa"):
        CustomRecipe(qfactory=current_scaling_factory, fp8_dpa=True)


def test_quantizer_role():
    r = QuantizerRole(module_type="linear", tensor_type="input", name="fc1")
    assert r == QuantizerRole("linear", "input", "fc1") and hash(r) == hash(QuantizerRole(
        "linear", "input", "fc1"))
    assert str(r) == "module_type=linear|tensor_type=input|name=fc1"
    assert str(QuantizerRole()) == "QuantizerRole()"
    assert QuantizerRole(module_type="moe").tensor_type == ""
    with pytest.raises(Exception):  # frozen
        r.name = "fc2"
    with pytest.raises(TypeError, match="tensor_type: expected a str"):
        QuantizerRole(tensor_type=None)


def test_align_size_contract_does_not_call_factory():
    calls = []

    def factory(role):
        calls.append(role)
        return current_scaling_factory(role)

    assert get_align_size_for_quantization(CustomRecipe(qfactory=factory)) == 128
    assert get_align_size_for_quantization(
        CustomRecipe(qfactory=factory, quantization_alignment=48)) == 48
    assert calls == []
    assert get_align_size_for_quantization(DelayedScaling()) == 16
    assert get_align_size_for_quantization(Float8CurrentScaling()) == 16
    assert get_align_size_for_quantization(MXFP8BlockScaling()) == 32
    with pytest.raises(TypeError, match="expected a Recipe"):
        get_align_size_for_quantization("mxfp8")


def test_fp8_torch_dtype_of_recipe():
    r = CustomRecipe(qfactory=current_scaling_factory)
    assert get_fp8_torch_dtype(r, fprop_tensor=True) == torch.float8_e4m3fn
    assert get_fp8_torch_dtype(r, fprop_tensor=False) == torch.float8_e5m2
    assert get_fp8_torch_dtype(Float8CurrentScaling().fp8_format, False) == torch.float8_e5m2
    with pytest.raises(TypeError, match="expected a Format"):
        get_fp8_torch_dtype("hybrid")


def test_tensor_index_names():
    assert (FP8FwdTensorIdx.GEMM1_INPUT, FP8FwdTensorIdx.GEMM1_WEIGHT,
            FP8FwdTensorIdx.GEMM1_OUTPUT, FP8FwdTensorIdx.GEMM2_INPUT) == (0, 1, 2, 3)
    assert (FP8BwdTensorIdx.GRAD_OUTPUT1, FP8BwdTensorIdx.GRAD_INPUT1,
            FP8BwdTensorIdx.GRAD_OUTPUT2) == (0, 1, 2)


# ----------------------------------------------------------------------------- factories
def test_factories():
    g = QuantizerRole("linear", "grad_output", "x")
    i = QuantizerRole("linear", "input", "x")
    assert current_scaling_factory(g).dtype == te.DType.kFloat8E5M2
    assert current_scaling_factory(i).dtype == te.DType.kFloat8E4M3
    assert current_scaling_factory(None).dtype == te.DType.kFloat8E4M3
    assert isinstance(mxfp8_factory(g), MXFP8Quantizer)
    assert mxfp8_factory(g).dtype == te.DType.kFloat8E4M3
    assert isinstance(high_precision_factory(None), IdentityQuantizer)
    x = torch.randn(4, 8)
    assert high_precision_factory(None)(x) is x
    assert isinstance(delayed_scaling_factory(i), DelayedScalingRequest)
    a, b = current_scaling_factory(i), current_scaling_factory(i)
    assert a is not b
    with pytest.raises(TypeError, match="role: expected a QuantizerRole"):
        current_scaling_factory("input")
    for f in (nvfp4_factory, nvfp4_ref_rht_2d_factory):  # NVFP4: TE's role rules
        w = f(QuantizerRole("linear", "weight"))
        assert w.with_2d_quantization and not w.with_rht and f(i).with_rht
    assert nvfp4_factory(g).stochastic_rounding and not nvfp4_ref_rht_2d_factory(g).stochastic_rounding
    # Float8BlockScaling's defaults: 128x128 blocks for linear weights, 1x128 tiles otherwise
    assert float8_block_scaling_factory(QuantizerRole("linear", "weight")).block_scaling_dim == 2
    assert float8_block_scaling_factory(i).block_scaling_dim == 1
    assert isinstance(mxfp8_fwd_nvfp4_bwd_factory(g), NVFP4Quantizer)
    hw = mxfp8_fwd_nvfp4_bwd_factory(QuantizerRole("linear", "weight"))
    assert isinstance(hw, HybridQuantizer) and hw.columnwise_source == "rowwise_dequantized"
    assert isinstance(hw.rowwise_quantizer, MXFP8Quantizer) and not hw.columnwise_quantizer.with_rht
    assert isinstance(mxfp8_fwd_nvfp4_bwd_factory(QuantizerRole("dpa", "qkv")), MXFP8Quantizer)
    assert isinstance(mxfp8_fwd_nvfp4_bwd_factory(None), MXFP8Quantizer)


# ----------------------------------------------------------------------------- modules
def _make(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    if kind == "Linear":
        return te.Linear(64, 48, params_dtype=BF16)
    if kind == "LayerNormLinear":
        return te.LayerNormLinear(64, 48, params_dtype=BF16)
    if kind == "LayerNormMLP":
        return te.LayerNormMLP(64, 96, params_dtype=BF16)
    return te_ops.Linear(64, 48, device="cpu", dtype=BF16)


def _run(model, x, recipe, steps: int = 1):
    """Forward + backward (a loss stressing the gradient's range); (out, dx, param grads)."""
    for p in model.parameters():
        p.grad = None
    for _ in range(steps):
        inp = x.clone().requires_grad_(True)
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            out = model(inp)
        w = torch.linspace(-3, 3, out.shape[-1])
        w[0] = 1e6
        (out.float() * w).sum().backward()
    return out.detach(), inp.grad, {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same(a, b):
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)
    assert a[2].keys() == b[2].keys()
    for k in a[2]:
        torch.testing.assert_close(a[2][k], b[2][k], rtol=0, atol=0, msg=k)


MODULES = ["Linear", "LayerNormLinear", "LayerNormMLP", "OpsLinear"]


@pytest.mark.parametrize("kind", MODULES)
@pytest.mark.parametrize(
    "factory, builtin",
    [(current_scaling_factory, Float8CurrentScaling), (mxfp8_factory, MXFP8BlockScaling),
     (high_precision_factory, None)],
    ids=["current", "mxfp8", "high_precision"],
)
def test_factory_matches_builtin(kind, factory, builtin):
    x = torch.randn(32, 64, dtype=BF16)
    ref = _run(_make(kind), x, builtin() if builtin else None, steps=2)
    got = _run(_make(kind), x, CustomRecipe(qfactory=factory), steps=2)
    _assert_same(ref, got)
    if builtin is not None:  # and differs from high precision (the cast happened)
        hp = _run(_make(kind), x, None)
        assert not torch.equal(hp[0], got[0])


def test_factory_options_are_honoured():
    """Per-role options reach the cast: a factory with power-of-two scales for the weight and E5M2
    for the input equals the built-in recipe with those QParams / format choices."""
    x = torch.randn(32, 64, dtype=BF16)

    def factory(role):
        q = current_scaling_factory(role)
        if role is not None and role.tensor_type == "weight":
            q.force_pow_2_scales = True
        return q

    ref = _run(_make("Linear"), x, Float8CurrentScaling(
        fp8_quant_fwd_weight=QParams(power_2_scale=True)))
    _assert_same(ref, _run(_make("Linear"), x, CustomRecipe(qfactory=factory)))
    plain = _run(_make("Linear"), x, Float8CurrentScaling())
    assert not torch.equal(plain[0], ref[0])

    def e5m2_input(role):  # a dtype the built-in HYBRID format never gives the input
        if role is not None and role.tensor_type == "input":
            return Float8CurrentScalingQuantizer(te.DType.kFloat8E5M2)
        return current_scaling_factory(role)

    got = _run(_make("Linear"), x, CustomRecipe(qfactory=e5m2_input))
    assert not torch.equal(got[0], plain[0])
    # the forward by hand: E5M2 input, E4M3 weight, per-tensor current scaling, FP32 accumulate
    m = _make("Linear")
    xq = Float8CurrentScalingQuantizer(te.DType.kFloat8E5M2)(x).dequantize(dtype=torch.float32)
    wq = Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)(m.weight.detach()).dequantize(
        dtype=torch.float32)
    ref_out = (xq.double() @ wq.double().t() + m.bias.detach().double()).to(BF16)
    torch.testing.assert_close(got[0], ref_out, rtol=2**-7, atol=1e-2)


def test_roles_and_invocations():
    calls = []

    def factory(role):
        calls.append(role)
        return current_scaling_factory(role)

    m = te.Linear(64, 48, params_dtype=BF16, name="proj")
    recipe = CustomRecipe(qfactory=factory)
    x = torch.randn(16, 64, dtype=BF16)
    _run(m, x, recipe, steps=2)
    assert calls == [QuantizerRole("linear", "input", "proj"),
                     QuantizerRole("linear", "weight", "proj"), None,
                     QuantizerRole("linear", "grad_output", "proj"), None]
    q = m.quantizers
    assert q["scaling_fwd"][FP8FwdTensorIdx.GEMM1_INPUT].dtype == te.DType.kFloat8E4M3
    assert q["scaling_bwd"][FP8BwdTensorIdx.GRAD_OUTPUT1].dtype == te.DType.kFloat8E5M2
    _run(m, x, CustomRecipe(qfactory=factory))  # another recipe object: asked again
    assert len(calls) == 10

    calls.clear()
    mlp = te.LayerNormMLP(64, 96, params_dtype=BF16, name="tl.mlp")
    _run(mlp, x, recipe)
    names = {(r.name, r.tensor_type) for r in calls if r is not None}
    assert names == {(f"tl.mlp.fc{i}", t) for i in (1, 2)
                     for t in ("input", "weight", "grad_output")}
    assert len(mlp.quantizers["scaling_fwd"]) == 6 and len(mlp.quantizers["scaling_bwd"]) == 4

    calls.clear()
    g = te.GroupedLinear(2, 64, 48, params_dtype=BF16, name="experts")
    with te.autocast(recipe=recipe):
        g(x, [8, 8]).float().sum().backward()
    assert {r.module_type for r in calls if r is not None} == {"grouped_linear"}
    assert {r.name for r in calls if r is not None} == {"experts"}
    assert len(calls) == 10  # 5 slots per GEMM


def test_builtin_recipe_exposes_quantizers():
    m = te.Linear(64, 48, params_dtype=BF16)
    _run(m, torch.randn(16, 64, dtype=BF16), Float8CurrentScaling())
    f, b = m.quantizers["scaling_fwd"], m.quantizers["scaling_bwd"]
    assert all(isinstance(q, Float8CurrentScalingQuantizer) for q in f + b)
    assert [q.dtype for q in f] == [te.DType.kFloat8E4M3] * 3
    assert [q.dtype for q in b] == [te.DType.kFloat8E5M2] * 2


@pytest.mark.parametrize(
    "factory, match",
    [
        (lambda r: mxfp8_factory(r) if r is not None and r.tensor_type == "weight"
         else current_scaling_factory(r), "mixing scaling kinds"),
        (lambda r: delayed_scaling_factory(r) if r is not None and r.tensor_type == "weight"
         else current_scaling_factory(r), "mixing scaling kinds"),
        (lambda r: object(), "quantizer object is not supported"),
    ],
    ids=["mixed", "mixed_delayed_request", "foreign"],
)
def test_unsupported_factories_raise(factory, match):
    m = te.Linear(64, 48, params_dtype=BF16)
    with pytest.raises(NotImplementedError, match=match):
        with te.autocast(recipe=CustomRecipe(qfactory=factory)):
            m(torch.randn(16, 64, dtype=BF16))


def test_grouped_padding_follows_alignment_contract():
    """Fp8Padding pads to the recipe's quantization_alignment; the padded grouped GEMM equals the
    built-in recipe's on the same padded splits."""
    x = torch.randn(32, 64, dtype=BF16)
    for align in (128, 48):
        recipe = CustomRecipe(qfactory=current_scaling_factory, quantization_alignment=align)
        pad, unpad = te.Fp8Padding(2), te.Fp8Unpadding(2)
        torch.manual_seed(1)
        g = te.GroupedLinear(2, 64, 48, params_dtype=BF16, bias=False)
        torch.manual_seed(1)
        g_ref = te.GroupedLinear(2, 64, 48, params_dtype=BF16, bias=False)
        with te.autocast(recipe=recipe):
            xp, splits = pad(x, [17, 15])
            out = unpad(g(xp, splits), [17, 15])
        assert pad.align_size == align and splits == [align, align]
        with te.autocast(recipe=Float8CurrentScaling()):
            ref = te.Fp8Unpadding(2, align)(g_ref(xp, splits), [17, 15])
        assert out.shape == (32, 48)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_quantized_model_init_refuses_custom_recipe():
    with pytest.raises(NotImplementedError, match="CustomRecipe FP8 weight parameters"):
        with te.quantized_model_init(recipe=CustomRecipe(qfactory=current_scaling_factory)):
            te.Linear(16, 16)


def test_ops_linear_get_quantizer_under_custom_recipe():
    def factory(role):
        if role is not None and role.tensor_type == "weight":
            return Float8CurrentScalingQuantizer(te.DType.kFloat8E5M2)
        return current_scaling_factory(role)

    op = te_ops.Linear(64, 48, device="cpu", dtype=BF16)
    _run(op, torch.randn(16, 64, dtype=BF16), CustomRecipe(qfactory=factory))
    basic = op.basic_ops[0]
    assert basic.get_quantizer("forward", 0).dtype == te.DType.kFloat8E4M3
    assert basic.get_quantizer("forward", 1).dtype == te.DType.kFloat8E5M2
    assert basic.get_quantizer("backward", 0).dtype == te.DType.kFloat8E5M2


@pytest.mark.parametrize("kind", ["Linear", "LayerNormMLP"])
@pytest.mark.parametrize("settings", [{}, dict(amax_history_len=4, margin=1,
                                                amax_compute_algo="most_recent")])
def test_delayed_scaling_request_matches_delayed_scaling(kind, settings):
    """Equal DelayedScalingRequests run as DelayedScaling(**settings) over several steps: the
    module's amax history and scales update at each autocast exit and backward (step 2 and 3 use
    updated scales, so a missing update would show)."""
    x = torch.randn(32, 64, dtype=BF16)
    ref_m, cus_m = _make(kind), _make(kind)
    ref = _run(ref_m, x, DelayedScaling(**settings), steps=3)
    req = DelayedScalingRequest(**settings)
    got = _run(cus_m, x, CustomRecipe(qfactory=lambda role: req), steps=3)
    _assert_same(ref, got)
    assert torch.equal(ref_m.fp8_fwd_scale, cus_m.fp8_fwd_scale)
    assert torch.equal(ref_m.fp8_bwd_amax_history, cus_m.fp8_bwd_amax_history)
    assert not torch.all(cus_m.fp8_fwd_scale == 1)  # the scales did update
    assert cus_m.fp8_fwd_amax_history.shape[0] == settings.get("amax_history_len", 1024)


def test_delayed_scaling_requests_must_agree():
    a, b = DelayedScalingRequest(margin=0), DelayedScalingRequest(margin=2)
    m = te.Linear(64, 48, params_dtype=BF16)
    with pytest.raises(NotImplementedError, match="different settings within one GEMM"):
        with te.autocast(recipe=CustomRecipe(
                qfactory=lambda r: a if r is not None and r.tensor_type == "input" else b)):
            m(torch.randn(16, 64, dtype=BF16))
    recipe = CustomRecipe(qfactory=lambda r: a if r is not None and r.name == "one" else b)
    one = te.Linear(64, 48, params_dtype=BF16, name="one")
    two = te.Linear(48, 8, params_dtype=BF16, name="two")
    with pytest.raises(NotImplementedError, match="different settings under one recipe"):
        with te.autocast(recipe=recipe):
            two(one(torch.randn(16, 64, dtype=BF16)))
    with pytest.raises(ValueError, match="amax_history_len"):
        DelayedScalingRequest(amax_history_len=0).delayed_scaling()
