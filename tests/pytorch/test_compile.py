"""torch.compile(fullgraph=True) of each module equals eager: bf16, and under fp8_autocast with each
recipe (outputs, gradients and the delayed-scaling state over two steps)."""

from __future__ import annotations

import copy

import pytest
import torch
from utils import assert_close

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
)
from transformer_engine_lite.pytorch.fp8 import FP8GlobalStateManager

BF16 = torch.bfloat16
MODULES = {
    "Linear": lambda: te.Linear(64, 48, params_dtype=BF16),
    "LayerNorm": lambda: te.LayerNorm(64, params_dtype=BF16),
    "RMSNorm": lambda: te.RMSNorm(64, params_dtype=BF16),
    "LayerNormLinear": lambda: te.LayerNormLinear(64, 48, params_dtype=BF16),
    "LayerNormMLP": lambda: te.LayerNormMLP(64, 96, activation="swiglu", params_dtype=BF16),
}
RECIPES = {
    "delayed": lambda: DelayedScaling(amax_history_len=4),
    "current": Float8CurrentScaling,
    "mxfp8": MXFP8BlockScaling,
}
CASES = [(name, None) for name in MODULES] + [
    ("Linear", "delayed"),
    ("Linear", "current"),
    ("Linear", "mxfp8"),
    ("LayerNormLinear", "delayed"),
    ("LayerNormMLP", "delayed"),
    ("LayerNormMLP", "current"),
    ("LayerNormMLP", "mxfp8"),
]


@pytest.mark.parametrize("module,recipe", CASES, ids=[f"{m}-{r or 'bf16'}" for m, r in CASES])
def test_compiled_equals_eager(module, recipe):
    torch.manual_seed(0)
    torch._dynamo.reset()
    eager = MODULES[module]()
    compiled_mod = copy.deepcopy(eager)
    compiled = torch.compile(compiled_mod, fullgraph=True)
    r = RECIPES[recipe]() if recipe else None
    for step in range(2):
        x = torch.randn(3, 5, 64, dtype=BF16) * (step + 1)
        dy = torch.randn(3, 5, eager(x).shape[-1], dtype=BF16)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        outs = []
        for m, xi in zip((eager, compiled), xs):
            with te.fp8_autocast(enabled=r is not None, fp8_recipe=r):
                y = m(xi)
            y.backward(dy)
            outs.append(y)
        # A compiled backward cannot queue the end-of-backward callback; its update runs at the
        # next autocast entry, or here explicitly.
        FP8GlobalStateManager.reduce_and_update_fp8_tensors(forward=False)
        assert_close(outs[1], outs[0], "compiled", f"step {step} output")
        assert_close(xs[1].grad, xs[0].grad, "compiled", f"step {step} input grad")
        for (n, p1), (_, p2) in zip(eager.named_parameters(), compiled_mod.named_parameters()):
            assert_close(p2.grad, p1.grad, "compiled", f"step {step} grad of {n}")
            p1.grad = p2.grad = None
        if hasattr(eager, "fp8_meta_tensors"):
            for fwd in (True, False):
                for a, b in zip(eager.fp8_meta_tensors(fwd), compiled_mod.fp8_meta_tensors(fwd)):
                    assert torch.equal(a, b), f"step {step}: FP8 state differs"


FP8_PARAM_CASES = [
    ("Linear", "current", "current"),
    ("LayerNormMLP", "delayed", "delayed"),
    ("LayerNormMLP", "current", "current"),
    ("LayerNormMLP", "mxfp8", "mxfp8"),
    ("LayerNormMLP", "current", None),  # FP8 weights, high-precision GEMMs (dequantized)
]


@pytest.mark.parametrize(
    "module,init,recipe",
    FP8_PARAM_CASES,
    ids=[f"{m}-{i}-{r or 'bf16'}" for m, i, r in FP8_PARAM_CASES],
)
def test_compiled_fp8_parameters_equal_eager(module, init, recipe):
    """Modules built under quantized_model_init: their Float8Tensor / MXFP8Tensor parameters are
    traceable wrapper subclasses (__tensor_flatten__), so fullgraph compile runs forward + backward
    on the stored FP8 bytes, with the eager results bit for bit."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    with te.quantized_model_init(recipe=RECIPES[init]()):
        eager = MODULES[module]()
    compiled_mod = copy.deepcopy(eager)
    compiled = torch.compile(compiled_mod, fullgraph=True)
    r = RECIPES[recipe]() if recipe else None
    x = torch.randn(3, 5, 64, dtype=BF16)
    res = []
    for m in (eager, compiled):
        xi = x.clone().requires_grad_(True)
        with te.fp8_autocast(enabled=r is not None, fp8_recipe=r):
            y = m(xi)
        y.backward(torch.ones_like(y))
        res.append((y, xi.grad))
    FP8GlobalStateManager.reduce_and_update_fp8_tensors(forward=False)
    assert_close(res[1][0], res[0][0], "compiled", "output")
    assert_close(res[1][1], res[0][1], "compiled", "input grad")
    for (n, p1), (_, p2) in zip(eager.named_parameters(), compiled_mod.named_parameters()):
        assert type(p1) is type(p2)
        assert_close(p2.grad, p1.grad, "compiled", f"grad of {n}")
