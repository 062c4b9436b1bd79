"""GroupedLinear under backward_override="high_precision" (TE's backward_override suite taught it):
the node saves the whole unquantized input once (None for the other groups' input slots, TE's
layout) and the backward splits it again; gradients equal the per-group Linear backward."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe
from transformer_engine_lite.pytorch.quantized_tensor import restore_from_saved

RECIPES = {"current": recipe.Float8CurrentScaling, "mxfp8": recipe.MXFP8BlockScaling,
           "block": recipe.Float8BlockScaling}


@pytest.mark.parametrize("name", list(RECIPES))
def test_high_precision_saves_whole_input_once(name):
    torch.manual_seed(0)
    splits = [64, 0, 128]
    m = te.GroupedLinear(3, 128, 128, bias=True, params_dtype=torch.bfloat16, device="cpu")
    x = torch.randn(sum(splits), 128, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(sum(splits), 128, dtype=torch.bfloat16)
    rc = RECIPES[name](backward_override="high_precision")
    with te.autocast(enabled=True, recipe=rc):
        y = m(x, splits)
    gf = y.grad_fn
    saved = restore_from_saved(gf.tensor_objects, list(gf.saved_tensors))
    assert torch.equal(saved[0], x.detach()) and saved[1] is None and saved[2] is None
    assert all(isinstance(w, torch.Tensor) for w in saved[3:6])
    y.backward(dy)
    # reference: high precision per group (the override runs both GEMMs on unquantized operands)
    rows = torch.split(x.detach().double(), splits)
    grads = torch.split(dy.double(), splits)
    dx_ref = torch.cat([g @ getattr(m, f"weight{i}").double() for i, g in enumerate(grads)])
    torch.testing.assert_close(x.grad.double(), dx_ref, rtol=1e-2, atol=1e-2)
    for i, (r, g) in enumerate(zip(rows, grads)):
        w_grad = getattr(m, f"weight{i}").grad
        torch.testing.assert_close(w_grad.double(), g.t() @ r, rtol=1e-2, atol=1e-2)


def test_quantized_backward_keeps_per_group_inputs():
    """Without the override the groups save their own (quantized) operands."""
    m = te.GroupedLinear(2, 128, 128, params_dtype=torch.bfloat16, device="cpu")
    x = torch.randn(128, 128, dtype=torch.bfloat16, requires_grad=True)
    with te.autocast(enabled=True, recipe=recipe.Float8CurrentScaling()):
        y = m(x, [64, 64])
    saved = restore_from_saved(y.grad_fn.tensor_objects, list(y.grad_fn.saved_tensors))
    assert saved[0] is not None and saved[1] is not None
    y.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
