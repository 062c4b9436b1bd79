"""The AOTriton backend's Triton kernels (common/aotriton/kernels) run on the CPU by Triton's
interpreter (TRITON_INTERPRET=1), through launch.py, which packs arguments from variants.py exactly
as the C++ glue does. Checked: forward O / LSE and backward dQ / dK / dV against an fp64 reference
(error <= 2x plain torch's in the low-precision dtype + a floor, attention_ref.check_bound) and
against the core's CPU flash kernel (torch.ops.te_lite.fused_attn_fwd / _bwd) on the same inputs,
dropout masks bit for bit against fused_attn_dropout_mask, the CPU kernel's conventions for masked
and padded rows, and the kernels' parameter lists against variants.py's ABI.

Triton picks interpreter or compiler when a function is decorated: TRITON_INTERPRET=1 is set
before the kernels are imported, restored afterwards (later test modules keep their environment),
and set again around each test (triton reads it while launching). aotriton_interp_shim makes the
run independent of what imported triton first and fixes the interpreter's bf16 dot and rounding;
the kernels themselves are exactly what build_tools/aotriton.py compiles.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
from dataclasses import dataclass, field

import pytest
import torch

_PREV_INTERPRET = os.environ.get("TRITON_INTERPRET")
os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    triton = pytest.importorskip("triton")
    import triton.language as tl

    from transformer_engine_lite.common.aotriton.kernels import (
        flash_bwd,
        flash_fwd,
        launch,
        philox,
        variants,
    )

    @triton.jit
    def _dot_cast_kernel(A, B, C, D, N: tl.constexpr):
        """C = A.B (fp32) and D = C rounded to A's dtype, for the shim check."""
        r = tl.arange(0, N)
        a = tl.load(A + r[:, None] * N + r[None, :])
        b = tl.load(B + r[:, None] * N + r[None, :])
        c = tl.dot(a, b)
        tl.store(C + r[:, None] * N + r[None, :], c)
        tl.store(D + r[:, None] * N + r[None, :], c.to(A.dtype.element_ty))
finally:
    if _PREV_INTERPRET is None:
        os.environ.pop("TRITON_INTERPRET", None)

import aotriton_interp_shim
from attention_ref import (
    BF16,
    FP16,
    Case,
    allowed_keys,
    build_layout,
    canonical_grads,
    check_bound,
    cu_seqlens,
    make_problem,
    reference,
    sizes,
    to_format,
)
from utils import assert_close

from transformer_engine_lite.pytorch.attention.inputs import check_window

