"""te.make_graphed_callables on the CPU: graphed modules against eager copies (outputs, input and
parameter gradients, FP8 recipes included), TE's warm-up / FP8-state / gradient-buffer semantics
and the argument checks."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe as rc
from transformer_engine_lite.pytorch.fp8 import FP8GlobalStateManager

RECIPES = {
    "none": None,
    "delayed": rc.DelayedScaling(),
    "current": rc.Float8CurrentScaling(),
    "mxfp8": rc.MXFP8BlockScaling(),
}


def _pair(make):
    torch.manual_seed(1)
    a, b = make(), make()
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("kind", ["linear", "layernorm_mlp", "sequential"])
def test_graphed_equals_eager(name, kind):
    """Three training steps through the graphed module and an eager copy under the same outer
    autocast: outputs, input grads and accumulated parameter grads are bitwise equal (delayed
    scaling's amax/scale updates included: the warm-up's are undone, the steps' happen)."""
    rec = RECIPES[name]
    make = {
        "linear": lambda: te.Linear(64, 64, params_dtype=torch.bfloat16),
        "layernorm_mlp": lambda: te.LayerNormMLP(64, 128, params_dtype=torch.bfloat16),
        "sequential": lambda: torch.nn.Sequential(te.Linear(64, 64, params_dtype=torch.bfloat16),
                                                  te.Linear(64, 64, params_dtype=torch.bfloat16)),
    }[kind]
    graphed, eager = _pair(make)
    sample = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    graphed = te.make_graphed_callables(graphed, (sample,), enabled=rec is not None, recipe=rec)
    for _ in range(3):
        x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(32, 64, dtype=torch.bfloat16)
        with te.autocast(enabled=rec is not None, recipe=rec):
            y1 = graphed(x)
        y1.backward(dy)
        gx1, x.grad = x.grad, None
        with te.autocast(enabled=rec is not None, recipe=rec):
            y2 = eager(x)
        y2.backward(dy)
        assert torch.equal(y1, y2)
        assert torch.equal(gx1, x.grad)
        for p1, p2 in zip(graphed.parameters(), eager.parameters()):
            assert torch.equal(p1.grad, p2.grad)


def test_captured_recipe_applies_without_outer_autocast():
    """The graph keeps the autocast it was captured with: called outside any autocast, the
    graphed module still runs FP8 (equal to eager under that autocast, not to eager without)."""
    rec = rc.Float8CurrentScaling()
    graphed, eager = _pair(lambda: te.Linear(64, 64))
    x = torch.randn(16, 64)
    graphed = te.make_graphed_callables(graphed, (x,), enabled=True, recipe=rec)
    y = graphed(x)
    with te.autocast(recipe=rec):
        ref = eager(x)
    assert torch.equal(y, ref)
    assert not torch.equal(y, eager(x))


def test_warmup_leaves_fp8_state_rng_and_grads_untouched():
    m = te.Linear(32, 32)
    with te.autocast(recipe=rc.DelayedScaling()):
        m(torch.randn(4, 32)).sum().backward()
    before = [getattr(m, n).clone() for n in m._FP8_META_BUFFERS]
    grad = m.weight.grad.clone()
    sample = torch.randn(4, 32, requires_grad=True)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    te.make_graphed_callables(m, (sample,), enabled=True,
                              recipe=rc.DelayedScaling(), num_warmup_iters=4)
    assert torch.equal(torch.rand(3), expected)
    for n, b in zip(m._FP8_META_BUFFERS, before):
        assert torch.equal(getattr(m, n), b), n
    assert torch.equal(m.weight.grad, grad)


def test_hooks_and_warmup_count():
    calls = []
    m = te.Linear(8, 8)
    hooks = [{"forward_pre_hooks": {0: lambda mod: calls.append("pre")},
              "backward_hooks": {0: lambda mod: calls.append("bwd")}}]
    te.make_graphed_callables(
        (m,), ((torch.randn(2, 8, requires_grad=True),),), num_warmup_iters=2,
        pre_warmup_hook=lambda: calls.append("start"), post_warmup_hook=lambda: calls.append("end"),
        capture_time_hooks=hooks)
    # two warm-up passes, then the capture pass
    assert calls == ["start", "pre", "bwd", "pre", "bwd", "end", "pre", "bwd"]


def test_param_grad_clone_policy():
    for clone in (True, False):
        m = te.make_graphed_callables(torch.nn.Linear(8, 8, bias=False), (torch.randn(2, 8),),
                                      clone_param_grads_on_return=clone)
        seen = []
        h = m.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad))
        m(torch.randn(2, 8)).sum().backward()
        m.zero_grad(set_to_none=True)
        m(torch.randn(2, 8)).sum().backward()
        h.remove()
        assert (seen[0].data_ptr() == seen[1].data_ptr()) == (not clone)


