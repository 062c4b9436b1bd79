"""TE-JAX attention's argument errors (transformer_engine_lite.jax.attention.fused_attn): each bad
argument raises an error naming it, on both backends (flash via mode "auto", and unfused). These
tests set the mode themselves, so ci/jax.sh runs the file once (test_attention.py, the numerics,
runs once per attention mode).
"""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from attention_utils import set_mode

from transformer_engine_lite.jax import attention as A

BACKENDS = ["flash", "unfused"]

# ===================================================================================== errors
B, S, H, D = 2, 7, 4, 16


def _x(*shape, dtype=jnp.bfloat16):
    return jnp.ones(shape, dtype)


def _call(
    qkv=None,
    bias=None,
    desc=None,
    bias_type="no_bias",
    mask="no_mask",
    layout="bshd_bshd_bshd",
    softmax="vanilla",
    dropout=0.0,
    **kw,
):
    qkv = (Q, Q, Q) if qkv is None else qkv
    return A.fused_attn(
        qkv, bias, desc, None, bias_type, mask, layout, softmax, 0.25, dropout, True, **kw
    )


Q = _x(B, S, H, D)
# (id, exception, message pattern, _call's arguments)
ERRORS = [
    ("two-arrays-for-separate", ValueError, "argument 'qkv'.*expects 3", {"qkv": (Q, Q)}),
    ("three-arrays-for-bs3hd", ValueError, "argument 'qkv'.*expects 1", {"layout": "bs3hd"}),
    ("q-rank", ValueError, "argument 'q'.*4-D", {"qkv": (_x(B, S, H * D), Q, Q)}),
    ("kv-rank", ValueError, "argument 'k'.*5-D", {"qkv": (Q, Q), "layout": "bshd_bs2hd"}),
    (
        "qkv-not-3",
        ValueError,
        "argument 'q'.*3 = q, k, v",
        {"qkv": (_x(B, S, 2, H, D),), "layout": "bs3hd"},
    ),
    (
        "head-dims",
        ValueError,
        "argument 'k'.*head_dim 16",
        {"qkv": (Q, _x(B, S, H, 8), _x(B, S, H, 8))},
    ),
    (
        "h-not-divisible",
        ValueError,
        "argument 'k'.*dividing q's 4",
        {"qkv": (Q, _x(B, S, 3, D), _x(B, S, 3, D))},
    ),
    ("k-v-mismatch", ValueError, "argument 'v'", {"qkv": (Q, Q, _x(B, S + 1, H, D))}),
    ("dtypes", TypeError, "'k', 'v'", {"qkv": (Q, _x(B, S, H, D, dtype=jnp.float16), Q)}),
    ("bias-missing", ValueError, "argument 'bias'", {"bias_type": "post_scale_bias"}),
    ("padding-no-descriptor", ValueError, "argument 'sequence_descriptor'", {"mask": "padding"}),
    ("thd-no-descriptor", ValueError, "argument 'sequence_descriptor'", {"layout": "thd_thd_thd"}),
    ("dropout-no-seed", ValueError, "argument 'seed'", {"dropout": 0.1}),
    ("softmax-unknown", ValueError, "argument 'softmax_type'", {"softmax": "soft"}),
    # (context parallelism's own refusals need a mesh: tests/jax/test_distributed_cp_attention.py)
    (
        "cp-strategy-unknown",
        ValueError,
        "context_parallel_strategy",
        {"context_parallel_strategy": "spiral"},
    ),
    ("mask-unknown", ValueError, "attn_mask_type.*'causal_top_left'", {"mask": "causal_top_left"}),
    ("layout-unknown", ValueError, "argument 'qkv_layout'", {"layout": "sbhd"}),
    ("bias-type-unknown", ValueError, "argument 'attn_bias_type'", {"bias_type": "alibi"}),
]


@pytest.mark.parametrize("backend", ["flash", "unfused"])
@pytest.mark.parametrize("exc,match,kwargs", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_name_the_argument(exc, match, kwargs, backend, monkeypatch):
    set_mode(monkeypatch, "auto" if backend == "flash" else "unfused")
    with pytest.raises(exc, match=match):
        _call(**kwargs)


@pytest.mark.parametrize("backend", ["flash", "unfused"])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"context_parallel_causal_load_balanced": True},
        {"context_parallel_strategy": A.CPStrategy.RING},
        {"context_parallel_strategy": A.CPStrategy.ALL_GATHER,
         "context_parallel_causal_load_balanced": True},
    ],
    ids=["load-balanced", "ring", "all-gather-balanced"],
)
def test_cp_flags_without_cp_axis_change_nothing(kwargs, backend, monkeypatch):
    """Without a context_parallel_axis no sequence is split, so the CP strategy and the
    load-balancing flag are no-ops, as in TE (whose test_fused_attn.py passes
    context_parallel_causal_load_balanced=True to every non-CP case)."""
    set_mode(monkeypatch, "auto" if backend == "flash" else "unfused")
    q = jnp.sin(jnp.arange(B * S * H * D, dtype=jnp.float32)).reshape(B, S, H, D)
    q = q.astype(jnp.bfloat16)
    plain = _call(qkv=(q, q * 0.5, q), mask="causal")
    flagged = _call(qkv=(q, q * 0.5, q), mask="causal", **kwargs)
    assert jnp.array_equal(plain, flagged)


def test_segment_pos_required():
    with pytest.raises(ValueError, match="argument 'segment_pos'"):
        A.SequenceDescriptor.from_segment_ids_and_pos(_x(B, S, dtype=jnp.int32))


BAD_BIAS = {"3d": (H, S, S), "b3": (3, H, S, S), "h2": (1, 2, S, S), "skv+1": (B, H, S, S + 1)}


@pytest.mark.parametrize(
    "backend",
    BACKENDS,
)
@pytest.mark.parametrize("shape", list(BAD_BIAS))
def test_bias_shape_error(shape, backend, monkeypatch):
    set_mode(monkeypatch, "auto" if backend == "flash" else "unfused")
    with pytest.raises(ValueError, match=r"argument 'bias'.*\[1 or 2, 1 or 4, 7, 7\]"):
        _call(bias=_x(*BAD_BIAS[shape]), bias_type="post_scale_bias")


@pytest.mark.parametrize(
    "backend",
    BACKENDS,
)
def test_seqlens_shape_error(backend, monkeypatch):
    set_mode(monkeypatch, "auto" if backend == "flash" else "unfused")
    desc = A.SequenceDescriptor.from_seqlens(jnp.array([1, 2, 3], jnp.int32))
    with pytest.raises(ValueError, match="argument 'q_seqlens'"):
        _call(desc=desc, mask="padding")


@pytest.mark.parametrize(
    "backend",
    BACKENDS,
)
def test_thd_bias_shape_error(backend, monkeypatch):
    """A thd bias is indexed by row positions: [1 or b, 1 or h, s_q, s_kv], as with bshd."""
    set_mode(monkeypatch, "auto" if backend == "flash" else "unfused")
    ids = jnp.ones((B, S), jnp.int32)
    desc = A.SequenceDescriptor.from_segment_ids_and_pos(ids, jnp.zeros((B, S), jnp.int32))
    with pytest.raises(ValueError, match="argument 'bias'"):
        _call(bias=_x(1, H, S, S + 1), desc=desc, bias_type="post_scale_bias", mask="padding",
              layout="thd_thd_thd")