aotriton_interp_shim.install()
ops = torch.ops.te_lite


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    """Every jit function these tests reach runs interpreted, whatever imported triton first
    (and TRITON_INTERPRET=1 while they run: triton checks it again when launching)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with aotriton_interp_shim.interpreted(philox, flash_fwd, flash_bwd, sys.modules[__name__]):
        yield


NEG_INF = float("-inf")
LSE_ATOL = 1e-4  # fp32 LSE of the rounded inputs: only the fp32 summation order differs


# ===================================================================================== problems
@dataclass(frozen=True)
class Run:
    """One test problem: the attention Case (layout, mask, dtype, sizes, window), dropout, and
    BLOCK_M / BLOCK_N overrides (None: the arch family's config from variants.py)."""

    case: Case
    p: float = 0.0
    arch: str = "nvidia"
    blocks: dict | None = field(default=None, hash=False)

    def id(self) -> str:
        extra = f"-p{self.p}" if self.p else ""
        if self.blocks:
            extra += f"-blk{self.blocks['BLOCK_M']}x{self.blocks['BLOCK_N']}"
        return f"{self.case.id()}{extra}-{self.arch}"


SMALL = {"BLOCK_M": 16, "BLOCK_N": 32}  # many blocks per row: exercises block skipping
B, S, T = "bshd_bshd_bshd", "sbhd_sbhd_sbhd", "thd_thd_thd"
# fmt: off
RUNS = [
    # dtype x head dim (64, 128, padded 80 / 40) x mask x GQA (h_kv 4, 2, 1) x dropout x lengths
    # (1, 17, 127, 129) x layout, pairwise-ish; arch: which family's BLOCK_M / BLOCK_N config
    Run(Case(B, "no_mask", BF16, b=2, sq=17, h=4, d=64)),
    Run(Case(B, "causal", FP16, b=2, sq=127, h=4, h_kv=2, d=64), blocks=SMALL),
    Run(Case(S, "causal_bottom_right", BF16, b=2, sq=17, skv=129, h=4, h_kv=1, d=128)),
    Run(Case(T, "padding", FP16, b=2, sq=129, h=2, d=80), arch="amd"),
    Run(Case(B, "padding", BF16, b=2, sq=129, skv=17, h=4, h_kv=2, d=64, padding_via="cu"), p=0.2),
    Run(Case(S, "padding_causal", FP16, b=2, sq=129, skv=127, h=2, h_kv=1, d=64), p=0.3,
        blocks=SMALL),
    Run(Case(T, "padding_causal_bottom_right", BF16, b=2, sq=17, skv=129, h=4, h_kv=2, d=128),
        arch="amd"),
    Run(Case(B, "causal", FP16, b=1, sq=129, skv=17, h=2, d=40)),
    Run(Case(B, "causal_bottom_right", BF16, b=1, sq=129, skv=17, h=2, d=64), blocks=SMALL),
    Run(Case(S, "no_mask", FP16, b=2, sq=1, skv=127, h=4, h_kv=2, d=128), p=0.1),
    # (not one key per row with dropout: there dS = 0 exactly, but FlashAttention's Delta comes
    # from the rounded O = keep_scale * v, so dQ's error is O's rounding, not a multiple of torch's)
    Run(Case(T, "causal_bottom_right", BF16, b=2, sq=1, skv=33, h=2, d=64), p=0.25),
    Run(Case(T, "causal", FP16, b=2, sq=1, h=2, d=64)),
    # packed layouts: q, k, v strided views of one buffer
    Run(Case("bs3hd", "causal", BF16, b=2, sq=33, h=2, d=64)),
    Run(Case("sbhd_sbh2d", "padding", FP16, b=2, sq=17, skv=33, h=4, h_kv=2, d=64,
             padding_via="cu")),
    # sliding windows (causal masks end at the diagonal; the others are bottom-right aligned)
    Run(Case(B, "no_mask", BF16, b=1, sq=127, h=2, d=64, window=(3, 5)), blocks=SMALL),
    Run(Case(B, "causal", FP16, b=2, sq=129, h=4, h_kv=2, d=64, window=(4, 0)), blocks=SMALL),
    Run(Case(T, "padding", BF16, b=2, sq=129, h=2, d=80, window=(10, -1)), p=0.15),
    Run(Case(S, "causal_bottom_right", FP16, b=1, sq=17, skv=129, h=2, d=64, window=(5, 0))),
    Run(Case(B, "no_mask", BF16, b=1, sq=17, skv=33, h=2, d=128, window=(0, 0)), arch="amd"),
    # windows longer than any sequence (the kernels take i32: 2^40 is clamped) are unbounded
    Run(Case(B, "causal_bottom_right", FP16, b=1, sq=33, skv=17, h=2, d=64, window=(2**40, 0)),
        blocks=SMALL),
    Run(Case(S, "no_mask", BF16, b=1, sq=17, skv=33, h=2, d=64, window=(2**31 - 1, 2**40)),
        blocks=SMALL),
]
# fmt: on


def _varlen(case: Case) -> bool:
    return case.fmt == "thd" or "padding" in case.mask


def _setup(run: Run, seed: int = 0) -> dict:
    """Inputs of a run in its layout (dtype-rounded), cu_seqlens, rng_state and the keep mask."""
    case = run.case
    prob = make_problem(case, seed)
    q, k, v, _, _ = build_layout(
        case.layout, prob["q"], prob["k"], prob["v"], prob["lens_q"], prob["lens_kv"], case.dtype
    )
    q, k, v = q.detach(), k.detach(), v.detach()
    skv = sizes(case)[0]
    cu = (cu_seqlens(prob["lens_q"]), cu_seqlens(prob["lens_kv"])) if _varlen(case) else (None,) * 2
    rng = torch.tensor([1234 + seed, 5 + 3 * seed], dtype=torch.int64) if run.p else None
    keep = ops.fused_attn_dropout_mask(rng, case.b, case.h, case.sq, skv, run.p) if run.p else None
    dout = to_format(prob["dout"], case.fmt, prob["lens_q"]).to(case.dtype)
    return {
        "prob": prob,
        "q": q,
        "k": k,
        "v": v,
        "cu": cu,
        "rng": rng,
        "keep": keep,
        "dout": dout,
        "skv": skv,
        "window": check_window("test", case.mask, case.window),
    }


def _kwargs(run: Run, s: dict) -> dict:
    case = run.case
    return {
        "fmt": case.fmt,
        "mask_type": case.mask,
        "window": s["window"],
        "cu_seqlens_q": s["cu"][0],
        "cu_seqlens_kv": s["cu"][1],
        "max_seqlen_q": case.sq,
        "max_seqlen_kv": s["skv"],
        "sm_scale": case.d**-0.5,
        "dropout": run.p,
        "rng_state": s["rng"],
        "arch_family": run.arch,
        "blocks": run.blocks,
    }


def _triton(run: Run, s: dict):
    """(out, lse, dq, dk, dv) of the Triton kernels, in the run's layout."""
    kw = _kwargs(run, s)
    out, lse = launch.run_fwd(s["q"], s["k"], s["v"], **kw)
    dout = s["dout"].reshape(out.shape)
    dq, dk, dv = launch.run_bwd(s["q"], s["k"], s["v"], out, dout, lse, **kw)
    return out, lse, dq, dk, dv


def _cpu(run: Run, s: dict):
    """The same through the core's CPU flash kernel (torch.ops.te_lite)."""
    case = run.case
    left, right = s["window"]
    common = (
        case.layout,
        None,
        *s["cu"],
        case.sq,
        s["skv"],
        case.d**-0.5,
        run.p,
        s["rng"],
        "no_bias",
        case.mask,
        left,
        right,
    )
    out, lse = ops.fused_attn_fwd(s["q"], s["k"], s["v"], *common, True)
    dout = s["dout"].reshape(out.shape)
    dq, dk, dv, _, _ = ops.fused_attn_bwd(s["q"], s["k"], s["v"], out, dout, lse, *common, True)
    return out, lse, dq, dk, dv


def _canonical(run: Run, s: dict, out, dq, dk, dv):
    case, prob = run.case, s["prob"]
    lq, lkv = prob["lens_q"], prob["lens_kv"]
    return (
        canonical_grads(out.view(s["dout"].shape), case.fmt, lq, case.sq),
        canonical_grads(dq, case.fmt, lq, case.sq),
        canonical_grads(dk, case.fmt, lkv, s["skv"]),
        canonical_grads(dv, case.fmt, lkv, s["skv"]),
    )


def ref_lse(run: Run, s: dict) -> torch.Tensor:
    """fp64 LSE [b, h, sq] of the dtype-rounded inputs (what the kernels see): -inf for rows
    without keys and rows past len_q."""
    case, prob = run.case, s["prob"]
    q, k = (prob[n].to(case.dtype).double() for n in ("q", "k"))
    rep = case.h // k.shape[2]
    lse = torch.full((case.b, case.h, case.sq), NEG_INF, dtype=torch.float64)
    for bi in range(case.b):
        lq, lkv = prob["lens_q"][bi], prob["lens_kv"][bi]
        qi = q[bi, :lq].transpose(0, 1)
        ki = k[bi, :lkv].transpose(0, 1).repeat_interleave(rep, 0)
        sc = (qi @ ki.transpose(-1, -2)) * case.d**-0.5
        allowed = allowed_keys(case.mask, case.window, lq, lkv)
        lse[bi, :, :lq] = sc.masked_fill(~allowed, NEG_INF).logsumexp(-1)
    return lse


def check_lse(what: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    """Same -inf rows exactly; finite rows within LSE_ATOL * max(1, |ref|)."""
    got = got.double()
    assert torch.equal(got == NEG_INF, ref == NEG_INF), (
        f"{what}: rows with LSE = -inf differ: got {(got == NEG_INF).nonzero()[:4].tolist()}..., "
        f"expected {(ref == NEG_INF).nonzero()[:4].tolist()}..."
    )
    fin = ref != NEG_INF
    if fin.any():
        err = ((got[fin] - ref[fin]).abs() / ref[fin].abs().clamp(min=1.0)).max().item()
        assert err <= LSE_ATOL, f"{what}: max relative LSE error {err:.3g} > {LSE_ATOL}"


# ===================================================================================== numerics
@pytest.mark.parametrize("run", RUNS, ids=[r.id() for r in RUNS])
def test_fwd_bwd_vs_reference_and_cpu(run: Run):
    case = run.case
    s = _setup(run)
    out, lse, dq, dk, dv = _triton(run, s)
    got = _canonical(run, s, out, dq, dk, dv)
    keep = s["keep"]
    ref_out, ref_grads = reference(case, s["prob"], torch.float64, keep, run.p)
    low_out, low_grads = reference(case, s["prob"], case.dtype, keep, run.p)
    for name, g, r, lo in zip(
        ("out", "dq", "dk", "dv"), got, (ref_out, *ref_grads[:3]), (low_out, *low_grads[:3])
    ):
        check_bound(f"triton {name}", g, r, lo, case.dtype)
    check_lse("triton LSE vs fp64", lse, ref_lse(run, s))

    c_out, c_lse, c_dq, c_dk, c_dv = _cpu(run, s)
    check_lse("triton LSE vs CPU flash", lse, c_lse.double())
    for name, g, c in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), (c_out, c_dq, c_dk, c_dv)):
        assert_close(g, c.reshape(g.shape), case.dtype, f"triton vs CPU flash: {name}")


