"""DotProductAttention and its backends against an fp64 reference (attention_ref.py), per mode.

ci/pytorch.sh runs this file once per attention backend configuration; NVTE_ATTN_CI_MODE names it
and configure_fused_attn_env (ci/_utils.sh) has set the switches:
  auto      no switch: flash for what it supports, unfused for the rest (pre_scale_bias, masks)
  flash     ck and aotriton off: as auto
  unfused   flash (and ck, aotriton) off: everything runs the framework math
  ck / aotriton   only that backend (+ unfused) on: not built here, so the selection falls back to
            unfused (asserted); the numerics of a backend that is not built are skipped.
Every case of CASES runs through DotProductAttention (the expected backend asserted), and is
compared with an fp64 reference and with the same math in plain torch in the low-precision dtype
(error <= 2x torch's + a floor, utils.ATTENTION_FLOOR), forward and dq/dk/dv/dbias; the flash
backend is also compared with UnfusedDotProductAttention called directly. Module tests:
test_attention_modules.py; errors for bad arguments: test_attention_args.py; op schema checks
(opcheck): test_ops_attention.py.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace

import pytest
import torch
from attention_ref import (
    BF16,
    FP16,
    FP32,
    NAMES,
    Case,
    check_bound,
    cu_seqlens,
    dpa_kwargs,
    make_dpa,
    make_problem,
    reference,
    run_case,
    run_dpa,
    run_unfused_direct,
    sizes,
)
from utils import assert_close

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import capi, config
from transformer_engine_lite.pytorch.attention import backends
from transformer_engine_lite.pytorch.attention.inputs import check_window

MODE = config.get("NVTE_ATTN_CI_MODE") or "auto"
# The switches configure_fused_attn_env sets per mode (reference/attention_dispatch.md).
MODE_ENV = {
    "auto": {},
    "flash": {"NVTE_FUSED_ATTN": "0", "NVTE_FUSED_ATTN_CK": "0", "NVTE_FUSED_ATTN_AOTRITON": "0"},
    "unfused": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0"},
    "ck": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN_AOTRITON": "0"},
    "aotriton": {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN_CK": "0"},
}
SWITCHES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_FUSED_ATTN_CK", "NVTE_FUSED_ATTN_AOTRITON")
if MODE not in MODE_ENV:
    raise ValueError(f"NVTE_ATTN_CI_MODE: expected one of {sorted(MODE_ENV)}, got {MODE!r}")
NOT_BUILT = pytest.mark.skipif(
    MODE in ("ck", "aotriton"),
    reason=f"backend '{MODE}' is not built in this build: the selection falls back to unfused "
    "(test_selection_follows_mode), whose numerics the 'unfused' mode covers",
)


CASES = [
    # every layout (packed ones as views of one buffer), every mask
    Case(),
    Case("sbhd_sbhd_sbhd", "causal", FP16, sq=97, d=59),
    Case("thd_thd_thd", "padding", BF16, d=32),
    Case("bs3hd", "causal", BF16, sq=97),
    Case("sb3hd", "no_mask", FP32, d=128),
    Case("bsh3d", "padding_causal", FP16),
    Case("sbh3d", "causal_bottom_right", BF16, d=32),
    Case("bshd_bs2hd", "causal_bottom_right", FP16, sq=17, skv=97, h_kv=2),
    Case("bshd_bsh2d", "padding", BF16, sq=17, skv=97, d=59, h_kv=1, padding_via="cu"),
    Case("sbhd_sb2hd", "padding_causal_bottom_right", FP32, sq=97, skv=17, d=32),
    Case("sbhd_sbh2d", "no_mask", BF16, sq=1, skv=17),
    Case("t3hd", "padding_causal", BF16),
    Case("th3d", "padding", FP16, d=32),
    Case("thd_t2hd", "padding_causal_bottom_right", BF16, sq=17, skv=33, h_kv=2),
    Case("thd_th2d", "padding", FP32, d=128, h_kv=1),
    Case("thd_thd_thd", "causal", FP16, sq=33, skv=17, d=59),  # thd reads it as padding_causal
    # GQA / MQA, head dims, d_v != d_qk, length-1 sequences
    Case(mask="causal", h=6, h_kv=2, sq=97, d=128),
    Case("sbhd_sbhd_sbhd", "no_mask", FP16, sq=1, h_kv=1, d=32),
    Case(mask="causal", dv=32),
    Case("thd_thd_thd", "padding_causal", FP32, d=59, dv=32, h_kv=2),
    Case(mask="causal_bottom_right", sq=1, skv=17, d=32),
    # sliding windows (causal masks end at the diagonal; others are bottom-right aligned)
    Case(mask="causal", sq=97, window=(4, 0)),
    Case(mask="no_mask", dtype=FP16, sq=97, window=(3, 5)),
    Case("sbhd_sbhd_sbhd", "padding", BF16, sq=97, d=32, window=(8, 2)),
    Case(mask="no_mask", dtype=FP32, sq=17, skv=33, window=(0, 0)),
    Case(mask="causal_bottom_right", sq=17, skv=97, window=(5, 0)),
    Case("thd_thd_thd", "padding", FP16, sq=97, d=59, window=(10, -1)),
    # post-scale bias of each broadcast shape, ALiBi with default and given slopes
    Case(bias="post_scale_bias", bias_shape="1hss"),
    Case(mask="causal", dtype=FP16, sq=97, bias="post_scale_bias", bias_shape="b1ss"),
    Case(dtype=FP32, sq=17, skv=33, bias="post_scale_bias", bias_shape="bhss"),
    Case("sbhd_sbhd_sbhd", "padding_causal", BF16, bias="post_scale_bias", bias_shape="11ss"),
    Case(mask="causal", sq=97, bias="alibi"),
    Case(dtype=FP16, sq=17, skv=97, bias="alibi", slopes="h"),
    Case("sbhd_sbhd_sbhd", "padding_causal", FP32, bias="alibi", slopes="bh", h=3),
    Case("thd_thd_thd", "padding_causal_bottom_right", BF16, sq=33, skv=17, bias="alibi"),
    # only the framework math takes these: unfused in every mode
    Case(mask="causal", bias="pre_scale_bias", bias_shape="bhss"),
    Case(mask="arbitrary", dtype=FP32, sq=17, skv=33),
    Case("sbhd_sbhd_sbhd", "arbitrary", BF16, bias="post_scale_bias", bias_shape="b1ss"),
    # combinations: packed + long, padding + bias, windows with GQA / ALiBi / varlen, length 1
    Case(
        "bshd_bshd_bshd", "padding_causal_bottom_right", FP16, sq=97, skv=33, window=(7, 0), h_kv=2
    ),
    Case("thd_thd_thd", "padding_causal", BF16, sq=97, window=(16, 0), bias="alibi", slopes="bh"),
    Case("bsh3d", "causal", FP32, sq=1, d=59),
    Case("thd_th2d", "padding", BF16, sq=1),
    Case(
        mask="padding",
        dtype=FP16,
        sq=97,
        bias="post_scale_bias",
        bias_shape="bhss",
        h_kv=1,
        padding_via="cu",
    ),
    Case("thd_thd_thd", "padding", FP32, sq=33, bias="post_scale_bias", bias_shape="b1ss"),
    Case("sbhd_sbhd_sbhd", "causal", FP16, sq=97, h=8, h_kv=2, d=128, window=(20, 0)),
    # long sequences (a few: the fp64 reference is O(s^2))
    Case("sb3hd", "causal", BF16, b=1, h=2, sq=1025, d=128),
    Case(mask="causal", b=1, h=2, sq=1025),
    Case("thd_thd_thd", "padding", FP16, b=2, h=2, sq=1025, d=32),
]


def expected_backend(case: Case) -> str:
    if MODE in ("unfused", "ck", "aotriton"):
        return "unfused"
    return "unfused" if case.bias == "pre_scale_bias" or case.mask == "arbitrary" else "flash"


@NOT_BUILT
@pytest.mark.parametrize("case", CASES, ids=[c.id() for c in CASES])
def test_attention_numerics(case: Case):
    prob = make_problem(case)
    out, grads, used = run_dpa(case, prob)
    assert used == [expected_backend(case)], f"backend used: {used}, mode {MODE}"
    ref_out, ref_grads = reference(case, prob, torch.float64)
    low_out, low_grads = reference(case, prob, case.dtype)
    for name, got, r, lo in zip(NAMES, (out, *grads), (ref_out, *ref_grads), (low_out, *low_grads)):
        if r is not None:
            check_bound(f"{used[0]} {name}", got, r, lo, case.dtype)
    if used == ["flash"]:  # and against the reference backend, called directly
        u_out, u_grads = run_unfused_direct(case, prob)
        for name, got, u in zip(NAMES, (out, *grads), (u_out, *u_grads)):
            if u is not None:
                assert_close(got, u, case.dtype, f"flash vs unfused: {name}")


# ===================================================================================== selection
def test_mode_env_consistent():
    """The switches of this run are those of its mode (a misconfigured CI run fails here)."""
    got = {k: os.environ[k] for k in SWITCHES if os.environ.get(k) == "0"}
    assert got == MODE_ENV[MODE], f"mode {MODE}: expected switches {MODE_ENV[MODE]}, got {got}"


def _config(**kw) -> capi.NVTEFusedAttnConfig:
    base = {
        "device": 0,
        "q_dtype": int(capi.DType.BFloat16),
        "kv_dtype": int(capi.DType.BFloat16),
        "qkv_layout": 9,
        "bias_type": 0,
        "attn_mask_type": 2,
        "dropout": 0.0,
        "num_attn_heads": 4,
        "num_gqa_groups": 4,
        "max_seqlen_q": 17,
        "max_seqlen_kv": 17,
        "head_dim_qk": 64,
        "head_dim_v": 64,
        "window_size_left": -1,
        "window_size_right": 0,
    }
    base.update(kw)
    return capi.NVTEFusedAttnConfig(**base)


def test_selection_follows_mode():
    names = capi.fused_attn_backend_names()
    selected, reasons = capi.fused_attn_backend_reasons(_config())
    want = "flash" if MODE in ("auto", "flash") else "unfused"
    assert names[selected] == want, f"mode {MODE}: selected {names[selected]}, reasons {reasons}"
    by_name = dict(zip(names, reasons))
    # Neither ck nor aotriton is built for a CPU build: ck/aotriton modes fall back to unfused.
    assert by_name["ck"] == "not built in this build"
    assert by_name["aotriton"] == "not built in this build"
    if MODE in ("unfused", "ck", "aotriton"):
        assert by_name["flash"] == "disabled by NVTE_FLASH_ATTN=0"
    # Through the module: the expected backend ran.
    case = Case(mask="causal")
    assert run_dpa(case, make_problem(case))[2] == [want]


@pytest.mark.parametrize(
    "env,case,flash_reason",
    [
        ({}, Case(bias="pre_scale_bias"), "pre_scale_bias is not supported by flash"),
        (
            {},
            Case(mask="arbitrary"),
            "attn_mask_type 'arbitrary' is supported by the unfused backend only",
        ),
        ({"NVTE_FLASH_ATTN": "0"}, Case(), "disabled by NVTE_FLASH_ATTN=0"),
    ],
    ids=["pre_scale_bias", "arbitrary", "flash-off"],
)
def test_no_backend_lists_every_reason(monkeypatch, env, case, flash_reason):
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if MODE not in ("auto", "flash"):  # flash is off in this mode: that is its reason
        flash_reason = "disabled by NVTE_FLASH_ATTN=0"
    with pytest.raises(NotImplementedError) as e:
        run_dpa(case, make_problem(case))
    for part in (
        "ck: not built in this build",
        "aotriton: not built in this build",
        f"flash: {flash_reason}",
        "unfused: disabled by NVTE_UNFUSED_ATTN=0",
    ):
        assert part in str(e.value), f"{part!r} not in {e.value}"


# ===================================================================================== logging
def _expected_log(level: int) -> list[str]:
    names = capi.fused_attn_backend_names()
    selected, reasons = capi.fused_attn_backend_reasons(_config())
    lines = []
    if level >= 2:
        for name in ("ck", "aotriton", "flash", "unfused"):
            reason = reasons[names.index(name)]
            if reason:
                lines.append(f"Disabling {backends.BACKEND_NAMES[name]} due to {reason}")
    if level >= 1:
        lines.append(f"Selected backend = {backends.BACKEND_NAMES[names[selected]]}")
    return lines


@pytest.mark.parametrize("debug,level", [("1", "2"), ("1", "1"), ("1", "0"), ("0", "2")])
def test_nvte_debug_logging(monkeypatch, capsys, debug, level):
    monkeypatch.setenv("NVTE_DEBUG", debug)
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", level)
    case = Case(mask="causal")
    prob = make_problem(case)
    dpa = make_dpa(case)
    run_dpa(case, prob, dpa)
    logged = [ln.split("]: ", 1)[1] for ln in capsys.readouterr().err.splitlines() if "]: " in ln]
    assert logged == (_expected_log(int(level)) if debug == "1" else [])
    run_dpa(case, prob, dpa)  # same module and configuration: logged once
    assert "Selected" not in capsys.readouterr().err
    if debug == "1" and level != "0":  # another configuration is logged again
        case2 = replace(case, mask="no_mask")
        run_dpa(case2, prob, make_dpa(case2))
        assert "Selected backend" in capsys.readouterr().err


def test_nvte_debug_level_invalid(monkeypatch):
    monkeypatch.setenv("NVTE_DEBUG", "1")
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", "7")
    with pytest.raises(ValueError, match="NVTE_DEBUG_LEVEL"):
        run_dpa(Case(), make_problem(Case()))


# ===================================================================================== dropout
def test_dropout_mask_statistics_and_determinism():
    p, shape = 0.3, (4, 8, 256, 256)
    rng = torch.tensor([1234, 77], dtype=torch.int64)
    mask = torch.ops.te_lite.fused_attn_dropout_mask(rng, *shape, p)
    assert mask.dtype == torch.uint8 and tuple(mask.shape) == shape
    assert torch.equal(mask, torch.ops.te_lite.fused_attn_dropout_mask(rng.clone(), *shape, p))
    n = mask.numel()
    rate = mask.double().mean().item()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(rate - (1 - p)) < 5 * sigma, f"keep rate {rate} vs {1 - p} (sigma {sigma:.2e})"
    for other in ([1235, 77], [1234, 78]):
        m2 = torch.ops.te_lite.fused_attn_dropout_mask(torch.tensor(other), *shape, p)
        agree = (m2 == mask).double().mean().item()  # independent masks agree on p^2 + (1-p)^2
        assert abs(agree - (p * p + (1 - p) ** 2)) < 0.01


DROPOUT_CASES = [
    Case(mask="causal", h=4, h_kv=2, sq=33),
    Case("thd_thd_thd", "padding", FP32, d=32),
    Case("sbhd_sbhd_sbhd", "no_mask", FP16, sq=17, skv=33, bias="post_scale_bias"),
]


@NOT_BUILT
@pytest.mark.parametrize("case", DROPOUT_CASES, ids=[c.id() for c in DROPOUT_CASES])
def test_dropout_flash_equals_unfused_and_reference(case: Case):
    """Both backends drop the logits of the one Philox keep mask: equal results, and the fp64
    reference with that mask agrees."""
    p = 0.25
    prob = make_problem(case)
    skv, _, _ = sizes(case)
    rng = torch.tensor([42, 7], dtype=torch.int64)
    keep = torch.ops.te_lite.fused_attn_dropout_mask(rng, case.b, case.h, case.sq, skv, p)
    dpa = make_dpa(case, p)
    window = check_window("test", case.mask, case.window)
    padded = case.fmt == "thd" or "padding" in case.mask
    cu = (cu_seqlens(prob["lens_q"]), cu_seqlens(prob["lens_kv"])) if padded else (None, None)
    mask = "padding" if case.fmt == "thd" and case.mask == "no_mask" else case.mask

    def runner(backend):
        def call(q, k, v, bias):
            return backend(
                q, k, v, case.layout, *cu, case.sq, skv, mask, window, case.bias, bias, None, rng
            )

        return call

    results = {}
    for name, backend in (("flash", dpa.flash_attention), ("unfused", dpa.unfused_attention)):
        results[name] = run_case(case, prob, runner(backend.train()))
    ref_out, ref_grads = reference(case, prob, torch.float64, keep, p)
    low_out, low_grads = reference(case, prob, case.dtype, keep, p)
    for name, (out, grads) in results.items():
        for what, got, r, lo in zip(
            NAMES, (out, *grads), (ref_out, *ref_grads), (low_out, *low_grads)
        ):
            if r is not None:
                check_bound(f"{name} {what} (dropout)", got, r, lo, case.dtype)
    (fo, fg), (uo, ug) = results["flash"], results["unfused"]
    for what, a, b in zip(NAMES, (fo, *fg), (uo, *ug)):
        if a is not None:
            assert_close(a, b, case.dtype, f"flash vs unfused with dropout: {what}")


def test_dropout_seeded_by_torch_generator():
    """Dropout seeds come from torch's generator: same seed -> identical bytes forward and
    backward, another seed -> another result; eval mode applies no dropout."""
    case = Case(mask="causal", dtype=FP32, sq=33)
    prob = make_problem(case)
    dpa = make_dpa(case, p=0.4)

    def run(seed):
        torch.manual_seed(seed)
        return run_dpa(case, prob, dpa)[:2]

    (o1, g1), (o2, g2), (o3, _) = run(3), run(3), run(4)
    assert torch.equal(o1, o2) and all(torch.equal(a, b) for a, b in zip(g1[:3], g2[:3]))
    assert not torch.equal(o1, o3)
    dpa.eval()
    no_drop = run_dpa(case, prob, make_dpa(case))[0]
    assert torch.equal(run_dpa(case, prob, dpa)[0], no_drop)


def test_dropout_seeds_from_rng_state_tracker():
    """With get_rng_state_tracker, the seeds come from inside the tracker's fork()."""

    class Tracker:
        @contextlib.contextmanager
        def fork(self, name="model-parallel-rng"):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(1234)  # the tracker's own stream, here restarted each time
                yield

    case = Case(mask="causal", dtype=FP32, sq=33)
    prob = make_problem(case)
    tracked = te.DotProductAttention(
        case.h, case.d, attention_dropout=0.4, qkv_format="bshd", get_rng_state_tracker=Tracker
    )
    outs = []
    for seed in (1, 2):
        torch.manual_seed(seed)  # the default generator does not matter
        outs.append(run_dpa(case, prob, tracked)[0])
    assert torch.equal(outs[0], outs[1])
    torch.manual_seed(1)
    assert not torch.equal(run_dpa(case, prob, make_dpa(case, p=0.4))[0], outs[0])


