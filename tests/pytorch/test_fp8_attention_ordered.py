"""FP8 attention's GEMMs in the canonical order (te_lite::ordered_bmm, core
nvte_ordered_batched_gemm): every output an fmaf chain over K in index order from +0, so a CUDA/HIP
run gives the CPU's bytes (test_gpu_parity.py checks that on a device).

The oracle here is independent of the op: a NumPy fmaf chain. fp32 x fp32 products are exact in
fp64 (48 significant bits of 53); the sum p + c is computed in fp64 with its exact error (TwoSum)
and rounded to odd (when inexact and the last bit is even, one ulp towards the error), and the
round-to-odd fp64 value rounds to the correctly rounded fp32 (53 >= 2 * 24 + 2 bits: Boldo and
Melquiond, "When double rounding is odd"). So _fmaf(a, b, c) == fmaf(a, b, c) bit for bit, for the
finite values used here, vectorised over all outputs, one K step at a time, in index order.

Checked: the op against the oracle (every transpose, tails, K = 0, leading dims, its backward);
the FP8 DotProductAttention forward + backward (delayed and current scaling, causal / no mask, GQA,
fp8_output) against the same module with its GEMMs and GQA head expansion swapped for the oracle's
(the quantization points, softmax and elementwise steps are the module's own in both runs), bit for
bit; and thread counts 1 and 2 giving the same bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe as R
from transformer_engine_lite.pytorch.attention import backends


# ------------------------------------------------------------------------------------- the oracle
def _fmaf(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fmaf(a, b, c) elementwise for fp32 arrays (see the module docstring)."""
    p = a.astype(np.float64) * b.astype(np.float64)  # exact
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)  # TwoSum: p + c == s + err exactly
    even = (s.view(np.int64) & 1) == 0
    fix = (err != 0) & even
    s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def oracle_mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a [..., m, K] . b [..., K, n] as fmaf chains over K in index order from +0."""
    a = np.ascontiguousarray(a, np.float32)
    b = np.ascontiguousarray(b, np.float32)
    c = np.zeros((*a.shape[:-1], b.shape[-1]), np.float32)
    for q in range(a.shape[-1]):
        c = _fmaf(a[..., :, q : q + 1], b[..., q : q + 1, :], c)
    return c


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()


class _OracleMatmul(torch.autograd.Function):
    """ordered_matmul's contract with the oracle: y = a . op(b); da = dy . op(b)^T,
    d op(b) = a^T . dy (transposed back when transb)."""

    @staticmethod
    def forward(ctx, a, b, transb):
        ctx.save_for_backward(a, b)
        ctx.transb = transb
        bb = _np(b).swapaxes(-1, -2) if transb else _np(b)
        return torch.from_numpy(oracle_mm(_np(a), bb))

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        bb = _np(b).swapaxes(-1, -2) if ctx.transb else _np(b)
        da = torch.from_numpy(oracle_mm(_np(dy), bb.swapaxes(-1, -2)))
        dbb = oracle_mm(_np(a).swapaxes(-1, -2), _np(dy))
        db = torch.from_numpy(np.ascontiguousarray(dbb.swapaxes(-1, -2) if ctx.transb else dbb))
        return da, db, None


class _OracleExpand(torch.autograd.Function):
    """GQA: each KV head repeated for its group; its gradient the group's sum, g0 + g1 + ...,
    in fp32, in index order."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return torch.from_numpy(np.repeat(_np(x), group, axis=1))

    @staticmethod
    def backward(ctx, g):
        gg = _np(g)
        b, h, s, d = gg.shape
        gg = gg.reshape(b, h // ctx.group, ctx.group, s, d)
        acc = gg[:, :, 0].copy()
        for i in range(1, ctx.group):
            acc = acc + gg[:, :, i]
        return torch.from_numpy(acc), None


def _oracle_patch(monkeypatch):
    monkeypatch.setattr(backends, "ordered_matmul",
                        lambda a, b, transb=False: _OracleMatmul.apply(a, b, transb))
    monkeypatch.setattr(backends, "expand_heads", _OracleExpand.apply)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def _same_bytes(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, what
    bad = (_bits(a) != _bits(b)).sum().item()
    assert bad == 0, f"{what}: {bad} of {a.numel()} elements differ"


def _values(n: int, g: torch.Generator) -> torch.Tensor:
    """fp32 values over ~2^-20 .. 2^20 of either sign: every rounding of the chain shows."""
    mant = torch.rand(n, generator=g) + 1.0
    exp = torch.randint(-20, 21, (n,), generator=g).float()
    sign = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
    return sign * mant * torch.exp2(exp)


# ------------------------------------------------------------------------------------ the op
@pytest.mark.parametrize("transa", [False, True])
@pytest.mark.parametrize("transb", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 7, 13, 5), (2, 97, 65, 33), (2, 6, 17, 0),
                                   (1, 20, 130, 300)])