def test_masked_and_padded_rows_follow_cpu_conventions():
    """Rows past len_q: O = 0, LSE = -inf, dQ = 0; rows with no kept key (bottom-right causal with
    len_q > len_kv): O = 0, LSE = -inf; keys past len_kv: dK = dV = 0 -- exactly, as the CPU
    kernel writes them (flash_fwd_cpu.cpp, flash_bwd_cpu.cpp)."""
    case = Case(
        "bshd_bshd_bshd",
        "padding_causal_bottom_right",
        FP16,
        b=2,
        sq=40,
        skv=24,
        h=2,
        d=64,
        padding_via="cu",
    )
    run = Run(case, blocks=SMALL)
    s = _setup(run)
    lq, lkv = s["prob"]["lens_q"], s["prob"]["lens_kv"]
    results = {"triton": _triton(run, s), "cpu": _cpu(run, s)}
    for who, (out, lse, dq, dk, dv) in results.items():
        for bi in range(case.b):
            empty = lq[bi] - lkv[bi]  # rows i < lq - lkv keep no key (bottom-right diagonal)
            assert empty > 0
            for rows in (slice(lq[bi], None), slice(0, empty)):
                assert not out[bi, rows].any(), f"{who}: O of rows {rows} of seq {bi} not 0"
                assert (lse[bi, :, rows] == NEG_INF).all(), f"{who}: LSE of {rows} not -inf"
            assert not dq[bi, lq[bi] :].any(), f"{who}: dQ of padded rows not 0"
            assert not dq[bi, :empty].any(), f"{who}: dQ of rows without keys not 0"
            assert not dk[bi, lkv[bi] :].any() and not dv[bi, lkv[bi] :].any(), (
                f"{who}: dK / dV of padded keys not 0"
            )
            assert (lse[bi, :, empty : lq[bi]] > NEG_INF).all()


