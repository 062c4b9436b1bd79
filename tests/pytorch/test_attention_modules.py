"""MultiheadAttention and TransformerLayer (forward + backward, every parameter gradient) against
fp64 re-implementations in plain torch written here, their TE options and FP8 autocast.
The attention inside runs whichever backend the environment selects (test_attention.py covers
the backends themselves)."""

from __future__ import annotations

import math

import pytest
import torch
from attention_ref import ref_attention
from utils import (
    NORMWISE,
    TOLERANCES,
    assert_close,
    copy_params,
    ref_activation,
    ref_linear,
    ref_norm,
)

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import DelayedScaling, Float8CurrentScaling

S, B, HIDDEN, HEADS = 11, 2, 64, 4


# ----------------------------------------------------------------------------- references
def ref_rope(x: torch.Tensor, freqs: torch.Tensor, fmt: str, interleaved: bool) -> torch.Tensor:
    """x [s, b, h, d] / [b, s, h, d]; freqs [s_max, 1, 1, d2]: RoPE of the first d2 features."""
    s = x.shape[0] if fmt == "sbhd" else x.shape[1]
    f = freqs[:s].double()
    if fmt == "bshd":
        f = f.transpose(0, 1)
    d2 = f.shape[-1]
    t, rest = x[..., :d2], x[..., d2:]
    if interleaved:
        pairs = t.unflatten(-1, (-1, 2))
        rot = torch.stack((-pairs[..., 1], pairs[..., 0]), -1).flatten(-2)
    else:
        a, b = t.chunk(2, -1)
        rot = torch.cat((-b, a), -1)
    return torch.cat((t * f.cos() + rot * f.sin(), rest), -1)


def _weight(p: dict, prefix: str, names: tuple[str, ...], kind: str):
    """The (split or fused) weight / bias of a GEMM module in p, concatenated in output order."""
    if f"{prefix}{kind}" in p:
        return p[f"{prefix}{kind}"]
    parts = [p.get(f"{prefix}{n}_{kind}") for n in names]
    return None if parts[0] is None else torch.cat(parts)


def _linear(p: dict, prefix: str, x, names=("query", "key", "value")):
    return ref_linear(x, _weight(p, prefix, names, "weight"), _weight(p, prefix, names, "bias"))


def _norm(m, p: dict, prefix: str, x):
    return ref_norm(
        m.normalization,
        x,
        p[f"{prefix}layer_norm_weight"],
        p.get(f"{prefix}layer_norm_bias"),
        m.eps,
        m.zero_centered_gamma,
    )


def _split(m: te.MultiheadAttention, y: torch.Tensor, groups: list[int]) -> list[torch.Tensor]:
    d, g = m.hidden_size_per_attention_head, m.num_gqa_groups
    lead = y.shape[:-1]
    if m.qkv_weight_interleaved:
        parts = y.view(*lead, g, sum(groups), d).split(groups, -2)
    else:
        parts = y.view(*lead, sum(groups), g, d).split(groups, -3)
    return [t.reshape(*lead, n * g, d) for t, n in zip(parts, groups)]


def ref_mha(m: te.MultiheadAttention, p: dict, x, enc=None, rope=None, mask=None):
    """fp64 MultiheadAttention: returns (out [without proj bias if return_bias], proj bias,
    norm output)."""
    fmt = m.qkv_format
    hpg = m.num_attention_heads // m.num_gqa_groups
    ln = None
    if m.attention_type == "self":
        pre = "layernorm_qkv." if m.input_layernorm else "qkv."
        ln = _norm(m.layernorm_qkv, p, pre, x) if m.input_layernorm else x
        q, k, v = _split(m, _linear(p, pre, ln), [hpg, 1, 1])
    else:
        pre = "layernorm_query." if m.input_layernorm else "query_layer."
        ln = _norm(m.layernorm_query, p, pre, x) if m.input_layernorm else x
        q = _linear(p, pre, ln, ("query",))
        q = q.view(*q.shape[:-1], m.num_attention_heads, -1)
        k, v = _split(m, _linear(p, "key_value.", enc, ("key", "value")), [1, 1])
    if rope is not None:
        qf, kf = rope if isinstance(rope, tuple) else (rope, rope)
        q = ref_rope(q, qf, fmt, m.rotary_pos_interleaved)
        k = ref_rope(k, kf, fmt, m.rotary_pos_interleaved)
    if fmt == "sbhd":
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    b, sq, skv = q.shape[0], q.shape[1], k.shape[1]
    ctx = ref_attention(
        q,
        k,
        v,
        mask=mask or m.attn_mask_type,
        window=None,
        scale=q.shape[-1] ** -0.5,
        lens_q=[sq] * b,
        lens_kv=[skv] * b,
    )
    if fmt == "sbhd":
        ctx = ctx.transpose(0, 1)
    ctx = ctx.reshape(*ctx.shape[:2], -1)
    out = ref_linear(ctx, p["proj.weight"])
    bias = p.get("proj.bias")
    if not m.return_bias and bias is not None:
        out = out + bias
    return out, bias, ln


