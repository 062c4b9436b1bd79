"""TE's recipe-state API (issue #28, from TE's test_recipe.py): module.fp8_meta / quantizers as
live views of the module's delayed-scaling buffers, the unfused and batched update functions
against an fp64 reference, TE's "no roll for a slot that saw no amax" rule, NVFP4BlockScaling as a
recipe object, and what a forward does when the recipe changes."""

from __future__ import annotations

import warnings

import pytest
import torch

import transformer_engine_lite.pytorch as te
import transformer_engine_lite.pytorch.tex as tex
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    QParams,
)
from transformer_engine_lite.pytorch.quantization import (
    DelayedScalingRecipeState,
    FP8GlobalStateManager,
    _amax_and_scale_update,
    _default_sf_compute,
)

FP32_MAX = torch.finfo(torch.float32).max


def _ref_scale(amax: float, prev: float, fp8_max: float, margin: float) -> float:
    """fp64 reference of TE's scale rule, rounded to fp32 once at the end."""
    if not (amax > 0.0) or amax == float("inf"):
        return prev
    s = (fp8_max / amax) / 2.0**margin
    return min(s, FP32_MAX) if s != float("inf") else FP32_MAX


def _ref_update(hist: torch.Tensor, scale: torch.Tensor, fp8_max: float, margin: float, algo):
    h = hist.double()
    amax = h.amax(0) if algo == "max" else h[0]
    new_h = torch.roll(h, -1, 0)
    new_h[0] = 0
    new_s = torch.tensor([_ref_scale(a, p, fp8_max, margin)
                          for a, p in zip(amax.tolist(), scale.double().tolist())])
    return new_h.float(), new_s.float()


# ----------------------------------------------------------------------------- update functions
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("fmt,fwd", [(Format.HYBRID, True), (Format.HYBRID, False),
                                     (Format.E4M3FNUZ, True)])
def test_amax_and_scale_update_matches_fp64(algo, fmt, fwd):
    g = torch.Generator().manual_seed(7)
    hist = torch.rand(13, 5, generator=g) * 3
    hist[:, 3] = 0  # a slot that never saw an amax keeps its scale
    scale = torch.rand(5, generator=g) + 0.5
    recipe = DelayedScaling(margin=1, fp8_format=fmt, amax_history_len=13, amax_compute_algo=algo)
    fp8_max = fmt.max(fwd)
    ref_h, ref_s = _ref_update(hist, scale, fp8_max, 1, algo)
    _amax_and_scale_update(hist, scale, fp8_max, recipe)  # in place
    torch.testing.assert_close(hist, ref_h, rtol=0, atol=0)
    # fp32 division vs fp64 rounded once: within one fp32 ulp
    torch.testing.assert_close(scale, ref_s, rtol=2**-23, atol=0)


def test_amax_and_scale_update_callables():
    hist = torch.tensor([[1.0, 2.0], [4.0, 0.5], [2.0, 8.0]])
    scale = torch.ones(2)
    seen = {}

    def sf(amax, scale, fp8_max, recipe):
        seen["args"] = (amax.clone(), fp8_max, recipe.margin)
        return torch.full_like(scale, 3.0)

    recipe = DelayedScaling(margin=2, amax_compute_algo=lambda h: h.sum(0),
                            scaling_factor_compute_algo=sf)
    _amax_and_scale_update(hist, scale, 448.0, recipe)
    # amax from the history before the roll; then roll by -1 with row 0 zeroed
    torch.testing.assert_close(seen["args"][0], torch.tensor([7.0, 10.5]))
    assert seen["args"][1:] == (448.0, 2)
    torch.testing.assert_close(hist, torch.tensor([[0.0, 0.0], [2.0, 8.0], [1.0, 2.0]]))
    torch.testing.assert_close(scale, torch.full((2,), 3.0))
    with pytest.raises(TypeError, match="expected DelayedScaling"):
        _amax_and_scale_update(hist, scale, 448.0, Float8CurrentScaling())


@pytest.mark.parametrize(
    "amax,expected",
    [(0.0, 0.75), (float("inf"), 0.75), (float("nan"), 0.75), (448.0 / FP32_MAX / 2, FP32_MAX),
     (3.5, 448.0 / 3.5 / 2)],
    ids=["zero", "inf", "nan", "tiny", "normal"],
)
def test_default_sf_compute(amax, expected):
    scale = torch.tensor([0.75])
    out = _default_sf_compute(torch.tensor([amax]), scale, 448.0, 1)
    assert out is scale  # written in place, as TE's
    torch.testing.assert_close(scale, torch.tensor([expected], dtype=torch.float32))


