"""Argument handling of the attention API: every bad input or unsupported TE feature raises a clear
error naming the argument (DotProductAttention, MultiheadAttention, TransformerLayer and the
te_lite fused-attention ops). Independent of the backend mode."""

from __future__ import annotations

import pytest
import torch
from attention_ref import BF16, FP32, cu_seqlens

import transformer_engine_lite.pytorch as te

S, B, HIDDEN, HEADS = 11, 2, 64, 4


def _qkv(fmt="bshd", dtype=FP32, h=4, h_kv=4, d=16, s=5):
    shape = {"bshd": (2, s), "sbhd": (s, 2), "thd": (2 * s,)}[fmt]
    return (torch.randn(*shape, n, d, dtype=dtype) for n in (h, h_kv, h_kv))


def _dpa(**kw):
    return te.DotProductAttention(4, 16, qkv_format=kw.pop("qkv_format", "bshd"), **kw)


BAD_INPUTS = [
    ("heads", lambda: _dpa()(*_qkv(h=3)), ValueError, "query_layer heads: expected 4"),
    ("gqa heads", lambda: _dpa(num_gqa_groups=2)(*_qkv()), ValueError, "key_layer heads"),
    ("head dim", lambda: _dpa()(*_qkv(d=8)), ValueError, "head dim: expected 16"),
    ("ndim", lambda: _dpa()(*_qkv("thd")), ValueError, "needs a 4-D tensor"),
    (
        "dtypes",
        lambda: _dpa()(next(_qkv(dtype=BF16)), *list(_qkv())[1:]),
        TypeError,
        "dtypes differ",
    ),
    ("int dtype", lambda: _dpa()(*(t.int() for t in _qkv())), TypeError, "float32, float16"),
    ("mask name", lambda: _dpa()(*_qkv(), attn_mask_type="lower"), ValueError, "attn_mask_type"),
    ("format name", lambda: _dpa()(*_qkv(), qkv_format="bhsd"), ValueError, "qkv_format"),
    (
        "bias name",
        lambda: _dpa()(*_qkv(), core_attention_bias_type="pre"),
        ValueError,
        "core_attention_bias_type",
    ),
    (
        "bias shape",
        lambda: _dpa()(
            *_qkv(),
            core_attention_bias_type="post_scale_bias",
            core_attention_bias=torch.zeros(1, 4, 5, 4),
        ),
        ValueError,
        r"expected \[1 or 2, 1 or 4, 5, 5\]",
    ),
    (
        "bias without type",
        lambda: _dpa()(*_qkv(), core_attention_bias=torch.zeros(1, 4, 5, 5)),
        ValueError,
        "core_attention_bias is given",
    ),
    (
        "alibi slopes",
        lambda: _dpa()(*_qkv(), core_attention_bias_type="alibi", alibi_slopes=torch.ones(3)),
        ValueError,
        "alibi_slopes",
    ),
    (
        "padding without lengths",
        lambda: _dpa()(*_qkv(), attn_mask_type="padding"),
        ValueError,
        "needs attention_mask or cu_seqlens",
    ),
    (
        "left padding",
        lambda: _dpa()(
            *_qkv(),
            attn_mask_type="padding",
            attention_mask=torch.tensor([True, False, False, False, False]).expand(2, 1, 1, 5),
        ),
        ValueError,
        "padding must be at the end",
    ),
    (
        "thd without cu_seqlens",
        lambda: _dpa(qkv_format="thd")(*_qkv("thd")),
        ValueError,
        "needs cu_seqlens_q",
    ),
    (
        "thd max_seqlen too small",
        lambda: _dpa(qkv_format="thd")(
            *_qkv("thd"),
            cu_seqlens_q=cu_seqlens([5, 5]),
            cu_seqlens_kv=cu_seqlens([5, 5]),
            max_seqlen_q=4,
        ),
        ValueError,
        "max_seqlen_q=4 is smaller",
    ),
    (
        "mask not a tensor",
        lambda: _dpa()(*_qkv(), attention_mask="causal"),
        TypeError,
        "attention_mask",
    ),
    ("causal window", lambda: _dpa()(*_qkv(), window_size=(2, 3)), ValueError, "right = 0"),
    ("window type", lambda: _dpa()(*_qkv(), window_size=(2,)), ValueError, "window_size"),
    (
        "arbitrary without mask",
        lambda: _dpa()(*_qkv(), attn_mask_type="arbitrary"),
        ValueError,
        "needs attention_mask",
    ),
    ("fp8_output", lambda: _dpa()(*_qkv(), fp8_output=1), ValueError, "fp8_output"),
    (
        "inference_params type",
        lambda: _dpa()(*_qkv(), inference_params=object()),
        TypeError,
        "InferenceParams",
    ),
    (
        "padded cu_seqlens",
        lambda: _dpa()(*_qkv(), cu_seqlens_q_padded=cu_seqlens([5, 5])),
        NotImplementedError,
        "cu_seqlens_q_padded",
    ),
    ("cp_group", lambda: _dpa(cp_group=object()), ValueError, "not initialized"),
    ("softmax_type", lambda: _dpa(softmax_type="off_by_one"), ValueError, "softmax_type"),
    ("gqa groups", lambda: _dpa(num_gqa_groups=3), ValueError, "num_gqa_groups"),
    ("dropout", lambda: _dpa(attention_dropout=1.0), ValueError, "attention_dropout"),
]


