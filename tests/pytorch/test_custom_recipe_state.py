"""CustomRecipe: CustomRecipeState (quantizers of one direction from the factory, delayed-scaling
requests served from shared buffers it owns), the modules' boundary roles
(output_quantizer_role / grad_input_quantizer_role) and TE's rule that a factory answers every
slot (None is an error)."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import CustomRecipe, DelayedScaling, Format
from transformer_engine_lite.pytorch.custom_recipes.quantizer_factories import (
    current_scaling_factory,
)
from transformer_engine_lite.pytorch.quantization import (
    CustomRecipeState,
    DelayedScalingRequest,
    QuantizerRole,
)
from transformer_engine_lite.pytorch.tensor import Float8CurrentScalingQuantizer, Float8Quantizer

ROLES = [QuantizerRole("linear", t) for t in ("input", "weight", "output")]


def test_state_serves_delayed_requests_from_shared_buffers():
    req = DelayedScalingRequest(fp8_format=Format.E4M3, amax_history_len=16)
    state = CustomRecipeState(CustomRecipe(qfactory=lambda r: req), mode="backward",
                              num_quantizers=3, roles=ROLES)
    qs = state.make_quantizers()
    assert all(isinstance(q, Float8Quantizer) for q in qs)
    assert all(q.dtype == te.DType.kFloat8E4M3 for q in qs)  # E4M3 format: backward too
    assert state._has_delayed_scaling and state.scale.shape == (3,)
    assert state.amax_history.shape == (16, 3) and torch.all(state.scale == 1)
    inner = state._inner_delayed_scaling_recipe
    assert isinstance(inner, DelayedScaling) and inner.amax_history_len == 16
    # views: quantizing through slot 1 records its amax in history row 0, column 1
    x = torch.tensor([[1.0, -6.0]])
    qs[1](x)
    assert state.amax_history[0].tolist() == [0.0, 6.0, 0.0]
    state.scale.fill_(2.0)
    assert qs[2].scale.item() == 2.0


def test_state_mixed_and_inheritance():
    def mixed(role):
        if role is not None and role.tensor_type == "weight":
            return DelayedScalingRequest()
        return Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)

    recipe = CustomRecipe(qfactory=mixed)
    state = CustomRecipeState(recipe, mode="forward", num_quantizers=3, roles=ROLES)
    qs = state.make_quantizers()
    assert [type(q) for q in qs] == [Float8CurrentScalingQuantizer, Float8Quantizer,
                                     Float8CurrentScalingQuantizer]
    assert qs[1].dtype == te.DType.kFloat8E4M3
    assert state.scale.shape == (1,) and state.amax_history.shape == (1024, 1)
    state.amax_history.fill_(2.5)
    again = CustomRecipeState(recipe, mode="forward", num_quantizers=3, roles=ROLES)
    assert again.inherit_state_from(state)
    again.make_quantizers()
    assert again.amax_history is state.amax_history and torch.all(again.amax_history == 2.5)
    assert not CustomRecipeState(recipe, mode="forward").inherit_state_from(object())
    stateless = CustomRecipeState(CustomRecipe(qfactory=current_scaling_factory), mode="forward")
    assert len(stateless.make_quantizers()) == 1 and not stateless._has_delayed_scaling
    assert stateless.scale is None and stateless.amax_history is None


def test_state_checks():
    recipe = CustomRecipe(qfactory=current_scaling_factory)
    with pytest.raises(TypeError, match="expected a CustomRecipe"):
        CustomRecipeState(DelayedScaling(), mode="forward")
    with pytest.raises(ValueError, match="mode"):
        CustomRecipeState(recipe, mode="fwd")
    with pytest.raises(ValueError, match="num_quantizers"):
        CustomRecipeState(recipe, mode="forward", num_quantizers=0)
    with pytest.raises(ValueError, match="roles"):
        CustomRecipeState(recipe, mode="forward", num_quantizers=2, roles=ROLES)
    unequal = CustomRecipe(qfactory=lambda r: DelayedScalingRequest(margin=len(r.tensor_type)))
    with pytest.raises(ValueError, match="must be equal"):
        CustomRecipeState(unequal, mode="forward", num_quantizers=3, roles=ROLES).make_quantizers()
    with pytest.raises(ValueError, match="returned None for slot 0"):
        CustomRecipeState(CustomRecipe(qfactory=lambda r: None), mode="forward").make_quantizers()


def test_module_factory_returning_none_is_an_error():
    m = te.Linear(32, 16)
    with pytest.raises(ValueError, match="returned None for slot 2"):
        with te.autocast(recipe=CustomRecipe(
                qfactory=lambda r: None if r is None else current_scaling_factory(r))):
            m(torch.randn(4, 32))


def test_boundary_roles_reach_the_factory():
    seen = []

    def factory(role):
        seen.append(role)
        return current_scaling_factory(role)

    recipe = CustomRecipe(qfactory=factory)
    m = te.Linear(32, 16, name="proj")
    x = torch.randn(16, 32)
    with te.autocast(recipe=recipe):
        m(x)
    assert seen[2] is None and seen[4] is None and len(seen) == 5
    consumer = QuantizerRole("dpa", "qkv", "attn")
    m.output_quantizer_role = consumer
    with te.autocast(recipe=recipe):  # a changed boundary role: asked again, with it
        m(x)
    assert len(seen) == 10 and seen[7] == consumer and seen[9] is None
    assert m.quantizers["scaling_fwd"][2] is not None
    with te.autocast(recipe=recipe):  # unchanged: not asked again
        m(x)
    assert len(seen) == 10
    m.grad_input_quantizer_role = "fc1"
    with pytest.raises(TypeError, match="grad_input_quantizer_role: expected a QuantizerRole"):
        with te.autocast(recipe=recipe):
            m(x)
