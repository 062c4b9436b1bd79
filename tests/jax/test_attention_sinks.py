"""TE-JAX attention sinks (softmax_type 'off-by-one' / 'learnable'): fused_attn / unfused_attn and
the flax DotProductAttention (param 'softmax_offset' [1, h, 1, 1]) against an fp64 numpy reference
written from the definition: softmax over the kept keys plus one sink logit per head (0, or the
offset) with no value row. The offset's gradient is checked against the closed form
-sum over batch and rows of p_sink * rowsum(dO * O), in fp64."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_engine_lite.jax import attention as A
from transformer_engine_lite.jax.flax import DotProductAttention

B, S, H, D = 2, 11, 4, 8
SCALE = 0.35


def _ref(q, k, v, offset, softmax_type, causal):
    """fp64: out [b, s, h, d], p_sink [b, h, s]."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    x = np.einsum("bqhd,bkhd->bhqk", q, k) * SCALE
    if causal:
        x = np.where(np.tril(np.ones((S, S), bool)), x, -np.inf)
    sink = np.zeros(H) if softmax_type == "off_by_one" else np.asarray(offset, np.float64).ravel()
    sink = np.broadcast_to(sink.reshape(1, H, 1, 1), (*x.shape[:-1], 1))
    z = np.concatenate((x, sink), -1)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", p[..., :-1], v)
    return out, p[..., -1]


def _inputs(dtype):
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(4))
    return [jnp.asarray(t, dtype) for t in (q, k, v)], g


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-5), (jnp.bfloat16, 3e-2)],
                         ids=["fp32", "bf16"])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
@pytest.mark.parametrize("softmax_type", ["off_by_one", "learnable"])
@pytest.mark.parametrize("fn", ["fused_attn", "unfused_attn"])
def test_matches_fp64_reference(fn, softmax_type, mask, dtype, tol):
    (q, k, v), g = _inputs(dtype)
    offset = jnp.asarray([-1.0, 0.5, 2.0, 0.0], jnp.float32).reshape(1, H, 1, 1)

    def run(offset):
        return getattr(A, fn)((q, k, v), None, None, None, attn_bias_type="no_bias",
                              attn_mask_type=mask, qkv_layout="bshd_bshd_bshd",
                              softmax_type=softmax_type, scaling_factor=SCALE,
                              dropout_probability=0.0, is_training=True, softmax_offset=offset)

    out = run(offset)
    ref, p_sink = _ref(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                       offset, softmax_type, mask == "causal")
    err = np.abs(np.asarray(out, np.float64) - ref).max()
    assert err <= tol * max(1.0, np.abs(ref).max()), err
    if softmax_type == "learnable":
        d_off = jax.grad(lambda o: jnp.sum(run(o).astype(jnp.float32) * g))(offset)
        want = -(p_sink * np.einsum("bqhd,bqhd->bhq", ref, g)).sum(axis=(0, 2))
        assert np.abs(want).max() > 1e-2  # the sink matters: the check can fail
        np.testing.assert_allclose(np.asarray(d_off).ravel(), want,
                                   atol=tol * B * S * max(1.0, np.abs(want).max()))


def test_sink_changes_output_and_learnable_needs_offset():
    (q, k, v), _ = _inputs(jnp.float32)
    kw = {"attn_bias_type": "no_bias", "attn_mask_type": "no_mask", "qkv_layout": "bshd_bshd_bshd",
          "scaling_factor": SCALE, "dropout_probability": 0.0, "is_training": False}
    van = A.fused_attn((q, k, v), None, None, None, softmax_type="vanilla", **kw)
    one = A.fused_attn((q, k, v), None, None, None, softmax_type="off_by_one", **kw)
    assert float(jnp.abs(van - one).max()) > 1e-2
    with pytest.raises(ValueError, match="softmax_offset"):
        A.fused_attn((q, k, v), None, None, None, softmax_type="learnable", **kw)


def test_flax_dpa_learnable_param():
    (q, k, v), g = _inputs(jnp.float32)
    dpa = DotProductAttention(head_dim=D, num_attention_heads=H, attn_mask_type="no_mask",
                              scale_factor=SCALE, softmax_type="learnable",
                              transpose_batch_sequence=False)
    params = dpa.init(jax.random.PRNGKey(0), q, k, v, deterministic=True)
    off = params["params"]["softmax_offset"]
    off = getattr(off, "value", off)
    assert off.shape == (1, H, 1, 1) and off.dtype == jnp.float32
    out = dpa.apply(params, q, k, v, deterministic=True)
    ref, _ = _ref(q, k, v, np.zeros(H), "learnable", False)
    np.testing.assert_allclose(np.asarray(out), ref, atol=2e-5)
    grads = jax.grad(lambda p: jnp.sum(dpa.apply(p, q, k, v, deterministic=True) * g))(params)
    gd = grads["params"]["softmax_offset"]
    assert float(jnp.abs(getattr(gd, "value", gd)).sum()) > 0


def test_flax_transformer_layer_passes_softmax_type():
    from transformer_engine_lite.jax.flax import TransformerLayer

    layer = TransformerLayer(hidden_size=32, mlp_hidden_size=64, num_attention_heads=4,
                             softmax_type="learnable", hidden_dropout=0.0, attention_dropout=0.0,
                             transpose_batch_sequence=False)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, 8, 32)), jnp.float32)
    params = layer.init(jax.random.PRNGKey(0), x, deterministic=True)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    names = ["/".join(str(getattr(k, "key", k)) for k in path) for path, _ in flat]
    assert any("softmax_offset" in n for n in names), names
    grads = jax.grad(lambda p: jnp.sum(layer.apply(p, x, deterministic=True) ** 2))(params)
    g = [leaf for (path, leaf), n in zip(jax.tree_util.tree_flatten_with_path(grads)[0], names)
         if "softmax_offset" in n]
    assert float(jnp.abs(g[0]).sum()) > 0
