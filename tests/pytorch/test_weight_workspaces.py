"""TE's cached weight casts, module._fp8_workspaces (module/_weight_workspace.py): TE's keys and
tensor types per recipe, populated when TE populates them (is_first_microbatch True or False),
re-quantized in place on a refresh (stable buffer addresses), reused without quantizing when
is_first_microbatch=False, and a cached step bit-identical to an uncached one."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)
from transformer_engine_lite.pytorch.tensor import (
    Float8BlockwiseQTensor,
    Float8Tensor,
    MXFP8Tensor,
    NVFP4Tensor,
)

BF16 = torch.bfloat16
HIDDEN, FFN = 128, 256  # multiples of 128: the NVFP4 weight shapes TE swizzles

RECIPES = {
    "delayed": DelayedScaling,
    "current": Float8CurrentScaling,
    "mxfp8": MXFP8BlockScaling,
    "block": Float8BlockScaling,
    "nvfp4": lambda **kw: NVFP4BlockScaling(disable_stochastic_rounding=True, **kw),
}
TENSOR_TYPE = {
    "delayed": Float8Tensor,
    "current": Float8Tensor,
    "mxfp8": MXFP8Tensor,
    "block": Float8BlockwiseQTensor,
    "nvfp4": NVFP4Tensor,
}
MODULES = {
    "Linear": (lambda: te.Linear(HIDDEN, FFN, params_dtype=BF16), ["weight"]),
    "LayerNormLinear": (lambda: te.LayerNormLinear(HIDDEN, FFN, params_dtype=BF16), ["weight"]),
    "LayerNormMLP": (lambda: te.LayerNormMLP(HIDDEN, FFN, params_dtype=BF16),
                     ["fc1_weight", "fc2_weight"]),
    "GroupedLinear": (lambda: te.GroupedLinear(2, HIDDEN, FFN, params_dtype=BF16),
                      ["weight0", "weight1"]),
}
ALL = [(m, r) for m in MODULES for r in RECIPES]


def _build(module: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return MODULES[module][0]()


def _call(m, x, first):
    if isinstance(m, te.GroupedLinear):
        return m(x, [x.shape[0] // 2, x.shape[0] - x.shape[0] // 2], is_first_microbatch=first)
    return m(x, is_first_microbatch=first)


def _step(m, recipe, x, first):
    """One microbatch (forward and backward): (out, dgrad)."""
    x = x.detach().clone().requires_grad_(True)
    with te.autocast(recipe=recipe):
        y = _call(m, x, first)
    y.float().square().sum().backward()
    return y.detach(), x.grad


def _inner(ws):
    return {n: getattr(ws, n) for n in ws._inner_names() if getattr(ws, n) is not None}


def _snapshot(m):
    return {k: {n: (t.data_ptr(), t.clone()) for n, t in _inner(ws).items()}
            for k, ws in m._fp8_workspaces.items()}


class _QuantizeLog(TorchDispatchMode):
    """Element counts of the tensors the te_lite cast ops read."""

    def __init__(self) -> None:
        super().__init__()
        self.numels: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith("te_lite.") and "quantize" in name and "dequantize" not in name:
            self.numels.append(args[0].numel())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("module,recipe", ALL)
def test_keys_types_and_when(module, recipe):
    """TE's keys and tensor types; nothing cached without is_first_microbatch; MXFP8 and NVFP4
    (at these shapes) hold GEMM-swizzled scales as TE's preswizzled weights."""
    rec = RECIPES[recipe]()
    m = _build(module)
    x = torch.randn(32, HIDDEN, dtype=BF16)
    _step(m, rec, x, None)
    assert m._fp8_workspaces == {}
    _step(m, rec, x, True)
    assert sorted(m._fp8_workspaces) == sorted(MODULES[module][1])
    for ws in m._fp8_workspaces.values():
        assert type(ws) is TENSOR_TYPE[recipe]
        assert not ws.requires_grad
        if recipe in ("mxfp8", "nvfp4"):
            assert ws._with_gemm_swizzled_scales
    # a first forward with is_first_microbatch=False also caches (TE: a miss quantizes)
    m2 = _build(module)
    _step(m2, rec, x, False)
    assert sorted(m2._fp8_workspaces) == sorted(MODULES[module][1])


