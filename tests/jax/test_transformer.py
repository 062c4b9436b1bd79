"""Attention Flax modules (DotProductAttention, MultiHeadAttention, RelativePositionBiases,
TransformerLayer) against pure-JAX references written here with the parameters copied (forward and
gradients, fp32 / bf16, both attention backends), TE's field counts, defaults and parameter paths,
FP8 under each recipe, dropout streams, the decode cache and refused fields."""

from __future__ import annotations

import dataclasses
import math
import warnings
from functools import partial

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from utils import assert_close, tols

import transformer_engine_lite.jax as te
import transformer_engine_lite.jax.flax as te_flax
from transformer_engine_lite.common import recipe

HI = jax.lax.Precision.HIGHEST
F32, BF16 = jnp.float32, jnp.bfloat16
RECIPES = [recipe.DelayedScaling(), recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling()]
ENC, DEC = te_flax.TransformerLayerType.ENCODER, te_flax.TransformerLayerType.DECODER
KEY = jax.random.PRNGKey


def _unbox(vs):
    return flax.core.meta.unbox(vs["params"])


# Inputs and parameters come from numpy: jax.random and the initialisers compile once per shape,
# which was most of this file's run time (the initialisers are tested on their own).
def randn(seed, shape, dtype, scale=1.0):
    x = np.random.default_rng(seed).standard_normal(shape, np.float32) * scale
    return jnp.asarray(x, dtype)


def _shapes(module, *args, **kw):
    # args closed over, not traced: MHA detects self-attention by identity (inputs_q is
    # inputs_kv) and RelativePositionBiases takes Python ints
    return jax.eval_shape(lambda key: module.init(key, *args, **kw), KEY(0))


def _rand_params(module, *args, seed=0, **kw):
    """Random parameters of module's structure: norm scales != 1 and biases != 0 (every
    parameter matters), kernels ~ 0.5 / sqrt(fan_in)."""
    rng = np.random.default_rng(seed)

    def draw(path, s):
        name, x = path[-1].key, rng.standard_normal(s.shape, np.float32)
        if name == "scale" or "bias" in name or name == "rel_embedding":
            return jnp.asarray((name == "scale") + 0.2 * x)
        return jnp.asarray(0.5 * x / np.sqrt(s.shape[0]))

    return jax.tree_util.tree_map_with_path(draw, _unbox(_shapes(module, *args, **kw)))


def _paths(params) -> set:
    return set(flax.traverse_util.flatten_dict(params, sep="/"))


def _ein(spec, *xs):
    return jnp.einsum(spec, *(x.astype(F32) for x in xs), precision=HI)


def _compare(fn, ref, args, dtype, w, scales=(4.0, 8.0)):
    """fn(*args) vs ref(*args in fp32): values, and gradients of sum(out * w) w.r.t. args."""
    argnums = tuple(range(len(args)))

    def grads(f, args):
        def loss(*a):
            out = f(*a)
            return jnp.sum(out.astype(F32) * w), out

        return jax.value_and_grad(loss, argnums, has_aux=True)(*args)

    (_, out), g = grads(fn, args)
    (_, want), rg = grads(ref, jax.tree_util.tree_map(lambda t: t.astype(F32), args))
    assert out.dtype == dtype
    assert_close(out, want, dtype, scales[0])
    jax.tree_util.tree_map(lambda a, r: assert_close(a, r, dtype, scales[1]), g, rg)


@pytest.fixture(params=["fused", "unfused"])
def backend(request, monkeypatch):  # NVTE_FUSED_ATTN=0 forces DPA's unfused module
    monkeypatch.setenv("NVTE_FUSED_ATTN", "1" if request.param == "fused" else "0")
    return request.param


