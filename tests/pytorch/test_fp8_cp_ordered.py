"""FP8 attention's remaining device-dependent steps made canonical (attention/_canonical_math.py):
the sink softmax (softmax_type off-by-one / learnable) with the sink's and a learnable bias's
gradient, and FP8 context parallelism (cp_fp8.py: p2p ring, all_gather, a2a+p2p) with its GEMMs,
per-step LSE / probabilities and LSE merge.

The oracle is independent of our ops and of torch's exp / log:
- GEMMs and every ordered sum / broadcast: test_fp8_attention_ordered.py's NumPy fmaf chain
  (oracle_mm; a row sum is a chain against ones, so the sequential fp32 sum in index order);
- exp and log: the published definitions (_canonical_math's docstring) re-implemented in NumPy
  fp32 (IEEE single add / sub / mul / div, rint, bit operations), checked here against fp64
  (max error 2 ulp) and bit for bit against the ops over sweeps and special values.
The module then runs once as shipped and once with these primitives swapped in (the quantization
points and elementwise steps are the module's own in both runs): output, dq, dk, dv,
softmax_offset's and the bias's gradients, amax histories and scales equal bit for bit; and the
same with torch.set_num_threads 1 and 2. The CP cases run in 2 and 4 gloo processes.
"""

from __future__ import annotations

import contextlib
import gc
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
from test_context_parallel import _groups, _shard, _spawn
from test_context_parallel_fp8_ring import _inputs, _run
from test_fp8_attention_ordered import _OracleExpand, _OracleMatmul, _same_bytes

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe as R
from transformer_engine_lite.pytorch.attention import _canonical_math as cm
from transformer_engine_lite.pytorch.attention import backends
from transformer_engine_lite.pytorch.attention.dot_product_attention import cp_fp8

F32 = np.float32


# ------------------------------------------------------------------------ the NumPy primitives
def np_exp(x: np.ndarray) -> np.ndarray:
    """_canonical_math's exp definition in NumPy fp32."""
    x = np.asarray(x, F32)
    xc = np.clip(x, F32(-110.0), F32(100.0))
    k = np.rint(xc * F32(cm.LOG2E))
    r = (xc - k * F32(cm.LN2_HI)) - k * F32(cm.LN2_LO)
    p = np.full_like(r, F32(cm.EXP_COEFFS[0]))
    for c in cm.EXP_COEFFS[1:]:
        p = p * r + F32(c)
    ki = np.where(np.isnan(k), F32(0), k).astype(np.int32)
    k1 = ki >> 1
    s1 = ((k1 + 127) << 23).astype(np.int32).view(F32)
    s2 = ((ki - k1 + 127) << 23).astype(np.int32).view(F32)
    with np.errstate(over="ignore", under="ignore"):
        return (p * s1) * s2


def np_log(x: np.ndarray) -> np.ndarray:
    """_canonical_math's log definition in NumPy fp32."""
    x = np.asarray(x, F32)
    sub = x < F32(2.0**-126)
    with np.errstate(over="ignore"):  # the scaled branch is only taken for tiny x
        t = np.where(sub, x * F32(2.0**24), x).astype(F32)
    bits = t.view(np.int32)
    e = (bits >> 23) - 127 - sub.astype(np.int32) * 24
    m = ((bits & 0x7FFFFF) | 0x3F800000).astype(np.int32).view(F32)
    big = m > F32(cm.SQRT2)
    m = np.where(big, m * F32(0.5), m)
    e = e + big.astype(np.int32)
    f = m - F32(1)
    z = f / (f + F32(2))
    w = z * z
    s = np.full_like(w, F32(cm.LOG_COEFFS[0]))
    for c in cm.LOG_COEFFS[1:]:
        s = s * w + F32(c)
    z2 = z + z
    lm = z2 + z2 * (w * s)
    ef = e.astype(F32)
    y = ef * F32(cm.LN2_HI) + (ef * F32(cm.LN2_LO) + lm)
    y = np.where(x == 0, F32(-np.inf), y)
    y = np.where(x == np.inf, x, y)
    return np.where((x < 0) | np.isnan(x), F32(np.nan), y).astype(F32)


class _OracleExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.from_numpy(np_exp(x.detach().numpy()))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return torch.from_numpy(g.numpy() * y.numpy())


