"""FP8 extra state in checkpoints: exact round trip (scales, histories, next-step outputs), loading
with torch.load(weights_only=True), the older schema, checkpoints without FP8 state, bad input."""

from __future__ import annotations

import copy
import io

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import DelayedScaling
from transformer_engine_lite.pytorch._extra_state import decode_extra_state
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


def _state(m) -> dict:
    """The module's extra state, decoded from its uint8 encoding."""
    return decode_extra_state("test", m.get_extra_state())


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
    extra = decode_extra_state("test", state["_extra_state"])
    assert extra["version"] == EXTRA_STATE_VERSION
    assert extra["recipe"]["margin"] == 1
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
    encoded = te.Linear(4, 4).get_extra_state()
    # a 1-D uint8 tensor (TE's form: safetensors takes it) of torch.save's bytes, not a pickle
    assert encoded.dtype == torch.uint8 and encoded.dim() == 1
    assert bytes(encoded[:4].tolist()) == b"PK\x03\x04"
    state = decode_extra_state("test", encoded)
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
        (torch.ones(3, dtype=torch.float32), "expected a dict"),
    ],
)
def test_bad_extra_state(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        te.Linear(8, 8).set_extra_state(bad)


def _good_state() -> dict:
    m = te.Linear(8, 8)
    return _state(m)


def _with(**changes) -> dict:
    s = _good_state()
    for k, v in changes.items():
        if v is _DROP:
            del s[k]
        else:
            s[k] = v
    return s


_DROP = object()


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"amax_history_fwd": torch.zeros(4, 5)}, r"amax_history_fwd \[L, 3\]"),  # wrong length
        ({"scale_bwd": torch.ones(3)}, r"scale_bwd \[2\]"),
        ({"amax_history_fwd": torch.zeros(0, 3)}, r"L >= 1"),  # empty history
        ({"amax_history_fwd": torch.zeros(4, 3, dtype=torch.int32)}, "floating-point tensor, got torch.int32"),
        ({"scale_fwd": [1.0, 1.0, 1.0]}, "floating-point tensor, got list"),
        ({"scale_fwd": torch.tensor([1.0, float("nan"), 1.0])}, "scale_fwd finite and > 0"),
        ({"scale_fwd": torch.tensor([1.0, float("inf"), 1.0])}, "scale_fwd finite and > 0"),
        ({"scale_bwd": torch.tensor([1.0, -2.0])}, "scale_bwd finite and > 0"),
        ({"scale_bwd": torch.tensor([0.0, 1.0])}, "scale_bwd finite and > 0"),
        ({"amax_history_bwd": torch.full((4, 2), -1.0)}, "amax_history_bwd values >= 0"),
        ({"amax_history_bwd": torch.full((4, 2), float("nan"))}, "NaN: True"),
        ({"num_gemms": -1}, "num_gemms"),
        ({"num_gemms": "1"}, "num_gemms"),
        ({"recipe": "DelayedScaling"}, "recipe to be a dict"),
        ({"extra_key": 1}, r"unexpected keys \['extra_key'\]"),
        ({"scale_fwd": _DROP}, "scale_fwd to be a floating-point tensor, got NoneType"),
    ],
    ids=lambda v: None if isinstance(v, str) else str(sorted(v) if isinstance(v, dict) else v)[:30],
)
def test_hostile_extra_state_names_the_field_and_changes_nothing(changes, match):
    m = te.Linear(8, 8)
    with te.fp8_autocast():
        m(torch.randn(4, 8)).sum().backward()
    before = {k: v.clone() for k, v in _state(m).items() if isinstance(v, torch.Tensor)}
    # A state whose forward half is valid and changed: it must not be applied either.
    state = _with(**changes)
    if "amax_history_fwd" not in changes:
        state["amax_history_fwd"] = torch.full((4, 3), 7.0)
    with pytest.raises(ValueError, match=match):
        m.set_extra_state(state)
    after = _state(m)
    for k, v in before.items():
        assert torch.equal(after[k], v), f"{k} changed by a rejected checkpoint"


def test_infinite_amax_history_is_accepted():
    """An overflowed step records Inf; the recipe keeps the previous scale for it, so it loads."""
    m = te.Linear(8, 8)
    m.set_extra_state(_with(amax_history_fwd=torch.full((4, 3), float("inf"))))
    assert torch.isinf(m.fp8_fwd_amax_history).all()


