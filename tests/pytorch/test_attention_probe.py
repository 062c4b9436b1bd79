"""TE's attention probe and helpers (attention.dot_product_attention.{utils, backends},
cpp_extensions.fused_attn): import paths, get_attention_backend's answers against the env
switches and against what DotProductAttention runs, TE's return shape, the record
_attention_backends, check_set_window_size, TE's UnfusedDotProductAttention constructor."""

import logging
import warnings

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling
from transformer_engine_lite.pytorch.attention.dot_product_attention import (
    DotProductAttention,
    _attention_backends,
)
from transformer_engine_lite.pytorch.attention.dot_product_attention import utils as dpa_utils
from transformer_engine_lite.pytorch.attention.dot_product_attention.backends import (
    UnfusedDotProductAttention,
)
from transformer_engine_lite.pytorch.attention.dot_product_attention.utils import (
    AttentionLogging,
    AttentionParams,
    FlashAttentionUtils,
    check_set_window_size,
    get_attention_backend,
)
from transformer_engine_lite.pytorch.cpp_extensions.fused_attn import FusedAttnBackend

SWITCHES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in (*SWITCHES, "NVTE_FUSED_ATTN_CK", "NVTE_FUSED_ATTN_AOTRITON", "NVTE_DEBUG"):
        monkeypatch.delenv(var, raising=False)


def params(**kw):
    base = dict(
        qkv_dtype=torch.bfloat16,
        qkv_layout="bshd_bshd_bshd",
        batch_size=2,
        num_heads=4,
        num_gqa_groups=4,
        max_seqlen_q=32,
        max_seqlen_kv=32,
        head_dim_qk=64,
        head_dim_v=64,
        attn_mask_type="causal",
        device="cpu",
    )
    base.update(kw)
    return AttentionParams(**base)


def test_import_paths_are_one_module():
    from transformer_engine_lite.pytorch.attention import DotProductAttention as A
    from transformer_engine_lite.pytorch.attention.dot_product_attention import (
        dot_product_attention as module,
    )

    B, rec = module.DotProductAttention, module._attention_backends

    assert A is B is DotProductAttention is te.DotProductAttention
    assert rec is _attention_backends
    assert dpa_utils.get_cudnn_version is te.utils.get_cudnn_version


def test_return_shape_and_types():
    out = get_attention_backend(params())
    assert isinstance(out, tuple) and len(out) == 6
    use_flash, flash_version, use_fused, fused_sub, use_unfused, available = out
    assert isinstance(available, list) and len(available) == 3
    assert all(isinstance(x, bool) for x in (use_flash, use_fused, use_unfused, *available))
    # CPU: the flash kernel and the unfused backend; no GPU fused kernel. Flash is preferred.
    assert available == [True, False, True]
    assert (use_flash, use_fused, use_unfused) == (True, False, False)
    assert flash_version == FlashAttentionUtils.version and fused_sub is None


@pytest.mark.parametrize(
    "env, available, selected",
    [
        ({}, [True, False, True], "flash"),
        ({"NVTE_FLASH_ATTN": "0"}, [False, False, True], "unfused"),
        ({"NVTE_UNFUSED_ATTN": "0"}, [True, False, False], "flash"),
        ({"NVTE_FUSED_ATTN": "0"}, [True, False, True], "flash"),
        ({"NVTE_FLASH_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"}, [False, False, False], None),
    ],
)
def test_env_switches(monkeypatch, env, available, selected):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = get_attention_backend(params())
    assert out[5] == available
    assert (out[0], out[2], out[4]) == (selected == "flash", False, selected == "unfused")
    assert (out[1] is not None) == available[0]