class _OracleLog(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.from_numpy(np_log(x.detach().numpy()))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return torch.from_numpy(g.numpy() / x.detach().numpy())


def _oracle_mm(a, b, transb=False):
    return _OracleMatmul.apply(a, b, transb)


PATCHES = [
    (backends, "ordered_matmul", _oracle_mm),
    (backends, "expand_heads", _OracleExpand.apply),
    (cp_fp8, "ordered_matmul", _oracle_mm),
    (cp_fp8, "expand_heads", _OracleExpand.apply),
    (cm, "ordered_matmul", _oracle_mm),
    (cm, "exp", _OracleExp.apply),
    (cm, "log", _OracleLog.apply),
]


@contextlib.contextmanager
def oracle():
    """The module's primitives swapped for the NumPy oracle's (also inside forked workers)."""
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in PATCHES]
    for mod, name, fn in PATCHES:
        setattr(mod, name, fn)
    try:
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


@contextlib.contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------- FP8 context parallelism
# (name, cp_comm_type, recipe, mask, window, fmt, fp8_output): test_context_parallel_fp8_ring's
# case tuples (its _run: H 4, HKV 2 -- GQA -- D 16).
CP_CASES = {
    2: [
        ("p2p_delayed_causal_bshd", "p2p", "delayed", "causal", None, "bshd", False),
        ("p2p_current_nomask_sbhd", "p2p", "current", "no_mask", None, "sbhd", False),
        ("p2p_current_causal_bshd_mha", "p2p", "current", "causal", None, "bshd", True),
        ("ag_delayed_causal_sbhd", "all_gather", "delayed", "causal", None, "sbhd", False),
        ("ag_current_nomask_bshd", "all_gather", "current", "no_mask", None, "bshd", False),
    ],
    4: [
        ("p2p_delayed_nomask_bshd", "p2p", "delayed", "no_mask", None, "bshd", False),
        ("a2a+p2p_delayed_causal_bshd", "a2a+p2p", "delayed", "causal", None, "bshd", False),
        ("a2a+p2p_current_nomask_sbhd", "a2a+p2p", "current", "no_mask", None, "sbhd", True),
        ("ag_current_causal_sbhd", "all_gather", "current", "causal", None, "sbhd", False),
    ],
}
SEQ = 16


def _cp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for case in CP_CASES[world]:
            sdim = 1 if case[5] == "bshd" else 0
            args = [_shard(t, sdim, world, rank) for t in _inputs(case, SEQ)]
            group = _groups(world, case[1])
            runs = {}
            for label, ctx, n in (("ours", contextlib.nullcontext(), 1),
                                  ("threads2", contextlib.nullcontext(), 2),
                                  ("oracle", oracle(), 1)):
                # A dropped FP8 module (this file's earlier tests' in the forked parent, or the
                # previous run's) sits in a reference cycle until the cyclic GC frees it, at a
                # rank-dependent moment; while alive it stays in the FP8 registry, whose amax
                # all-reduce at the update would then differ in size between ranks.
                gc.collect()
                with ctx, threads(n):
                    runs[label] = _run(case, *args, group)
            results[case[0]] = runs
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def cp_runs():
    # The first tests of this file: the workers fork before this process has computed anything
    # (no OpenMP pool yet: a forked child could not start its own for the 2-thread runs).
    return {world: _spawn(world, _cp_worker) for world in (2, 4)}


def _flat(run):
    out, grads, hist, scale_inv = run
    items = [("out", out)] + list(zip(("dq", "dk", "dv"), grads))
    items += [("fwd amax history", hist[0]), ("bwd amax history", hist[1])]
    if scale_inv is not None:
        items.append(("O scale_inv", scale_inv))
    return items


@pytest.mark.parametrize("world", [2, 4])
def test_fp8_cp_matches_oracle_and_threads(world, cp_runs):
    for r in range(world):
        for name, runs in cp_runs[world][r].items():
            for (what, a), (_, w), (_, t2) in zip(*(_flat(runs[k]) for k in
                                                    ("ours", "oracle", "threads2"))):
                _same_bytes(a, w, f"{name} rank {r}/{world}: {what} vs the oracle")
                _same_bytes(a, t2, f"{name} rank {r}/{world}: {what}, threads 1 vs 2")


# ------------------------------------------------------------------------- the primitives
def _sweep() -> np.ndarray:
    g = np.random.default_rng(0)
    return np.concatenate([
        np.linspace(-104, 89, 400_001, dtype=F32),
        (g.standard_normal(100_000) * 30).astype(F32),
        np.array([0.0, -0.0, 1e-30, -1e-30, -87.3, -103.97, -150.0, 88.72, 88.73, 200.0,
                  np.inf, -np.inf, np.nan], F32),
    ])


