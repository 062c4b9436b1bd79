"""NVFP4BlockScaling with backward_override="dequantized" (TE's backward_override suites found it
failing: the saved row-wise copy went through the FP8 block cast): the Linear node saves the
row-wise NVFP4 bytes, E4M3 block scales and amax the forward used (1x16 blocks for the input, 16x16
for the weight), and the backward runs on their decode. Checked against NVFP4Quantizer's own
row-wise copy and GEMMs of the decoded values; "high_precision" saves the original operands."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe
from transformer_engine_lite.pytorch.quantized_tensor import NVFP4SavedOperand, restore_from_saved
from transformer_engine_lite.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

from utils import assert_close


def _decode(t: torch.Tensor, two_d: bool) -> torch.Tensor:
    """Independent path: NVFP4Quantizer's row-wise copy, dequantized to fp32."""
    q = NVFP4Quantizer(rowwise=True, columnwise=False, with_2d_quantization=two_d)(t.detach())
    return q.dequantize(dtype=torch.float32)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp64 product of the bf16-rounded operands (the backward GEMMs' inputs): the reference."""
    return a.to(torch.bfloat16).double() @ b.to(torch.bfloat16).double()


@pytest.mark.parametrize("bias", [False, True])
def test_saves_nvfp4_rowwise_and_backward_uses_it(bias):
    torch.manual_seed(0)
    m = te.Linear(128, 64, bias=bias, params_dtype=torch.bfloat16, device="cpu")
    x = torch.randn(32, 128, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(32, 64, dtype=torch.bfloat16)
    with te.autocast(enabled=True, recipe=recipe.NVFP4BlockScaling(backward_override="dequantized")):
        y = m(x)
    gf = y.grad_fn
    xs, ws = restore_from_saved(gf.tensor_objects, list(gf.saved_tensors))
    xd, wd = _decode(x, False), _decode(m.weight, True)
    for saved, ref in ((xs, xd), (ws, wd)):
        assert isinstance(saved, NVFP4SavedOperand)
        assert saved._rowwise_data.dtype == torch.uint8
        assert torch.equal(saved.dequantize(dtype=torch.float32), ref)
    y_ref = xd.double() @ wd.double().t()
    if bias:
        y_ref = y_ref + m.bias.detach().double()
    assert_close(y, y_ref, torch.bfloat16, "y")
    y.backward(dy)
    assert_close(x.grad, _mm(dy, wd), torch.bfloat16, "dgrad")
    assert_close(m.weight.grad, _mm(dy.t(), xd), torch.bfloat16, "wgrad")


@pytest.mark.parametrize("override", ["dequantized", "high_precision"])
@pytest.mark.parametrize("kind", ["linear", "layernorm_linear", "layernorm_mlp", "ops_linear"])
def test_every_module_trains(kind, override):
    torch.manual_seed(1)
    make = {
        "linear": lambda: te.Linear(64, 48, params_dtype=torch.bfloat16),
        "layernorm_linear": lambda: te.LayerNormLinear(64, 48, params_dtype=torch.bfloat16),
        "layernorm_mlp": lambda: te.LayerNormMLP(64, 128, params_dtype=torch.bfloat16),
        "ops_linear": lambda: te.ops.Sequential(te.ops.BasicLinear(64, 48, dtype=torch.bfloat16)),
    }[kind]
    m = make()
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    with te.autocast(enabled=True, recipe=recipe.NVFP4BlockScaling(backward_override=override)):
        y = m(x)
    y.float().square().sum().backward()
    assert torch.isfinite(x.grad.float()).all() and x.grad.abs().sum() > 0
    for p in m.parameters():
        assert p.grad is not None and torch.isfinite(p.grad.float()).all()