@pytest.mark.parametrize(
    "call,err,match", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_inputs_raise_clear_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


def _right_padding_mask(lengths, s):
    """TE's [b, 1, 1, s] bool mask, True = padded."""
    return torch.stack([torch.arange(s) >= n for n in lengths]).reshape(len(lengths), 1, 1, s)


def test_unused_arguments_are_ignored_as_te():
    """TE's DotProductAttention accepts and ignores what a format / mask does not use (TE's own
    test_attention.py passes them): cu_seqlens with a non-padding bshd mask, attention_mask with
    thd, and attention_mask next to cu_seqlens (cu_seqlens win)."""
    torch.manual_seed(0)
    q, k, v = _qkv(s=5)
    dpa = _dpa()
    ref = dpa(q, k, v, attn_mask_type="causal")
    out = dpa(q, k, v, attn_mask_type="causal", cu_seqlens_q=cu_seqlens([3, 5]),
              cu_seqlens_kv=cu_seqlens([3, 5]))
    assert torch.equal(out, ref)

    qt, kt, vt = _qkv("thd", s=5)
    dpa_thd = _dpa(qkv_format="thd")
    cu = cu_seqlens([4, 6])
    ref = dpa_thd(qt, kt, vt, attn_mask_type="padding_causal", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    out = dpa_thd(qt, kt, vt, attn_mask_type="padding_causal", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                  attention_mask=_right_padding_mask([4, 5], 6))
    assert torch.equal(out, ref)

    # bshd: the tensors' sequence dims are the lengths (TE passes max_seqlen_kv=256 with 128)
    assert torch.equal(dpa(q, k, v, attn_mask_type="causal", max_seqlen_q=9, max_seqlen_kv=3),
                       dpa(q, k, v, attn_mask_type="causal"))

    # padding: cu_seqlens decide; a contradicting attention_mask is not read
    cu = cu_seqlens([3, 5])
    ref = dpa(q, k, v, attn_mask_type="padding", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    out = dpa(q, k, v, attn_mask_type="padding", cu_seqlens_q=cu, cu_seqlens_kv=cu,
              attention_mask=_right_padding_mask([1, 2], 5))
    by_mask = dpa(q, k, v, attn_mask_type="padding", attention_mask=_right_padding_mask([3, 5], 5))
    assert torch.equal(out, ref) and torch.equal(by_mask, ref)


def _op(layout="bshd_bshd_bshd", mask="causal", q=None, k=None, v=None, bias_type="no_bias"):
    q0, k0, v0 = _qkv()
    return torch.ops.te_lite.fused_attn_fwd(
        q0 if q is None else q,
        k0 if k is None else k,
        v0 if v is None else v,
        layout,
        None,
        None,
        None,
        5,
        5,
        0.25,
        0.0,
        None,
        bias_type,
        mask,
        -1,
        0,
        False,
    )


def _strided_bs3hd():
    buf = torch.randn(2, 5, 3, 4, 16)
    return {
        "q": buf[:, :, 0],
        "k": buf[:, :, 1],
        "v": buf[:, :, 2].clone(),
    }  # v is not a view of it


OP_ERRORS = [
    ("layout name", lambda: _op(layout="bshd"), "qkv_layout': expected one of"),
    ("mask name", lambda: _op(mask="upper"), "mask_type': expected one of"),
    ("bias name", lambda: _op(bias_type="alibis"), "bias_type': expected one of"),
    ("packed strides", lambda: _op("bs3hd", **_strided_bs3hd()), "expects a view with strides"),
    (
        "packed pointers",
        lambda: _op(
            "bs3hd",
            v=torch.randn(2, 5, 3, 4, 16)[:, :, 2],
            **{k: v for k, v in _strided_bs3hd().items() if k != "v"},
        ),
        "packs it",
    ),
    ("ndim", lambda: _op("thd_thd_thd"), "expects a 3-D tensor"),
    ("int dtype", lambda: _op(q=torch.ones(2, 5, 4, 16, dtype=torch.int32)), "argument 'q'"),
]


@pytest.mark.parametrize("call,match", [c[1:] for c in OP_ERRORS], ids=[c[0] for c in OP_ERRORS])
def test_op_errors_name_the_argument(call, match):
    with pytest.raises(RuntimeError, match=match):
        call()


MODULE_BAD = [
    ("heads", lambda: te.MultiheadAttention(HIDDEN, 5), ValueError, "divisible"),
    (
        "tp without parallel mode",
        lambda: te.MultiheadAttention(HIDDEN, HEADS, tp_size=2),
        ValueError,
        "set_parallel_mode",
    ),
    (
        "qk_norm",
        lambda: te.MultiheadAttention(HIDDEN, HEADS, qk_norm_type="L2Norm"),
        ValueError,
        "qk_norm_type: expected None or one of",
    ),
    (
        "ub",
        lambda: te.MultiheadAttention(HIDDEN, HEADS, ub_overlap_ag=True, set_parallel_mode=True,
                                      tp_size=2, sequence_parallel=True),
        RuntimeError,
        "initialize_ub",
    ),
    (
        "attention_type",
        lambda: te.MultiheadAttention(HIDDEN, HEADS, attention_type="both"),
        ValueError,
        "attention_type",
    ),
    (
        "ln output without ln",
        lambda: te.MultiheadAttention(HIDDEN, HEADS, return_layernorm_output=True),
        ValueError,
        "input_layernorm",
    ),
    (
        "cross without encoder",
        lambda: te.MultiheadAttention(HIDDEN, HEADS, attention_type="cross")(
            torch.randn(S, B, HIDDEN)
        ),
        ValueError,
        "encoder_output",
    ),
    (
        "layer_type",
        lambda: te.TransformerLayer(HIDDEN, 96, HEADS, layer_type="moe"),
        ValueError,
        "layer_type",
    ),
    (
        "parallel mlp decoder",
        lambda: te.TransformerLayer(HIDDEN, 96, HEADS, parallel_attention_mlp=True,
                                    layer_type="decoder"),
        ValueError,
        "parallel_attention_mlp",
    ),
    (
        "ub overlap",
        lambda: te.TransformerLayer(HIDDEN, 96, HEADS, ub_tp_comm_overlap=True,
                                    set_parallel_mode=True, tp_size=2, sequence_parallel=True),
        RuntimeError,
        "initialize_ub",
    ),
    (
        "activation",
        lambda: te.TransformerLayer(HIDDEN, 96, HEADS, activation="tanh"),
        ValueError,
        "activation",
    ),
    (
        "decoder without encoder",
        lambda: te.TransformerLayer(HIDDEN, 96, HEADS, layer_type="decoder")(
            torch.randn(S, B, HIDDEN)
        ),
        ValueError,
        "encoder_output",
    ),
    (
        "inference type",
        lambda: te.TransformerLayer(HIDDEN, 96, HEADS)(
            torch.randn(S, B, HIDDEN), inference_params=object()
        ),
        TypeError,
        "InferenceParams",
    ),
    (
        "hidden size",
        lambda: te.TransformerLayer(HIDDEN, 96, HEADS)(torch.randn(S, B, 32)),
        ValueError,
        "last dim 64",
    ),
]


@pytest.mark.parametrize(
    "call,err,match", [c[1:] for c in MODULE_BAD], ids=[c[0] for c in MODULE_BAD]
)
def test_bad_module_arguments(call, err, match):
    with pytest.raises(err, match=match):
        call()


# What each selected backend runs as: AOTriton through the core's fused call (the flash module,
# whose nvte_fused_attn_* launch the AOTriton images when the selection picks them); CK has no
# binding. On a CPU machine the selection never picks either, so the selection is stubbed.
@pytest.mark.parametrize("picked,runs", [("aotriton", "flash"), ("flash", "flash"),
                                         ("unfused", "unfused"), ("ck", None)])
def test_selected_backend_binding(monkeypatch, picked, runs):
    from transformer_engine_lite.common.capi import DType
    from transformer_engine_lite.pytorch.attention import backends

    key = (0, int(DType.Float32), "bshd_bshd_bshd", "no_bias", "causal", 0.0, 4, 4, 16, 16, 64, 64,
           -1, 0, "")
    reasons = tuple("" if n == picked else "stub" for n in ("aotriton", "ck", "flash", "unfused"))
    monkeypatch.setattr(backends.selection, "select", lambda *key, **kw: (picked, reasons))
    if runs is None:
        with pytest.raises(NotImplementedError, match="backend 'ck' was selected"):
            backends._select(12345, *key)
    else:
        assert backends._select(12345, *key) == runs
    # TE's record names the slot: flash kernel -> FlashAttention, ck / aotriton -> FusedAttention
    rec = backends._attention_backends
    assert rec["use_fused_attention"] == (picked in ("ck", "aotriton"))
    assert rec["use_flash_attention"] == (picked == "flash")
    assert rec["use_unfused_attention"] == (picked == "unfused")