def test_exp_matches_numpy_definition_and_fp64():
    x = _sweep()
    got = cm.exp(torch.from_numpy(x)).numpy()
    want = np_exp(x)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    ref = np.exp(x.astype(np.float64))
    ok = np.isfinite(ref) & (ref < np.finfo(F32).max) & (ref >= 2.0**-126)
    ulp = np.spacing(ref[ok].astype(F32)).astype(np.float64)
    assert (np.abs(got[ok] - ref[ok]) / ulp).max() <= 2.0
    assert got[x == -np.inf][0] == 0 and got[x == np.inf][0] == np.inf
    assert np.isnan(got[np.isnan(x)]).all() and got[x == 0][0] == 1.0
    # subnormal results: within 2 units of the 2^-149 grid
    tiny = np.isfinite(ref) & (ref < 2.0**-126)
    assert (np.abs(got[tiny] - ref[tiny]) <= 2 * 2.0**-149).all()


def test_log_matches_numpy_definition_and_fp64():
    g = np.random.default_rng(1)
    x = np.concatenate([
        (g.random(200_000) * 1000).astype(F32), (g.random(50_000) * 2 + 0.5).astype(F32),
        (g.random(10_000) * 1e-38).astype(F32), np.float32(2.0) ** np.arange(-149, 128, dtype=F32),
        np.array([0.0, np.inf, -1.0, np.nan, 1.0, np.finfo(F32).max], F32),
    ])
    got = cm.log(torch.from_numpy(x)).numpy()
    want = np_log(x)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))
    ok = np.isfinite(x) & (x > 0)
    ref = np.log(x[ok].astype(np.float64))
    ulp = np.spacing(np.abs(ref).astype(F32)).astype(np.float64)
    assert (np.abs(got[ok] - ref) / ulp).max() <= 2.0
    assert np.isnan(got[x == -1]).all() and got[x == 0][0] == -np.inf
    assert got[x == np.inf][0] == np.inf and got[x == 1][0] == 0


def test_exp_log_backward_and_errors():
    x = torch.randn(100, requires_grad=True)
    y = cm.exp(x)
    g = torch.randn(100)
    y.backward(g)
    assert torch.equal(x.grad, g * y.detach())
    x = (torch.rand(100) + 0.1).requires_grad_(True)
    cm.log(x).backward(g)
    assert torch.equal(x.grad, g / x.detach())
    with pytest.raises(ValueError, match="argument 'x' of dtype torch.float32, got torch.bfloat16"):
        cm.exp(torch.zeros(3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="canonical_log"):
        cm.log(torch.zeros(3, dtype=torch.float64))


def test_ordered_sums_and_broadcast_match_sequential_sum():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 70, generator=g) * torch.exp2(torch.randint(-10, 10, (3, 5, 70),
                                                                     generator=g).float())
    seq = np.zeros((3, 5), F32)
    for j in range(70):  # the sequential sum from +0 in index order
        seq = seq + x[..., j].numpy()
    assert np.array_equal(cm.row_sum(x).numpy().view(np.int32), seq.view(np.int32))
    s = torch.randn(1, 4, 1, 1, generator=g).requires_grad_(True)
    y = cm.ordered_broadcast(s, (3, 4, 6, 1))
    assert torch.equal(y, s.detach().expand(3, 4, 6, 1))
    gy = torch.randn(3, 4, 6, 1, generator=g)
    y.backward(gy)
    want = np.zeros(4, F32)
    for b in range(3):
        for i in range(6):
            want = want + gy[b, :, i, 0].numpy()
    assert np.array_equal(s.grad.reshape(4).numpy().view(np.int32), want.view(np.int32))
    r = torch.randn(2, 3, generator=g).requires_grad_(True)
    e = cm.row_expand(r, 5)
    assert torch.equal(e, r.detach().unsqueeze(-1).expand(2, 3, 5))
    ge = torch.randn(2, 3, 5, generator=g)
    e.backward(ge)
    seq = np.zeros((2, 3), F32)
    for j in range(5):
        seq = seq + ge[..., j].numpy()
    assert np.array_equal(r.grad.numpy().view(np.int32), seq.view(np.int32))