def test_nvfp4_swizzles_only_where_te_does():
    """TE preswizzles an NVFP4 2D weight only when both dims are multiples of 128."""
    m = te.Linear(64, 96, params_dtype=BF16)
    _step(m, RECIPES["nvfp4"](), torch.randn(32, 64, dtype=BF16), True)
    assert not m._fp8_workspaces["weight"]._with_gemm_swizzled_scales


@pytest.mark.parametrize("module,recipe", ALL)
def test_refresh_requantizes_in_place(module, recipe):
    """is_first_microbatch=True after a weight update re-quantizes into the same buffers: each
    data / scale_inv tensor keeps its address and holds the new weight's bytes."""
    rec = RECIPES[recipe]()
    m, plain = _build(module), _build(module)
    x = torch.randn(32, HIDDEN, dtype=BF16)
    _step(m, rec, x, True)
    _step(m, rec, x, False)
    before = _snapshot(m)
    with torch.no_grad():
        for name in MODULES[module][1]:
            for mod in (m, plain):
                getattr(mod, name).mul_(1.5).add_(0.01)
    y, dx = _step(m, rec, x, True)
    after = _snapshot(m)
    if recipe != "delayed":  # the GEMMs read the refreshed cast: the uncached results
        y_ref, dx_ref = _step(plain, rec, x, None)
        assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    assert sorted(after) == sorted(before)
    changed = False
    for key, bufs in before.items():
        assert sorted(after[key]) == sorted(bufs), key
        for n, (ptr, old) in bufs.items():
            assert after[key][n][0] == ptr, f"{key}.{n} moved"
            changed |= not torch.equal(after[key][n][1], old)
        # the refreshed bytes are the new weight's: those of a fresh cast of it (not under
        # delayed scaling, whose scale the autocast exit updated after the refresh)
        ws = m._fp8_workspaces[key]
        if recipe != "delayed":
            fresh = ws._quantizer.quantize(getattr(m, key).detach())
            for n, t in _inner(fresh).items():
                assert torch.equal(_inner(ws)[n], t), f"{key}.{n}"
    assert changed


@pytest.mark.parametrize("module,recipe", ALL)
def test_reuse_does_not_quantize(module, recipe):
    """is_first_microbatch=False quantizes no weight: the cast the first microbatch cached is
    what the GEMMs read, even after the weight changed (TE's contract: it must not)."""
    rec = RECIPES[recipe]()
    m = _build(module)
    weight_numels = {getattr(m, n).numel() for n in MODULES[module][1]}
    x = torch.randn(32, HIDDEN, dtype=BF16)
    log = _QuantizeLog()
    with log:
        y0, _ = _step(m, rec, x, True)
    assert weight_numels & set(log.numels)
    before = _snapshot(m)
    with torch.no_grad():
        for name in MODULES[module][1]:
            getattr(m, name).mul_(-1.0)  # ignored until the next first microbatch
    log = _QuantizeLog()
    with log:
        y1, _ = _step(m, rec, x, False)
    assert not weight_numels & set(log.numels)
    after = _snapshot(m)
    for key, bufs in before.items():
        for n, (ptr, old) in bufs.items():
            assert after[key][n][0] == ptr and torch.equal(after[key][n][1], old)
    if recipe != "delayed":  # delayed: the input's scale moved after the first step
        assert torch.equal(y0, y1)


@pytest.mark.parametrize("module,recipe", ALL)
def test_cached_equals_uncached(module, recipe):
    """Outputs, input gradients and weight gradients of n microbatches with the cache equal those
    without it bit for bit (delayed scaling: one autocast for all microbatches, so both runs use
    the same scales)."""
    rec = RECIPES[recipe]()
    cached, plain = _build(module), _build(module)
    xs = [torch.randn(32, HIDDEN, dtype=BF16) for _ in range(3)]
    outs = {}
    for tag, m in (("cached", cached), ("plain", plain)):
        res = []
        with te.autocast(recipe=rec):
            for i, x in enumerate(xs):
                res.append(_step(m, rec, x, (i == 0) if tag == "cached" else None))
        outs[tag] = res
    for i, ((y, dx), (y_ref, dx_ref)) in enumerate(zip(outs["cached"], outs["plain"])):
        assert torch.equal(y, y_ref), f"microbatch {i} out"
        assert torch.equal(dx, dx_ref), f"microbatch {i} dgrad"
    for (n, p), (_, q) in zip(cached.named_parameters(), plain.named_parameters()):
        assert torch.equal(p.grad, q.grad), n