def test_fused_update_after_reduction():
    h1 = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    h2 = torch.tensor([[5.0], [1.0], [1.0]])
    s1, s2 = torch.ones(2), torch.ones(1)
    # slot 0 reduced to 4; slot 1 reduced to nothing and saw nothing: untouched; h2 keeps its own 5
    buf = torch.tensor([4.0, 0.0, 0.0])
    tex.fused_amax_and_scale_update_after_reduction(buf, [h1, h2], [s1, s2], "max",
                                                    tex.DType.kFloat8E4M3, 0)
    torch.testing.assert_close(h1, torch.tensor([[0.0, 0.0], [2.0, 1.0], [4.0, 2.0]]))
    torch.testing.assert_close(s1, torch.tensor([448.0 / 4.0, 1.0]))
    torch.testing.assert_close(h2, torch.tensor([[0.0], [1.0], [5.0]]))
    torch.testing.assert_close(s2, torch.tensor([448.0 / 5.0]))
    with pytest.raises(ValueError, match="expected 3 amaxes"):
        tex.fused_amax_and_scale_update_after_reduction(torch.zeros(2), [h1, h2], [s1, s2],
                                                        "max", tex.DType.kFloat8E4M3, 0)
    with pytest.raises(ValueError, match="amax_compute_algo"):
        tex.fused_amax_and_scale_update_after_reduction(buf, [h1, h2], [s1, s2], "mean",
                                                        tex.DType.kFloat8E4M3, 0)


# ----------------------------------------------------------------------------- module fp8_meta
def _step(m, recipe, x, **kw):
    with te.autocast(recipe=recipe):
        y = m(x, **kw)
    y.backward(torch.ones_like(y))


def test_fp8_meta_is_a_live_view():
    recipe = DelayedScaling(amax_history_len=5, margin=0)
    m = te.Linear(16, 16)
    assert m.fp8_meta["recipe"] is None and "scaling_fwd" not in m.fp8_meta
    assert m.quantizers == {"scaling_fwd": [], "scaling_bwd": []}
    x = torch.randn(8, 16)
    _step(m, recipe, x)
    meta = m.fp8_meta
    assert meta["recipe"] is recipe and meta["fp8_max_fwd"] == 448.0
    assert meta["fp8_max_bwd"] == 57344.0
    key = FP8GlobalStateManager.get_meta_tensor_key(forward=True)
    st = meta[key]
    assert isinstance(st, DelayedScalingRecipeState)
    assert st.amax_history.shape == (5, 3) and st.scale.shape == (3,)
    assert st.amax_history.data_ptr() == m.fp8_meta_tensors(True)[0].data_ptr()
    # writes through the view are what the next forward quantizes with: scale 2^-4 on the input
    st.scale[0] = 2.0**-4
    qs = m.quantizers["scaling_fwd"]
    assert len(qs) == 3 and float(qs[0].scale) == 2.0**-4
    hist_before = st.amax_history.clone()
    _step(m, recipe, x)
    # the update ran in place on the same tensor: the input slot rolled, the output slot (never
    # quantized: amax 0) kept its history and scale (TE's rule)
    cur = x.abs().max().reshape(1)
    torch.testing.assert_close(st.amax_history[:, 0],
                               torch.cat([torch.zeros(1), hist_before[2:, 0], cur]))
    torch.testing.assert_close(st.amax_history[:, 2], hist_before[:, 2])
    assert float(st.scale[2]) == 1.0


def test_cached_weight_slot_is_not_rolled():
    """is_first_microbatch=False reuses the weight cast: no new weight amax, so the weight slot
    keeps its history and scale, while the input slot rolls (TE's test_recipe expectation)."""
    recipe = DelayedScaling(amax_history_len=4)
    m = te.Linear(16, 16)
    x = torch.randn(8, 16)
    _step(m, recipe, x, is_first_microbatch=True)
    hist, scale, _ = m.fp8_meta_tensors(True)
    h0, s0 = hist.clone(), scale.clone()
    _step(m, recipe, x, is_first_microbatch=False)
    torch.testing.assert_close(hist[:, 1], h0[:, 1])
    torch.testing.assert_close(scale[1], s0[1])
    assert not torch.equal(hist[:, 0], h0[:, 0])


def test_history_length_of_module_built_inside_autocast():
    with te.autocast(recipe=DelayedScaling(amax_history_len=31)):
        m = te.Linear(16, 16)
    assert m.fp8_meta_tensors(True)[0].shape[0] == 31
    assert te.Linear(16, 16).fp8_meta_tensors(True)[0].shape[0] == 1024