def test_merge_matches_fp64():
    """The canonical LSE merge is the LSE merge: fp32-accurate against fp64, -inf rows kept."""
    g = torch.Generator().manual_seed(3)
    o1, o2 = torch.randn(2, 3, 7, 8, generator=g), torch.randn(2, 3, 7, 8, generator=g)
    l1, l2 = torch.randn(2, 3, 7, generator=g) * 5, torch.randn(2, 3, 7, generator=g) * 5
    l1[0, 0, 0] = l2[0, 0, 0] = float("-inf")
    o1[0, 0, 0] = o2[0, 0, 0] = 0
    out, lse = cm.merge(o1, l1, o2, l2)
    rl = torch.logaddexp(l1.double(), l2.double())
    safe = torch.where(torch.isinf(rl), 0, rl)
    ro = (o1.double() * (l1 - safe).exp().unsqueeze(-1)
          + o2.double() * (l2 - safe).exp().unsqueeze(-1))
    assert lse[0, 0, 0] == float("-inf") and not out[0, 0, 0].any()
    torch.testing.assert_close(lse.double(), rl, rtol=5e-7, atol=5e-7)
    torch.testing.assert_close(out.double(), ro, rtol=2e-6, atol=2e-6)


# ------------------------------------------------------------------- FP8 attention with sinks
RECIPES = {
    "delayed": lambda: R.DelayedScaling(fp8_dpa=True, amax_history_len=4),
    "current": lambda: R.Float8CurrentScaling(fp8_dpa=True),
}


def _sink_run(mode, mask, h_kv, softmax_type, bias=False, steps=2, b=2, s=21, h=4, d=16):
    """Per step: the output and dq, dk, dv, d softmax_offset (learnable), d bias (bias)."""
    torch.manual_seed(0)
    dpa = te.DotProductAttention(h, d, num_gqa_groups=h_kv, qkv_format="bshd",
                                 attn_mask_type=mask, softmax_type=softmax_type)
    if softmax_type == "learnable":
        with torch.no_grad():
            dpa.softmax_offset.copy_(torch.tensor([-1.0, 0.5, 2.0, 0.0]))
    recipe = RECIPES[mode]()
    results = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        q = torch.randn(b, s, h, d, generator=gen).requires_grad_(True)
        k = (torch.randn(b, s, h_kv, d, generator=gen) * 1.5).requires_grad_(True)
        v = (torch.randn(b, s, h_kv, d, generator=gen) * 2.0).requires_grad_(True)
        kw = {}
        if bias:
            kw = dict(core_attention_bias_type="post_scale_bias",
                      core_attention_bias=torch.randn(1, h, s, s, generator=gen)
                      .requires_grad_(True))
        with te.fp8_autocast(fp8_recipe=recipe):
            out = dpa(q, k, v, **kw)
        out.backward(torch.randn(out.shape, generator=gen))
        res = [out.detach().clone(), q.grad, k.grad, v.grad]
        if softmax_type == "learnable":
            res.append(dpa.softmax_offset.grad.clone())
            dpa.softmax_offset.grad = None
        if bias:
            res.append(kw["core_attention_bias"].grad)
        results.append(res)
    return results


SINK_CASES = [
    ("delayed", "causal", 2, "learnable", False),
    ("current", "no_mask", 4, "learnable", False),
    ("delayed", "no_mask", 1, "off-by-one", False),
    ("current", "causal", 2, "off-by-one", False),
    ("current", "no_mask", 4, "learnable", True),
]


@pytest.mark.parametrize("mode, mask, h_kv, softmax_type, bias", SINK_CASES)
def test_fp8_sinks_match_oracle(mode, mask, h_kv, softmax_type, bias):
    got = _sink_run(mode, mask, h_kv, softmax_type, bias)
    with oracle():
        want = _sink_run(mode, mask, h_kv, softmax_type, bias)
    names = ["out", "dq", "dk", "dv"] + ["d softmax_offset"] * (softmax_type == "learnable")
    names += ["d bias"] * bias
    for step, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(names)
        for name, a, b in zip(names, g, w):
            _same_bytes(a, b, f"{mode} {mask} h_kv={h_kv} {softmax_type} step {step}: {name}")
    if softmax_type == "learnable":
        assert got[0][4].abs().max() > 1e-3  # the sink matters


def test_fp8_sinks_same_bytes_across_threads():
    with threads(1):
        one = _sink_run("current", "causal", 2, "learnable", steps=1, s=70, d=32)
    with threads(2):
        two = _sink_run("current", "causal", 2, "learnable", steps=1, s=70, d=32)
    for name, a, b in zip(("out", "dq", "dk", "dv", "d offset"), one[0], two[0]):
        _same_bytes(a, b, f"threads 1 vs 2: {name}")