def test_gqa_dkdv_sums_every_head_of_the_group():
    """MQA dK / dV equal the sum over heads of the same problem with K, V repeated per head."""
    case = Case("bshd_bshd_bshd", "causal", FP16, b=1, sq=33, h=4, h_kv=1, d=64)
    run = Run(case)
    s = _setup(run)
    _, _, dq, dk, dv = _triton(run, s)
    rep = {n: s[n].repeat_interleave(4, dim=2) for n in ("k", "v")}
    s_mha = {**s, **rep}
    _, _, dq2, dk2, dv2 = _triton(
        Run(Case("bshd_bshd_bshd", "causal", FP16, b=1, sq=33, h=4, d=64)), s_mha
    )
    assert torch.equal(dq, dq2)
    for g, g2 in ((dk, dk2), (dv, dv2)):
        assert_close(g, g2.float().sum(2, keepdim=True).to(g.dtype), FP16, "GQA group sum")


# ===================================================================================== dropout
@pytest.mark.parametrize(
    "seed,offset,shape,p",
    [
        (42, 7, (2, 3, 17, 33), 0.3),
        (2**40 + 5, 2**35 + 3, (1, 2, 5, 129), 0.5),
        (-3, 2**63 - 1, (1, 1, 3, 7), 0.1),  # seed >= 2^63 as uint64
        (2**32 - 1, 2**32, (2, 1, 1, 130), 0.9),
        (0, 0, (1, 4, 9, 1), 0.25),
    ],
)
def test_dropout_mask_bit_exact(seed, offset, shape, p):
    rng = torch.tensor([seed, offset], dtype=torch.int64)
    want = ops.fused_attn_dropout_mask(rng, *shape, p)
    got = launch.dropout_mask(rng, *shape, p, block=16)
    assert torch.equal(got, want), (
        f"{int((got != want).sum())} of {got.numel()} keep decisions differ, first at "
        f"{(got != want).nonzero()[:4].tolist()}"
    )


def test_dropout_threshold_and_scale_match_core():
    # philox.h: round(p * 2^32) of the fp32 p, saturated; keep scale 1 / (1 - p) in fp32.
    assert launch.dropout_threshold(0.0) == 0
    assert launch.dropout_threshold(0.5) == 2**31
    assert launch.dropout_threshold(1.0 - 2**-30) == 0xFFFFFFFF
    assert launch.keep_scale(0.1) == float(torch.tensor(1.0) / (1.0 - torch.tensor(0.1)))