# ===================================================================================== varlen
@NOT_BUILT
def test_thd_equals_per_sequence_bshd():
    """thd (padding_causal, one empty sequence, sequences of several lengths) gives each sequence
    what a batch-of-one bshd call gives it."""
    lens, h, d = [5, 0, 23, 9], 3, 32
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(sum(lens), h, d, generator=g) for _ in range(3))
    cu = cu_seqlens(lens)
    dpa = te.DotProductAttention(h, d, qkv_format="thd", attn_mask_type="padding_causal")
    out = dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=23, max_seqlen_kv=23)
    ref = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal")
    for i, n in enumerate(lens):
        if n == 0:
            continue
        a, b_ = cu[i].item(), cu[i + 1].item()
        one = ref(q[None, a:b_], k[None, a:b_], v[None, a:b_])[0]
        assert_close(out[a:b_], one, torch.float32, f"sequence {i}")


# ===================================================================================== compile
COMPILE_CASES = [
    Case(mask="causal", dtype=FP32, h_kv=2),
    Case("thd_thd_thd", "padding_causal", FP32, d=32),
    Case(mask="causal", dtype=FP32, bias="pre_scale_bias"),  # the unfused path
    Case("sbhd_sbhd_sbhd", "padding", BF16, bias="alibi", padding_via="cu"),
]