def ref_layer(layer: te.TransformerLayer, p: dict, x, enc=None, rope=None):
    def sub(prefix):
        return {k[len(prefix) :]: v for k, v in p.items() if k.startswith(prefix)}

    post = layer.apply_residual_connection_post_layernorm
    out, bias, ln = ref_mha(layer.self_attention, sub("self_attention."), x, rope=rope)
    res = ln if post and not layer.output_layernorm else x
    h = res + out + (0 if bias is None else bias)
    if layer.layer_type == "decoder":
        out, bias, ln = ref_mha(layer.inter_attention, sub("inter_attention."), h, enc=enc)
        h = (ln if post else h) + out + (0 if bias is None else bias)
    mlp = layer.layernorm_mlp
    pm = sub("layernorm_mlp.")
    ln = _norm(mlp, pm, "", h)
    y = ref_activation(mlp.activation, ref_linear(ln, pm["fc1_weight"], pm.get("fc1_bias")))
    y = ref_linear(y, pm["fc2_weight"], pm.get("fc2_bias"))
    out = (ln if post else h) + y
    if layer.output_layernorm:
        n = layer.layernorm
        out = ref_norm(
            n._kind,
            out,
            p["layernorm.weight"],
            p.get("layernorm.bias"),
            n.eps,
            n.zero_centered_gamma,
        )
    return out


# ----------------------------------------------------------------------------- harness
def compare(module, ref_fn, shapes: dict, dtype, kind=None, recipe=None, call=None):
    """Runs call (default: module) forward + backward, optionally under fp8_autocast, and ref_fn
    on fp64 copies of the inputs and of module's parameters; compares output, input and parameter
    gradients."""
    g = torch.Generator().manual_seed(0)
    inputs = {
        n: torch.randn(s, generator=g).to(dtype).requires_grad_(True) for n, s in shapes.items()
    }
    with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
        out = (call or module)(*inputs.values())
    out = out[0] if isinstance(out, tuple) else out
    dy = torch.randn(out.shape, generator=g).to(dtype)
    out.backward(dy)
    p64 = {n: t.detach().double().requires_grad_(True) for n, t in module.named_parameters()}
    x64 = {n: t.detach().double().requires_grad_(True) for n, t in inputs.items()}
    ref = ref_fn(p64, *x64.values())
    ref = ref[0] if isinstance(ref, tuple) else ref
    ref.backward(dy.double())
    kind = kind or dtype
    assert torch.isfinite(out).all(), "non-finite output"
    assert_close(out, ref, kind, "output")
    for n, t in inputs.items():
        assert_close(t.grad, x64[n].grad, kind, f"grad of input {n}")
    scale = max(t.grad.abs().max().item() for t in p64.values())
    for n, prm in module.named_parameters():
        r = p64[n].grad
        if kind in NORMWISE and r.norm() <= 1e-9 * scale:
            # Exactly-zero gradients (the key bias: softmax ignores a per-row constant) have no
            # relative scale: the FP8 result must be small against the module's gradients.
            assert prm.grad.abs().max().item() <= TOLERANCES[kind][0] * scale, f"grad of {n}"
            continue
        assert_close(prm.grad, r, kind, f"grad of {n}")


def _x_shape(fmt: str, s: int = S) -> tuple[int, int, int]:
    return (s, B, HIDDEN) if fmt == "sbhd" else (B, s, HIDDEN)