def test_dropout_changes_with_rng_state():
    """Another offset draws another mask: outputs differ (the kernels read RngState)."""
    case = Case("bshd_bshd_bshd", "no_mask", FP16, b=1, sq=17, h=2, d=64)
    run = Run(case, p=0.5)
    s = _setup(run)
    out1, _ = launch.run_fwd(s["q"], s["k"], s["v"], **_kwargs(run, s))
    kw = _kwargs(run, s)
    kw["rng_state"] = s["rng"] + torch.tensor([0, 1])
    out2, _ = launch.run_fwd(s["q"], s["k"], s["v"], **kw)
    assert not torch.equal(out1, out2)


# ===================================================================================== shim, ABI
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_interpreter_shim_dot_and_rounding(dtype):
    """tl.dot of bf16 is a real product (not of the raw bits) and fp32 -> bf16 rounds to nearest
    even as torch does."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 16, generator=g).to(dtype) for _ in range(2))
    c = torch.empty(16, 16)
    d = torch.empty(16, 16, dtype=dtype)
    _dot_cast_kernel[(1,)](a, b, c, d, N=16)
    want = a.double() @ b.double()
    assert (c.double() - want).abs().max().item() < 1e-4
    assert torch.equal(d, c.to(dtype))


def test_kernel_params_match_variants_abi():
    """Each kernel's non-constexpr params, in order, are variants.py's list; every name is in the
    ABI vocabulary with its ABI type; constexprs are BLOCK_M, BLOCK_N, BLOCK_D."""
    assert len(set(variants.ABI_NAMES)) == len(variants.ABI_NAMES)
    assert set(variants.ABI_TYPES) == set(variants.ABI_NAMES)
    for k in variants.KERNELS:
        fn = variants.jit_function(k["name"])
        params = inspect.signature(fn.fn).parameters.values()
        is_cx = {p.name: p.annotation in (tl.constexpr, "tl.constexpr") for p in params}
        names = [n for n, cx in is_cx.items() if not cx]
        assert names == [n for n, _ in k["params"]], f"{k['name']}: params differ from variants"
        assert tuple(n for n, cx in is_cx.items() if cx) == k["constexprs"] == variants.CONSTEXPRS
        for n, t in k["params"]:
            assert n in variants.ABI_NAMES, f"{k['name']}: {n} not in ABI_NAMES"
            assert t == variants.ABI_TYPES[n], f"{k['name']}: {n} typed {t}"
        assert k["grid"][0] in variants.GRID_AXIS0 and k["grid"][1] in variants.GRID_AXIS1
        sig = variants.signature(k["name"], "bf16")
        assert list(sig) == list(is_cx), f"{k['name']}: signature order"


@pytest.mark.parametrize("family", variants.ARCH_FAMILIES)
def test_every_variant_has_a_config(family):
    for k in variants.KERNELS:
        for dtype in variants.DTYPES:
            for bd in variants.BLOCK_DS:
                cfg = variants.config(k["name"], family, dtype, bd)
                assert set(cfg) == {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}
                # tl.dot needs >= 16 per dim; powers of two for tl.arange
                for blk in (cfg["BLOCK_M"], cfg["BLOCK_N"]):
                    assert blk >= 16 and blk & (blk - 1) == 0
    with pytest.raises(KeyError, match="arch family"):
        variants.config("attn_fwd", "intel", "bf16", 64)
    assert variants.block_d_for(80) == 128 and variants.block_d_for(32) == 64


def test_launcher_rejects_bad_arguments():
    q = torch.zeros(1, 4, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="one dtype"):
        launch.run_fwd(q, q.float(), q)
    with pytest.raises(ValueError, match="cu_seqlens"):
        launch.run_fwd(q, q, q, mask_type="padding")
    with pytest.raises(ValueError, match="rng_state"):
        launch.run_fwd(q, q, q, dropout=0.1)
    with pytest.raises(ValueError, match="exceeds"):
        z = torch.zeros(1, 4, 2, 192, dtype=torch.float16)
        launch.run_fwd(z, z, z)


def test_empty_problem_launches_nothing():
    q = torch.zeros(0, 4, 2, 64, dtype=torch.bfloat16)
    out, lse = launch.run_fwd(q, q, q)
    assert out.shape == q.shape and lse.shape == (0, 2, 4)
    assert math.isclose(launch.keep_scale(0.5), 2.0)
