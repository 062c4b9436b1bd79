"""TE-JAX attention (transformer_engine_lite.jax.attention.fused_attn) against an fp64 reference
(attention_utils.py), per CI attention mode.

ci runs this file once per configuration (configure_fused_attn_env, ci/_utils.sh, sets the switches
and NVTE_ATTN_CI_MODE): auto / flash run the flash primitive for everything but pre_scale_bias;
unfused, ck and aotriton (neither is built here) run the unfused JAX math. Numerics tests assert the
backend that ran and hold in every mode; selection tests set the switches themselves (monkeypatch).
Values and gradients are bounded by flash-attention's rule: error vs fp64 <= 2x the error of plain
JAX in the same dtype + a floor (attention_utils.check_bound); tokens no key / query sees are
exactly 0. Dropout, vmap / jit, logging and empty batches follow (argument errors:
test_attention_errors.py).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_utils import (
    MODE,
    MODE_ENV,
    NAMES,
    SWITCHES,
    Case,
    assert_results_close,
    check_against_reference,
    dropout_mask,
    make_problem,
    pack,
    run_jax,
    seed_words,
    selection_log_lines,
    set_mode,
)

from transformer_engine_lite.common import attention_selection as selection
from transformer_engine_lite.jax import attention as A
from transformer_engine_lite.jax.cpp_extensions import attention as tex_attn

CASES = [
    # every layout x every mask, each dtype
    Case(),
    Case(mask="padding", dtype="fp16", sq=17, skv=7),
    Case(mask="causal", dtype="fp32"),
    Case(mask="padding_causal", h_kv=2),
    Case(mask="causal_bottom_right", dtype="fp16", sq=17, skv=7),  # rows 0-9 see no key
    Case(mask="padding_causal_bottom_right", sq=7, skv=17, h_kv=1),
    Case(mask="padding", dtype="fp32", lens=((5, 17), (0, 7))),  # a row with no key at all
    Case(mask="padding", dtype="fp16", desc="segment_ids"),
    Case("bs3hd", "no_mask", "fp32"),
    Case("bs3hd", "causal"),
    Case("bs3hd", "padding", "fp16", lens=((17, 1), (17, 1))),
    Case("bs3hd", "padding_causal", "fp32", sq=7),
    Case("bs3hd", "causal_bottom_right", "fp16"),
    Case("bs3hd", "padding_causal_bottom_right"),
    Case("bshd_bs2hd", "causal_bottom_right", sq=7, skv=17, h_kv=2),
    Case("bshd_bs2hd", "padding", "fp32", sq=17, skv=1, h_kv=1),
    Case("bshd_bs2hd", "no_mask", "fp16", sq=1, skv=17),
    Case("bshd_bs2hd", "padding_causal", "fp16", sq=17, skv=7),
    Case("bshd_bs2hd", "causal", "fp32", sq=7, skv=17),
    Case("bshd_bs2hd", "padding_causal_bottom_right", "bf16", sq=17, skv=7, h_kv=2),
    Case("t3hd", "padding", m=3),
    Case("t3hd", "causal", "fp16", m=2, desc="offsets"),
    Case("t3hd", "no_mask", "fp32", sq=1),
    Case("t3hd", "padding_causal_bottom_right", "fp32", m=3, desc="offsets"),
    Case("t3hd", "padding_causal", "bf16", sq=7, m=2),
    Case("t3hd", "causal_bottom_right", "fp16", sq=9, m=2, desc="offsets"),
    Case("thd_t2hd", "causal", "fp16", sq=9, skv=13, m=2),
    Case("thd_t2hd", "padding", "bf16", sq=1, skv=7, h_kv=1),
    Case("thd_t2hd", "padding_causal", "fp32", sq=13, skv=9, m=2, desc="offsets"),
    Case("thd_thd_thd", "causal", "bf16", sq=9, m=3),
    Case("thd_thd_thd", "padding_causal_bottom_right", "fp16", sq=13, skv=9, h_kv=2, m=2),
    Case("thd_t2hd", "padding_causal_bottom_right", sq=17, skv=23, h_kv=2, m=2, desc="offsets"),
    Case("thd_t2hd", "causal_bottom_right", "fp32", m=3),
    Case("thd_t2hd", "no_mask", "fp16", sq=7, skv=17, h_kv=1, m=2),
    Case("thd_thd_thd", "padding_causal", "fp16", h_kv=1, m=3),
    Case("thd_thd_thd", "no_mask", sq=17, skv=7, m=2, desc="offsets"),
    Case("thd_thd_thd", "causal_bottom_right", "fp32", sq=7, skv=17, m=2),
    Case("thd_thd_thd", "padding", "fp32", d=40, dv=24, m=2),
    # odd lengths and head dims, d_v != d_qk
    Case(sq=1, d=59),
    Case("bs3hd", "causal", "fp16", sq=1),
    Case(mask="causal", dtype="fp32", sq=17, d=40, dv=24, h_kv=2),
    # post_scale_bias of each broadcast shape
    Case(bias="post_scale_bias", bias_shape="1hss"),
    Case("bs3hd", "causal", "fp16", bias="post_scale_bias", bias_shape="b1ss"),
    Case("bshd_bs2hd", "padding", "fp32", sq=7, skv=17, bias="post_scale_bias", bias_shape="bhss"),
    Case(
        mask="padding_causal_bottom_right",
        sq=17,
        skv=7,
        bias="post_scale_bias",
        bias_shape="bhss",
        h_kv=2,
    ),
    # thd with a bias: indexed by row positions (TE's rule); the flash core gets per-sequence slices
    Case("thd_thd_thd", "padding_causal", "fp32", sq=13, skv=9, m=2, desc="offsets",
         bias="post_scale_bias", bias_shape="1hss"),
    Case("thd_t2hd", "padding", "bf16", sq=17, skv=23, m=3, bias="post_scale_bias",
         bias_shape="bhss"),
    Case("t3hd", "padding_causal_bottom_right", "fp16", m=2, bias="post_scale_bias",
         bias_shape="b1ss"),
    Case("thd_thd_thd", "padding", "fp32", m=2, h_kv=2, bias="pre_scale_bias", bias_shape="1hss"),
    # pre_scale_bias: the unfused backend in every mode
    Case(mask="causal", bias="pre_scale_bias", bias_shape="bhss"),
    Case("bshd_bs2hd", "padding", "fp32", sq=7, skv=17, bias="pre_scale_bias", bias_shape="1hss"),
    # sliding windows (no_mask's are bottom-right aligned; causal ones end at the diagonal)
    Case(mask="no_mask", window=(2, 0)),
    Case(mask="no_mask", dtype="fp16", sq=7, skv=17, window=(3, 1)),
    Case(mask="no_mask", dtype="fp32", window=(-1, 2)),
    Case(mask="causal", window=(2, 0), h_kv=2),
    Case("bs3hd", "padding", "fp16", window=(3, 1)),
    Case("bshd_bs2hd", "causal_bottom_right", "fp32", sq=17, skv=7, window=(2, 0)),
    Case("thd_thd_thd", "padding_causal", "bf16", m=2, window=(2, 0)),
    Case("t3hd", "no_mask", "fp16", m=2, desc="offsets", window=(3, 1)),
]


def expected_backend(case: Case) -> str:
    if MODE in ("unfused", "ck", "aotriton") or case.bias == "pre_scale_bias":
        return "unfused"
    return "flash"


BACKENDS = ["flash", "unfused"]


@pytest.fixture
def backend_spy(monkeypatch):
    """Records which backend fused_attn dispatched to ("flash" / "unfused"), at trace time."""
    used: list[str] = []
    fused, unfused = A._fused, A._unfused

    def spy_fused(*args, **kwargs):
        used.append("flash")
        return fused(*args, **kwargs)

    def spy_unfused(*args, **kwargs):  # sink= (attention sinks) is a keyword
        used.append("unfused")
        return unfused(*args, **kwargs)

    monkeypatch.setattr(A, "_fused", spy_fused)
    monkeypatch.setattr(A, "_unfused", spy_unfused)
    return used


@pytest.mark.parametrize("case", CASES, ids=[c.id() for c in CASES])
def test_fused_attn_numerics(case: Case, backend_spy):
    prob = make_problem(case)
    res = run_jax(case, prob)
    assert backend_spy == [expected_backend(case)], f"mode {MODE}: ran {backend_spy}"
    check_against_reference(case, prob, res, what=f"{backend_spy[0]} ")


def test_case_grid_coverage():
    """The pruned grid still holds every layout x mask, dtype, GQA ratio, bias shape, the
    windows, odd lengths and both thd descriptor forms."""
    layouts = {c.layout for c in CASES}
    assert layouts == {m.value for m in A.QKVLayout}
    for layout in layouts:
        masks = {c.mask for c in CASES if c.layout == layout}
        assert masks == {m.value for m in A.AttnMaskType}, (layout, masks)
    assert {c.dtype for c in CASES} == {"bf16", "fp16", "fp32"}
    assert {c.heads_kv for c in CASES if c.h == 4} == {4, 2, 1}
    assert {c.bias_shape for c in CASES if c.bias == "post_scale_bias"} == {"1hss", "b1ss", "bhss"}
    assert {c.descriptor_kind for c in CASES if c.thd} == {"segment_ids", "offsets"}
    windows = {(c.mask, c.window) for c in CASES}
    for want in (
        ("no_mask", (2, 0)),
        ("no_mask", (3, 1)),
        ("no_mask", (-1, 2)),
        ("causal", (2, 0)),
    ):
        assert want in windows, want
    assert {1, 7, 17} <= {c.sq for c in CASES} & {c.s_kv for c in CASES}
    assert any(c.bias == "pre_scale_bias" for c in CASES)


# ===================================================================================== dropout
P = 0.3
DROPOUT_CASES = [
    Case(mask="causal", dtype="fp32", h_kv=2),
    Case("bshd_bs2hd", "padding", "bf16", sq=7, skv=17, bias="post_scale_bias"),
    Case("thd_thd_thd", "padding_causal", "fp32", m=3),
    Case("t3hd", "no_mask", "fp16", m=2, desc="offsets"),
]


@pytest.mark.parametrize("case", DROPOUT_CASES, ids=[c.id() for c in DROPOUT_CASES])
def test_dropout_flash_equals_unfused_and_reference(case: Case, monkeypatch, backend_spy):
    """Both backends drop the logits of the kernel's Philox keep mask: equal outputs (same mask)
    and gradients, and the fp64 reference with that mask agrees."""
    set_mode(monkeypatch, "auto")
    key = jax.random.PRNGKey(1234)
    prob = make_problem(case)
    flash = run_jax(case, prob, seed=key, dropout=P)
    assert backend_spy == ["flash"]
    unfused = run_jax(case, prob, A.unfused_attn, seed=key, dropout=P)
    assert_results_close("flash vs unfused (dropout)", flash, unfused, case.dtype)
    drop = dropout_mask(case, prob, key, P)
    check_against_reference(case, prob, flash, drop, P, "flash (dropout) ")
    check_against_reference(case, prob, unfused, drop, P, "unfused (dropout) ")


def _keep_readout(seed, p: float) -> np.ndarray:
    """The keep mask as fused_attn applies it: q = 0 gives uniform probabilities 1/s_kv, and v =
    one-hot rows reads them out, so out * s_kv * (1 - p) = keep [b, s_q, h, s_kv] exactly."""
    b, s, h = 2, 64, 4
    q = jnp.zeros((b, s, h, 16), jnp.float32)
    k = jax.random.normal(jax.random.PRNGKey(0), (b, s, h, 16), jnp.float32)
    v = jnp.broadcast_to(jnp.eye(s, dtype=jnp.float32)[None, :, None, :], (b, s, h, s))
    args = ("no_bias", "no_mask", "bshd_bshd_bshd", "vanilla", 1.0, p, True)
    out = A.fused_attn((q, k, v), None, None, seed, *args)
    return np.asarray(out, np.float64) * s * (1 - p)


def test_dropout_rate_and_mask():
    """The fraction dropped is p (within 5 sigma), and it is the dropout-mask primitive's mask."""
    key = jax.random.PRNGKey(7)
    kept = _keep_readout(key, P)
    np.testing.assert_allclose(kept, np.round(kept), atol=1e-4)
    n = kept.size
    rate = 1.0 - kept.mean()
    sigma = (P * (1 - P) / n) ** 0.5
    assert abs(rate - P) < 5 * sigma, f"dropped fraction {rate:.4f} vs p = {P} (sigma {sigma:.1e})"
    mask = np.asarray(tex_attn.dropout_keep_mask(seed_words(key), 2, 4, 64, 64, P))
    np.testing.assert_array_equal(np.round(kept).astype(bool), mask.transpose(0, 2, 1, 3))