def test_op_matches_oracle(transa, transb, shape):
    bsz, m, n, k = shape
    g = torch.Generator().manual_seed(m * 131 + n * 7 + k)
    a = _values(bsz * m * k, g).reshape(bsz, k, m) if transa else \
        _values(bsz * m * k, g).reshape(bsz, m, k)
    b = _values(bsz * k * n, g).reshape(bsz, n, k) if transb else \
        _values(bsz * k * n, g).reshape(bsz, k, n)
    got = torch.ops.te_lite.ordered_bmm(a, b, transa, transb)
    aa = _np(a).swapaxes(-1, -2) if transa else _np(a)
    bb = _np(b).swapaxes(-1, -2) if transb else _np(b)
    _same_bytes(got, torch.from_numpy(oracle_mm(aa, bb)), f"ordered_bmm {shape} {transa} {transb}")


def test_oracle_is_an_fma():
    """The oracle rounds once per term: fmaf(a, a, -(1 + 2^-11)) with a = 1 + 2^-12 is 2^-24
    (a multiply then an add would give 0); and a rounding case decided by the sticky bits."""
    a = np.float32(1 + 2.0**-12)
    assert _fmaf(np.array([a]), np.array([a]), np.array([np.float32(-(1 + 2.0**-11))]))[0] == \
        np.float32(2.0**-24)
    x = torch.tensor([[1.0, 1 + 2.0**-12]]), torch.tensor([[-(1 + 2.0**-11)], [1 + 2.0**-12]])
    assert torch.ops.te_lite.ordered_bmm(*x, False, False).item() == 2.0**-24
    # A sum 2^-60 below an fp32 midpoint: 1 + 2^-23 + (2^-24 - 2^-60) rounds down to 1 + 2^-23;
    # plain fp64 would round it onto the midpoint first (a tie, to even: 1 + 2^-22).
    a, b = np.float32(2.0**-12 * (1 + 2.0**-18)), np.float32(2.0**-12 * (1 - 2.0**-18))
    c = np.float32(1 + 2.0**-23)
    assert np.float32(np.float64(a) * np.float64(b) + np.float64(c)) == np.float32(1 + 2.0**-22)
    assert _fmaf(np.array([a]), np.array([b]), np.array([c]))[0] == c
    x = torch.tensor([[1.0, float(a)]]), torch.tensor([[float(c)], [float(b)]])
    assert torch.ops.te_lite.ordered_bmm(*x, False, False).item() == float(c)


def test_op_leading_dims_and_backward():
    g = torch.Generator().manual_seed(3)
    a = _values(2 * 3 * 9 * 11, g).reshape(2, 3, 9, 11).requires_grad_(True)
    b = _values(2 * 3 * 10 * 11, g).reshape(2, 3, 10, 11).requires_grad_(True)
    y = torch.ops.te_lite.ordered_bmm(a, b, False, True)
    ar, br = (t.detach().clone().requires_grad_(True) for t in (a, b))
    yr = _OracleMatmul.apply(ar, br, True)
    _same_bytes(y, yr, "forward")
    dy = _values(y.numel(), g).reshape(y.shape)
    y.backward(dy)
    yr.backward(dy)
    _same_bytes(a.grad, ar.grad, "da")
    _same_bytes(b.grad, br.grad, "db")


@pytest.mark.parametrize("transa, transb", [(False, False), (True, False), (True, True)])
def test_op_backward_every_layout(transa, transb):
    g = torch.Generator().manual_seed(int(transa) * 2 + int(transb))
    a = _values(2 * 7 * 5, g).reshape(2, 5, 7) if transa else _values(70, g).reshape(2, 7, 5)
    b = _values(2 * 5 * 6, g).reshape(2, 6, 5) if transb else _values(60, g).reshape(2, 5, 6)
    a.requires_grad_(True)
    b.requires_grad_(True)
    y = torch.ops.te_lite.ordered_bmm(a, b, transa, transb)
    dy = _values(y.numel(), g).reshape(y.shape)
    y.backward(dy)
    aa = _np(a).swapaxes(-1, -2) if transa else _np(a)
    bb = _np(b).swapaxes(-1, -2) if transb else _np(b)
    da = oracle_mm(_np(dy), bb.swapaxes(-1, -2))  # d op(a)
    db = oracle_mm(aa.swapaxes(-1, -2), _np(dy))  # d op(b)
    _same_bytes(a.grad, torch.from_numpy(np.ascontiguousarray(da.swapaxes(-1, -2) if transa
                                                               else da)), "da")
    _same_bytes(b.grad, torch.from_numpy(np.ascontiguousarray(db.swapaxes(-1, -2) if transb
                                                               else db)), "db")


