"""Recipe backward_override as TE: what the Linear autograd node saves and exposes, and what its
backward computes, checked against independent fp64 references built from the saved operands.

"high_precision": the node saves the unquantized input (even without save_original_input) and
runs dgrad / wgrad on the unquantized operands. "dequantized": the node saves the FP8 input the
forward used (even with save_original_input=True) and the backward runs on its dequantized
values. Both: the output gradient is not quantized (ctx.fp8 False, no grad_output_quantizer).
"""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe
from transformer_engine_lite.pytorch import ops as te_ops
from transformer_engine_lite.pytorch.quantization import get_align_size_for_quantization
from transformer_engine_lite.pytorch.quantized_tensor import (
    Float8SavedOperand,
    prepare_for_saving,
    restore_from_saved,
)
from transformer_engine_lite.pytorch.tensor import Float8CurrentScalingQuantizer, MXFP8Quantizer
from transformer_engine_lite.pytorch.utils import is_non_tn_fp8_gemm_supported


def _run(module, x, rc, save_ctx=True):
    x = x.detach().clone().requires_grad_(True)
    with te.autocast(enabled=True, recipe=rc):
        y = module(x)
    gf = y.grad_fn
    state = None
    if save_ctx:
        state = (gf.backward_override, gf.fp8, gf.grad_output_quantizer,
                 gf.reduce_and_update_bwd_fp8_tensors,
                 restore_from_saved(gf.tensor_objects, list(gf.saved_tensors)))
    return y, x, state


def _ref_grads(x_saved, w_saved, dy):
    """fp64 dgrad / wgrad from the saved operands (rounded once to the activation dtype by the
    GEMM; the reference is rounded the same way, so the comparison tolerates one bf16 ulp)."""
    x64, w64, dy64 = x_saved.double(), w_saved.double(), dy.double()
    return dy64 @ w64, dy64.t() @ x64