def test_dropout_same_key_same_result_other_key_other_result():
    key = jax.random.PRNGKey(3)
    a, b = _keep_readout(key, P), _keep_readout(jax.random.PRNGKey(3), P)
    np.testing.assert_array_equal(a, b)
    for other in (jax.random.PRNGKey(4), jax.random.split(key)[0]):
        c = _keep_readout(other, P)
        agree = (np.round(a) == np.round(c)).mean()  # independent masks agree on p^2 + (1-p)^2
        assert abs(agree - (P * P + (1 - P) ** 2)) < 0.02, agree


def test_dropout_seed_forms_agree():
    """A typed key, its raw uint32 data, and TE's per-device [n, 2] keys (row 0 used) give the
    same mask."""
    typed = jax.random.key(11)
    raw = jax.random.key_data(typed)
    per_device = jnp.stack([raw, raw + 1])
    want = _keep_readout(typed, P)
    for seed in (raw, per_device):
        np.testing.assert_array_equal(_keep_readout(seed, P), want)


@pytest.mark.parametrize("backend", ["flash", "unfused"])
def test_no_dropout_when_not_training(backend, monkeypatch):
    set_mode(monkeypatch, "auto" if backend == "flash" else "unfused")
    case = Case(mask="causal", dtype="fp32")
    prob = make_problem(case)
    plain = run_jax(case, prob, is_training=False)
    dropped = run_jax(case, prob, seed=jax.random.PRNGKey(1), dropout=P, is_training=False)
    np.testing.assert_array_equal(dropped[0], plain[0])