# ------------------------------------------------------------------------------ references
def ref_attention(q, k, v, bias=None, *, causal=False, q_len=None, kv_len=None, scale=1.0,
                  pre_scale=False, window=None):
    """softmax(scale * q k^T + bias) v in fp32; q [b, sq, h, d], k / v [b, sk, h_kv, d]. Rows
    with nothing kept (and padded queries) give 0, the backends' convention."""
    _, sq, h, _ = q.shape
    sk = k.shape[1]
    k, v = (jnp.repeat(t, h // t.shape[2], axis=2) for t in (k, v))
    s = _ein("bqhd,bkhd->bhqk", q, k)
    bias = 0.0 if bias is None else bias
    s = (s + bias) * scale if pre_scale else s * scale + bias
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    keep = np.ones((1, 1, sq, sk), bool) & ((j <= i) if causal else True)
    if window is not None:
        keep = keep & (j >= i - window[0]) & ((j <= i + window[1]) if window[1] >= 0 else True)
    if kv_len is not None:  # [b, 1, 1|sq, 1|sk] per-row lengths
        keep = keep & (j < np.asarray(kv_len)[:, None, None, None])
    if q_len is not None:
        keep = keep & (i < np.asarray(q_len)[:, None, None, None])
    p = jax.nn.softmax(jnp.where(keep, s, -1e30), axis=-1) * np.any(keep, -1, keepdims=True)
    return _ein("bhqk,bkhd->bqhd", p, v)


def ref_norm(x, p, kind, eps=1e-6):
    x = x.astype(F32)
    if kind == "layernorm":
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * p["scale"] \
            + p["ln_bias"]
    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * p["scale"]


def ref_rope(x, method, windows=(1, 10000)):
    """Rotation of pairs (2i, 2i+1) ("consecutive") or (i, i + d/2) ("alternate") by the angle
    pos / (lo * (hi/lo)^(2i/d)); x [b, s, h, d]."""
    x = x.astype(F32)
    d, lo, hi = x.shape[-1], windows[0], windows[1]
    ang = np.arange(x.shape[1])[:, None] / (lo * (hi / lo) ** (2 * np.arange(d // 2) / d))
    cos, sin = (jnp.asarray(f(ang), F32)[None, :, None, :] for f in (np.cos, np.sin))
    if method == "consecutive":
        a, b = x[..., 0::2], x[..., 1::2]
        return jnp.stack([a * cos - b * sin, b * cos + a * sin], -1).reshape(x.shape)
    a, b = jnp.split(x, 2, -1)
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def t5_bucket(rel: int, bidirectional: bool, num_buckets=32, max_distance=128) -> int:
    """T5's relative_position_bucket, one scalar at a time in float64."""
    n, ret = -rel, 0
    if bidirectional:
        num_buckets //= 2
        ret += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return ret + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact)
                        * (num_buckets - exact))
    return ret + min(large, num_buckets - 1)


def ref_relpos(table, q_len, k_len, bidirectional):
    idx = np.array([[t5_bucket(j - i, bidirectional) for j in range(k_len)]
                    for i in range(q_len)])
    return table[:, idx][None]


def ref_mha(p, xq, xkv, h, g, *, norm="layernorm", ln=True, rope=None, causal=True,
            kv_len=None, bias=None):
    """te_flax.MultiHeadAttention's math on its own parameter dict -> (out, ln_out)."""
    first = p["qkv"] if "qkv" in p else p["query"]
    y = ref_norm(xq, first, norm) if ln else xq.astype(F32)
    dense = lambda x, q: _ein("bsh,h...->bs...", x, q["kernel"]) + q.get("bias", 0.0)
    if "qkv" in p:
        qkv = dense(y, p["qkv"])
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
        q = dense(y, p["query"])
        src = y if xq is xkv else xkv
        if "kv" in p:
            kv = dense(src, p["kv"])
            k, v = kv[:, :, 0], kv[:, :, 1]
        else:
            k, v = dense(src, p["key"]), dense(src, p["value"])
    b, s = q.shape[:2]
    d = q.shape[-1] // h
    q, k, v = q.reshape(b, s, h, d), k.reshape(b, -1, g, d), v.reshape(b, -1, g, d)
    if rope:
        q, k = ref_rope(q, rope), ref_rope(k, rope)
    o = ref_attention(q, k, v, causal=causal, kv_len=kv_len, bias=bias)
    return dense(o.reshape(b, s, h * d), p["out"]), y


def ref_mlp(p, x, norm, act):
    h = _ein("bsh,hnf->bsnf", ref_norm(x, p, norm), p["wi_kernel"]) + p.get("wi_bias", 0.0)
    a = jax.nn.gelu(h[..., 0, :], approximate=True) if act == ("gelu",) else \
        jax.nn.silu(h[..., 0, :]) * h[..., 1, :]
    return _ein("bsf,fh->bsh", a, p["wo_kernel"]) + p.get("wo_bias", 0.0)


def ref_layer(p, x, enc, enc_len, c):
    """te_flax.TransformerLayer (pre-norm; post-norm residual / output_layernorm variants)."""
    h, g = c["heads"], c.get("num_gqa_groups") or c["heads"]
    norm, post = c.get("layernorm_type", "layernorm"), c.get("post_ln", False)
    decoder = c["layer_type"] is DEC
    bias = ref_relpos(p["relpos_bias"]["rel_embedding"], x.shape[1], x.shape[1], not decoder)
    att = p["self_attention" if decoder else "attention"]
    y, ln = ref_mha(att, x, x, h, g, norm=norm, ln=not c.get("output_ln"), bias=bias)
    x = y + (ln if post else x)
    if decoder:
        y, ln = ref_mha(p["encoder_decoder_attention"], x, enc, h, g, norm=norm, causal=False,
                        kv_len=enc_len)
        x = y + (ln if post else x)
    z = ref_mlp(p["mlp"], x, norm, c["act"]) + (ref_norm(x, p["mlp"], norm) if post else x)
    return ref_norm(z, p["output_layernorm"], norm) if c.get("output_ln") else z


# ------------------------------------------------------------------------------ fields
def _fields(cls):
    return {f.name: f for f in dataclasses.fields(cls) if f.name not in ("parent", "name")}


def test_fields_and_defaults_match_te():
    counts = {te_flax.DotProductAttention: 21, te_flax.MultiHeadAttention: 37,
              te_flax.RelativePositionBiases: 6, te_flax.TransformerLayer: 44}
    for cls, n in counts.items():
        assert len(_fields(cls)) == n, (cls.__name__, sorted(_fields(cls)))
    defaults = {
        te_flax.DotProductAttention: {"attn_mask_type": "causal", "qkv_layout": "bshd_bshd_bshd",
                                      "transpose_batch_sequence": None, "dtype": None,
                                      "softmax_type": "vanilla", "dropout_rng_name": "dropout"},
        te_flax.MultiHeadAttention: {"scaled_query_init": True, "fuse_qkv_params": True,
                                     "rotary_pos_emb_windows": (1, 10000), "num_heads": None,
                                     "dropout_rate": None, "output_layernorm": None,
                                     "apply_residual_connection_post_layernorm": None,
                                     "fuse_qkv": None, "dtype": jnp.float32},
        te_flax.TransformerLayer: {"hidden_size": 512, "mlp_hidden_size": 2048,
                                   "num_attention_heads": 8, "hidden_dropout": 0.1,
                                   "attention_dropout": 0.1, "layer_type": ENC,
                                   "enable_relative_embedding": True,
                                   "transpose_batch_sequence": False,
                                   "self_attn_mask_type": "causal"}}
    for cls, want in defaults.items():
        assert {k: _fields(cls)[k].default for k in want} == want, cls.__name__
    assert [m.value for m in te_flax.TransformerLayerType] == ["encoder", "decoder"]
    with pytest.warns(UserWarning, match="transpose_batch_sequence defaults to False"):
        assert te_flax.DotProductAttention(4, 2).transpose_batch_sequence is False


# ------------------------------------------------------------------------------ DotProductAttention
DPA_CASES = {
    "causal": {"mask_type": "causal"},
    "padding_mask": {"mask_type": "padding"},
    "padding_causal": {"mask_type": "padding_causal"},
    "gqa": {"mask_type": "no_mask", "h_kv": 1},
    "post_scale_bias": {"mask_type": "causal", "bias": "post_scale_bias"},
    "window": {"mask_type": "causal", "window": (3, 0)},
}


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(DPA_CASES))
def test_dpa_matches_reference(case, dtype, backend):
    c = DPA_CASES[case]
    b, s, h, d = 2, 8, 4, 8  # the shapes of the MHA / layer tests: shared compilations
    hk = c.get("h_kv", h)
    q, k, v = (randn(i, (b, s, n, d), dtype) for i, n in ((1, h), (2, hk), (3, hk)))
    bias = randn(4, (1, h, s, s), dtype) if "bias" in c else None
    lens = np.array([8, 5])
    padding = "padding" in c["mask_type"]
    mask = None
    if padding:  # True = masked: keys and queries past each row's length
        keep = np.arange(s)[None, :] < lens[:, None]
        mask = jnp.asarray(~(keep[:, None, :, None] & keep[:, None, None, :]))
    dpa = te_flax.DotProductAttention(head_dim=d, num_attention_heads=h, num_gqa_groups=hk,
                                      attn_mask_type=c["mask_type"], attn_bias_type=c.get("bias"),
                                      transpose_batch_sequence=False,
                                      window_size=c.get("window"),
                                      float32_logits=backend == "unfused")
    ref = partial(ref_attention, causal="causal" in c["mask_type"], scale=1 / math.sqrt(d),
                  window=c.get("window"),
                  q_len=lens if padding else None, kv_len=lens if padding else None)
    _compare(lambda q, k, v, bias: dpa.apply({}, q, k, v, mask, bias), ref, (q, k, v, bias),
             dtype, randn(5, (b, s, h, d), F32), (2.0, 4.0))


def test_dpa_backend_submodule_and_fallback_warning(monkeypatch):
    """The backend runs as TE's auto-named submodule; pre_scale_bias has no fused kernel here, so
    the unfused one runs with TE's warning, once per configuration."""
    from transformer_engine_lite.jax.cpp_extensions import base

    base._warn_once.cache_clear()  # the warning is once per process and message
    q = randn(1, (2, 8, 4, 8), F32)
    bias = randn(2, (1, 4, 8, 8), F32)

    def backend_of(dpa, *args):
        _, st = dpa.apply({}, q, q, q, *args, capture_intermediates=True,
                          mutable=["intermediates"])
        return [k for k in st["intermediates"] if k.endswith("DotProductAttention_0")]

    fused = te_flax.DotProductAttention(head_dim=8, num_attention_heads=4,
                                        transpose_batch_sequence=False)
    assert backend_of(fused) == ["_FusedDotProductAttention_0"]
    pre = fused.clone(attn_bias_type="pre_scale_bias")
    with pytest.warns(UserWarning, match="Fused attention is not enabled because there is no"):
        assert backend_of(pre, None, bias) == ["_UnfusedDotProductAttention_0"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # second time: no warning
        out = pre.apply({}, q, q, q, None, bias)
    want = ref_attention(q, q, q, causal=True, bias=bias, scale=1 / math.sqrt(8), pre_scale=True)
    assert_close(out, want, F32, 2.0)


@pytest.mark.parametrize("layout", ["bs3hd", "bshd_bs2hd"])
@pytest.mark.parametrize("tbs", [False, True], ids=["bshd", "sbhd"])
def test_dpa_packed_layouts_and_transpose(layout, tbs):
    q, k, v = (randn(i, (2, 8, 4, 8), F32) for i in range(3))
    want = ref_attention(q, k, v, causal=True, scale=0.5)
    args = (jnp.stack([q, k, v], axis=2), None, None) if layout == "bs3hd" else \
        (q, jnp.stack([k, v], axis=2), None)
    if tbs:
        args = tuple(a if a is None else jnp.swapaxes(a, 0, 1) for a in args)
    dpa = te_flax.DotProductAttention(head_dim=8, num_attention_heads=4, qkv_layout=layout,
                                      scale_factor=0.5, transpose_batch_sequence=tbs)
    out = dpa.apply({}, *args)
    assert_close(jnp.swapaxes(out, 0, 1) if tbs else out, want, F32, 2.0)


# ------------------------------------------------------------------------------ MultiHeadAttention
MHA_CASES = {
    "fused_qkv": {},
    "gqa_query_kv": {"num_gqa_groups": 1},
    "separate_qkv": {"fuse_qkv_params": False},
    "rope_consecutive": {"enable_rotary_pos_emb": True},
    "rope_alternate": {"enable_rotary_pos_emb": True, "rotary_pos_emb_group_method": "alternate",
                       "num_gqa_groups": 2, "use_bias": True},
    "cross_rmsnorm": {"layernorm_type": "rmsnorm", "attn_mask_type": "no_mask"},
}
_Q = {"query/kernel", "query/scale", "query/ln_bias"}
MHA_PATHS = {  # TE's submodules: qkv (self, no GQA), query + kv, or query + key + value
    "fused_qkv": {"qkv/kernel", "qkv/scale", "qkv/ln_bias", "out/kernel"},
    "gqa_query_kv": _Q | {"kv/kernel", "out/kernel"},
    "separate_qkv": _Q | {"key/kernel", "value/kernel", "out/kernel"},
    "rope_alternate": _Q | {"query/bias", "kv/kernel", "kv/bias", "out/kernel", "out/bias"},
    "cross_rmsnorm": {"query/kernel", "query/scale", "kv/kernel", "out/kernel"},
}


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(MHA_CASES))
def test_mha_matches_reference(case, dtype):
    c = MHA_CASES[case]
    b, s, hidden, h = 2, 8, 32, 4
    xq = randn(1, (b, s, hidden), dtype)
    cross = case.startswith("cross")
    xkv = randn(2, (b, 12, hidden), dtype) if cross else xq
    mha = te_flax.MultiHeadAttention(head_dim=8, num_attention_heads=h,
                                     transpose_batch_sequence=False, **c)
    p = _rand_params(mha, xq, xkv)
    if case in MHA_PATHS:
        assert _paths(p) == MHA_PATHS[case]
    g = c.get("num_gqa_groups", h)
    rope = c.get("rotary_pos_emb_group_method", "consecutive") if "rope" in case else None
    # xkv is xq for self-attention: MHA tells them apart by identity
    _compare(lambda p: mha.apply({"params": p}, xq, xkv)[0],
             lambda p: ref_mha(p, xq, xkv, h, g, norm=c.get("layernorm_type", "layernorm"),
                               rope=rope, causal=c.get("attn_mask_type") != "no_mask")[0],
             (p,), dtype, randn(3, (b, s, hidden), F32))


@pytest.mark.parametrize("scaled", [True, False])
def test_mha_initialisers(scaled):
    """Default kernel_init is variance_scaling(1, fan_in, normal); scaled_query_init divides the
    query part by sqrt(head_dim); q, k and v are drawn independently."""
    x = jnp.zeros((1, 4, 64))
    mha = te_flax.MultiHeadAttention(head_dim=16, num_attention_heads=4,
                                     scaled_query_init=scaled, transpose_batch_sequence=False)
    p = _unbox(mha.clone(kernel_init=lambda key, shape, dtype: jnp.ones(shape, dtype)).init(
        KEY(0), x, x))
    np.testing.assert_allclose(p["qkv"]["kernel"][:, 0], 0.25 if scaled else 1.0, rtol=1e-6)
    np.testing.assert_allclose(p["qkv"]["kernel"][:, 1:], 1.0)
    p = _unbox(mha.init(KEY(0), x, x))
    kq, kk, kv = (np.asarray(p["qkv"]["kernel"][:, i]) for i in range(3))
    assert abs(kk.std() * 8 - 1) < 0.1 and abs(kv.std() * 8 - 1) < 0.1  # 1/sqrt(fan_in 64)
    assert abs(kq.std() * 8 * (4 if scaled else 1) - 1) < 0.1  # and 1/sqrt(head_dim 16)
    assert np.max(np.abs(kk - kv)) > 0.1
    assert np.abs(p["out"]["kernel"]).max() > 3 / 8  # "normal", not truncated at 2 sigma


def test_mha_decode_cache_matches_full_causal():
    """Decoding one token at a time through the cache gives the causal full-sequence output."""
    b, length, hidden = 2, 8, 32
    x = randn(1, (b, length, hidden), F32)
    kw = {"head_dim": 8, "num_attention_heads": 4, "transpose_batch_sequence": False}
    dec = te_flax.MultiHeadAttention(attn_mask_type="padding", **kw)
    args = (x, x, jnp.zeros((b, 1, length, length), bool))
    cache = _shapes(dec, *args, decode=True)["cache"]
    assert set(cache) == {"cached_key", "cached_value", "cache_index"}
    cache = jax.tree_util.tree_map(lambda t: jnp.zeros(t.shape, t.dtype), cache)
    params = _rand_params(dec, *args, decode=True)
    want, _ = te_flax.MultiHeadAttention(**kw).apply({"params": params}, x, x)
    for t in range(length):
        xt = x[:, t:t + 1]
        (out, _), upd = dec.apply({"params": params, "cache": cache}, xt, xt, decode=True,
                                  mutable=["cache"])
        cache = upd["cache"]
        assert_close(out[:, 0], want[:, t], F32, 4.0)
    assert int(cache["cache_index"]) == length
    with pytest.raises(ValueError, match="one-step query"):
        dec.apply({"params": params, "cache": cache}, x, x, decode=True, mutable=["cache"])


@pytest.mark.parametrize("alias, value, field, want", [
    ("num_heads", 3, "num_gqa_groups", 3), ("dropout_rate", 0.3, "attention_dropout", 0.3),
    ("fuse_qkv", False, "fuse_qkv_params", True),  # TE: warns, no effect
    ("apply_residual_connection_post_layernorm", True, "return_layernorm_output", False)])
def test_mha_deprecated_aliases(alias, value, field, want):
    with pytest.warns(DeprecationWarning, match=alias):
        m = te_flax.MultiHeadAttention(head_dim=4, num_attention_heads=1,
                                       transpose_batch_sequence=False, **{alias: value})
    assert getattr(m, field) == want and m.num_gqa_groups == m.num_attention_heads
    with pytest.raises(ValueError, match="output_layernorm"):
        te_flax.MultiHeadAttention(head_dim=4, num_attention_heads=1, output_layernorm=True,
                                   transpose_batch_sequence=False)


# ------------------------------------------------------------------------------ RelativePositionBiases
@pytest.mark.parametrize("lens", [(5, 300), (300, 5), (9, 9)], ids=str)
@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_buckets(bidirectional, lens):
    """Buckets vs T5's formula over distances past max_distance (128), in both directions."""
    rpb = te_flax.RelativePositionBiases(num_buckets=32, max_distance=128, num_attention_heads=3)
    vs = {"params": _rand_params(rpb, *lens, bidirectional)}
    table = vs["params"]["rel_embedding"]  # (heads, buckets)
    out = rpb.apply(vs, *lens, bidirectional)
    assert out.shape == (1, 3, *lens)
    np.testing.assert_array_equal(out, ref_relpos(table, *lens, bidirectional))
    buckets = {t5_bucket(r, bidirectional) for r in range(-300, 300)}
    # every bucket is reachable but 16 when bidirectional ("key after query" at distance 0)
    assert buckets == (set(range(32)) - {16} if bidirectional else set(range(32)))


# ------------------------------------------------------------------------------ TransformerLayer
LAYER_CASES = {
    "enc_ln_gelu": {"layer_type": ENC, "act": ("gelu",)},
    "enc_rms_swiglu_gqa": {"layer_type": ENC, "act": ("silu", "linear"),
                           "layernorm_type": "rmsnorm", "num_gqa_groups": 2},
    "enc_post_ln_residual": {"layer_type": ENC, "act": ("gelu",), "post_ln": True},
    "enc_output_ln": {"layer_type": ENC, "act": ("silu", "linear"), "output_ln": True},
    "dec_ln_swiglu": {"layer_type": DEC, "act": ("silu", "linear")},
    "dec_rms_gelu": {"layer_type": DEC, "act": ("gelu",), "layernorm_type": "rmsnorm"},
    "dec_seq_first": {"layer_type": DEC, "act": ("gelu",), "transpose_batch_sequence": True},
}


def _layer(c, **extra):
    kw = {k: v for k, v in c.items() if k in ("layer_type", "layernorm_type", "num_gqa_groups",
                                              "transpose_batch_sequence")}
    kw = dict(hidden_size=32, mlp_hidden_size=48, num_attention_heads=c.get("heads", 4),
              mlp_activations=c["act"], hidden_dropout=0.0, attention_dropout=0.0,
              apply_residual_connection_post_layernorm=c.get("post_ln", False),
              output_layernorm=c.get("output_ln", False), **kw)
    return te_flax.TransformerLayer(**{**kw, **extra})


def _layer_inputs(dtype, b=2, s=8):
    x = randn(1, (b, s, 32), dtype)
    enc = randn(2, (b, 12, 32), dtype)
    enc_len = np.array([12, 6])
    # cross-attention padding mask [b, 1, s_q, s_kv], True = masked (encoder padding)
    mask = jnp.asarray(np.broadcast_to(np.arange(12)[None, None, None, :] >=
                                       enc_len[:, None, None, None], (b, 1, s, 12)))
    return x, enc, enc_len, mask


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(LAYER_CASES))
def test_transformer_layer_matches_reference(case, dtype):
    c = dict(LAYER_CASES[case], heads=4)
    layer = _layer(c)
    x, enc, enc_len, mask = _layer_inputs(dtype)
    tbs = c.get("transpose_batch_sequence", False)
    seq_first = (lambda t: jnp.swapaxes(t, 0, 1)) if tbs else (lambda t: t)  # [s, b, h] inputs
    args = (seq_first(x), seq_first(enc), None, mask) if c["layer_type"] is DEC else (x,)
    p = _rand_params(layer, *args)
    _compare(lambda p: seq_first(layer.apply({"params": p}, *args, deterministic=True)),
             lambda p: ref_layer(p, x, enc, enc_len, c), (p,), dtype, randn(3, x.shape, F32))


def test_transformer_layer_parameter_paths():
    x, enc, _, mask = _layer_inputs(F32)
    c = {"layer_type": ENC, "act": ("gelu",)}

    def paths(layer, *args):
        return _paths(_unbox(_shapes(layer, *args)))

    def under(prefix, names):
        return {f"{prefix}/{n}" for n in names}

    mlp = under("mlp", ("wi_kernel", "wo_kernel", "scale", "ln_bias"))
    enc_paths = MHA_PATHS["fused_qkv"]
    want = under("attention", enc_paths) | mlp | {"relpos_bias/rel_embedding"}
    assert paths(_layer(c), x) == want
    assert paths(_layer(c, use_bias=True), x) - want == {
        "attention/qkv/bias", "attention/out/bias", "mlp/wi_bias", "mlp/wo_bias"}
    unfused = paths(_layer(c, fuse_qkv_params=False, enable_relative_embedding=False), x)
    assert unfused == under("attention", MHA_PATHS["separate_qkv"]) | mlp
    assert "output_layernorm/scale" in paths(_layer(c, output_layernorm=True), x)
    dec = paths(_layer(dict(c, layer_type=DEC)), x, enc, None, mask)
    assert dec == (under("self_attention", enc_paths) | mlp | {"relpos_bias/rel_embedding"}
                   | under("encoder_decoder_attention", MHA_PATHS["gqa_query_kv"]))
    lora = paths(_layer(c, low_rank_adaptation_scope="all", low_rank_adaptation_dim=4), x)
    assert {"attention/qkv/lora_a_kernel", "attention/out/lora_b_kernel",
            "mlp/wi_lora_a_kernel", "mlp/wo_lora_b_kernel"} <= lora


@pytest.mark.parametrize("rc", RECIPES, ids=lambda r: type(r).__name__)
def test_transformer_layer_fp8(rc):
    """Forward + backward under each recipe: finite, and close to the fp32 layer."""
    c = {"layer_type": ENC, "act": ("gelu", "linear")}
    layer = _layer(c)
    x = randn(4, (4, 8, 32), BF16)  # 32 tokens: MXFP8 blocks of 32 along them in wgrad
    p = _rand_params(layer, x)
    want = layer.apply({"params": p}, x.astype(F32), deterministic=True)
    with te.autocast(enabled=True, recipe=rc):
        # apply with mutable collections creates the FP8 state (params exist already)
        _, vs = layer.apply({"params": p}, x, deterministic=True, mutable=True)
        assert (te.NVTE_FP8_COLLECTION_NAME in vs) == isinstance(rc, recipe.DelayedScaling)

        def loss(vs):
            out = layer.apply(vs, x, deterministic=True)
            return jnp.mean(out.astype(F32) ** 2), out

        (_, out), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(dict(vs))
    assert all(bool(jnp.all(jnp.isfinite(t))) for t in jax.tree_util.tree_leaves(g))
    assert float(jnp.max(jnp.abs(g["params"]["attention"]["qkv"]["kernel"]))) > 0
    # FP8 error relative to what the layer adds to x (measured 0.07-0.08; bf16: 0.007)
    err = jnp.linalg.norm(out.astype(F32) - want) / jnp.linalg.norm(want - x.astype(F32))
    assert float(err) < tols("fp8")["rtol"], float(err)


# ------------------------------------------------------------------------------ dropout
@pytest.mark.parametrize("field", ["hidden_dropout", "attention_dropout", "drop_path"])
def test_dropout_streams(field):
    """Each dropout draws from the "dropout" stream: on (deterministic=False) it changes the
    output, the same key reproduces it and another key differs."""
    c = {"layer_type": ENC, "act": ("gelu",)}
    x = randn(5, (2, 8, 32), F32)
    layer = _layer(c, **{field: 0.3})
    vs = {"params": _rand_params(layer, x, deterministic=True)}
    det = layer.apply(vs, x, deterministic=True)
    run = lambda k: layer.apply(vs, x, deterministic=False, rngs={"dropout": KEY(k)})
    a, a2, b = run(1), run(1), run(2)
    assert not np.allclose(a, det) and not np.allclose(a, b)
    np.testing.assert_array_equal(a, a2)
    with pytest.raises(flax.errors.InvalidRngError):
        layer.apply(vs, x, deterministic=False)  # no "dropout" stream given


# ------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("kw, err, match", [
    ({"softmax_type": "off-by-one"}, ValueError, "softmax_type"),  # TE-JAX spells off_by_one
    ({"score_mod": lambda s: s}, NotImplementedError, "score_mod"),
    ({"context_parallel_strategy": "spiral"}, ValueError, "context_parallel_strategy"),
    ({"qkv_layout": "bhsd"}, ValueError, "qkv_layout"),
    ({"attn_bias_type": "post_scale_bias"}, ValueError, "attn_bias_type"),
    ({"dtype": jnp.bfloat16}, ValueError, "dtype"),
    ({"num_gqa_groups": 1}, ValueError, "num_gqa_groups"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_dpa_refused_and_bad_inputs(kw, err, match):
    q = jnp.zeros((1, 4, 2, 8))
    dpa = te_flax.DotProductAttention(head_dim=8, num_attention_heads=2,
                                      transpose_batch_sequence=False, **kw)
    with pytest.raises(err, match=match):
        dpa.apply({}, q, q, q)


@pytest.mark.parametrize("fields, shape, call, err, match", [
    ({}, (8, 32), {}, ValueError, "3-D"),
    ({"hidden_size": 30}, (2, 8, 32), {}, ValueError, "hidden_size"),
    ({}, (2, 8, 32), {"decode": True}, ValueError, "decode"),
    ({"layer_type": DEC}, (2, 8, 32), {}, ValueError, "encoded"),
    ({"softmax_type": "sink"}, (2, 8, 32), {}, ValueError, "softmax_type"),
    ({"low_rank_adaptation_scope": "some"}, (2, 8, 32), {}, ValueError,
     "low_rank_adaptation_scope"),
    ({"rotary_pos_emb_group_method": "spiral", "enable_rotary_pos_emb": True}, (2, 8, 32), {},
     ValueError, "rotary_pos_emb_group_method"),
    ({"hidden_dropout_dims": (5,)}, (2, 8, 32), {}, ValueError, "hidden_dropout_dims"),
    ({"layer_type": "encoder"}, (2, 8, 32), {}, TypeError, "layer_type"),
    ({}, (2, 8, 32), {"score_mod_tensors": {"a": 1}}, NotImplementedError, "score_mod_tensors"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_layer_refused_and_bad_inputs(fields, shape, call, err, match):
    layer = _layer({"layer_type": ENC, "act": ("gelu",)}, **fields)
    with pytest.raises(err, match=match):
        _shapes(layer, jnp.zeros(shape), **call)  # the checks run while tracing


def test_mha_input_dtypes_must_match():
    x = jnp.zeros((2, 8, 32))
    mha = te_flax.MultiHeadAttention(head_dim=8, num_attention_heads=4,
                                     transpose_batch_sequence=False)
    with pytest.raises(ValueError, match="dtype"):
        _shapes(mha, x, x.astype(BF16))