MHA_CASES = [
    {"input_layernorm": True},
    {
        "qkv_format": "bshd",
        "fuse_qkv_params": True,
        "num_gqa_groups": 2,
        "attn_mask_type": "no_mask",
    },
    {
        "fuse_qkv_params": True,
        "qkv_weight_interleaved": False,
        "input_layernorm": True,
        "normalization": "RMSNorm",
        "rope": "pair",
    },
    {
        "attention_type": "cross",
        "qkv_format": "bshd",
        "input_layernorm": True,
        "fuse_qkv_params": True,
        "attn_mask_type": "no_mask",
    },
    {
        "attention_type": "cross",
        "num_gqa_groups": 1,
        "input_layernorm": True,
        "normalization": "RMSNorm",
        "zero_centered_gamma": True,
        "attn_mask_type": "no_mask",
        "rope": "one",
    },
    {
        "input_layernorm": True,
        "return_bias": True,
        "return_layernorm_output": True,
        "kv_channels": 24,
    },
    {"qkv_format": "bshd", "rotary_pos_interleaved": True, "rope": "one", "num_gqa_groups": 2},
]


def _rope_args(kind, d):
    if kind is None:
        return None
    rpe = te.RotaryPositionEmbedding(d)
    if kind == "pair":
        return (rpe(S), te.RotaryPositionEmbedding(d, rotary_percent=0.5)(S + 4))
    return rpe(S + 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kw", MHA_CASES, ids=[str(i) for i in range(len(MHA_CASES))])
def test_multihead_attention(kw, dtype):
    kw = dict(kw)
    rope_kind = kw.pop("rope", None)
    m = te.MultiheadAttention(HIDDEN, HEADS, attention_dropout=0.0, params_dtype=dtype, **kw)
    fmt = m.qkv_format
    rope = _rope_args(rope_kind, m.hidden_size_per_attention_head)
    shapes = {"x": _x_shape(fmt)}
    cross = m.attention_type == "cross"
    if cross:
        shapes["enc"] = _x_shape(fmt, S + 6)

    def run(x, enc=None):
        return m(x, encoder_output=enc, rotary_pos_emb=rope)

    def ref(p, x, enc=None):
        out, bias, _ = ref_mha(m, p, x, enc, rope)
        return out if not m.return_bias else out + bias

    def module(x, enc=None):
        out = run(x, enc)
        if m.return_bias:  # (out, bias, ln_out): the sum is what the reference returns
            assert len(out) == 3 and out[2].shape == x.shape
            return out[0] + out[1]
        return out

    compare(m, ref, shapes, dtype, call=module)


LAYER_CASES = [
    {},
    {
        "layer_type": "decoder",
        "attn_input_format": "bshd",
        "activation": "swiglu",
        "normalization": "RMSNorm",
        "num_gqa_groups": 2,
        "fuse_qkv_params": True,
        "rope": True,
    },
    {"apply_residual_connection_post_layernorm": True, "activation": "relu", "kv_channels": 8},
    {"output_layernorm": True, "zero_centered_gamma": True, "self_attn_mask_type": "no_mask"},
    {"layer_type": "decoder", "apply_residual_connection_post_layernorm": True, "bias": False},
]


@pytest.mark.parametrize("kw", LAYER_CASES, ids=[str(i) for i in range(len(LAYER_CASES))])
def test_transformer_layer(kw):
    kw = dict(kw)
    rope = te.RotaryPositionEmbedding(HIDDEN // HEADS)(S) if kw.pop("rope", False) else None
    layer = te.TransformerLayer(
        HIDDEN,
        96,
        HEADS,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
        **kw,
    )
    fmt = layer.attn_input_format
    shapes = {"x": _x_shape(fmt)}
    if layer.layer_type == "decoder":
        shapes["enc"] = _x_shape(fmt, S - 4)

    def module(x, enc=None):
        return layer(x, encoder_output=enc, rotary_pos_emb=rope)

    compare(
        layer,
        lambda p, x, enc=None: ref_layer(layer, p, x, enc, rope),
        shapes,
        torch.float32,
        call=module,
    )


@pytest.mark.parametrize(
    "recipe", [DelayedScaling(), Float8CurrentScaling()], ids=["delayed", "current"]
)
def test_transformer_layer_fp8(recipe):
    """Under fp8_autocast the layer's GEMMs run in FP8: finite, and within the FP8 tolerance of the
    fp64 reference (the attention itself stays bf16)."""
    layer = te.TransformerLayer(
        HIDDEN, 128, HEADS, hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.bfloat16
    )
    compare(
        layer,
        lambda p, x: ref_layer(layer, p, x),
        {"x": _x_shape("sbhd", 32)},
        torch.bfloat16,
        kind="fp8_2gemm",
        recipe=recipe,
    )


def test_dropout_in_training_only():
    layer = te.TransformerLayer(
        HIDDEN, 96, HEADS, hidden_dropout=0.3, attention_dropout=0.3, drop_path_rate=0.2
    )
    x = torch.randn(_x_shape("sbhd"))
    torch.manual_seed(0)
    a = layer(x)
    torch.manual_seed(0)
    assert torch.equal(layer(x), a)
    assert not torch.equal(layer(x), a)
    layer.eval()
    assert torch.equal(layer(x), layer(x))


def test_padding_mask_and_thd_through_the_layer():
    """A padded bshd batch and the same sequences packed as thd give the same valid tokens."""
    layers = [
        te.TransformerLayer(
            HIDDEN,
            96,
            HEADS,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            self_attn_mask_type="padding_causal",
            attn_input_format=fmt,
        )
        for fmt in ("bshd", "thd")
    ]
    copy_params(layers[1], layers[0])
    lens = [S, 6]
    x = torch.randn(B, S, HIDDEN)
    mask = (torch.arange(S)[None] >= torch.tensor(lens)[:, None]).view(B, 1, 1, S)
    padded = layers[0](x, attention_mask=mask)
    cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32)
    packed = layers[1](torch.cat([x[0], x[1, : lens[1]]]), cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert_close(packed, torch.cat([padded[0], padded[1, : lens[1]]]), torch.float32, "thd")


def test_decoder_sequences_as_te():
    """TransformerLayer hands the self-attention q's sequences for both sides (cu_seqlens_q) and
    the cross-attention q's and kv's (cu_seqlens_kv: the encoder's), in bshd too; there
    cu_seqlens are the padding, as an enc_dec_attn_mask of the same lengths gives."""
    torch.manual_seed(0)
    layer = te.TransformerLayer(HIDDEN, 96, HEADS, layer_type="decoder", attn_input_format="bshd",
                                self_attn_mask_type="padding", hidden_dropout=0.0,
                                attention_dropout=0.0)
    x, enc = torch.randn(B, S, HIDDEN), torch.randn(B, 7, HIDDEN)
    lq, lkv = [9, S], [4, 7]
    cu_q = torch.tensor([0, lq[0], sum(lq)], dtype=torch.int32)
    cu_kv = torch.tensor([0, lkv[0], sum(lkv)], dtype=torch.int32)
    by_cu = layer(x, encoder_output=enc, enc_dec_attn_mask_type="padding", cu_seqlens_q=cu_q,
                  cu_seqlens_kv=cu_kv, max_seqlen_q=S, max_seqlen_kv=7)

    def pad(lens, s):
        return torch.stack([torch.arange(s) >= n for n in lens]).reshape(B, 1, 1, s)

    by_mask = layer(x, attention_mask=pad(lq, S), encoder_output=enc,
                    enc_dec_attn_mask_type="padding", enc_dec_attn_mask=(pad(lq, S), pad(lkv, 7)))
    for b, n in enumerate(lq):
        assert_close(by_cu[b, :n], by_mask[b, :n], torch.float32, f"sequence {b}")


def test_parameter_names_follow_te():
    names = {
        n
        for n, _ in te.TransformerLayer(
            HIDDEN, 96, HEADS, layer_type="decoder", output_layernorm=True
        ).named_parameters()
    }
    for n in (
        "self_attention.qkv.query_weight",
        "self_attention.proj.weight",
        "inter_attention.layernorm_query.query_weight",
        "inter_attention.key_value.key_weight",
        "layernorm_mlp.fc1_weight",
        "layernorm.weight",
    ):
        assert n in names, f"{n} not in {sorted(names)}"
    fused = te.MultiheadAttention(HIDDEN, HEADS, input_layernorm=True, fuse_qkv_params=True)
    assert {n for n, _ in fused.named_parameters()} == {
        "layernorm_qkv.layer_norm_weight",
        "layernorm_qkv.layer_norm_bias",
        "layernorm_qkv.weight",
        "layernorm_qkv.bias",
        "proj.weight",
        "proj.bias",
    }
    assert math.isclose(fused.core_attention.softmax_scale, (HIDDEN // HEADS) ** -0.5)