# ===================================================================================== vmap / jit
VMAP_CASES = [
    Case(mask="padding_causal", dtype="fp32", h_kv=2),
    Case("bshd_bs2hd", "causal", "bf16", sq=7, skv=17, bias="post_scale_bias", bias_shape="b1ss"),
    Case("thd_thd_thd", "padding", "fp32", m=2),
    Case("bs3hd", "causal", "fp32"),  # unfused: the upper-triangular softmax op
    Case(mask="no_mask", dtype="fp16"),  # unfused: the plain scaled softmax op
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", VMAP_CASES, ids=[c.id() for c in VMAP_CASES])
def test_vmap_equals_loop(case: Case, backend: str, monkeypatch, backend_spy):
    """vmap over a leading axis (inputs, and for padded cases the descriptor too) equals calling
    fused_attn on each slice; gradients as well."""
    set_mode(monkeypatch, "auto" if backend == "flash" else "unfused")
    probs = [make_problem(Case(**{**case.__dict__, "seed": i})) for i in range(3)]

    def loss(qkv, bias, desc, dout):
        out = A.fused_attn(
            qkv,
            bias,
            desc,
            None,
            case.bias,
            case.mask,
            case.layout,
            "vanilla",
            0.3,
            0.0,
            True,
            max_segments_per_seq=case.m,
        )
        return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32)), out

    step = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    args = [(pack(case.layout, p.q, p.k, p.v), p.bias, p.desc, p.dout) for p in probs]
    stacked = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *args)
    (_, outs), grads = jax.jit(jax.vmap(step))(*stacked)
    one = jax.jit(step)
    for i, a in enumerate(args):
        (_, out), g = one(*a)
        np.testing.assert_array_equal(np.asarray(outs[i]), np.asarray(out), err_msg=f"out [{i}]")
        for j, (gv, gl) in enumerate(
            zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(g))
        ):
            np.testing.assert_array_equal(
                np.asarray(gv[i]), np.asarray(gl), err_msg=f"grad {j} [{i}]"
            )
    assert set(backend_spy) == {backend}