@pytest.mark.parametrize("recipe", ["current", "mxfp8", "block", "nvfp4"])
@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_backward_override_cached_equals_uncached(recipe, override):
    """With a backward_override the backward reads the weight as uncached (high_precision: the
    weight itself, not its cached cast)."""
    rec = RECIPES[recipe](backward_override=override)
    cached, plain = _build("Linear"), _build("Linear")
    xs = [torch.randn(32, HIDDEN, dtype=BF16) for _ in range(2)]
    for i, x in enumerate(xs):
        y, dx = _step(cached, rec, x, i == 0)
        y_ref, dx_ref = _step(plain, rec, x, None)
        assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref), f"microbatch {i}"
    assert torch.equal(cached.weight.grad, plain.weight.grad)


@pytest.mark.parametrize("recipe", ["mxfp8", "block", "nvfp4"])
def test_inference_cast_is_replaced_when_dgrad_needs_columnwise(recipe):
    """TE's workspace check: a cast cached without its column-wise copy (no input gradient) is
    replaced by a new one when a later microbatch's backward needs that copy."""
    rec = RECIPES[recipe]()
    cached, plain = _build("Linear"), _build("Linear")
    x = torch.randn(32, HIDDEN, dtype=BF16)
    with torch.no_grad(), te.autocast(recipe=rec):
        cached(x, is_first_microbatch=True)
    ws = cached._fp8_workspaces["weight"]
    if recipe != "block":  # (Float8BlockScaling's 128x128 weight blocks: one grid for both)
        assert ws._columnwise_data is None
    y, dx = _step(cached, rec, x, False)
    new = cached._fp8_workspaces["weight"]
    assert new._columnwise_data is not None
    y_ref, dx_ref = _step(plain, rec, x, None)
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)


def test_recipe_change_clears_workspaces():
    """TE clears the cached casts when the recipe type changes (they hold the old format)."""
    m = _build("Linear")
    x = torch.randn(32, HIDDEN, dtype=BF16)
    _step(m, RECIPES["current"](), x, True)
    assert type(m._fp8_workspaces["weight"]) is Float8Tensor
    with pytest.warns(UserWarning, match="Recipe type changed"):
        _step(m, RECIPES["mxfp8"](), x, False)
    assert type(m._fp8_workspaces["weight"]) is MXFP8Tensor


def test_fp8_parameters_are_not_cached():
    """FP8 weight parameters (quantized_model_init) need no cast: nothing is cached (TE's)."""
    with te.quantized_model_init(enabled=True, recipe=RECIPES["current"]()):
        m = te.Linear(HIDDEN, FFN, params_dtype=BF16)
    _step(m, RECIPES["current"](), torch.randn(32, HIDDEN, dtype=BF16), True)
    assert m._fp8_workspaces == {}


@pytest.mark.parametrize("recipe", ["current", "mxfp8", "block", "nvfp4"])
def test_gemm_reads_the_cached_tensor(recipe):
    """The GEMM operands come from the cached tensor's current bytes: re-quantizing it directly
    (TE's ws.quantize_) is seen by the next is_first_microbatch=False forward, which then equals
    an uncached forward of the new weight (the operands derived from it are not kept stale)."""
    rec = RECIPES[recipe]()
    cached, plain = _build("Linear"), _build("Linear")
    x = torch.randn(32, HIDDEN, dtype=BF16)
    _step(cached, rec, x, True)
    _step(cached, rec, x, False)  # the derived operands are in use
    with torch.no_grad():
        for m in (cached, plain):
            m.weight.mul_(0.5).add_(0.03)
    cached._fp8_workspaces["weight"].quantize_(cached.weight.detach())
    y, dx = _step(cached, rec, x, False)
    y_ref, dx_ref = _step(plain, rec, x, None)
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)


