"""torch.ops.te_lite, the attention and RoPE ops (fused_attn_fwd/bwd, fused_attn_dropout_mask,
fused_rope_fwd/bwd): torch.library.opcheck cases (schema, fake kernel, autograd registration, AOT
dispatch with dynamic shapes). Every other op, errors and the coverage check over both files
(test_every_op_has_an_opcheck_case): test_ops.py. Numerics: test_attention.py, test_rope.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytest.importorskip(
    "transformer_engine_lite.pytorch.te_lite_ops",
    reason="PyTorch extension not built",
    exc_type=ImportError,
)
from op_helpers import ops, randn, run_opcheck

# (op name, id, args factory), as OPCHECK_CASES in test_ops.py, whose coverage check imports these.
ATTENTION_OPCHECK_CASES: list[tuple[str, str, Callable[[], tuple]]] = []

# fused RoPE: angles [s_max, 1, 1, d2] with d2 < d (partial rotation), thd with offsets.
_ROPE_CU = (0, 3, 3, 8)
for _name, _fmt, _shape, _dt, _inter in (
    ("fused_rope_fwd", "sbhd", (5, 2, 3, 16), torch.float32, False),
    ("fused_rope_fwd", "bshd", (2, 5, 3, 16), torch.bfloat16, True),
    ("fused_rope_fwd", "thd", (9, 3, 16), torch.float16, False),
    ("fused_rope_bwd", "sbhd", (5, 2, 3, 16), torch.float32, True),
    ("fused_rope_bwd", "thd", (9, 3, 16), torch.bfloat16, False),
):
    ATTENTION_OPCHECK_CASES.append(
        (
            _name,
            f"{_fmt}-{str(_dt)[6:]}{'-interleaved' if _inter else ''}",
            lambda s=_shape, d=_dt, f=_fmt, i=_inter: (
                randn(*s, dtype=d, requires_grad=True),
                randn(6, 1, 1, 12, seed=1, scale=3.0),
                f,
                i,
                torch.tensor(_ROPE_CU, dtype=torch.int32) if f == "thd" else None,
            ),
        )
    )

# fused attention (flash backend): separate layouts (opcheck copies its inputs, which would undo a
# packed layout's views; packed layouts are tested in test_attention.py).
_ATTN_CU = (0, 5, 5, 12)


def _attn_args(fmt, dtype, mask, bias_type="no_bias", dropout=0.0, grad=True):
    h, h_kv, d = 4, 2, 16
    tok = (3, 7) if fmt == "bshd" else (12,)
    q, k, v = (
        randn(*tok, n, d, dtype=dtype, seed=i, requires_grad=grad)
        for i, n in enumerate((h, h_kv, h_kv))
    )
    thd = fmt == "thd"
    cu = torch.tensor(_ATTN_CU, dtype=torch.int32) if thd else None
    sq = 7
    bias = (
        randn(1, h, sq, sq, dtype=dtype, seed=5, requires_grad=grad)
        if bias_type == "post_scale_bias"
        else None
    )
    rng = torch.tensor([11, 3], dtype=torch.int64) if dropout > 0 else None
    layout = f"{fmt}_{fmt}_{fmt}"
    return (
        q,
        k,
        v,
        layout,
        bias,
        cu,
        cu,
        sq,
        sq,
        0.25,
        dropout,
        rng,
        bias_type,
        mask,
        -1,
        0 if "causal" in mask else -1,
        True,
    )


def _attn_bwd_args(*fwd_args):
    fwd = [a.detach() if isinstance(a, torch.Tensor) else a for a in fwd_args]
    out, lse = ops.fused_attn_fwd(*fwd)
    q, k, v, layout, bias, cu, cu_kv, sq, skv, scale, p, rng, bias_type, mask, left, right, _ = fwd
    d_out = randn(*out.shape, dtype=out.dtype, seed=9)
    return (
        q,
        k,
        v,
        out,
        d_out,
        lse,
        layout,
        bias,
        cu,
        cu_kv,
        sq,
        skv,
        scale,
        p,
        rng,
        bias_type,
        mask,
        left,
        right,
        True,
    )


ATTENTION_OPCHECK_CASES += [
    ("fused_attn_fwd", "bshd-bf16-causal", lambda: _attn_args("bshd", torch.bfloat16, "causal")),
    (
        "fused_attn_fwd",
        "thd-fp32-bias-dropout",
        lambda: _attn_args("thd", torch.float32, "padding", "post_scale_bias", 0.3),
    ),
    (
        "fused_attn_bwd",
        "thd-fp16-bias",
        lambda: _attn_bwd_args(
            *_attn_args("thd", torch.float16, "padding_causal", "post_scale_bias")
        ),
    ),
    (
        "fused_attn_bwd",
        "bshd-fp32-dropout",
        lambda: _attn_bwd_args(*_attn_args("bshd", torch.float32, "no_mask", dropout=0.2)),
    ),
    (
        "fused_attn_dropout_mask",
        "p0.25",
        lambda: (torch.tensor([7, 1], dtype=torch.int64), 2, 3, 5, 9, 0.25),
    ),
]


@pytest.mark.parametrize(
    "name,factory",
    [(c[0], c[2]) for c in ATTENTION_OPCHECK_CASES],
    ids=[f"{c[0]}-{c[1]}" for c in ATTENTION_OPCHECK_CASES],
)
def test_opcheck(name, factory):
    run_opcheck(name, factory())


@pytest.mark.parametrize("layout,pack", [("bs3hd", 3), ("bshd_bs2hd", 2)])
def test_fused_attn_packed_empty_batch(layout, pack):
    """Views of an empty packed buffer all share one pointer; with no element to address, the core's
    packed-pointer check has nothing to check and the call returns empty results."""
    buf = torch.zeros(0, 6, pack, 2, 8, dtype=torch.bfloat16)
    views = buf.unbind(2)
    q = views[0] if pack == 3 else torch.zeros(0, 6, 2, 8, dtype=torch.bfloat16)
    k, v = views[-2], views[-1]
    args = (layout, None, None, None, 6, 6, 0.35, 0.0, None, "no_bias", "causal", -1, -1)
    out, lse = ops.fused_attn_fwd(q, k, v, *args, True)
    assert out.shape == (0, 6, 2, 8) and lse.shape == (0, 2, 6)
    dq, dk, dv, _, _ = ops.fused_attn_bwd(q, k, v, out, torch.zeros_like(out), lse, *args, False)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
