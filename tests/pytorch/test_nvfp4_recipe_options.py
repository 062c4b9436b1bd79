"""NVFP4BlockScaling's TE 2.12+ options in modules (TE's backward_override and nvfp4 module suites
use them): row_scaled_activation (one amax per activation row) and the nvfp4_4over6 scopes (4over6
block scale selection, E4M3 bound 256 where nvfp4_4over6_e4m3_use_256 selects, MAE / MSE), by TE's
per-role rules. Each is checked against NVFP4Quantizer's own bytes (the oracle of the quantizer
suites) and an fp64 GEMM, and shown to change the result (no ignored flag)."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import NVFP4BlockScaling
from transformer_engine_lite.pytorch.quantized_tensor import NVFP4SavedOperand, restore_from_saved
from transformer_engine_lite.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

from utils import assert_close


def _decode(t: torch.Tensor, **opts) -> torch.Tensor:
    """The row-wise NVFP4 copy NVFP4Quantizer makes of t, decoded to fp32."""
    return NVFP4Quantizer(rowwise=True, columnwise=False, **opts)(t.detach()).dequantize(
        dtype=torch.float32)


def _run(m, x, recipe):
    with te.autocast(enabled=True, recipe=recipe):
        return m(x)


@pytest.fixture
def linear():
    torch.manual_seed(0)
    m = te.Linear(128, 64, bias=False, params_dtype=torch.bfloat16)
    x = (torch.randn(32, 128) * torch.logspace(-2, 1, 32).unsqueeze(1)).bfloat16().requires_grad_()
    return m, x


CASES = {
    # recipe kwargs -> (input options, weight options)
    "row_scaled": (dict(row_scaled_activation=True), dict(row_scaled_nvfp4=True), {}),
    "4over6_weights": (dict(nvfp4_4over6="weights"), {},
                       dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=256)),
    "4over6_weights_448_mse": (
        dict(nvfp4_4over6="weights", nvfp4_4over6_e4m3_use_256="none",
             nvfp4_4over6_err_mode="MSE"),
        {}, dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=448, nvfp4_4over6_err_mode="MSE")),
    "4over6_all_no_rht": (
        dict(nvfp4_4over6="all", disable_rht=True),
        dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=256),
        dict(nvfp4_use_4over6=True, nvfp4_e4m3_max=256)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_uses_the_option(case, linear):
    m, x = linear
    kw, x_opts, w_opts = CASES[case]
    y = _run(m, x, NVFP4BlockScaling(**kw))
    ref = _decode(x, **x_opts).double() @ _decode(m.weight, with_2d_quantization=True,
                                                  **w_opts).double().t()
    assert_close(y, ref, torch.bfloat16, case)
    plain = _run(m, x, NVFP4BlockScaling(**{k: v for k, v in kw.items() if k == "disable_rht"}))
    assert not torch.equal(y, plain), f"{case}: the option changed nothing"
    y.float().square().sum().backward()
    assert torch.isfinite(x.grad.float()).all() and torch.isfinite(m.weight.grad.float()).all()


@pytest.mark.parametrize("scope", ["activations", "all"])
def test_4over6_with_rht_is_refused_as_te(scope, linear):
    m, x = linear
    with pytest.raises(ValueError, match="4over6 quantization does not support RHT"):
        _run(m, x, NVFP4BlockScaling(nvfp4_4over6=scope))


def test_row_scaled_dequantized_override_saves_per_row_amaxes(linear):
    m, x = linear
    y = _run(m, x, NVFP4BlockScaling(row_scaled_activation=True, backward_override="dequantized"))
    xs, _ = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))
    assert isinstance(xs, NVFP4SavedOperand) and xs._amax_rowwise.numel() == x.shape[0]
    assert torch.equal(xs.dequantize(dtype=torch.float32), _decode(x, row_scaled_nvfp4=True))
    y.float().sum().backward()


@pytest.mark.parametrize("kind", ["layernorm_linear", "layernorm_mlp", "ops_linear"])
def test_every_module_trains(kind):
    torch.manual_seed(2)
    m = {
        "layernorm_linear": lambda: te.LayerNormLinear(64, 48, params_dtype=torch.bfloat16),
        "layernorm_mlp": lambda: te.LayerNormMLP(64, 128, params_dtype=torch.bfloat16),
        "ops_linear": lambda: te.ops.Sequential(te.ops.BasicLinear(64, 48, dtype=torch.bfloat16)),
    }[kind]()
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    for kw in (dict(row_scaled_activation=True), dict(nvfp4_4over6="weights")):
        y = _run(m, x, NVFP4BlockScaling(**kw))
        y.float().square().sum().backward()
        assert torch.isfinite(x.grad.float()).all()