# ----------------------------------------------------------------------------- recipe changes
def test_recipe_type_change_warns_once():
    m = te.Linear(32, 32)
    x = torch.randn(32, 32)
    _step(m, DelayedScaling(), x)
    with pytest.warns(UserWarning, match="Recipe type changed from DelayedScaling to "
                                         "MXFP8BlockScaling"):
        _step(m, MXFP8BlockScaling(), x)
    assert all(type(q).__name__ == "MXFP8Quantizer" for q in m.quantizers["scaling_fwd"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(m, MXFP8BlockScaling(), x)


def test_fp8_weights_under_another_recipe_type_raise():
    with te.quantized_model_init(recipe=MXFP8BlockScaling()):
        m = te.Linear(32, 32)
    x = torch.randn(32, 32)
    with pytest.raises(RuntimeError, match="Recipe mismatch for 'weight': tensor supports recipe "
                                           "MXFP8BlockScaling, but got DelayedScaling"):
        with te.autocast(recipe=DelayedScaling()):
            m(x)
    m(x)  # outside an FP8 autocast the weight is dequantized, as before


def test_fp8_weight_quantizer_follows_a_changed_recipe():
    with te.quantized_model_init(recipe=DelayedScaling(margin=0)):
        m = te.Linear(32, 32)
    x = torch.randn(32, 32)
    _step(m, DelayedScaling(margin=0), x)
    old = m.weight._quantizer
    assert old.update_margin == 0.0
    with pytest.warns(UserWarning, match="Quantizer is being updated"):
        _step(m, DelayedScaling(margin=3), x)
    new = m.weight._quantizer
    assert new is not old and new.update_margin == 3.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(m, DelayedScaling(margin=3), x)  # the same recipe again: nothing to update


# ----------------------------------------------------------------------------- NVFP4 recipe object
def test_nvfp4_recipe_object(monkeypatch):
    r = NVFP4BlockScaling()
    assert r.nvfp4() and not r.delayed() and r.fp4_format is Format.E2M1
    assert (r.nvfp4_4over6, r.nvfp4_4over6_e4m3_use_256, r.nvfp4_4over6_err_mode) == (
        "none", "all", "MAE")
    assert r.fp4_quant_fwd_inp == QParams(random_hadamard_transform=True)
    assert r.fp4_quant_fwd_weight == QParams(fp4_2d_quantization=True)
    assert r.fp4_quant_bwd_grad == QParams(random_hadamard_transform=True,
                                           stochastic_rounding=True)
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_RHT", "1")
    monkeypatch.setenv("NVTE_NVFP4_4OVER6", "weights")
    monkeypatch.setenv("NVTE_NVFP4_4OVER6_ERR_MODE", "mse")
    r = NVFP4BlockScaling()
    assert r.disable_rht and r.nvfp4_4over6 == "weights" and r.nvfp4_4over6_err_mode == "MSE"
    assert not r.fp4_quant_fwd_inp.random_hadamard_transform
    for kw, match in (({"nvfp4_4over6": "some"}, "nvfp4_4over6: expected one of"),
                      ({"nvfp4_4over6_err_mode": "L1"}, "nvfp4_4over6_err_mode"),
                      ({"fp8_format": Format.HYBRID}, "fp8_format: expected Format.E4M3"),
                      ({"backward_override": "fp8"}, "backward_override")):
        with pytest.raises(ValueError, match=match):
            NVFP4BlockScaling(**kw)
    with pytest.raises(TypeError, match="disable_2d_quantization: expected a bool"):
        NVFP4BlockScaling(disable_2d_quantization=1)
    with te.autocast(recipe=NVFP4BlockScaling()):  # the env's 4over6 "weights" scope runs
        y = te.Linear(64, 32, params_dtype=torch.bfloat16)(torch.randn(16, 64, dtype=torch.bfloat16))
    assert torch.isfinite(y.float()).all()


def test_fp4_settings_refused_by_fp8_recipes():
    with pytest.raises(ValueError, match="Format.E2M1 is an FP4 format"):
        DelayedScaling(fp8_format=Format.E2M1)
    with pytest.raises(ValueError, match="fp8_quant_fwd_inp.stochastic_rounding: an NVFP4 option"):
        Float8CurrentScaling(fp8_quant_fwd_inp=QParams(stochastic_rounding=True))


def test_fp8_meta_and_quantizers_under_custom_recipe():
    from transformer_engine_lite.common.recipe import CustomRecipe
    from transformer_engine_lite.pytorch.custom_recipes.quantizer_factories import (
        current_scaling_factory,
    )
    from transformer_engine_lite.pytorch.quantization import CustomRecipeState

    m = te.Linear(32, 32, name="proj")
    _step(m, CustomRecipe(qfactory=current_scaling_factory), torch.randn(16, 32))
    st = m.fp8_meta["scaling_fwd"]
    assert isinstance(st, CustomRecipeState)
    assert [r.tensor_type if r is not None else None for r in st.roles] == [
        "input", "weight", None]
    assert st.roles[0].name == "proj"
    # the quantizers the GEMMs ran with (module/_custom.py), not rebuilt ones
    assert m.quantizers is m.__dict__["quantizers"]
    with pytest.warns(UserWarning, match="Recipe type changed from CustomRecipe to DelayedScaling"):
        _step(m, DelayedScaling(), torch.randn(16, 32))  # back to delayed: buffer views again
    assert m.quantizers["scaling_fwd"][0].scale.data_ptr() == m.fp8_fwd_scale.data_ptr()