@NOT_BUILT
@pytest.mark.parametrize("case", COMPILE_CASES, ids=[c.id() for c in COMPILE_CASES])
def test_torch_compile_fullgraph_equals_eager(case: Case):
    prob = make_problem(case)
    dpa = make_dpa(case)
    eager = run_case(case, prob, lambda q, k, v, b: dpa(q, k, v, **dpa_kwargs(case, prob, b)))
    compiled = torch.compile(dpa, fullgraph=True, backend="aot_eager")
    got = run_case(case, prob, lambda q, k, v, b: compiled(q, k, v, **dpa_kwargs(case, prob, b)))
    for what, a, b in zip(NAMES, (got[0], *got[1]), (eager[0], *eager[1])):
        if b is not None:
            assert_close(a, b, "compiled", f"compiled vs eager: {what}")


# ===================================================================================== misc
@NOT_BUILT
def test_checkpoint_core_attention_recomputes_the_same():
    case = Case(mask="causal", dtype=FP32, sq=33)
    prob = make_problem(case)
    dpa = make_dpa(case, p=0.2)  # dropout: the recomputation must draw the same mask

    def run(ckpt):
        torch.manual_seed(11)
        return run_case(case, prob, lambda q, k, v, b: dpa(q, k, v, checkpoint_core_attention=ckpt))

    (o1, g1), (o2, g2) = run(False), run(True)
    assert torch.equal(o1, o2) and all(torch.equal(a, b) for a, b in zip(g1[:3], g2[:3]))


def test_fp8_autocast_keeps_attention_high_precision():
    """Under fp8_autocast the attention math is unchanged (only GEMM modules run FP8) unless the
    recipe asks for FP8 attention (test_fp8_attention.py), which no other recipe than delayed /
    current scaling offers."""
    from transformer_engine_lite.common.recipe import DelayedScaling

    case = Case(mask="causal", dtype=FP32)
    prob = make_problem(case)
    plain = run_dpa(case, prob)[0]
    with te.fp8_autocast(fp8_recipe=DelayedScaling()):
        assert torch.equal(run_dpa(case, prob)[0], plain)
    from transformer_engine_lite.common.recipe import MXFP8BlockScaling

    recipe = MXFP8BlockScaling(fp8_dpa=True)
    with pytest.raises(NotImplementedError, match="fp8_dpa"), te.fp8_autocast(fp8_recipe=recipe):
        run_dpa(case, prob)