@pytest.mark.parametrize("save_original_input", [False, True])
def test_dequantized_saves_fp8_input_and_uses_it(save_original_input):
    torch.manual_seed(0)
    m = te.Linear(64, 32, bias=True, params_dtype=torch.bfloat16, device="cpu",
                  save_original_input=save_original_input)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    dy = torch.randn(32, 32, dtype=torch.bfloat16)
    rc = recipe.Float8CurrentScaling(backward_override="dequantized")
    y, xr, (mode, fp8, q, upd, saved) = _run(m, x, rc)
    assert mode == "dequantized" and not fp8 and q is None and not upd
    # the FP8 input the forward used, as a non-tensor storage with only the row-wise bytes
    assert isinstance(saved[0], Float8SavedOperand) and saved[0]._transpose is None
    ref_in = Float8CurrentScalingQuantizer(torch.float8_e4m3fn)(x).dequantize(dtype=torch.float32)
    assert torch.equal(saved[0].dequantize(dtype=torch.float32), ref_in)
    # the backward dequantizes to the activation dtype (TE's rule), so the reference does too
    xs = saved[0].dequantize(dtype=torch.bfloat16)
    ws = saved[1].dequantize(dtype=torch.bfloat16)
    y.backward(dy)
    dx_ref, dw_ref = _ref_grads(xs, ws, dy)
    torch.testing.assert_close(xr.grad.double(), dx_ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(m.weight.grad.double(), dw_ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(m.bias.grad.float(), dy.float().sum(0), rtol=1e-2, atol=1e-2)


def test_dequantized_ignores_save_original_input_bit_exact():
    torch.manual_seed(1)
    a = te.Linear(64, 32, params_dtype=torch.bfloat16, device="cpu")
    b = te.Linear(64, 32, params_dtype=torch.bfloat16, device="cpu", save_original_input=True)
    b.load_state_dict(a.state_dict())
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    dy = torch.randn(32, 32, dtype=torch.bfloat16)
    rc = recipe.Float8CurrentScaling(backward_override="dequantized")
    grads = []
    for m in (a, b):
        y, xr, _ = _run(m, x, rc, save_ctx=False)
        y.backward(dy)
        grads.append((xr.grad, m.weight.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("rc_cls", [recipe.Float8CurrentScaling, recipe.MXFP8BlockScaling])
def test_high_precision_saves_original_input(rc_cls):
    torch.manual_seed(2)
    m = te.Linear(64, 32, bias=False, params_dtype=torch.float32, device="cpu")
    x = torch.randn(32, 64)
    dy = torch.randn(32, 32)
    y, xr, (mode, fp8, q, upd, saved) = _run(m, x, rc_cls(backward_override="high_precision"))
    assert mode == "high_precision" and not fp8 and q is None and not upd
    assert type(saved[0]) is torch.Tensor and torch.equal(saved[0], x)
    y.backward(dy)
    # the unquantized weight and input: fp32 GEMMs vs fp64
    dx_ref, dw_ref = _ref_grads(x, m.weight.detach(), dy)
    torch.testing.assert_close(xr.grad.double(), dx_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.weight.grad.double(), dw_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rc", [recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling()])
def test_quantized_backward_exposes_grad_quantizer(rc):
    m = te.Linear(64, 32, device="cpu")
    _, _, (mode, fp8, q, upd, _) = _run(m, torch.randn(32, 64), rc)
    assert mode is None and fp8 and upd
    assert isinstance(q, MXFP8Quantizer if rc.mxfp8() else Float8CurrentScalingQuantizer)


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_quantize_op_keeps_gradient_unquantized_under_override(override):
    torch.manual_seed(3)
    x = torch.randn(32, 64)
    dy = torch.randn(32, 64)
    grads = {}
    for ov in (None, override):
        xr = x.clone().requires_grad_(True)
        with te.autocast(enabled=True, recipe=recipe.Float8CurrentScaling(backward_override=ov)):
            y = te_ops.Sequential(te_ops.Quantize(forward=True, backward=True))(xr)
        y.backward(dy)
        grads[ov] = xr.grad
    assert torch.equal(grads[override], dy)  # passed through untouched
    assert not torch.equal(grads[None], dy)  # the default quantizes it (E5M2 for HYBRID; E4M3 here)


def test_restore_from_saved_round_trip_and_errors():
    q = Float8CurrentScalingQuantizer(torch.float8_e4m3fn)
    t = q(torch.randn(8, 16))
    plain = torch.randn(3)
    flat, objs = prepare_for_saving(t, None, plain)
    assert len(flat) == 4 and objs[1] is None and objs[2] is None
    out, rest = restore_from_saved(objs, flat, return_saved_tensors=True)
    assert rest == [] and out[1] is None and out[2] is plain
    assert torch.equal(out[0].dequantize(), t.dequantize())
    with pytest.raises(ValueError, match="more tensor_objects"):
        restore_from_saved([None, None], [plain])
    with pytest.raises(ValueError, match="needs 2 tensors"):
        restore_from_saved(objs[:1], flat[:1])
    with pytest.raises(TypeError, match="expected lists"):
        restore_from_saved(objs, tuple(flat).__iter__())


def test_align_size_and_gemm_layouts():
    assert get_align_size_for_quantization(recipe.MXFP8BlockScaling()) == 32
    assert get_align_size_for_quantization(recipe.Float8CurrentScaling()) == 16
    assert get_align_size_for_quantization(recipe.DelayedScaling()) == 16
    with pytest.raises(TypeError, match="expected a Recipe"):
        get_align_size_for_quantization("mxfp8")
    assert is_non_tn_fp8_gemm_supported() is True


@pytest.mark.parametrize("override", [None, "high_precision", "dequantized"])
def test_grouped_linear_one_node_state_and_grads(override):
    """GroupedLinear is one autograd node: TE's saved-operand order (inputs, then weights), its
    backward state, and per-group gradients equal to per-group Linear modules (same GEMMs)."""
    torch.manual_seed(4)
    splits = [32, 0, 64]
    g = te.GroupedLinear(3, 64, 32, params_dtype=torch.bfloat16, device="cpu")
    lins = [te.Linear(64, 32, params_dtype=torch.bfloat16, device="cpu") for _ in splits]
    for i, lin in enumerate(lins):
        lin.weight.data.copy_(getattr(g, f"weight{i}").data)
        lin.bias.data.copy_(torch.randn(32))
        getattr(g, f"bias{i}").data.copy_(lin.bias.data)
    x = torch.randn(sum(splits), 64, dtype=torch.bfloat16)
    dy = torch.randn(sum(splits), 32, dtype=torch.bfloat16)
    rc = recipe.Float8CurrentScaling(backward_override=override)
    xr = x.clone().requires_grad_(True)
    with te.autocast(enabled=True, recipe=rc):
        y = g(xr, splits)
    gf = y.grad_fn
    assert type(gf).__name__ == "_GroupedLinearBackward"
    assert gf.backward_override == override and gf.fp8 == (override is None)
    saved = restore_from_saved(gf.tensor_objects, list(gf.saved_tensors))
    assert len(saved) == 6  # 3 inputs, then 3 weights
    if override == "high_precision":
        # TE's layout: the whole unquantized input once, None in the other groups' slots
        assert type(saved[0]) is torch.Tensor and torch.equal(saved[0], x)
        assert saved[1] is None and saved[2] is None
    if override == "dequantized":
        assert all(isinstance(s, Float8SavedOperand) for s in saved)
    assert tuple(saved[3].shape) == (32, 64)
    y.backward(dy)
    dx_parts = []
    for i, (lin, part, dpart) in enumerate(zip(lins, x.split(splits), dy.split(splits))):
        if part.shape[0] == 0:
            dx_parts.append(torch.zeros_like(part))
            continue
        pr = part.clone().requires_grad_(True)
        with te.autocast(enabled=True, recipe=rc):
            yl = lin(pr)
        yl.backward(dpart)
        assert torch.equal(yl, y.detach()[sum(splits[:i]):sum(splits[:i + 1])])
        assert torch.equal(getattr(g, f"weight{i}").grad, lin.weight.grad)
        assert torch.equal(getattr(g, f"bias{i}").grad, lin.bias.grad)
        dx_parts.append(pr.grad)
    assert torch.equal(xr.grad, torch.cat(dx_parts))
    assert torch.equal(g.weight1.grad, torch.zeros_like(g.weight1))  # the empty group


def test_grouped_tensor_path_predicate_and_flag():
    from transformer_engine_lite.pytorch.module.grouped_linear import (
        is_module_grouped_tensor_path_supported,
    )

    for rc in (None, recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling()):
        assert is_module_grouped_tensor_path_supported(rc, torch.bfloat16) is False
    with pytest.raises(TypeError, match="dtype"):
        is_module_grouped_tensor_path_supported(None, "bf16")
    with pytest.raises(TypeError, match="use_grouped_tensor"):
        te.GroupedLinear(2, 16, 16, device="cpu", use_grouped_tensor="yes")
    m = te.GroupedLinear(2, 16, 16, device="cpu", use_grouped_tensor=True)
    assert m.use_grouped_tensor is True
    y = m(torch.randn(8, 16), [3, 5])  # the split path (TE's fallback)
    assert y.shape == (8, 16)


def test_mxfp8_dequantized_saves_rowwise_blocks():
    """MXFP8 "dequantized": the node saves the row-wise MXFP8 bytes and block scales the forward
    used (no column-wise copy), and the backward's GEMMs run on their bf16 values."""
    from transformer_engine_lite.pytorch.quantized_tensor import MXFP8SavedOperand

    torch.manual_seed(5)
    m = te.Linear(64, 32, bias=False, params_dtype=torch.bfloat16, device="cpu",
                  save_original_input=True)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    dy = torch.randn(32, 32, dtype=torch.bfloat16)
    y, xr, (mode, fp8, q, _, saved) = _run(m, x, recipe.MXFP8BlockScaling(
        backward_override="dequantized"))
    assert mode == "dequantized" and not fp8 and q is None
    assert all(isinstance(s, MXFP8SavedOperand) and s._columnwise_data is None for s in saved)
    ref = MXFP8Quantizer(torch.float8_e4m3fn, columnwise=False)
    assert torch.equal(saved[0].dequantize(dtype=torch.float32),
                       ref(x).dequantize(dtype=torch.float32))
    xs, ws = saved[0].dequantize(dtype=torch.bfloat16), saved[1].dequantize(dtype=torch.bfloat16)
    y.backward(dy)
    dx_ref, dw_ref = _ref_grads(xs, ws, dy)
    torch.testing.assert_close(xr.grad.double(), dx_ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(m.weight.grad.double(), dw_ref, rtol=1e-2, atol=1e-2)
