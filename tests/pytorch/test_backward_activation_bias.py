"""ops.fused.BackwardActivationBias (TE main): the backward plan of Linear(bias) + ReLU / GELU under
a quantized forward holds it exactly when the recipe has no backward_override (TE's rule), the plan
follows the recipe from one forward to the next, and the gradients are byte-identical to the
unfused backward (the op composes the same kernels). Also Float8BlockScaling's backward_override
field (TE's; the backward_override suites run it)."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
import transformer_engine_lite.pytorch.ops as te_ops
from transformer_engine_lite.common import recipe
from transformer_engine_lite.pytorch.ops import fused as fused_mod

RECIPES = {
    "current": recipe.Float8CurrentScaling,
    "mxfp8": recipe.MXFP8BlockScaling,
    "block": recipe.Float8BlockScaling,
}


def _model(act):
    torch.manual_seed(0)
    return te_ops.Sequential(te_ops.Linear(128, 128, bias=True, dtype=torch.bfloat16), act())


def _step(model, rcp, x, dy):
    x = x.clone().requires_grad_(True)
    with te.fp8_autocast(enabled=rcp is not None, fp8_recipe=rcp):
        y = model(x)
    y.backward(dy)
    return y.detach(), x.grad, model[0].weight.grad.clone(), model[0].bias.grad.clone()


def _has_fusion(model) -> bool:
    ops = model._module_groups[0]._backward_ops
    return any(isinstance(op, fused_mod.BackwardActivationBias) for op, _ in ops)


@pytest.mark.parametrize("act", [te_ops.ReLU, te_ops.GELU], ids=["relu", "gelu"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_fusion_in_plan_and_bytes_unchanged(name, act, monkeypatch):
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    dy = torch.randn(64, 128, dtype=torch.bfloat16)
    fused_model = _model(act)
    got = _step(fused_model, RECIPES[name](), x, dy)
    assert _has_fusion(fused_model)
    # the unfused plan (the pass disabled) gives the same bytes
    monkeypatch.setattr(fused_mod, "fuse_backward_activation_bias", lambda plan, recipe=None: plan)
    plain_model = _model(act)
    want = _step(plain_model, RECIPES[name](), x, dy)
    assert not _has_fusion(plain_model)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_override_and_unquantized_keep_plain_ops(override):
    x = torch.randn(32, 128, dtype=torch.bfloat16)
    dy = torch.randn(32, 128, dtype=torch.bfloat16)
    model = _model(te_ops.ReLU)
    _step(model, recipe.Float8CurrentScaling(backward_override=override), x, dy)
    assert not _has_fusion(model)
    # the same model, next step without override: the plan is rebuilt with the fusion
    model.zero_grad()
    _step(model, recipe.Float8CurrentScaling(), x, dy)
    assert _has_fusion(model)
    model.zero_grad()
    _step(model, None, x, dy)  # unquantized: no grad-output quantizer, no fusion (TE's rule)
    assert not _has_fusion(model)


def test_not_fused_for_other_activations():
    model = te_ops.Sequential(te_ops.Linear(128, 128, bias=True), te_ops.SReLU())
    _step(model, recipe.Float8CurrentScaling(), torch.randn(32, 128), torch.randn(32, 128))
    assert not _has_fusion(model)


def test_constructor_checks():
    with pytest.raises(TypeError, match="activation"):
        fused_mod.BackwardActivationBias(bias=te_ops.Bias(8), activation=te_ops.SReLU())
    with pytest.raises(TypeError, match="bias"):
        fused_mod.BackwardActivationBias(bias=te_ops.ReLU(), activation=te_ops.ReLU())


@pytest.mark.parametrize("override", [None, "high_precision", "dequantized"])
def test_float8_block_scaling_backward_override(override):
    r = recipe.Float8BlockScaling(backward_override=override)
    assert r.backward_override == override
    assert f"backward_override={override}" in repr(r)


def test_float8_block_scaling_backward_override_rejects():
    with pytest.raises(ValueError, match="backward_override"):
        recipe.Float8BlockScaling(backward_override="fp32")