@pytest.mark.parametrize("backend", ["flash", "unfused"])
@pytest.mark.parametrize(
    "case", VMAP_CASES[:1] + [Case("t3hd", "causal", "bf16", m=3)], ids=lambda c: c.id()
)
def test_jit_equals_eager(case: Case, backend: str, monkeypatch, backend_spy):
    set_mode(monkeypatch, "auto" if backend == "flash" else "unfused")
    prob = make_problem(case)
    eager, jitted = run_jax(case, prob, jit=False), run_jax(case, prob, jit=True)
    for name, a, b in zip(NAMES, jitted, eager):
        if b is None:
            continue
        if backend == "flash":  # one kernel call either way: the same bytes
            np.testing.assert_array_equal(a, b, err_msg=f"jit vs eager: {name}")
        else:  # XLA fuses the unfused math differently under jit (seen at the AVX2 level): 1 ulp
            np.testing.assert_allclose(a, b, rtol=2 * np.finfo(a.dtype).eps, atol=1e-7,
                                       err_msg=f"jit vs eager: {name}")
    assert set(backend_spy) == {backend}


# ===================================================================================== selection
def _avail(dtype=jnp.bfloat16, bias="no_bias", **kw) -> bool:
    args = {
        "is_training": True,
        "q_dtype": dtype,
        "kv_dtype": dtype,
        "qkv_layout": "bshd_bshd_bshd",
        "attn_bias_type": bias,
        "attn_mask_type": "causal",
        "softmax_type": "vanilla",
        "dropout_probability": 0.0,
        "q_num_heads": 4,
        "kv_num_heads": 4,
        "q_max_seqlen": 17,
        "kv_max_seqlen": 17,
        "head_dim_qk": 64,
        "head_dim_v": 64,
    }
    args.update(kw)
    return A.is_fused_attn_kernel_available(**args)