def test_op_errors():
    f32 = torch.zeros(2, 3, 4)
    with pytest.raises(RuntimeError, match="argument 'a': expected dtype"):
        torch.ops.te_lite.ordered_bmm(f32.bfloat16(), torch.zeros(2, 4, 5), False, False)
    with pytest.raises(RuntimeError, match="same K"):
        torch.ops.te_lite.ordered_bmm(f32, torch.zeros(2, 5, 5), False, False)
    with pytest.raises(RuntimeError, match="same leading"):
        torch.ops.te_lite.ordered_bmm(f32, torch.zeros(3, 4, 5), False, False)
    with pytest.raises(RuntimeError, match="argument 'b': expected at least 2"):
        torch.ops.te_lite.ordered_bmm(f32, torch.zeros(4), False, False)


# ------------------------------------------------------------------------------ FP8 attention
RECIPES = {
    "delayed": lambda: R.DelayedScaling(fp8_dpa=True, amax_history_len=4),
    "current": lambda: R.Float8CurrentScaling(fp8_dpa=True),
}


def _run(mode, mask, h_kv, fp8_output, steps=2, b=2, s=33, h=4, d=16):
    """Per step: output (values) and dq, dk, dv of a fresh-seeded FP8 DotProductAttention."""
    torch.manual_seed(0)
    dpa = te.DotProductAttention(h, d, num_gqa_groups=h_kv, qkv_format="bshd",
                                 attn_mask_type=mask)
    recipe = RECIPES[mode]()
    results = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        q = (torch.randn(b, s, h, d, generator=gen)).requires_grad_(True)
        k = (torch.randn(b, s, h_kv, d, generator=gen) * 1.5).requires_grad_(True)
        v = (torch.randn(b, s, h_kv, d, generator=gen) * 2.0).requires_grad_(True)
        with te.fp8_autocast(fp8_recipe=recipe):
            out = dpa(q, k, v, fp8_output=fp8_output)
        if fp8_output:
            assert isinstance(out, te.Float8Tensor)
            vals = out.dequantize()
        else:
            vals = out
        dy = torch.randn(vals.shape, generator=gen)
        vals.backward(dy)
        results.append((vals.detach().clone(), q.grad, k.grad, v.grad))
    return results


CASES = [
    ("delayed", "no_mask", 4, False),
    ("delayed", "causal", 2, False),
    ("current", "causal", 4, False),
    ("current", "no_mask", 1, False),
    ("delayed", "causal", 1, True),
    ("current", "no_mask", 2, True),
]


@pytest.mark.parametrize("mode, mask, h_kv, fp8_output", CASES)
def test_dpa_matches_oracle(mode, mask, h_kv, fp8_output, monkeypatch):
    """Two steps (delayed scaling: the second with the scales the first recorded): the output and
    the three gradients equal those of the oracle's GEMMs, bit for bit."""
    got = _run(mode, mask, h_kv, fp8_output)
    _oracle_patch(monkeypatch)
    want = _run(mode, mask, h_kv, fp8_output)
    for step, (g, w) in enumerate(zip(got, want)):
        for name, a, b in zip(("out", "dq", "dk", "dv"), g, w):
            _same_bytes(a, b, f"{mode} {mask} h_kv={h_kv} fp8_output={fp8_output} step {step}: "
                              f"{name}")


def test_dpa_same_bytes_across_threads():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _run("current", "causal", 2, False, steps=1, s=70, d=32)
        torch.set_num_threads(2)
        two = _run("current", "causal", 2, False, steps=1, s=70, d=32)
    finally:
        torch.set_num_threads(before)
    for name, a, b in zip(("out", "dq", "dk", "dv"), one[0], two[0]):
        _same_bytes(a, b, f"threads 1 vs 2: {name}")


def test_high_precision_path_unchanged(monkeypatch):
    """Without FP8 attention the unfused backend keeps its own GEMMs: the ordered op never runs."""
    calls = []
    monkeypatch.setattr(backends, "ordered_matmul", lambda *a, **k: calls.append(1))
    dpa = te.DotProductAttention(4, 16, qkv_format="bshd")
    q, k, v = (torch.randn(2, 9, 4, 16) for _ in range(3))
    dpa(q, k, v)
    assert not calls
