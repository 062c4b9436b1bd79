"""Rotary position embedding (transformer_engine_lite.pytorch.attention.rope): the angles of
RotaryPositionEmbedding, apply_rotary_pos_emb fused (te_lite.fused_rope_fwd/bwd) and unfused
against an fp64 reference for sbhd / bshd / thd, interleaved or not, partial rotary dims and every
dtype, gradients against fp64 autograd, gradcheck of the ops, errors, torch.compile. opcheck of the
two ops: test_ops_attention.py (with the attention ops)."""

from __future__ import annotations

import itertools

import pytest
import torch

te = pytest.importorskip(
    "transformer_engine_lite.pytorch", reason="PyTorch extension not built", exc_type=ImportError
)
from op_helpers import TOLERANCES, assert_close, ops, randn

from transformer_engine_lite.pytorch import RotaryPositionEmbedding, apply_rotary_pos_emb

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
# thd offsets: sequences of 5, 0, 1 and 7 tokens (empty and single-token ones included), then 2
# padding tokens that belong to no sequence.
THD_CU = (0, 5, 5, 6, 13)
THD_TOKENS = 15


# ===================================================================================== reference
def positions(tensor_format: str, shape: tuple[int, ...], cu=THD_CU) -> torch.Tensor:
    """Position of every token, broadcastable against t[..., :d2] once unsqueezed; -1 = padding."""
    if tensor_format == "sbhd":
        return torch.arange(shape[0]).view(-1, 1, 1)
    if tensor_format == "bshd":
        return torch.arange(shape[1]).view(1, -1, 1)
    pos = torch.full((shape[0],), -1)
    for a, b in itertools.pairwise(cu):
        pos[a:b] = torch.arange(b - a)
    return pos.view(-1, 1)