def test_mode_env_consistent():
    """The switches of this run are those of its mode (a misconfigured CI run fails here)."""
    got = {k: os.environ[k] for k in SWITCHES if os.environ.get(k) == "0"}
    assert got == MODE_ENV[MODE], f"mode {MODE}: expected switches {MODE_ENV[MODE]}, got {got}"


def test_selection_follows_ci_mode(backend_spy):
    want = "flash" if MODE in ("auto", "flash") else "unfused"
    assert _avail() == (want == "flash")
    assert (
        A.attention_backend(
            jnp.bfloat16, "bshd_bshd_bshd", "no_bias", "causal", 0.0, 4, 4, 17, 17, 64, 64
        )
        == want
    )
    case = Case(mask="causal")
    run_jax(case, make_problem(case))
    assert backend_spy == [want]


def test_kernel_available(monkeypatch):
    set_mode(monkeypatch, "auto")
    assert _avail()
    assert _avail(jnp.float16, qkv_layout="thd_t2hd", attn_mask_type="padding", kv_num_heads=1)
    assert not _avail(bias="pre_scale_bias")
    assert not _avail(softmax_type="off_by_one")
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")
    assert not _avail()


@pytest.mark.parametrize(
    "case", [Case(mask="causal", h_kv=2), Case("thd_t2hd", "padding", m=2)], ids=lambda c: c.id()
)
def test_flash_disabled_runs_unfused(case: Case, monkeypatch, backend_spy):
    set_mode(monkeypatch, "auto")
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")
    prob = make_problem(case)
    res = run_jax(case, prob)
    assert backend_spy == ["unfused"]
    check_against_reference(case, prob, res)