# ----------------------------------------------------------------- single grouped weight
def _single(monkeypatch, seed=0, **kw):
    monkeypatch.setenv("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")
    torch.manual_seed(seed)
    with pytest.warns(UserWarning, match="experimental"):
        return te.GroupedLinear(3, HIDDEN, FFN, params_dtype=BF16, single_grouped_weight=True,
                                **kw)


def _grouped_bufs(ws):
    names = ("rowwise_data", "columnwise_data", "scale_inv", "columnwise_scale_inv", "amax")
    return {n: getattr(ws, n) for n in names if getattr(ws, n) is not None}


def _call3(m, x, first):
    return m(x, [16, 32, x.shape[0] - 48], is_first_microbatch=first)


def _step3(m, rec, x, first):
    x = x.detach().clone().requires_grad_(True)
    with te.autocast(recipe=rec):
        y = _call3(m, x, first)
    y.float().square().sum().backward()
    return y.detach(), x.grad


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_single_grouped_weight_caches_one_grouped_tensor(monkeypatch, recipe):
    """TE's key "weight": one GroupedTensor for all experts (its members: the recipe's tensor
    type); a refresh after a weight update rewrites its buffers in place (same addresses, new
    bytes), a reuse leaves them as they are."""
    from transformer_engine_lite.pytorch.tensor import GroupedTensor

    rec = RECIPES[recipe]()
    m = _single(monkeypatch)
    x = torch.randn(64, HIDDEN, dtype=BF16)
    _step3(m, rec, x, None)
    assert m._fp8_workspaces == {}
    _step3(m, rec, x, True)
    assert list(m._fp8_workspaces) == ["weight"]
    ws = m._fp8_workspaces["weight"]
    assert isinstance(ws, GroupedTensor) and ws.num_tensors == 3
    assert all(type(t) is TENSOR_TYPE[recipe] for t in ws.quantized_tensors)
    before = {n: (t.data_ptr(), t.clone()) for n, t in _grouped_bufs(ws).items()}
    old = _single(monkeypatch)  # the weight before the update, uncached
    with torch.no_grad():
        m.weight.mul_(0.5).add_(0.03)
    y, dx = _step3(m, rec, x, False)  # reuse: the old bytes stay, and the GEMMs read them
    assert m._fp8_workspaces["weight"] is ws
    if recipe != "delayed":  # (delayed: the scales moved since the caching step)
        y_ref, dx_ref = _step3(old, rec, x, None)
        assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    for n, t in _grouped_bufs(ws).items():
        assert torch.equal(t, before[n][1]), n
    _step3(m, rec, x, True)  # refresh: in place
    assert m._fp8_workspaces["weight"] is ws
    after = _grouped_bufs(ws)
    assert {n: t.data_ptr() for n, t in after.items()} == {n: p for n, (p, _) in before.items()}
    assert not torch.equal(after["rowwise_data"], before["rowwise_data"][1])


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_single_grouped_weight_cached_equals_uncached(monkeypatch, recipe):
    """Each expert's member holds exactly its own cast (delayed scaling: its own scale): outputs
    and gradients of cached microbatches equal uncached ones bit for bit."""
    rec = RECIPES[recipe]()
    cached, plain = _single(monkeypatch), _single(monkeypatch)
    xs = [torch.randn(64, HIDDEN, dtype=BF16) for _ in range(3)]
    outs = {}
    for tag, m in (("cached", cached), ("plain", plain)):
        with te.autocast(recipe=rec):
            outs[tag] = [_step3(m, rec, x, (i == 0) if tag == "cached" else None)
                         for i, x in enumerate(xs)]
    for i, ((y, dx), (y_ref, dx_ref)) in enumerate(zip(outs["cached"], outs["plain"])):
        assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref), f"microbatch {i}"
    assert torch.equal(cached.weight.grad, plain.weight.grad)


@pytest.mark.parametrize("recipe", ["mxfp8", "block", "nvfp4"])
def test_single_grouped_inference_cast_is_replaced_for_dgrad(monkeypatch, recipe):
    """TE's check on the grouped workspace: one cached without column-wise data (no input
    gradient) is replaced when a later microbatch's backward needs it."""
    rec = RECIPES[recipe]()
    cached, plain = _single(monkeypatch), _single(monkeypatch)
    x = torch.randn(64, HIDDEN, dtype=BF16)
    with torch.no_grad(), te.autocast(recipe=rec):
        _call3(cached, x, True)
    ws = cached._fp8_workspaces["weight"]
    assert ws.columnwise_data is None
    y, dx = _step3(cached, rec, x, False)
    new = cached._fp8_workspaces["weight"]
    assert new is not ws and new.columnwise_data is not None
    y_ref, dx_ref = _step3(plain, rec, x, None)
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)