@pytest.mark.parametrize(
    "kw, available",
    [
        (dict(core_attention_bias_type="pre_scale_bias"), [False, False, True]),
        (dict(core_attention_bias_type="post_scale_bias"), [True, False, True]),
        (dict(attn_mask_type="arbitrary"), [False, False, True]),
        (dict(qkv_layout="thd_thd_thd", attn_mask_type="padding_causal"), [True, False, True]),
        (dict(num_heads=6, num_gqa_groups=4), [False, False, False]),  # not a divisor: none
        # context parallelism runs the flash kernel per chunk: flash only
        (dict(context_parallel=True, attn_mask_type="causal"), [True, False, False]),
        (dict(context_parallel=True, cp_comm_type="a2a", window_size=(4, 4)), [True, False, False]),
        (
            dict(context_parallel=True, qkv_layout="thd_thd_thd", attn_mask_type="padding_causal"),
            [True, False, False],
        ),
        # padding between thd sequences (the real tokens are attended), with and without CP
        (
            dict(qkv_layout="thd_thd_thd", attn_mask_type="padding_causal", pad_between_seqs=True),
            [True, False, True],
        ),
        (
            dict(context_parallel=True, qkv_layout="thd_thd_thd", attn_mask_type="padding",
                 pad_between_seqs=True),
            [True, False, False],
        ),  # fmt: skip
        # a post_scale_bias with CP: the p2p ring only
        (
            dict(context_parallel=True, core_attention_bias_type="post_scale_bias"),
            [True, False, False],
        ),
        (
            dict(context_parallel=True, cp_comm_type="a2a",
                 core_attention_bias_type="post_scale_bias"),
            [False, False, False],
        ),  # fmt: skip
        # FP8 attention with CP: the unfused emulation, every cp_comm_type, bshd / sbhd only
        (
            dict(context_parallel=True, cp_comm_type="a2a", fp8=True,
                 fp8_meta={"recipe": DelayedScaling(fp8_dpa=True)}),
            [False, False, True],
        ),  # fmt: skip
        (
            dict(context_parallel=True, fp8=True,
                 fp8_meta={"recipe": Float8CurrentScaling(fp8_dpa=True)}),
            [False, False, True],
        ),  # fmt: skip
        # TE's probe names FP8 attention's input dtype as qkv_dtype (TE's CP test does)
        (
            dict(qkv_dtype=torch.float8_e4m3fn, context_parallel=True, cp_comm_type="all_gather",
                 fp8=True, fp8_meta={"recipe": DelayedScaling(fp8_dpa=True)}),
            [False, False, True],
        ),  # fmt: skip
        (dict(qkv_dtype=torch.float8_e4m3fn), [False, False, False]),  # not without FP8 attention
        (
            dict(qkv_dtype=torch.float8_e4m3fn, qkv_type=type("Float8Tensor", (torch.Tensor,), {}),
                 fp8=True, fp8_meta={"recipe": Float8CurrentScaling(fp8_mha=True)}),
            [False, False, True],
        ),  # fmt: skip
        (
            dict(context_parallel=True, fp8=True, qkv_layout="thd_thd_thd",
                 attn_mask_type="padding_causal",
                 fp8_meta={"recipe": Float8CurrentScaling(fp8_dpa=True)}),
            [False, False, False],
        ),  # fmt: skip
    ],
)
def test_configuration_rules(kw, available):
    assert get_attention_backend(params(**kw))[5] == available


@pytest.mark.parametrize(
    "kw",
    [
        dict(softmax_type="off_by_one"),  # TE-JAX's spelling: not the PyTorch name
        dict(context_parallel=True, qkv_layout="thd_thd_thd", cp_comm_type="all_gather"),
        dict(context_parallel=True, attn_mask_type="padding"),
        dict(context_parallel=True, window_size=(4, 0), attn_mask_type="causal"),
        dict(num_splits=2),
        dict(return_max_logit=True),
        dict(cuda_graph=True),
        dict(pad_between_seqs=True),  # bshd: padding between sequences is for thd
        dict(fp8_output=True),
        dict(has_score_mod=True),
        dict(qkv_type=type("Float8Tensor", (torch.Tensor,), {})),
        dict(fp8=True, fp8_meta={"recipe": MXFP8BlockScaling(fp8_mha=True)}),
        dict(core_attention_bias_type="post_scale_bias", core_attention_bias_shape="111s"),
        dict(core_attention_bias_type="alibi", alibi_slopes_shape=[3]),
        dict(qkv_layout="paged_kv_bshd_bshd_bshd"),
        dict(qkv_dtype=torch.float8_e4m3fn),
        dict(attn_mask_type="arbitrary", qkv_layout="thd_thd_thd"),
        dict(
            attn_mask_type="no_mask",
            window_size=(4, 4),
            bottom_right_diagonal=False,
            max_seqlen_kv=64,
        ),
    ],
)
def test_unsupported_disables_every_backend(kw, caplog):
    with caplog.at_level(logging.DEBUG, logger="transformer_engine_lite.attention"):
        out = get_attention_backend(params(**kw))
    assert out == (False, None, False, None, False, [False, False, False])
    assert "Disabling FlashAttention due to" in caplog.text


