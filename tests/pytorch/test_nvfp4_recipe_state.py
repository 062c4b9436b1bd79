"""TE's NVFP4BlockScalingRecipeState: one NVFP4Quantizer per slot, configured by the slot's tensor
type (the role's tensor_type when known, else positional), and what RecipeState.create and a
module's fp8_meta give for an NVFP4BlockScaling recipe."""

from __future__ import annotations

import pytest

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import NVFP4BlockScaling, QParams
from transformer_engine_lite.pytorch.quantization import (
    NVFP4BlockScalingRecipeState,
    QuantizerRole,
    RecipeState,
)


def _recipe(**kw):
    return NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, **kw)


def _cfg(q):
    return (q.row_scaled_nvfp4, q.nvfp4_use_4over6, q.nvfp4_e4m3_max, q.with_rht,
            q.stochastic_rounding, q.with_2d_quantization)


def test_positional_forward_and_backward_slots():
    r = NVFP4BlockScaling()  # TE's defaults: RHT and SR for gradients, 2-D weights
    fwd = NVFP4BlockScalingRecipeState(r, mode="forward", num_quantizers=6).make_quantizers()
    bwd = NVFP4BlockScalingRecipeState(r, mode="backward", num_quantizers=2).make_quantizers()
    assert all(isinstance(q, te.NVFP4Quantizer) for q in fwd + bwd)
    # slots 1 and 4 are weights (2-D blocks), the others activations; gradients: RHT + SR
    assert [q.with_2d_quantization for q in fwd] == [False, True, False] * 2
    assert all(q.with_rht and q.stochastic_rounding for q in bwd)
    assert not any(q.with_rht or q.stochastic_rounding for q in fwd[1::3])


@pytest.mark.parametrize("scope", ["none", "weights", "activations", "all"])
@pytest.mark.parametrize("use_256", ["none", "weights", "activations", "all"])
def test_4over6_scopes_and_row_scaling(scope, use_256):
    r = _recipe(nvfp4_4over6=scope, nvfp4_4over6_e4m3_use_256=use_256,
                row_scaled_activation=True, nvfp4_4over6_err_mode="MSE")
    r.fp4_quant_fwd_inp = QParams()
    r.fp4_quant_fwd_weight = QParams()
    r.fp4_quant_bwd_grad = QParams()
    roles = [QuantizerRole(module_type="linear", tensor_type=t)
             for t in ("weight", "input", "output")] + [None]
    got = NVFP4BlockScalingRecipeState(r, mode="forward", num_quantizers=4,
                                       roles=roles).make_quantizers()
    kinds = ["weight", "input", "output", "input"]  # None: positional slot 3 -> input
    for q, kind in zip(got, kinds):
        w = kind == "weight"
        four = scope == "all" or (scope == "weights") == w and scope != "none"
        big = four and (use_256 == "all" or use_256 != "none" and (use_256 == "weights") == w)
        assert q.nvfp4_use_4over6 == four and q.nvfp4_e4m3_max == (256 if big else 448)
        assert q.row_scaled_nvfp4 == (not w) and q.nvfp4_4over6_err_mode == "MSE"
    # gradients: never 4over6, never row-scaled
    for q in NVFP4BlockScalingRecipeState(r, mode="backward", num_quantizers=2).make_quantizers():
        assert not q.nvfp4_use_4over6 and not q.row_scaled_nvfp4 and q.nvfp4_e4m3_max == 448


def test_4over6_with_rht_or_sr_is_refused():
    r = NVFP4BlockScaling(nvfp4_4over6="all", disable_stochastic_rounding=True)
    r.fp4_quant_fwd_inp = QParams(random_hadamard_transform=True)
    with pytest.raises(ValueError, match="4over6 quantization does not support RHT"):
        NVFP4BlockScalingRecipeState(r, mode="forward", num_quantizers=1).make_quantizers()
    r.fp4_quant_fwd_inp = QParams(stochastic_rounding=True)
    with pytest.raises(ValueError, match="does not support stochastic rounding"):
        NVFP4BlockScalingRecipeState(r, mode="forward", num_quantizers=1).make_quantizers()


def test_roles_are_checked_and_create_dispatches():
    with pytest.raises(ValueError, match=r"roles: expected None or 2 QuantizerRole"):
        NVFP4BlockScalingRecipeState(_recipe(), mode="forward", num_quantizers=2,
                                     roles=[QuantizerRole()])
    with pytest.raises(ValueError, match="mode: expected 'forward' or 'backward'"):
        NVFP4BlockScalingRecipeState(_recipe(), mode="sideways")
    st = RecipeState.create(_recipe(), mode="backward", num_quantizers=2)
    assert isinstance(st, NVFP4BlockScalingRecipeState) and len(st.make_quantizers()) == 2
