"""FP8 extra state in checkpoints: exact round trip (scales, histories, next-step outputs), loading
with torch.load(weights_only=True), the older schema, checkpoints without FP8 state, bad input."""

from __future__ import annotations

import copy
import io

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import DelayedScaling
from transformer_engine_lite.pytorch.module.base import EXTRA_STATE_VERSION

RECIPE = DelayedScaling(amax_history_len=8, margin=1)


def _train_step(m, x, seed):
    g = torch.Generator().manual_seed(seed)
    with te.fp8_autocast(fp8_recipe=RECIPE):
        y = m(x)
    y.backward(torch.randn(y.shape, generator=g))
    return y.detach()


def _roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _meta(m):
    return [t.clone() for f in (True, False) for t in m.fp8_meta_tensors(f)[:2]]


@pytest.mark.parametrize(
    "make",
    [
        lambda: te.Linear(32, 16),
        lambda: te.LayerNormLinear(32, 16),
        lambda: te.LayerNormMLP(32, 48, activation="geglu"),
    ],
    ids=["Linear", "LayerNormLinear", "LayerNormMLP"],
)
def test_roundtrip_restores_state_and_next_step(make):
    torch.manual_seed(0)
    m = make()
    x = torch.randn(6, 32)
    for step in range(3):
        _train_step(m, x * (step + 1), step)
    state = _roundtrip(m.state_dict())
    assert state["_extra_state"]["version"] == EXTRA_STATE_VERSION
    assert state["_extra_state"]["recipe"]["margin"] == 1
    fresh = make()
    fresh.load_state_dict(state)
    for a, b in zip(_meta(m), _meta(fresh)):
        assert torch.equal(a, b)
    m.zero_grad()
    y1 = _train_step(m, x * 5, 7)
    y2 = _train_step(fresh, x * 5, 7)
    assert torch.equal(y1, y2)
    for (n, p1), (_, p2) in zip(m.named_parameters(), fresh.named_parameters()):
        assert torch.equal(p1.grad, p2.grad), n
    for a, b in zip(_meta(m), _meta(fresh)):
        assert torch.equal(a, b)


def test_extra_state_is_plain_data():
    state = te.Linear(4, 4).get_extra_state()
    assert isinstance(state, dict)
    for v in state.values():
        assert v is None or isinstance(v, (int, str, dict, torch.Tensor))
    _roundtrip(state)  # weights_only=True accepts it


def test_old_schema_loads():
    m = te.Linear(8, 8)
    hist = torch.rand(16, 3)
    scale = torch.tensor([2.0, 4.0, 1.0])
    v1 = {
        "version": 1,
        "amax_history_fwd": hist,
        "scale_fwd": scale,
        "scale_inv_fwd": 1 / scale,
        "amax_history_bwd": torch.zeros(16, 2),
        "scale_bwd": torch.tensor([8.0, 1.0]),
        "scale_inv_bwd": torch.tensor([0.125, 1.0]),
    }
    sd = m.state_dict()
    sd["_extra_state"] = v1
    m.load_state_dict(_roundtrip(sd))
    assert torch.equal(m.fp8_fwd_amax_history, hist) and torch.equal(m.fp8_fwd_scale, scale)
    assert m.fp8_bwd_scale[0] == 8.0
    # The next autocast brings the history to the recipe's length, keeping the newest rows.
    with te.fp8_autocast(fp8_recipe=RECIPE):
        pass
    assert torch.equal(m.fp8_fwd_amax_history, hist[:8])


@pytest.mark.parametrize(
    "empty",
    [None, torch.empty(0), {}, {"version": 2, "num_gemms": 1}],
    ids=["none", "empty_tensor", "empty_dict", "no_fp8_fields"],
)
def test_checkpoint_without_fp8_state_loads(empty):
    m = te.Linear(8, 8)
    before = _meta(m)
    sd = copy.copy(m.state_dict())
    sd["_extra_state"] = empty
    m.load_state_dict(sd)
    for a, b in zip(before, _meta(m)):
        assert torch.equal(a, b)
    # A high-precision checkpoint without the key loads non-strictly.
    del sd["_extra_state"]
    missing = m.load_state_dict(sd, strict=False).missing_keys
    assert missing == ["_extra_state"]


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"version": 99}, "schema version"),
        ({"version": 2, "num_gemms": 2}, "num_gemms"),
        (
            {"version": 2, "amax_history_fwd": torch.zeros(4, 6), "scale_fwd": torch.ones(6)},
            r"amax_history_fwd \[L, 3\]",
        ),
        (torch.ones(3, dtype=torch.uint8), "expected a dict"),
    ],
)
def test_bad_extra_state(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        te.Linear(8, 8).set_extra_state(bad)