# ----------------------------------------------------------------- TE's pickled extra state (#28)
import pickle  # noqa: E402

from transformer_engine_lite.common.recipe import (  # noqa: E402
    Float8CurrentScaling,
    MXFP8BlockScaling,
)
from transformer_engine_lite.pytorch._extra_state import (  # noqa: E402
    UNSAFE_PICKLE_EXTRA_STATE_ENV,
    CheckpointExtraStatePolicy,
    recipe_extra_state_policy,
    should_load_extra_state_pickle,
)

# Hand-written protocol-2 pickle of TE's own stateless extra state, naming TE's module (which is
# not importable here): {"recipe": transformer_engine.common.recipe.Float8CurrentScaling(),
# "extra_fp8_variables": {}}
_TE_STATELESS = (b"\x80\x02}q\x00(X\x06\x00\x00\x00recipeq\x01ctransformer_engine.common.recipe\n"
                 b"Float8CurrentScaling\nq\x02)\x81q\x03}q\x04bX\x13\x00\x00\x00"
                 b"extra_fp8_variablesq\x05}q\x06u.")


def _as_te_tensor(payload: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)  # TE 2.x's form


def test_pickle_classifier():
    assert not should_load_extra_state_pickle(_TE_STATELESS, "t")
    assert not should_load_extra_state_pickle(pickle.dumps({}), "t")
    assert not should_load_extra_state_pickle(b"", "t")
    stateless_two = pickle.dumps({"recipe": Float8CurrentScaling(), "r2": MXFP8BlockScaling()})
    assert not should_load_extra_state_pickle(stateless_two, "t")
    # protocol 4 memoizes the module name and fetches it again for DelayedScaling: the
    # classifier must still see which class it is (a literal-strings-only scan would not)
    mixed = pickle.dumps({"recipe": Float8CurrentScaling(), "r2": DelayedScaling()}, protocol=4)
    assert b"DelayedScaling" in mixed
    for bad in (mixed, pickle.dumps({"recipe": DelayedScaling()}), b"not a pickle",
                pickle.dumps({"scale_fwd": torch.ones(1)})):
        with pytest.raises(RuntimeError, match=UNSAFE_PICKLE_EXTRA_STATE_ENV):
            should_load_extra_state_pickle(bad, "t")
    assert recipe_extra_state_policy(DelayedScaling()) is (
        CheckpointExtraStatePolicy.STATEFUL_FP8_DELAYED_SCALING)


@pytest.mark.parametrize("cls", ["Float8BlockScaling", "NVFP4BlockScaling"])
def test_block_recipe_pickles_name_common_recipe(cls):
    # defined in common/recipe_block.py, they pickle under their public module (TE's), so a
    # stateless checkpoint of them needs no unsafe-unpickle opt-in (it did before)
    from transformer_engine_lite.common import recipe

    rec = getattr(recipe, cls)()
    payload = pickle.dumps({"recipe": rec, "extra_fp8_variables": {}})
    assert b"transformer_engine_lite.common.recipe\n" in pickle.dumps(rec, protocol=2)
    assert not should_load_extra_state_pickle(payload, "t")
    assert type(pickle.loads(payload)["recipe"]) is type(rec)
    # pickles written before name common.recipe_block: still classified as stateless
    # (protocol 2 names a class in a newline-terminated GLOBAL line, so it can be edited)
    v2 = pickle.dumps({"recipe": rec, "extra_fp8_variables": {}}, protocol=2)
    old = v2.replace(b"common.recipe\n", b"common.recipe_block\n")
    assert old != v2
    assert not should_load_extra_state_pickle(old, "t")


def test_te_pickled_extra_state_in_load_state_dict(monkeypatch):
    m = te.Linear(8, 8)
    with te.fp8_autocast(fp8_recipe=RECIPE):
        m(torch.randn(4, 8)).sum().backward()
    before = _meta(m)
    sd = m.state_dict()
    sd["_extra_state"] = _as_te_tensor(_TE_STATELESS)  # stateless: loads as "no FP8 state"
    m.load_state_dict(sd)
    assert all(torch.equal(a, b) for a, b in zip(before, _meta(m)))
    sd["_extra_state"] = _as_te_tensor(pickle.dumps({"recipe": DelayedScaling(),
                                                     "scale_fwd": torch.ones(3)}))
    with pytest.raises(RuntimeError, match="refusing to load pickled"):
        m.load_state_dict(sd)
    monkeypatch.setenv(UNSAFE_PICKLE_EXTRA_STATE_ENV, "1")
    with pytest.raises(ValueError, match="amax_history_fwd"):  # incomplete: refused whole
        m.load_state_dict(sd)
    assert all(torch.equal(a, b) for a, b in zip(before, _meta(m)))  # nothing was assigned


