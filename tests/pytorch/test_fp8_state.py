"""FP8 state machine per ARCHITECTURE.md §5: amax recording, history roll, scale update (forward at
the outermost autocast exit, backward at the end of backward), modules that did not run, nesting,
recipes without state, availability and recipe validation."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
    QParams,
)
from transformer_engine_lite.pytorch.fp8 import FP8GlobalStateManager

F32_MAX = torch.finfo(torch.float32).max


class RefState:
    """TE's delayed-scaling update in plain torch (one column set = one module's slots)."""

    def __init__(self, length: int, n: int, recipe: DelayedScaling, fp8_max: float) -> None:
        self.hist = torch.zeros(length, n)
        self.scale = torch.ones(n)
        self.recipe, self.fp8_max = recipe, fp8_max

    def step(self, amaxes: torch.Tensor) -> None:
        self.hist[0] = amaxes
        amax = self.hist.max(0).values if self.recipe.amax_compute_algo == "max" else self.hist[0]
        s = (torch.tensor(self.fp8_max) / amax) / (2.0**self.recipe.margin)
        s = torch.where(torch.isfinite(amax) & (amax > 0), s, self.scale)
        self.scale = torch.where(torch.isinf(s), torch.tensor(F32_MAX), s)
        self.hist = torch.roll(self.hist, -1, 0)
        self.hist[0] = 0


@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("margin", [0, 2])
def test_delayed_scaling_updates(algo, margin):
    recipe = DelayedScaling(margin=margin, amax_history_len=3, amax_compute_algo=algo)
    torch.manual_seed(0)
    m = te.Linear(32, 16)
    fwd = RefState(3, 3, recipe, 448.0)
    bwd = RefState(3, 2, recipe, 57344.0)
    for step, mult in enumerate([1.0, 4.0, 0.5, 2.0, 0.25]):
        x = torch.randn(8, 32) * mult
        dy = torch.randn(8, 16) / mult
        scale_before = m.fp8_fwd_scale.clone()
        with te.fp8_autocast(fp8_recipe=recipe):
            y = m(x)
            # Inside the block: amaxes recorded in row 0, scales not yet updated.
            assert m.fp8_fwd_amax_history[0, 0] == x.abs().max()
            assert torch.equal(m.fp8_fwd_scale, scale_before)
        fwd.step(torch.tensor([x.abs().max(), m.weight.detach().abs().max(), 0.0]))
        assert torch.equal(m.fp8_fwd_amax_history, fwd.hist), f"step {step} fwd history"
        assert torch.equal(m.fp8_fwd_scale, fwd.scale), f"step {step} fwd scale"
        y.backward(dy)  # eager backward: updated when the backward pass ends
        bwd.step(torch.tensor([dy.abs().max(), 0.0]))
        assert torch.equal(m.fp8_bwd_amax_history, bwd.hist), f"step {step} bwd history"
        assert torch.equal(m.fp8_bwd_scale, bwd.scale), f"step {step} bwd scale"


def test_module_not_run_keeps_history():
    recipe = DelayedScaling(amax_history_len=4)
    a, b = te.Linear(8, 8), te.Linear(8, 8)
    x = torch.randn(4, 8)
    with te.fp8_autocast(fp8_recipe=recipe):
        a(x).sum().backward()
        b(x).sum().backward()
    snap = [t.clone() for t in (*b.fp8_meta_tensors(True)[:2], *b.fp8_meta_tensors(False)[:2])]
    with te.fp8_autocast(fp8_recipe=recipe):
        a(x * 3).sum().backward()
    after = (*b.fp8_meta_tensors(True)[:2], *b.fp8_meta_tensors(False)[:2])
    for s, t in zip(snap, after):
        assert torch.equal(s, t), "a module that did not run had its FP8 state changed"
    assert a.fp8_fwd_amax_history[-1, 0] == 3 * x.abs().max()


def test_forward_only_does_not_roll_backward_history():
    m = te.Linear(8, 8)
    recipe = DelayedScaling(amax_history_len=2)
    with torch.no_grad(), te.fp8_autocast(fp8_recipe=recipe):
        m(torch.randn(2, 8))
    with te.fp8_autocast(fp8_recipe=recipe):
        pass
    assert torch.all(m.fp8_bwd_amax_history == 0) and torch.all(m.fp8_bwd_scale == 1)
    assert m.fp8_fwd_amax_history[-1, 0] > 0


def test_nesting_restores_state_and_updates_at_outermost_exit():
    outer, inner = DelayedScaling(amax_history_len=2), DelayedScaling(amax_history_len=2, margin=1)
    a, b = te.Linear(8, 8), te.Linear(8, 8)
    x = torch.randn(4, 8)
    assert not FP8GlobalStateManager.is_fp8_enabled()
    with te.fp8_autocast(fp8_recipe=outer):
        with te.fp8_autocast(fp8_recipe=inner):
            assert FP8GlobalStateManager.get_fp8_recipe() is inner
            b(x)
        assert FP8GlobalStateManager.get_fp8_recipe() is outer
        with te.fp8_autocast(enabled=False):
            assert not FP8GlobalStateManager.is_fp8_enabled()
        assert FP8GlobalStateManager.is_fp8_enabled()
        a(x)
        assert torch.all(b.fp8_fwd_scale == 1), "updated before the outermost exit"
    assert not FP8GlobalStateManager.is_fp8_enabled()
    amax = x.abs().max()
    # Each module updated with the recipe it ran under (inner: margin 1).
    assert a.fp8_fwd_scale[0] == torch.tensor(448.0) / amax
    assert b.fp8_fwd_scale[0] == (torch.tensor(448.0) / amax) / 2.0


def test_exception_in_block_restores_state():
    with pytest.raises(RuntimeError, match="boom"), te.fp8_autocast(fp8_recipe=DelayedScaling()):
        raise RuntimeError("boom")
    assert not FP8GlobalStateManager.is_fp8_enabled()
    with te.autocast(recipe=Float8CurrentScaling()):
        assert FP8GlobalStateManager.get_fp8_recipe().float8_current_scaling()


@pytest.mark.parametrize("recipe", [Float8CurrentScaling(), MXFP8BlockScaling()], ids=str)
def test_stateless_recipes_leave_meta_untouched(recipe):
    m = te.LayerNormMLP(16, 32)
    x = torch.randn(3, 16, requires_grad=True)
    with te.fp8_autocast(fp8_recipe=recipe):
        m(x).sum().backward()
    for t in (*m.fp8_meta_tensors(True), *m.fp8_meta_tensors(False)):
        assert torch.all(t == (1 if t.dtype == torch.float32 and t.dim() == 1 else 0))


def test_custom_compute_algos():
    seen = {}

    def amax_algo(hist):
        seen["shape"] = tuple(hist.shape)
        return hist.mean(0)

    def scale_algo(amax, scale, fp8_max, recipe):
        return torch.where(amax > 0, 0.5 * fp8_max / amax, scale)

    recipe = DelayedScaling(
        amax_history_len=2, amax_compute_algo=amax_algo, scaling_factor_compute_algo=scale_algo
    )
    m = te.Linear(8, 4)
    x = torch.randn(3, 8)
    with te.fp8_autocast(fp8_recipe=recipe):
        m(x)
    assert seen["shape"][0] == 2
    assert torch.allclose(m.fp8_fwd_scale[0], 0.5 * 448.0 / (x.abs().max() / 2))


def test_tiny_and_nonfinite_amax():
    recipe = DelayedScaling(amax_history_len=1)
    m = te.Linear(4, 4, bias=False)
    with torch.no_grad():
        m.weight.fill_(1e-45)  # fp32 subnormal: 448 / amax overflows -> FLT_MAX
    with te.fp8_autocast(fp8_recipe=recipe):
        m(torch.zeros(2, 4))  # amax 0: previous scale kept
    assert m.fp8_fwd_scale[0] == 1.0 and m.fp8_fwd_scale[1] == F32_MAX


def test_history_length_follows_recipe():
    m = te.Linear(4, 4)
    assert m.fp8_fwd_amax_history.shape == (1024, 3)
    with te.fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=5)):
        m(torch.randn(2, 4))
    assert m.fp8_fwd_amax_history.shape == (5, 3) and m.fp8_bwd_amax_history.shape == (5, 2)
    assert m.fp8_fwd_amax_history[-1, 0] > 0


def test_dtype_conversion_keeps_meta_fp32():
    m = te.Linear(4, 4).to(torch.bfloat16)
    assert m.weight.dtype == torch.bfloat16
    assert m.fp8_fwd_scale.dtype == torch.float32 and m.fp8_fwd_ran.dtype == torch.int32


def test_format_and_availability():
    # TE's API: a bool, and (bool, reason) only with return_reason=True.
    assert te.is_fp8_available() is True
    assert te.is_fp8_available(return_reason=True) == (True, "")
    assert te.is_mxfp8_available() is True
    assert te.is_mxfp8_available(return_reason=True) == (True, "")
    assert te.is_fp8_block_scaling_available(return_reason=True) == (True, "")
    assert te.is_nvfp4_available() is True  # NVFP4 runs on the CPU (issue #24 part 2)
    assert te.is_nvfp4_available(return_reason=True) == (True, "")
    assert Format.HYBRID.value.max_fwd == 448 and Format.HYBRID.value.max_bwd == 57344
    assert Format.HYBRID_FNUZ.max(True) == 240 and Format.E4M3FNUZ.bwd == "e4m3fnuz"
    r = DelayedScaling()
    assert (r.margin, r.fp8_format, r.amax_history_len, r.amax_compute_algo, r.reduce_amax) == (
        0,
        Format.HYBRID,
        1024,
        "max",
        True,
    )
    assert MXFP8BlockScaling().fp8_format is Format.E4M3
    assert Float8CurrentScaling().fp8_quant_fwd_inp == QParams(False, 0.0)
    assert r.delayed() and not r.mxfp8() and MXFP8BlockScaling().mxfp8()


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: DelayedScaling(margin=-1), "margin"),
        (lambda: DelayedScaling(amax_history_len=0), "amax_history_len"),
        (lambda: DelayedScaling(amax_compute_algo="mean"), "amax_compute_algo"),
        (lambda: DelayedScaling(fp8_format="HYBRID"), "fp8_format"),
        (lambda: DelayedScaling(reduce_amax=1), "reduce_amax"),
        (lambda: Float8CurrentScaling(fp8_format=Format.E5M2FNUZ), "E5M2"),
        (lambda: Float8CurrentScaling(fp8_quant_fwd_inp=QParams(amax_epsilon=-1.0)), "epsilon"),
        (lambda: MXFP8BlockScaling(fp8_format=None), "fp8_format"),
    ],
)
def test_recipe_validation(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_fnuz_recipe_runs():
    m = te.Linear(32, 8)
    x = torch.randn(4, 32)
    with te.fp8_autocast(fp8_recipe=Float8CurrentScaling(fp8_format=Format.HYBRID_FNUZ)):
        y = m(x)
    ref = x.double() @ m.weight.detach().double().t() + m.bias.detach().double()
    assert ((y.double() - ref).norm() / ref.norm()) < 0.125


def test_manager_availability_pairs():
    # TE 2.x's FP8GlobalStateManager.is_*_available(): always the (available, reason) pair.
    m = FP8GlobalStateManager
    assert m.is_fp8_available() == (True, "") and m.is_mxfp8_available() == (True, "")
    assert m.is_fp8_block_scaling_available() == (True, "")
    assert m.is_nvfp4_available() == (True, "")


@pytest.mark.parametrize("recipe", [DelayedScaling(fp8_dpa=True), Float8CurrentScaling(fp8_dpa=True)],
                         ids=["delayed", "current"])
def test_dropped_modules_are_freed_without_the_cycle_collector(recipe):
    """A module dropped after an FP8 forward + backward is freed at once (reference counting), not
    when Python's cyclic collector happens to run: the FP8 attention plan and its quantization
    points used to form a cycle that kept the DotProductAttention alive."""
    import gc
    import weakref

    def run(m, *x):
        with te.fp8_autocast(fp8_recipe=recipe):
            y = m(*x)
        y.float().sum().backward()

    q = torch.randn(8, 2, 2, 16, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(4, 2, 32, requires_grad=True)
    makers = [(lambda: te.DotProductAttention(2, 16), (q, q, q)),
              (lambda: te.Linear(32, 32), (x,)),
              (lambda: te.TransformerLayer(32, 64, 2), (x,))]
    enabled = gc.isenabled()
    gc.disable()
    try:
        for make, args in makers:
            m = make()
            run(m, *args)
            ref = weakref.ref(m)
            del m
            assert ref() is None, f"{type(ref()).__name__} outlived its last reference"
    finally:
        if enabled:
            gc.enable()


def test_update_skips_modules_that_did_not_run():
    """Only the modules that ran join a delayed-scaling update (their 'ran' flags select them):
    a live module that did not run keeps its history and scale, and the reduction's size does
    not depend on how many other FP8 modules are alive (which differs between the ranks of an
    SPMD program while a dropped module waits for the cyclic collector)."""
    recipe = DelayedScaling(amax_history_len=3)
    idle, busy = te.Linear(16, 16), te.Linear(16, 16)
    x = torch.randn(4, 16)
    with te.fp8_autocast(fp8_recipe=recipe):
        idle(x)
        busy(x)
    idle_state = (idle.fp8_fwd_amax_history.clone(), idle.fp8_fwd_scale.clone())
    sizes = []
    import transformer_engine_lite.pytorch.fp8 as fp8_mod

    real = fp8_mod._update_delayed

    def spy(modules, *a, **k):
        sizes.append(len(modules))
        return real(modules, *a, **k)

    fp8_mod._update_delayed = spy
    try:
        with te.fp8_autocast(fp8_recipe=recipe):
            busy(x * 2)
    finally:
        fp8_mod._update_delayed = real
    assert sizes == [1], sizes
    assert torch.equal(idle.fp8_fwd_amax_history, idle_state[0])
    assert torch.equal(idle.fp8_fwd_scale, idle_state[1])
    assert int(busy.fp8_fwd_ran) == 0