@pytest.mark.parametrize(
    "env,case,must",
    [
        (
            {},
            Case(mask="causal"),
            [
                "Disabling CK due to not built in this build",
                "Disabling AOTriton due to not built in this build",
                "Selected backend = FlashAttention",
            ],
        ),
        (
            {"NVTE_FLASH_ATTN": "0"},
            Case(mask="causal"),
            [
                "Disabling FlashAttention due to disabled by NVTE_FLASH_ATTN=0",
                "Selected backend = UnfusedDotProductAttention",
            ],
        ),
        (
            {},
            Case(mask="causal", bias="pre_scale_bias", bias_shape="bhss"),
            [
                "Disabling FlashAttention due to pre_scale_bias is not supported by flash (use unfused)",
                "Selected backend = UnfusedDotProductAttention",
            ],
        ),
    ],
    ids=["auto", "flash-off", "pre_scale_bias"],
)
def test_nvte_debug_logging(monkeypatch, capsys, env, case, must):
    set_mode(monkeypatch, "auto")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("NVTE_DEBUG", "1")
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", "2")
    monkeypatch.setattr(selection, "_LAST_LOGGED", {})  # earlier tests' configurations
    prob = make_problem(case)
    run_jax(case, prob, jit=False)
    logged = [ln.split("]: ", 1)[1] for ln in capsys.readouterr().err.splitlines() if "]: " in ln]
    assert logged == selection_log_lines(case, 2)
    for line in must:
        assert line in logged, f"{line!r} not in {logged}"
    run_jax(case, prob, jit=False)  # same configuration: logged once
    assert "Selected backend" not in capsys.readouterr().err
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", "1")
    run_jax(case, prob, jit=False)
    logged = [ln.split("]: ", 1)[1] for ln in capsys.readouterr().err.splitlines() if "]: " in ln]
    assert logged == selection_log_lines(case, 1)


def test_no_logging_without_nvte_debug(monkeypatch, capsys):
    monkeypatch.setenv("NVTE_DEBUG", "0")
    monkeypatch.setattr(selection, "_LAST_LOGGED", {})
    case = Case(mask="causal")
    run_jax(case, make_problem(case), jit=False)
    assert "Selected backend" not in capsys.readouterr().err


# ===================================================================================== empty
@pytest.mark.parametrize(
    "case",
    [
        Case(mask="causal", b=0),
        Case("bs3hd", "padding", b=0),
        Case("thd_t2hd", "padding", b=0, m=2),
    ],
    ids=lambda c: c.id(),
)
def test_empty_batch(case: Case):
    q, k, v = (jnp.zeros((0, 17, 4, 16), jnp.bfloat16),) * 3
    desc = None
    if case.layout == "bs3hd":
        desc = A.SequenceDescriptor.from_seqlens(jnp.zeros((0,), jnp.int32))
    elif case.thd:
        ids = jnp.zeros((0, 17), jnp.int32)
        desc = A.SequenceDescriptor.from_segment_ids_and_pos(ids, ids)

    def loss(qkv):
        out = A.fused_attn(
            qkv,
            None,
            desc,
            None,
            "no_bias",
            case.mask,
            case.layout,
            "vanilla",
            0.25,
            0.0,
            True,
            max_segments_per_seq=case.m,
        )
        return jnp.sum(out.astype(jnp.float32)), out

    (_, out), grads = jax.value_and_grad(loss, has_aux=True)(pack(case.layout, q, k, v))
    assert out.shape == (0, 17, 4, 16) and out.dtype == jnp.bfloat16
    for g, x in zip(grads, pack(case.layout, q, k, v)):
        assert g.shape == x.shape