@pytest.mark.parametrize("recipe", ["mxfp8", "block", "nvfp4"])
def test_single_grouped_inference_refresh_keeps_columnwise_current(monkeypatch, recipe):
    """A refresh under no_grad rewrites the column-wise data the workspace holds too, so a later
    training microbatch's dgrad reads the new weight."""
    rec = RECIPES[recipe]()
    cached, plain = _single(monkeypatch), _single(monkeypatch)
    x = torch.randn(64, HIDDEN, dtype=BF16)
    _step3(cached, rec, x, True)
    with torch.no_grad():
        for m in (cached, plain):
            m.weight.mul_(0.5).add_(0.03)
        with te.autocast(recipe=rec):
            _call3(cached, x, True)
    y, dx = _step3(cached, rec, x, False)
    y_ref, dx_ref = _step3(plain, rec, x, None)
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)


def test_single_grouped_fp8_primary_weight_is_not_cached(monkeypatch):
    """TE: a primary FP8 grouped weight bypasses the workspace (no "weight" entry)."""
    with te.quantized_model_init(enabled=True, recipe=RECIPES["mxfp8"]()):
        m = _single(monkeypatch)
    _step3(m, RECIPES["mxfp8"](), torch.randn(64, HIDDEN, dtype=BF16), True)
    assert m._fp8_workspaces == {}


# ----------------------------------------------------------------- weight quantizers
@pytest.mark.parametrize("module", list(MODULES))
@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "nvfp4-1d", "current"])
def test_weight_quantizers_record_the_preswizzle_choice(module, recipe):
    """TE's _get_weight_quantizers(): one per weight (module.quantizers' forward weight slots),
    [None] outside an autocast; each forward writes TE's _enable_weight_preswizzle into their
    optimize_for_gemm, which the cached casts follow (MXFP8 always, NVFP4 2D at these shapes,
    neither NVFP4 1D nor per-tensor FP8)."""
    rec = (RECIPES["nvfp4"](disable_2d_quantization=True) if recipe == "nvfp4-1d"
           else RECIPES[recipe]())
    m = _build(module)
    assert m._get_weight_quantizers() == [None] * len(MODULES[module][1])
    x = torch.randn(32, HIDDEN, dtype=BF16)
    with te.autocast(recipe=rec):
        y = _call(m, x, True)
        qs = m._get_weight_quantizers()
    y.float().sum().backward()
    want = recipe in ("mxfp8", "nvfp4")
    assert len(qs) == len(MODULES[module][1])
    for q, ws in zip(qs, m._fp8_workspaces.values()):
        assert q is not None and q.internal
        assert q.optimize_for_gemm is want
        assert getattr(ws, "_with_gemm_swizzled_scales", False) is want


def test_enable_weight_preswizzle_rules():
    """TE's rule: never for FP8 primary weights; NVFP4 2D only for 128-aligned weights."""
    from transformer_engine_lite.pytorch.tensor import MXFP8Quantizer, NVFP4Quantizer

    m = te.Linear(64, 96, params_dtype=BF16)
    w128, w96 = torch.empty(128, 256), torch.empty(96, 64)
    q2d = NVFP4Quantizer(with_2d_quantization=True)
    assert m._enable_weight_preswizzle(MXFP8Quantizer(te.DType.kFloat8E4M3), w96)
    assert m._enable_weight_preswizzle(q2d, w128)
    assert not m._enable_weight_preswizzle(q2d, w96)
    assert not m._enable_weight_preswizzle(NVFP4Quantizer(), w128)  # 1D, no RHT
    with te.quantized_model_init(enabled=True, recipe=RECIPES["mxfp8"]()):
        p = te.Linear(64, 96, params_dtype=BF16)
    assert not p._enable_weight_preswizzle(MXFP8Quantizer(te.DType.kFloat8E4M3), w96)