def reference(t, freqs, tensor_format, interleaved, cu=THD_CU):
    """fp64 RoPE from the pair formula (a, b) = (j, j + d2/2) or (2i, 2i + 1), each feature with its
    own angle: out_a = x_a cos f_a - x_b sin f_a, out_b = x_b cos f_b + x_a sin f_b.
    Differentiable (the gradient reference)."""
    x = t.double()
    angles = freqs.double()[:, 0, 0, :]  # [s_max, d2]
    d2 = angles.shape[-1]
    pos = positions(tensor_format, tuple(t.shape), cu)
    f = torch.where(pos[..., None] >= 0, angles[pos.clamp(min=0)], 0.0)  # padding: angle 0
    a = torch.arange(0, d2, 2) if interleaved else torch.arange(d2 // 2)
    b = a + 1 if interleaved else a + d2 // 2
    xa, xb, fa, fb = x[..., a], x[..., b], f[..., a], f[..., b]
    out = x.clone()
    out[..., a] = xa * torch.cos(fa) - xb * torch.sin(fa)
    out[..., b] = xb * torch.cos(fb) + xa * torch.sin(fb)
    return out


def make_case(tensor_format, d, d2, dtype, seed=0, s=7, b=3, h=2, s_max=9):
    if tensor_format == "sbhd":
        shape = (s, b, h, d)
    elif tensor_format == "bshd":
        shape = (b, s, h, d)
    else:
        shape = (THD_TOKENS, h, d)
    t = randn(*shape, dtype=dtype, seed=seed)
    # Arbitrary angles, different for every feature (not TE's duplicated halves): a kernel that
    # paired a feature with the wrong angle would show.
    freqs = randn(s_max, 1, 1, d2, seed=seed + 1, scale=4.0)
    cu = torch.tensor(THD_CU, dtype=torch.int32) if tensor_format == "thd" else None
    return t, freqs, cu


FORMATS = ["sbhd", "bshd", "thd"]
DIMS = [(16, 16), (24, 8), (10, 6)]  # (d, d2): full and partial rotation


# ===================================================================================== forward
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d,d2", DIMS, ids=[f"d{d}r{r}" for d, r in DIMS])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("tensor_format", FORMATS)
def test_fused_and_unfused_match_fp64(tensor_format, interleaved, d, d2, dtype):
    t, freqs, cu = make_case(tensor_format, d, d2, dtype)
    ref = reference(t, freqs, tensor_format, interleaved)
    fused = apply_rotary_pos_emb(
        t, freqs, tensor_format, interleaved=interleaved, fused=True, cu_seqlens=cu
    )
    unfused = apply_rotary_pos_emb(
        t, freqs, tensor_format, interleaved=interleaved, cu_seqlens=cu
    )
    assert fused.dtype == dtype and fused.shape == t.shape
    assert_close(fused, ref, dtype, "fused")
    assert_close(unfused, ref, dtype, "unfused")
    # flash-attention's rule: the fused op (fp32 math, one rounding) is no worse than twice the
    # framework's own low-precision math (products in t's dtype), up to one rounding of the output.
    err, err_pt = (fused.double() - ref).abs().max(), (unfused.double() - ref).abs().max()
    assert err <= 2 * err_pt + TOLERANCES[dtype][0], (err, err_pt)
    # Features past d2 and thd padding tokens are copied bit for bit.
    assert torch.equal(fused[..., d2:], t[..., d2:])
    if tensor_format == "thd":
        assert torch.equal(fused[THD_CU[-1] :], t[THD_CU[-1] :])


def test_module_angles_and_application_match_te_definition():
    """TE's layout: theta_i = base^(-2i/d), angles [s, 1, 1, d] = [theta.., theta..] (interleaved:
    each repeated), position p = offset + index; applied to the first d features of 64."""
    dim, base, s, offset = 32, 500.0, 11, 3
    i = torch.arange(dim // 2, dtype=torch.float64)
    theta = base ** (-2 * i / dim)
    p = torch.arange(s, dtype=torch.float64) + offset
    angles = p[:, None] * theta[None, :]
    for interleaved, want in (
        (False, torch.cat((angles, angles), -1)),
        (True, angles.repeat_interleave(2, -1)),
    ):
        rope = RotaryPositionEmbedding(dim, rotary_base=base, interleaved=interleaved)
        freqs = rope(s, offset=offset)
        assert freqs.shape == (s, 1, 1, dim) and freqs.dtype == torch.float32
        torch.testing.assert_close(freqs[:, 0, 0].double(), want, atol=1e-5, rtol=1e-6)
        t = randn(s, 2, 4, 64)
        for fused in (False, True):
            out = apply_rotary_pos_emb(t, freqs, "sbhd", interleaved=interleaved, fused=fused)
            assert_close(out, reference(t, freqs, "sbhd", interleaved), torch.float32, "module")


def test_module_options():
    # rotary_percent: d2 = int(dim * percent) features (rounded up to even).
    assert RotaryPositionEmbedding(64, rotary_percent=0.5)(4).shape == (4, 1, 1, 32)
    assert RotaryPositionEmbedding(10, rotary_percent=0.5)(4).shape == (4, 1, 1, 6)
    plain = RotaryPositionEmbedding(8)(12)
    # Fixed interpolation divides positions by the factor.
    fixed = RotaryPositionEmbedding(8, seq_len_interpolation_factor=4)(12)
    torch.testing.assert_close(fixed, plain / 4)
    # With pretrained_max_position_embeddings: fixed up to pretrained * factor, then dynamic
    # (positions * pretrained / max_seq_len).
    within = RotaryPositionEmbedding(
        8, seq_len_interpolation_factor=2, pretrained_max_position_embeddings=6
    )(12)
    torch.testing.assert_close(within, plain / 2)
    beyond = RotaryPositionEmbedding(
        8, seq_len_interpolation_factor=1, pretrained_max_position_embeddings=6
    )(12)
    torch.testing.assert_close(beyond, plain * 6 / 12)
    # inv_freq is a buffer: it follows .to() and is saved in the state dict, as in TE.
    rope = RotaryPositionEmbedding(8).to(torch.float64)
    assert "inv_freq" in rope.state_dict() and rope(3).dtype == torch.float32


# ===================================================================================== backward
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("tensor_format", FORMATS)
def test_gradients_match_fp64_autograd(tensor_format, interleaved, dtype):
    t, freqs, cu = make_case(tensor_format, 24, 8, dtype, seed=3)
    grad = randn(*t.shape, dtype=dtype, seed=9)
    t64 = t.double().requires_grad_()
    (want,) = torch.autograd.grad(reference(t64, freqs, tensor_format, interleaved), t64, grad)
    for fused in (True, False):
        x = t.clone().requires_grad_()
        out = apply_rotary_pos_emb(
            x, freqs, tensor_format, interleaved=interleaved, fused=fused, cu_seqlens=cu
        )
        (got,) = torch.autograd.grad(out, x, grad)
        assert got.dtype == dtype
        assert_close(got, want, dtype, f"grad fused={fused}")


@pytest.mark.filterwarnings("ignore:Input #. requires gradient and is not a double")
@pytest.mark.parametrize("tensor_format", FORMATS)
def test_gradcheck_of_the_ops(tensor_format):
    """The ops are linear in t, so fp32 finite differences with a large step are exact up to
    rounding (~1e-7 / eps): gradcheck and gradgradcheck (the backward of each op is the other)."""
    t, freqs, cu = make_case(tensor_format, 10, 6, torch.float32, seed=5, s=4, b=2)
    t.requires_grad_()
    for op in (ops.fused_rope_fwd, ops.fused_rope_bwd):

        def fn(x, op=op):
            return op(x, freqs, tensor_format, True, cu)

        assert torch.autograd.gradcheck(fn, (t,), eps=1e-2, atol=1e-4, rtol=1e-3)
        assert torch.autograd.gradgradcheck(fn, (t,), eps=1e-2, atol=1e-4, rtol=1e-3)


def test_fused_gives_no_gradient_to_freqs_and_takes_strided_inputs():
    t, freqs, _ = make_case("sbhd", 16, 16, torch.float32)
    freqs.requires_grad_()
    x = t.transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()  # non-contiguous view
    assert not x.is_contiguous()
    out = apply_rotary_pos_emb(x, freqs, "sbhd", fused=True)
    assert_close(out, reference(t, freqs, "sbhd", False), torch.float32, "strided")
    out.sum().backward()
    assert x.grad is not None and freqs.grad is None


def test_torch_compile_fullgraph():
    t, freqs, _ = make_case("bshd", 24, 8, torch.bfloat16)

    def f(x):
        return apply_rotary_pos_emb(x, freqs, "bshd", interleaved=True, fused=True) * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(t), f(t))


# ===================================================================================== errors
def _call(fused=False, t=None, freqs=None, fmt="sbhd", cu=None):
    t = randn(5, 2, 3, 16) if t is None else t
    freqs = randn(5, 1, 1, 8) if freqs is None else freqs
    return apply_rotary_pos_emb(t, freqs, fmt, fused=fused, cu_seqlens=cu)


def _cu(*v):
    return torch.tensor(v, dtype=torch.int32)


PY_ERRORS = [
    ("format", lambda f: _call(f, fmt="sbdh"), ValueError, "tensor_format"),
    ("t dtype", lambda f: _call(f, t=torch.ones(5, 2, 3, 16, dtype=torch.int32)), TypeError, "t"),
    ("t ndim", lambda f: _call(f, t=randn(5, 3, 16)), ValueError, "4-D"),
    ("thd ndim", lambda f: _call(f, fmt="thd", cu=_cu(0, 5)), ValueError, "3-D"),
    ("freqs shape", lambda f: _call(f, freqs=randn(5, 2, 1, 8)), ValueError, r"\[s, 1, 1, d2\]"),
    ("d2 odd", lambda f: _call(f, freqs=randn(5, 1, 1, 7)), ValueError, "even"),
    ("d2 > d", lambda f: _call(f, freqs=randn(5, 1, 1, 18)), ValueError, "<= t's head dim 16"),
    ("short freqs", lambda f: _call(f, freqs=randn(4, 1, 1, 8)), ValueError, "5 positions"),
    (
        "bshd short",
        lambda f: _call(f, t=randn(2, 6, 3, 16), fmt="bshd"),
        ValueError,
        "6 positions",
    ),
    ("thd no cu", lambda f: _call(f, t=randn(9, 3, 16), fmt="thd"), ValueError, "cu_seqlens"),
    (
        "cu dtype",
        lambda f: _call(f, t=randn(9, 3, 16), fmt="thd", cu=_cu(0, 4).long()),
        ValueError,
        "int32",
    ),
    ("cp_rank", lambda f: apply_rotary_pos_emb(randn(4, 2, 3, 16), randn(8, 1, 1, 8),
                                               cp_size=2, cp_rank=2, fused=f), ValueError,
     "cp_rank < cp_size"),
    ("odd cp s", lambda f: apply_rotary_pos_emb(randn(3, 2, 3, 16), randn(8, 1, 1, 8),
                                                cp_size=2, fused=f), ValueError, "even"),
    ("short cp", lambda f: apply_rotary_pos_emb(randn(4, 2, 3, 16), randn(7, 1, 1, 8),
                                                cp_size=2, fused=f), ValueError, "x cp_size 2"),
    ("starts shape", lambda f: apply_rotary_pos_emb(randn(4, 2, 3, 16), randn(8, 1, 1, 8),
                                                    start_positions=_cu(0, 1, 2), fused=f),
     ValueError, r"start_positions must be an integer tensor \[2\]"),
]


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize(
    "call,exc,pattern", [c[1:] for c in PY_ERRORS], ids=[c[0] for c in PY_ERRORS]
)
def test_bad_arguments_raise(call, exc, pattern, fused):
    with pytest.raises(exc, match=pattern):
        call(fused)


@pytest.mark.parametrize(
    "cu,pattern",
    [
        ((1, 4, 9), "start at 0"),
        ((0, 5, 4, 9), "never decrease"),
        ((0, 4, 10), "exceeds t's 9 tokens"),
        ((0, 1, 9), r"sequences of \[1, 8\] tokens need rows outside freqs' 5"),
    ],
    ids=["start", "decreasing", "past end", "too long"],
)
def test_bad_offsets_raise_on_both_paths(cu, pattern):
    t, freqs = randn(9, 3, 16), randn(5, 1, 1, 8)
    with pytest.raises(ValueError, match=pattern):
        apply_rotary_pos_emb(t, freqs, "thd", cu_seqlens=_cu(*cu))
    # The fused op checks the offsets in the core (CPU tensors) and names the argument.
    with pytest.raises(
        RuntimeError, match="te_lite::fused_rope_fwd: .*argument '(cu_seqlens|freqs)'"
    ):
        apply_rotary_pos_emb(t, freqs, "thd", fused=True, cu_seqlens=_cu(*cu))


def test_fused_needs_fp32_freqs():
    with pytest.raises(TypeError, match="float32 freqs"):
        _call(True, freqs=randn(5, 1, 1, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="takes t in"):
        _call(True, t=randn(5, 2, 3, 16, dtype=torch.float64))
    # The unfused path takes any floating freqs (fp64 here: an fp64 computation).
    out = _call(False, t=randn(5, 2, 3, 16, dtype=torch.float64), freqs=randn(5, 1, 1, 8).double())
    assert out.dtype == torch.float64


OP_ERRORS = [
    (
        "format",
        lambda: ops.fused_rope_fwd(randn(5, 2, 3, 16), randn(5, 1, 1, 8), "sb", False),
        r"'tensor_format'.*'sbhd', 'bshd' or 'thd'",
    ),
    (
        "freqs dtype",
        lambda: ops.fused_rope_bwd(randn(5, 2, 3, 16), randn(5, 1, 1, 8).half(), "sbhd", False),
        r"'freqs'.*float32",
    ),
    (
        "t dtype",
        lambda: ops.fused_rope_fwd(randn(5, 2, 3, 16).double(), randn(5, 1, 1, 8), "sbhd", False),
        r"'t'.*float64",
    ),
    (
        "shape",
        lambda: ops.fused_rope_fwd(randn(5, 2, 3, 16), randn(5, 1, 1, 20), "sbhd", False),
        r"'freqs'.*even rotary dim",
    ),
    (
        "cu sbhd",
        lambda: ops.fused_rope_fwd(randn(5, 2, 3, 16), randn(5, 1, 1, 8), "sbhd", False, _cu(0, 5)),
        r"'cu_seqlens'.*expected none",
    ),
    (
        "cu thd",
        lambda: ops.fused_rope_fwd(randn(5, 3, 16), randn(5, 1, 1, 8), "thd", False),
        r"'cu_seqlens'.*got none",
    ),
]


@pytest.mark.parametrize("call,pattern", [c[1:] for c in OP_ERRORS], ids=[c[0] for c in OP_ERRORS])
def test_op_errors_name_the_argument(call, pattern):
    with pytest.raises(RuntimeError, match=pattern):
        call()


def test_empty_inputs():
    freqs = randn(4, 1, 1, 8)
    for fused in (False, True):
        out = apply_rotary_pos_emb(randn(0, 2, 3, 8), freqs, "sbhd", fused=fused)
        assert out.shape == (0, 2, 3, 8)
        t = randn(0, 3, 8)
        out = apply_rotary_pos_emb(t, freqs, "thd", fused=fused, cu_seqlens=_cu(0))
        assert out.shape == (0, 3, 8)


# ============================================================= start_positions, context parallel
def dual_chunk_rows(length: int, start: int, cp_size: int, cp_rank: int) -> list[int]:
    """Rows of freqs for the `length` local tokens of one sequence, built the way context
    parallelism lays them out (not from the kernel's formula): the full sequence of
    cp_size * length positions, offset by start, cut into 2 * cp_size equal chunks; this rank
    holds chunk cp_rank followed by chunk 2 * cp_size - 1 - cp_rank."""
    full = list(range(start, start + cp_size * length))
    if cp_size == 1:
        return full
    n = length // 2
    chunks = [full[i * n : (i + 1) * n] for i in range(2 * cp_size)]
    return chunks[cp_rank] + chunks[2 * cp_size - 1 - cp_rank]


def reference_rows(t, freqs, tensor_format, interleaved, rows):
    """fp64 RoPE with the angles of freqs[rows] per token (rows shaped like t[..., 0, 0] for
    sbhd / bshd, [t] for thd; -1 = pass through); the pair formula of `reference`."""
    x = t.double()
    angles = freqs.double()[:, 0, 0, :]
    d2 = angles.shape[-1]
    r = rows[..., None]  # broadcast over heads
    f = torch.where(r[..., None] >= 0, angles[r.clamp(min=0)], 0.0)
    a = torch.arange(0, d2, 2) if interleaved else torch.arange(d2 // 2)
    b = a + 1 if interleaved else a + d2 // 2
    out = x.clone()
    out[..., a] = x[..., a] * torch.cos(f[..., a]) - x[..., b] * torch.sin(f[..., a])
    out[..., b] = x[..., b] * torch.cos(f[..., b]) + x[..., a] * torch.sin(f[..., b])
    return out


# Full thd sequences of 8, 0, 4 and 4 tokens (multiples of 2 * cp_size for cp_size 2), 3 padding.
CP_CU = (0, 8, 8, 12, 16)


def cp_case(tensor_format, start, cp_size, cp_rank, dtype, seed=0, s=6, b=3, h=2, d=12, d2=8):
    """(t, freqs, cu, start_positions, rows) of one rank's shard."""
    s_max = 40
    if tensor_format == "thd":
        seqs = len(CP_CU) - 1
        local = [c // cp_size for c in CP_CU]
        tokens = local[-1] + 3
        t = randn(tokens, h, d, dtype=dtype, seed=seed)
        cu = torch.tensor(CP_CU, dtype=torch.int32)
        starts = torch.tensor([3, 0, 7, 11][:seqs], dtype=torch.int32) if start else None
        rows = torch.full((tokens,), -1)
        for i in range(seqs):
            first = int(starts[i]) if start else 0
            rows[local[i] : local[i + 1]] = torch.tensor(
                dual_chunk_rows(local[i + 1] - local[i], first, cp_size, cp_rank), dtype=torch.long
            )
    else:
        shape = (s, b, h, d) if tensor_format == "sbhd" else (b, s, h, d)
        t = randn(*shape, dtype=dtype, seed=seed)
        cu = None
        starts = torch.tensor([5, 0, 9][:b], dtype=torch.int32) if start else None
        per_seq = [dual_chunk_rows(s, int(starts[i]) if start else 0, cp_size, cp_rank)
                   for i in range(b)]
        rows = torch.tensor(per_seq).T if tensor_format == "sbhd" else torch.tensor(per_seq)
    freqs = randn(s_max, 1, 1, d2, seed=seed + 1, scale=4.0)
    return t, freqs, cu, starts, rows


CP_CASES = [(True, 1, 0), (False, 2, 0), (False, 2, 1), (True, 2, 1), (True, 3, 2)]
CP_IDS = [f"{'start_' if st else ''}cp{c}r{r}" for st, c, r in CP_CASES]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("start,cp_size,cp_rank", CP_CASES, ids=CP_IDS)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("tensor_format", FORMATS)
def test_start_positions_and_cp_match_fp64(tensor_format, interleaved, start, cp_size, cp_rank,
                                           dtype):
    """Forward and gradient of both paths against fp64, with per-sequence start offsets and
    dual-chunk context-parallel rows (thd: cu_seqlens of the whole sequences, divided by cp_size
    on the rank; cp_size 3 leaves thd lengths odd, which thd rejects: that case is sbhd/bshd)."""
    if tensor_format == "thd" and cp_size == 3:
        pytest.skip("CP_CU's lengths are not multiples of 2 * 3")
    t, freqs, cu, starts, rows = cp_case(tensor_format, start, cp_size, cp_rank, dtype)
    grad = randn(*t.shape, dtype=dtype, seed=7)
    t64 = t.double().requires_grad_()
    ref = reference_rows(t64, freqs, tensor_format, interleaved, rows)
    (want,) = torch.autograd.grad(ref, t64, grad.double())
    for fused in (True, False):
        x = t.clone().requires_grad_()
        out = apply_rotary_pos_emb(x, freqs, tensor_format, start_positions=starts,
                                   interleaved=interleaved, fused=fused, cu_seqlens=cu,
                                   cp_size=cp_size, cp_rank=cp_rank)
        assert_close(out, ref.detach(), dtype, f"fused={fused}")
        (got,) = torch.autograd.grad(out, x, grad)
        assert_close(got, want, dtype, f"grad fused={fused}")


def test_start_positions_zero_equals_none_and_cu_is_ignored_for_sbhd():
    t, freqs, _ = make_case("sbhd", 16, 8, torch.float32)
    zeros = torch.zeros(t.shape[1], dtype=torch.int32)
    for fused in (False, True):
        plain = apply_rotary_pos_emb(t, freqs, "sbhd", fused=fused)
        # TE ignores cu_seqlens for sbhd / bshd (its tests pass them).
        same = apply_rotary_pos_emb(t, freqs, "sbhd", zeros, fused=fused, cu_seqlens=_cu(0, 3))
        assert torch.equal(plain, same)


def test_fused_qkv_with_start_positions_and_cp():
    """apply_fused_qkv_rotary_pos_emb == apply_rotary_pos_emb on the split q and k, with offsets
    and context parallelism (TE rejects the two together; here both work), gradients included."""
    from transformer_engine_lite.pytorch.attention.rope import apply_fused_qkv_rotary_pos_emb

    hd, g, s, b = 8, 2, 4, 3
    qkv = randn(b, s, g, 4 * hd, dtype=torch.bfloat16, seed=2)
    qf, kf = randn(20, 1, 1, hd, seed=3), randn(20, 1, 1, hd, seed=4)
    starts = torch.tensor([1, 0, 6], dtype=torch.int32)
    x = qkv.clone().requires_grad_()
    q, k, v = apply_fused_qkv_rotary_pos_emb(x, qf, kf, [2 * hd, hd, hd], "bshd", starts,
                                             True, cp_size=2, cp_rank=1)
    (q0, k0, v0) = torch.split(qkv, [2 * hd, hd, hd], dim=-1)
    kw = dict(start_positions=starts, interleaved=True, cp_size=2, cp_rank=1)
    rows = torch.tensor([dual_chunk_rows(s, int(st), 2, 1) for st in starts])
    q_ref = reference_rows(q0.reshape(b, s, 2 * g, hd), qf, "bshd", True, rows)
    assert_close(q, q_ref, torch.bfloat16, "q")
    assert_close(k, reference_rows(k0, kf, "bshd", True, rows), torch.bfloat16, "k")
    assert torch.equal(v, v0)
    assert torch.equal(k, apply_rotary_pos_emb(k0, kf, "bshd", fused=True, **kw))
    grads = [randn(*o.shape, dtype=o.dtype, seed=i) for i, o in enumerate((q, k, v))]
    (got,) = torch.autograd.grad((q, k, v), x, grads)
    x64 = qkv.double().requires_grad_()
    q6, k6, v6 = torch.split(x64, [2 * hd, hd, hd], dim=-1)
    outs = (reference_rows(q6.reshape(b, s, 2 * g, hd), qf, "bshd", True, rows),
            reference_rows(k6, kf, "bshd", True, rows), v6)
    (want,) = torch.autograd.grad(outs, x64, [gr.double() for gr in grads])
    assert_close(got, want, torch.bfloat16, "qkv grad")


@pytest.mark.parametrize("tensor_format", FORMATS)
@pytest.mark.parametrize("bad", [-1, 40 - 6 + 1], ids=["negative", "past_end"])
def test_start_positions_outside_freqs_raise(tensor_format, bad):
    t, freqs, cu, starts, _ = cp_case(tensor_format, True, 1, 0, torch.float32)
    starts = starts.clone()
    # past_end: sequence 0 (6 tokens in sbhd/bshd, 8 in thd) would need row 40 or beyond.
    starts[0] = bad if bad < 0 else 40 - (8 if tensor_format == "thd" else 6) + 1
    with pytest.raises(ValueError, match="rows outside freqs"):
        apply_rotary_pos_emb(t, freqs, tensor_format, starts, cu_seqlens=cu)
    with pytest.raises(RuntimeError, match="argument 'start_positions'"):
        apply_rotary_pos_emb(t, freqs, tensor_format, starts, fused=True, cu_seqlens=cu)
    with pytest.raises(RuntimeError, match=r"'start_positions'.*int32"):
        apply_rotary_pos_emb(t, freqs, tensor_format, starts.long(), fused=True, cu_seqlens=cu)
