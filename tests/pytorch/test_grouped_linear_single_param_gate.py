"""GroupedLinear's single grouped weight / bias follow TE's NVTE_GROUPED_LINEAR_SINGLE_PARAM gate:
unset (or 0) turns both flags off with TE's warning, so a TE user's module has the per-expert
weight0.. / bias0.. parameters and state_dict keys it has on TE; an integer > 0 keeps one
[num_gemms, out, in] weight and [num_gemms, out] bias (TE's experimental-feature warning); anything
else is a ValueError naming the variable."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch.utils import resolve_grouped_linear_single_param_flags

ENV = "NVTE_GROUPED_LINEAR_SINGLE_PARAM"


@pytest.mark.parametrize("value", [None, "0"])
def test_unset_or_zero_falls_back_to_per_expert_parameters(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    with pytest.warns(UserWarning, match="falling back to per-expert parameters"):
        g = te.GroupedLinear(3, 16, 8, single_grouped_weight=True, single_grouped_bias=True)
    assert not g.single_grouped_weight and not g.single_grouped_bias
    names = [n for n, _ in g.named_parameters()]
    assert names == ["weight0", "bias0", "weight1", "bias1", "weight2", "bias2"]
    assert g.weight0.shape == (8, 16) and g.bias2.shape == (8,)


@pytest.mark.parametrize("value", ["1", "2"])
def test_enabled_keeps_single_grouped_parameters(monkeypatch, value):
    monkeypatch.setenv(ENV, value)
    with pytest.warns(UserWarning, match="experimental"):
        g = te.GroupedLinear(3, 16, 8, single_grouped_weight=True, single_grouped_bias=True)
    assert [n for n, _ in g.named_parameters()] == ["weight", "bias"]
    assert g.weight.shape == (3, 8, 16) and g.bias.shape == (3, 8)
    # Only the weight asked for: one grouped weight, per-expert biases.
    with pytest.warns(UserWarning, match="experimental"):
        g = te.GroupedLinear(2, 16, 8, single_grouped_weight=True)
    assert [n for n, _ in g.named_parameters()] == ["weight", "bias0", "bias1"]


def test_not_requested_reads_no_variable_and_warns_nothing(monkeypatch, recwarn):
    monkeypatch.setenv(ENV, "not-an-int")  # would be an error if it were read
    g = te.GroupedLinear(2, 16, 8)
    assert [n for n, _ in g.named_parameters()] == ["weight0", "bias0", "weight1", "bias1"]
    assert resolve_grouped_linear_single_param_flags(False, False) == (False, False)
    assert not [w for w in recwarn if "single_grouped" in str(w.message)]


def test_bad_value_is_a_value_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ValueError, match=r"NVTE_GROUPED_LINEAR_SINGLE_PARAM: expected an integer"):
        te.GroupedLinear(2, 16, 8, single_grouped_weight=True)


def test_fallback_module_computes_per_expert_linears(monkeypatch):
    # The fallen-back module is an ordinary GroupedLinear: expert i is x_i @ weight_i^T + bias_i.
    monkeypatch.delenv(ENV, raising=False)
    torch.manual_seed(0)
    with pytest.warns(UserWarning):
        g = te.GroupedLinear(2, 16, 8, single_grouped_weight=True, single_grouped_bias=True)
    x = torch.randn(10, 16)
    y = g(x, [4, 6])
    w = [g.weight0.double(), g.weight1.double()]
    b = [g.bias0.double(), g.bias1.double()]
    xd = x.double()
    ref = torch.cat([xd[:4] @ w[0].T + b[0], xd[4:] @ w[1].T + b[1]])  # fp64 reference
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
