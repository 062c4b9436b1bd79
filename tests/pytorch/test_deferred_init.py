"""TE's deferred initialization (issue #28, from TE's test_deferred_init.py): a module built on
device="meta" allocates nothing; reset_parameters() allocates its parameters on the default device
and initializes them as a direct construction would (same distribution, same attributes)."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import DelayedScaling

H = 64


def _make(cls, device, **kw):
    if cls in (te.LayerNorm, te.RMSNorm):
        return cls(H, device=device, **kw)
    if cls is te.GroupedLinear:
        return cls(2, H, 2 * H, device=device, **kw)
    return cls(H, 2 * H, device=device, **kw)


CORE = [te.LayerNorm, te.RMSNorm, te.Linear, te.LayerNormLinear, te.LayerNormMLP, te.GroupedLinear]


@pytest.mark.parametrize("cls", CORE, ids=lambda c: c.__name__)
def test_meta_then_reset_parameters(cls):
    kw = {"params_dtype": torch.bfloat16}
    if cls not in (te.LayerNorm, te.RMSNorm):
        kw["bias"] = True
    m = _make(cls, "meta", **kw)
    assert all(p.device.type == "meta" for p in m.parameters())
    torch.manual_seed(0)
    m.reset_parameters()
    assert all(p.device.type == "cpu" and p.dtype == torch.bfloat16 for p in m.parameters())
    torch.manual_seed(0)
    ref = _make(cls, "cpu", **kw)
    # the same initializers in the same order: the same values
    for (n, p), (rn, rp) in zip(m.named_parameters(), ref.named_parameters()):
        assert n == rn
        torch.testing.assert_close(p, rp, rtol=0, atol=0)
    x = torch.randn(3, H, dtype=torch.bfloat16)
    out = m(x, [1, 2]) if cls is te.GroupedLinear else m(x)
    assert torch.isfinite(out[0] if isinstance(out, tuple) else out).all()


def test_meta_keeps_parameter_attributes():
    m = te.LayerNormMLP(H, 2 * H, device="meta", sequence_parallel=True)
    m.reset_parameters()
    ref = te.LayerNormMLP(H, 2 * H, sequence_parallel=True)
    for (n, p), (_, rp) in zip(m.named_parameters(), ref.named_parameters()):
        assert p.__dict__ == rp.__dict__, n  # sequence_parallel, TP tags
    assert "sequence_parallel" in m.fc2_bias.__dict__  # set at construction, kept by the move


def test_reset_parameters_defer_init_keeps_meta():
    m = te.LayerNormLinear(H, H, device="meta")
    m.reset_parameters(defer_init=True)
    assert all(p.device.type == "meta" for p in m.parameters())


def test_meta_with_fp8_parameters():
    with te.quantized_model_init(recipe=DelayedScaling()):
        m = te.Linear(H, H, device="meta")
        m.reset_parameters()
    assert type(m.weight).__name__ == "Float8Tensor" and m.weight.device.type == "cpu"