@pytest.mark.parametrize("recipe", [DelayedScaling(fp8_dpa=True), Float8CurrentScaling(fp8_mha=True)])
def test_fp8_attention_runs_unfused(recipe):
    """FP8 attention is emulated on the unfused backend only (fp8_attention.py)."""
    out = get_attention_backend(params(fp8=True, fp8_meta={"recipe": recipe}))
    assert out == (False, None, False, None, True, [False, False, True])


def test_fp8_without_fp8_dpa_keeps_the_backends():
    out = get_attention_backend(params(fp8=True, fp8_meta={"recipe": DelayedScaling()}))
    assert out[5] == [True, False, True]


@pytest.mark.parametrize(
    "kw, env",
    [
        (dict(attn_mask_type="causal"), {}),
        (dict(attn_mask_type="no_mask"), {"NVTE_FLASH_ATTN": "0"}),
        (dict(attn_mask_type="arbitrary"), {}),
        (dict(attn_mask_type="causal", core_attention_bias_type="pre_scale_bias"), {}),
    ],
)
def test_answer_is_what_dot_product_attention_runs(monkeypatch, kw, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    p = params(qkv_dtype=torch.float32, **kw)
    want = get_attention_backend(p)
    dpa = DotProductAttention(4, 64, qkv_format="bshd", attn_mask_type=p.attn_mask_type)
    q, k, v = (torch.randn(2, 32, 4, 64) for _ in range(3))
    extra = {}
    if p.attn_mask_type == "arbitrary":
        extra["attention_mask"] = torch.rand(2, 1, 32, 32) > 0.7
    if p.core_attention_bias_type != "no_bias":
        extra["core_attention_bias_type"] = p.core_attention_bias_type
        extra["core_attention_bias"] = torch.randn(1, 4, 32, 32)
    dpa(q, k, v, **extra)
    got = tuple(
        _attention_backends[k]
        for k in (
            "use_flash_attention",
            "flash_attention_backend",
            "use_fused_attention",
            "fused_attention_backend",
            "use_unfused_attention",
        )
    )
    assert got == want[:5]
    rec = _attention_backends["attention_params"]
    assert (rec.qkv_layout, rec.attn_mask_type, rec.num_heads, rec.max_seqlen_kv) == (
        "bshd_bshd_bshd",
        p.attn_mask_type,
        4,
        32,
    )


def test_backend_selection_requires_update_asks_again(monkeypatch, caplog):
    monkeypatch.setenv("NVTE_DEBUG", "1")
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", "1")
    dpa = DotProductAttention(4, 64, qkv_format="bshd")
    q, k, v = (torch.randn(2, 24, 4, 64) for _ in range(3))
    with caplog.at_level(logging.INFO, logger="transformer_engine_lite.attention"):
        dpa(q, k, v)
        first = caplog.text.count("Selected backend")
        dpa(q, k, v)  # cached: not logged again
        assert caplog.text.count("Selected backend") == first == 1
        _attention_backends["backend_selection_requires_update"] = True
        dpa(q, k, v)
        assert caplog.text.count("Selected backend") == 2
    assert _attention_backends["backend_selection_requires_update"] is False


def test_check_set_window_size():
    assert check_set_window_size("causal") == (-1, 0)
    assert check_set_window_size("padding") == (-1, -1)
    assert check_set_window_size("causal_bottom_right", (8, 0)) == (8, 0)
    assert check_set_window_size("no_mask", (3, 5)) == (3, 5)
    with pytest.warns(UserWarning):
        assert check_set_window_size("causal", (-1, -1)) == (-1, 0)
    with pytest.warns(UserWarning):
        assert check_set_window_size("padding_causal", (4, 2)) == (4, 0)
    with pytest.warns(UserWarning):
        assert check_set_window_size("arbitrary", (-1, 0)) == (-1, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_set_window_size("causal", (-1, 0)) == (-1, 0)
    for mask, window in (("no_mask", (-1, 3)), ("causal", (-2, 0)), ("sliding", None)):
        with pytest.raises(ValueError, match="check_set_window_size"):
            check_set_window_size(mask, window)


def test_fused_attn_backend_enum():
    assert FusedAttnBackend["F16_arbitrary_seqlen"] == 1 and FusedAttnBackend["FP8"] == 2
    assert FusedAttnBackend.No_Backend == -1
    assert FusedAttnBackend.cast(1) is FusedAttnBackend.F16_arbitrary_seqlen
    with pytest.raises(ValueError, match="FusedAttnBackend.cast"):
        FusedAttnBackend.cast(7)


def test_versions_and_logging(monkeypatch):
    assert dpa_utils.get_cudnn_version() == (0, 0, 0)
    fa = FlashAttentionUtils
    assert fa.is_version_supported(fa.version_required, fa.version_required)
    assert not fa.is_version_supported(fa.max_version, fa.version_required)
    assert fa.v2_3_plus and fa.v2_4_plus and not fa.v2_5_plus and not fa.v3_is_installed
    monkeypatch.setenv("NVTE_DEBUG", "1")
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", "2")
    AttentionLogging.setup_logging()
    assert AttentionLogging._is_logging_setup and AttentionLogging.fa_logger.level == logging.DEBUG
    monkeypatch.setenv("NVTE_DEBUG", "0")
    AttentionLogging.setup_logging()
    assert AttentionLogging.fa_logger.level == logging.WARNING


@pytest.mark.parametrize("layout", ["bshd_bshd_bshd", "sbhd_sbhd_sbhd", "thd_thd_thd", "bs3hd"])
def test_unfused_te_constructor_matches_dot_product_attention(monkeypatch, layout):
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")  # DotProductAttention runs the unfused backend too
    torch.manual_seed(0)
    b, s, h, d = 2, 16, 4, 32
    fmt = layout.split("_")[0].replace("3", "")
    kwargs = {}
    if fmt == "thd":
        q, k, v = (torch.randn(b * s, h, d) for _ in range(3))
        cu = torch.tensor([0, 9, 25], dtype=torch.int32)
        kwargs = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=s, max_seqlen_kv=s)
        mask = "padding_causal"
    elif layout == "bs3hd":
        qkv = torch.randn(b, s, 3, h, d)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        mask = "causal"
    else:
        shape = (b, s, h, d) if fmt == "bshd" else (s, b, h, d)
        q, k, v = (torch.randn(shape) for _ in range(3))
        mask = "causal"
    unfused = UnfusedDotProductAttention(d**-0.5, attention_type="self", layer_number=1)
    out = unfused({}, q, k, v, qkv_layout=layout, attn_mask_type=mask, **kwargs)
    ref = DotProductAttention(h, d, qkv_format=fmt, attn_mask_type=mask)(q, k, v, **kwargs)
    assert _attention_backends["use_unfused_attention"]
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_unfused_te_constructor_rejects():
    with pytest.raises(NotImplementedError, match="softmax_type"):
        UnfusedDotProductAttention(0.1, softmax_type="off-by-one")
    with pytest.raises(ValueError, match="attention_type"):
        UnfusedDotProductAttention(0.1, attention_type="both")
    m = UnfusedDotProductAttention(0.1)
    q = torch.randn(2, 8, 2, 16)
    with pytest.raises(NotImplementedError, match="inference_params"):
        m({}, q, q, q, qkv_layout="bshd_bshd_bshd", inference_params=object())
    with pytest.raises(ValueError, match="qkv_layout"):
        m({}, q, q, q, qkv_layout="bhsd_bhsd_bhsd")


def test_tex_get_fused_attn_backend():
    from transformer_engine_lite.pytorch import tex

    args = [True, tex.DType.kBFloat16, tex.DType.kBFloat16, "bshd_bshd_bshd", "no_bias", "causal",
            "vanilla", 0.0, 4, 4, 32, 32, 64, 64, -1, 0]  # fmt: skip
    # ck and aotriton are GPU kernels: no fused sub-backend for CPU tensors
    assert tex.get_fused_attn_backend(*args, device="cpu") == FusedAttnBackend.No_Backend
    bad = list(args)
    bad[3] = 7
    with pytest.raises(TypeError, match="qkv_layout"):
        tex.get_fused_attn_backend(*bad)


def test_fused_slot_follows_tex(monkeypatch):
    from transformer_engine_lite.pytorch import tex

    seen = []

    def fake(*args):
        seen.append(args)
        return FusedAttnBackend.F16_arbitrary_seqlen

    monkeypatch.setattr(tex, "get_fused_attn_backend", fake)
    out = get_attention_backend(params())
    assert out == (False, FlashAttentionUtils.version, True, 1, False, [True, True, True])
    assert seen and seen[0][3:7] == ("bshd_bshd_bshd", "no_bias", "causal", "vanilla")


def test_probe_traces_under_compile(monkeypatch):
    def fn(x, p):
        use_flash, _, use_fused, _, use_unfused, _ = get_attention_backend(p)
        return x + int(use_flash) + 2 * int(use_fused) + 4 * int(use_unfused)

    monkeypatch.setenv("NVTE_FLASH_ATTN", "1")
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    x = torch.zeros(2)
    assert compiled(x, params()).tolist() == [1.0, 1.0]
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")  # dynamo guards os.environ: recompiles
    assert compiled(x, params()).tolist() == [4.0, 4.0]
    assert compiled(x, params(softmax_type="off-by-one")).tolist() == [4.0, 4.0]  # sinks: unfused
    assert compiled(x, params(return_max_logit=True)).tolist() == [0.0, 0.0]  # nothing runs it


def test_padded_offsets_equal_to_cu_seqlens_and_fast_zero_fill():
    torch.manual_seed(0)
    dpa = DotProductAttention(2, 16, qkv_format="thd", attn_mask_type="padding_causal")
    q, k, v = (torch.randn(20, 2, 16) for _ in range(3))
    cu = torch.tensor([0, 7, 16], dtype=torch.int32)
    base = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=9, max_seqlen_kv=9)
    ref = dpa(q, k, v, **base)
    assert ref[16:].abs().max() == 0  # tokens past the last sequence are zero-filled
    same = dpa(q, k, v, **base, cu_seqlens_q_padded=cu.clone(), cu_seqlens_kv_padded=cu.clone())
    slow = dpa(q, k, v, **base, fast_zero_fill=False)
    torch.testing.assert_close(same, ref, rtol=0, atol=0)
    torch.testing.assert_close(slow, ref, rtol=0, atol=0)
    # padding between sequences (kv only): the same keys moved to padded offsets, same output
    gaps = torch.tensor([0, 8, 18], dtype=torch.int32)
    k2, v2 = (torch.zeros_like(t) for t in (k, v))
    for t2, t in ((k2, k), (v2, v)):
        t2[0:7], t2[8:17] = t[0:7], t[7:16]
    out = dpa(q, k2, v2, **base, cu_seqlens_kv_padded=gaps)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(dpa(q, k, v, **base, num_splits=1), ref, rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="num_splits"):
        dpa(q, k, v, **base, num_splits=2)
    with pytest.raises(ValueError, match="fast_zero_fill"):
        dpa(q, k, v, **base, fast_zero_fill=1)


@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
def test_sinks_run_on_flash_and_unfused_on_the_cpu(softmax_type):
    # attention sinks: the CPU flash kernel and the unfused math take them, the fused slot not
    assert get_attention_backend(params(softmax_type=softmax_type))[5] == [True, False, True]