def _te_delayed_payload(hist_fwd, scale_fwd, hist_bwd, scale_bwd) -> bytes:
    """TE 2.x's pickled delayed-scaling extra state, with TE's class paths: pickled at protocol 0
    (text: class paths are plain lines, so ours can be renamed to TE's)."""
    state = {"recipe": DelayedScaling(amax_history_len=hist_fwd.shape[0]),
             "scale_fwd": scale_fwd, "amax_history_fwd": hist_fwd,
             "scale_bwd": scale_bwd, "amax_history_bwd": hist_bwd,
             "extra_fp8_variables": {"num_gemms": 1, "fp8_checkpoint": True}}
    data = pickle.dumps(state, protocol=0)
    te_data = data.replace(b"transformer_engine_lite.", b"transformer_engine.")
    assert b"ctransformer_engine.common.recipe\nDelayedScaling" in te_data
    return te_data


def test_te_delayed_pickled_state_loads_under_te_opt_in(monkeypatch):
    """A checkpoint converted from TE: with TE's opt-in its amax histories and scales load and
    the next step equals a module holding them."""
    hist_f = torch.rand(8, 3) * 4
    hist_b = torch.rand(8, 2) * 4
    scale_f = torch.tensor([2.0, 0.5, 1.0])
    scale_b = torch.tensor([4.0, 1.0])
    payload = _as_te_tensor(_te_delayed_payload(hist_f, scale_f, hist_b, scale_b))
    m = te.Linear(8, 8)
    with pytest.raises(RuntimeError, match=UNSAFE_PICKLE_EXTRA_STATE_ENV):
        m.set_extra_state(payload)
    monkeypatch.setenv(UNSAFE_PICKLE_EXTRA_STATE_ENV, "1")
    m.set_extra_state(payload)
    hf, sf, hb, sb = m.fp8_meta_tensors(True)[:2] + m.fp8_meta_tensors(False)[:2]
    assert torch.equal(hf, hist_f) and torch.equal(sf, scale_f)
    assert torch.equal(hb, hist_b) and torch.equal(sb, scale_b)
    # and it travels on in our encoding
    again = te.Linear(8, 8)
    again.set_extra_state(m.get_extra_state())
    assert all(torch.equal(a, b) for a, b in zip(_meta(m), _meta(again)))


def test_te_pickle_naming_a_missing_class_is_refused_clearly(monkeypatch):
    monkeypatch.setenv(UNSAFE_PICKLE_EXTRA_STATE_ENV, "1")
    data = pickle.dumps({"recipe": DelayedScaling(), "scale_fwd": torch.ones(3)}, protocol=0)
    data = data.replace(b"transformer_engine_lite.common.recipe\nDelayedScaling",
                        b"transformer_engine.common.recipe\nNoSuchRecipe")
    with pytest.raises(NotImplementedError, match="NoSuchRecipe"):
        te.Linear(8, 8).set_extra_state(_as_te_tensor(data))


def test_encoded_extra_state_survives_safetensors(tmp_path):
    """HF save_pretrained writes state dicts with safetensors, which takes tensors only."""
    safetensors = pytest.importorskip("safetensors.torch")
    m = te.Linear(8, 8)
    with te.fp8_autocast(fp8_recipe=RECIPE):
        m(torch.randn(4, 8)).sum().backward()
    safetensors.save_file(m.state_dict(), tmp_path / "m.safetensors")
    fresh = te.Linear(8, 8)
    fresh.load_state_dict(safetensors.load_file(tmp_path / "m.safetensors"))
    assert all(torch.equal(a, b) for a, b in zip(_meta(m), _meta(fresh)))


def test_damaged_encoded_state_is_a_value_error():
    enc = te.Linear(8, 8).get_extra_state()
    with pytest.raises(ValueError, match="weights_only"):
        te.Linear(8, 8).set_extra_state(enc[: enc.numel() // 2])