def test_weight_caching_needs_is_first_microbatch_and_uses_it():
    rec = rc.Float8CurrentScaling()
    graphed, eager = _pair(lambda: te.Linear(32, 32))
    x = torch.randn(4, 32)
    graphed = te.make_graphed_callables(torch.nn.Sequential(graphed), (x,), enabled=True,
                                        recipe=rec, cache_quantized_params=True)
    with pytest.raises(ValueError, match="is_first_microbatch"):
        graphed(x)
    for first in (True, False, False):
        with te.autocast(recipe=rec):
            y = graphed(x, is_first_microbatch=first)
            ref = eager(x, is_first_microbatch=first)
        assert torch.equal(y, ref)
    assert FP8GlobalStateManager.get_skip_fp8_weight_update_tensor() is None


def test_training_state_and_kwargs():
    m = te.make_graphed_callables(te.Linear(8, 8), (torch.randn(2, 8),))
    m.eval()  # captured in training mode: eval runs the original forward
    assert m(torch.randn(2, 8)).shape == (2, 8)

    class WithMask(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = te.Linear(8, 8)

        def forward(self, x, mask):
            return self.lin(x) * mask

    g = te.make_graphed_callables(WithMask(), (torch.randn(2, 8),),
                                  sample_kwargs={"mask": torch.ones(2, 8)})
    with pytest.raises(TypeError, match="mask"):
        g(torch.randn(2, 8))
    assert torch.equal(g(torch.randn(2, 8), mask=torch.zeros(2, 8)), torch.zeros(2, 8))


def test_pipeline_order_returns_one_forward_per_microbatch():
    layers = (te.Linear(8, 8), te.Linear(8, 8))
    samples = tuple((torch.randn(2, 8, requires_grad=True),) for _ in range(4))
    fwds = te.make_graphed_callables(layers, samples, _order=[1, 2, -2, -1, 1, 2, -2, -1],
                                     _num_layers_per_chunk=[1, 1])
    assert len(fwds) == 4
    x = torch.randn(2, 8, requires_grad=True)
    y = fwds[2](fwds[0](x))
    y.sum().backward()
    assert x.grad is not None and layers[0].weight.grad is not None


def test_argument_errors():
    m = te.Linear(4, 4)
    x = (torch.randn(2, 4),)
    with pytest.raises(TypeError, match="not supported"):
        te.make_graphed_callables(lambda t: t, x)
    with pytest.raises(ValueError, match="both kwargs are set"):
        te.make_graphed_callables(m, x, fp8_enabled=True, enabled=True)
    with pytest.warns(DeprecationWarning, match="fp8_enabled"):
        te.make_graphed_callables(te.Linear(4, 4), x, fp8_enabled=False)
    with pytest.raises(TypeError, match="enabled must be a bool"):
        te.make_graphed_callables(m, x, enabled=1)
    with pytest.raises(TypeError, match="only Tensors"):
        te.make_graphed_callables(m, (3,))
    with pytest.raises(NotImplementedError, match="fractional"):
        te.make_graphed_callables((m,), (x, x), _order=[1, 1, -1.5, -1, -1])
    h = te.Linear(4, 4)
    h.register_forward_hook(lambda *a: None)
    with pytest.raises(RuntimeError, match="hooks"):
        te.make_graphed_callables(h, x)


class _IgnoresSecond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, unused):
        return self.lin(x)


def test_allow_unused_input():
    sample = (torch.randn(2, 4), torch.randn(2, 4, requires_grad=True))
    with pytest.raises(RuntimeError, match="requires grad"):
        te.make_graphed_callables(_IgnoresSecond(), sample)
    g = te.make_graphed_callables(_IgnoresSecond(), sample, allow_unused_input=True)
    u = torch.randn(2, 4, requires_grad=True)
    g(torch.randn(2, 4), u).sum().backward()
    assert u.grad is None and g.lin.weight.grad is not None


def test_parameter_tensor_hook_fires_once_per_backward():
    """As a graph replay: a hook on a parameter sees the returned gradient once per backward."""
    m = te.make_graphed_callables(torch.nn.Linear(8, 8, bias=False), (torch.randn(2, 8),))
    seen = []
    h = m.weight.register_hook(lambda g: seen.append(g))
    m(torch.randn(2, 8)).sum().backward()
    m(torch.randn(2, 8)).sum().backward()
    h.remove()
    assert len(seen) == 2 and seen[0].data_ptr() != seen[1].data_ptr()
