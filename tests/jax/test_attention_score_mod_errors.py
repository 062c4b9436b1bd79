"""fused_attn(..., score_mod=...): the combinations TE-JAX refuses raise its ValueError (TE's
phrases, which its tests match) before this library's NotImplementedError for the score_mod path
it does not have (TE runs it through a cuDNN-frontend graph)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from transformer_engine_lite.jax import attention as A

B, S, H, D = 1, 16, 2, 32
Q = jax.ShapeDtypeStruct((B, S, H, D), jnp.float16)


def _score_mod(_graph, score, _tensors):
    return score


def _call(qkv=(Q, Q, Q), bias=None, desc=None, seed=None, bias_type="no_bias", mask="no_mask",
          layout="bshd_bshd_bshd", softmax="vanilla", dropout=0.0, **kw):
    return A.fused_attn(qkv, bias, desc, seed, bias_type, mask, layout, softmax, 1.0, dropout,
                        True, score_mod=_score_mod, **kw)


def test_te_case_masks_before_frontend():
    """TE's test_fused_attn_score_mod_rejects_masks_before_cudnn_frontend, in our words."""
    with pytest.raises(ValueError, match="mutually exclusive with attention masks"):
        _call(mask=A.AttnMaskType.CAUSAL_MASK, softmax=A.AttnSoftmaxType.VANILLA_SOFTMAX)


REFUSED = [
    ("layout", {"layout": "bs3hd", "qkv": (Q,)}, "BSHD_BSHD_BSHD"),
    ("two-arrays", {"qkv": (Q, Q)}, "separate query, key and value"),
    ("rank", {"qkv": (Q, Q, jax.ShapeDtypeStruct((B, S, H * D), jnp.float16))}, "rank-4"),
    ("dtypes", {"qkv": (Q, Q, jax.ShapeDtypeStruct((B, S, H, D), jnp.bfloat16))}, "one dtype"),
    ("fp32", {"qkv": (jax.ShapeDtypeStruct((B, S, H, D), jnp.float32),) * 3}, "FP16/BF16"),
    ("batch", {"qkv": (Q, jax.ShapeDtypeStruct((2, S, H, D), jnp.float16), Q)}, "batch"),
    ("kv-shape", {"qkv": (Q, Q, jax.ShapeDtypeStruct((B, S + 1, H, D), jnp.float16))},
     "key and value"),
    ("head-dim", {"qkv": (Q, jax.ShapeDtypeStruct((B, S, H, 16), jnp.float16),
                          jax.ShapeDtypeStruct((B, S, H, 16), jnp.float16))}, "head dimensions"),
    ("bias", {"bias_type": "post_scale_bias"}, "mutually exclusive with attention bias"),
    ("descriptor", {"desc": object()}, "padding/sequence descriptors"),
    ("seed", {"seed": jnp.zeros((2,), jnp.uint32)}, "dropout seed"),
    ("mask", {"mask": "padding_causal"}, "mutually exclusive with attention masks"),
    ("softmax", {"softmax": "off_by_one"}, "vanilla softmax"),
    ("dropout", {"dropout": 0.1}, "mutually exclusive with dropout"),
    ("segments", {"max_segments_per_seq": 2}, "packed/ragged"),
    ("window", {"window_size": (4, 0)}, "sliding-window"),
    ("cp", {"context_parallel_strategy": A.CPStrategy.RING}, "context parallelism"),
    ("cp-axis", {"context_parallel_axis": "cp"}, "context parallelism"),
    ("stripe", {"stripe_size": 2}, "striped context parallelism"),
]


@pytest.mark.parametrize("kw, match", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_as_te_refuses(kw, match):
    with pytest.raises(ValueError, match=match):
        _call(**kw)


@pytest.mark.parametrize("window", [None, (-1, -1)])
def test_valid_score_mod_is_not_implemented(window):
    with pytest.raises(NotImplementedError, match="score_mod"):
        _call(window_size=window)
