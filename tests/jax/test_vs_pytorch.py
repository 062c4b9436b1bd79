"""The JAX and PyTorch front ends agree bit for bit: FP8 bytes of the same input and scale, and the
delayed-scaling state (amax history, scale) of a GEMM after several training steps on the same data
(te.pytorch.Linear vs te.dense / te_flax.DenseGeneral). Skipped without the PyTorch front end."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from utils import FP8, assert_bytes_equal

import transformer_engine_lite.jax as te
from transformer_engine_lite.common import recipe
from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.quantize import QuantizerFactory

torch = pytest.importorskip("torch")
te_torch = pytest.importorskip("transformer_engine_lite.pytorch")

TORCH_FP8 = {np.dtype(jnp.float8_e4m3fn): torch.float8_e4m3fn,
             np.dtype(jnp.float8_e5m2): torch.float8_e5m2,
             np.dtype(jnp.float8_e4m3fnuz): torch.float8_e4m3fnuz,
             np.dtype(jnp.float8_e5m2fnuz): torch.float8_e5m2fnuz}


def _t(x):
    return torch.from_numpy(np.asarray(x, np.float32).copy())


@pytest.mark.parametrize("q_dtype", FP8)
def test_quantize_bytes_equal_pytorch(q_dtype):
    x = np.random.default_rng(0).standard_normal((33, 70)).astype(np.float32) * 50
    x[0, :4] = [np.nan, np.inf, -np.inf, 1e-7]
    scale = np.array([3.0], np.float32)
    q, amax, si = tex.quantize(jnp.asarray(x), jnp.asarray(scale), q_dtype)
    tq, tamax, tsi = torch.ops.te_lite.quantize(_t(x), _t(scale), TORCH_FP8[np.dtype(q_dtype)])
    assert_bytes_equal(q, tq.view(torch.uint8).numpy().view(np.dtype(q_dtype)))
    np.testing.assert_array_equal(np.asarray(amax), tamax.numpy())
    np.testing.assert_array_equal(np.asarray(si), tsi.numpy())


def test_mxfp8_bytes_equal_pytorch():
    x = np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32) * 10
    got = tex.quantize_mxfp8(jnp.asarray(x), jnp.float8_e4m3fn, True, True)
    want = torch.ops.te_lite.quantize_mxfp8(_t(x), torch.float8_e4m3fn, True, True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), w.view(torch.uint8).numpy())


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_state_equals_pytorch_linear(algo):
    """Same weights, inputs and output gradients for 5 steps: the FP8 state of te.pytorch.Linear
    (input, weight, grad-output columns) equals the JAX quantizer states bit for bit."""
    rc = recipe.DelayedScaling(amax_history_len=4, margin=1, amax_compute_algo=algo)
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((24, 32)) * 0.2).astype(np.float32)  # JAX kernel [in, out]
    lin = te_torch.Linear(24, 32, bias=False)
    with torch.no_grad():
        lin.weight.copy_(_t(w.T))
    q = QuantizerFactory.create_set(fp8_recipe=rc)
    kernel = jnp.asarray(w)

    def loss(x, q, g):
        return jnp.sum(te.dense(x, kernel, None, quantizer_set=q) * g)

    step = jax.jit(jax.value_and_grad(loss, argnums=1))
    for i in range(5):
        x = (rng.standard_normal((16, 24)) * (1 + i)).astype(np.float32)
        g = (rng.standard_normal((16, 32)) * (0.5 + i)).astype(np.float32)
        xt = _t(x).requires_grad_(True)
        with te_torch.fp8_autocast(enabled=True, fp8_recipe=rc):
            yt = lin(xt)
        yt.backward(_t(g))
        _, q = step(jnp.asarray(x), q, jnp.asarray(g))
        fwd_hist, fwd_scale = lin.fp8_fwd_amax_history.numpy(), lin.fp8_fwd_scale.numpy()
        bwd_hist, bwd_scale = lin.fp8_bwd_amax_history.numpy(), lin.fp8_bwd_scale.numpy()
        np.testing.assert_array_equal(np.asarray(q.x.amax_history), fwd_hist[:, 0])
        np.testing.assert_array_equal(np.asarray(q.x.scale), fwd_scale[:1])
        np.testing.assert_array_equal(np.asarray(q.kernel.amax_history), fwd_hist[:, 1])
        np.testing.assert_array_equal(np.asarray(q.kernel.scale), fwd_scale[1:2])
        np.testing.assert_array_equal(np.asarray(q.dgrad.amax_history), bwd_hist[:, 0])
        np.testing.assert_array_equal(np.asarray(q.dgrad.scale), bwd_scale[:1])


def test_denormal_inputs_as_pytorch():
    """XLA's CPU threads flush denormals; the handlers run the core with IEEE denormals on every
    thread, as PyTorch does: amax and FP8 bytes of denormal inputs are not read as zero."""
    x = np.full((4096,), 1e-39, np.float32)
    x[::7] = -3e-39
    scale = np.array([2.0**126], np.float32)
    for _ in range(3):
        q, amax, _ = jax.jit(lambda a: tex.quantize(a, jnp.asarray(scale), jnp.float8_e4m3fn))(
            jnp.asarray(x))
        tq, tamax, _ = torch.ops.te_lite.quantize(_t(x), _t(scale), torch.float8_e4m3fn)
        assert float(amax[0]) == float(tamax[0]) > 0
        assert_bytes_equal(q, tq.view(torch.uint8).numpy().view(np.dtype(jnp.float8_e4m3fn)))


# ===================================================================================== attention
# JAX fused_attn (flash backend) and torch.ops.te_lite.fused_attn_fwd / bwd (autograd) on the same
# inputs: both call nvte_fused_attn_fwd / bwd, so outputs and gradients are bit-identical. JAX's thd
# ([b, s, h, d] rows of up to m segments) is given to torch as the core's thd: the segments' tokens
# in order, cu_seqlens over the b * m segments (empty ones included), max_seqlen = s, and as many
# tokens (b * s) as JAX's packed buffer.
from attention_utils import Case, make_problem, run_jax

from transformer_engine_lite.jax import attention as jattn
from transformer_engine_lite.jax.cpp_extensions import attention as jtex

_ATTN_SWITCHES = (
    "NVTE_FLASH_ATTN",
    "NVTE_FUSED_ATTN",
    "NVTE_FUSED_ATTN_CK",
    "NVTE_FUSED_ATTN_AOTRITON",
    "NVTE_UNFUSED_ATTN",
)
_TORCH_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _torch_of(x, dtype):
    return torch.from_numpy(np.array(jnp.asarray(x, jnp.float32))).to(dtype)


def _torch_attention(case: Case, prob, key=None, p: float = 0.0):
    """The case through torch.ops.te_lite.fused_attn_fwd (+ autograd backward), results in JAX's
    canonical [b, s, ...] form as float32 numpy: (out, dq, dk, dv, dbias)."""
    dt = _TORCH_DT[case.dtype]
    segs_q, segs_kv = prob.segs
    thd = case.thd

    def tokens(x, segs):  # [b, s, ...] -> [b * s, ...]: the segments' tokens first, then zeros
        x = _torch_of(x, dt)
        if not thd:
            return x
        parts = [x[r, s0 : s0 + n] for r, row in enumerate(segs) for s0, n in row]
        flat = torch.cat(parts) if parts else x.reshape(-1, *x.shape[2:])[:0]
        pad = x.new_zeros((x.shape[0] * x.shape[1] - flat.shape[0], *x.shape[2:]))
        return torch.cat([flat, pad])

    def untokens(y, segs, s):  # inverse of tokens (the padding tokens must have come out 0)
        y = y.detach().float()
        if not thd:
            return y.numpy()
        out = torch.zeros((case.b, s, *y.shape[1:]))
        i = 0
        for r, row in enumerate(segs):
            for s0, n in row:
                out[r, s0 : s0 + n] = y[i : i + n]
                i += n
        assert not y[i:].any(), "torch thd tokens past cu_seqlens[-1] not 0"
        return out.numpy()

    def cu(segs):
        lens = (
            [n for row in segs for _, n in row + [(0, 0)] * (case.m - len(row))]
            if thd
            else [row[0][1] for row in segs]
        )
        return torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32)

    q, k, v = tokens(prob.q, segs_q), tokens(prob.k, segs_kv), tokens(prob.v, segs_kv)
    tail = case.layout.split("_")[-1]
    dim = 1 if thd else 2  # the packing dim of [t, 3, h, d] / [b, s, 3, h, d]
    if tail in ("bs3hd", "t3hd"):
        buf = torch.stack([q, k, v], dim=dim).requires_grad_(True)
        q, k, v = (buf.select(dim, i) for i in range(3))
        leaves = [buf]
    elif tail in ("bs2hd", "t2hd"):
        buf = torch.stack([k, v], dim=dim).requires_grad_(True)
        q = q.requires_grad_(True)
        k, v = (buf.select(dim, i) for i in range(2))
        leaves = [q, buf]
    else:
        leaves = [t.requires_grad_(True) for t in (q, k, v)]
        q, k, v = leaves
    bias = None if prob.bias is None else _torch_of(prob.bias, dt).requires_grad_(True)
    padded = case.padded
    rng = None
    if p > 0:
        w = np.asarray(jax.random.key_data(key), np.uint32).reshape(-1)[:2].astype(np.int64)
        rng = torch.tensor([int(w[0]) | (int(w[1]) << 32), 0], dtype=torch.int64)
    left, right = jattn._window(case.window, jattn.canonicalize_attn_mask_type(case.mask))
    out, _ = torch.ops.te_lite.fused_attn_fwd(
        q,
        k,
        v,
        case.layout,
        bias,
        cu(segs_q) if padded else None,
        cu(segs_kv) if padded else None,
        case.sq,
        case.s_kv,
        case.d**-0.5,
        p,
        rng,
        case.bias,
        jtex.core_mask(case.layout, case.mask),
        left,
        right,
        True,
    )
    out.backward(tokens(prob.dout, segs_q))
    if len(leaves) == 1:
        dq, dk, dv = (leaves[0].grad.select(dim, i) for i in range(3))
    elif len(leaves) == 2:
        dq, dk, dv = leaves[0].grad, leaves[1].grad.select(dim, 0), leaves[1].grad.select(dim, 1)
    else:
        dq, dk, dv = (t.grad for t in leaves)
    return (
        untokens(out, segs_q, case.sq),
        untokens(dq, segs_q, case.sq),
        untokens(dk, segs_kv, case.s_kv),
        untokens(dv, segs_kv, case.s_kv),
        None if bias is None else bias.grad.float().numpy(),
    )


ATTN_VS_TORCH = {
    "bshd": [
        Case("bshd_bshd_bshd", "padding_causal", "bf16", h_kv=2, bias="post_scale_bias"),
        Case("bshd_bshd_bshd", "no_mask", "fp16", sq=7, skv=17, window=(3, 1), h_kv=1),
    ],
    "kvpacked": [
        Case("bshd_bs2hd", "causal_bottom_right", "fp16", sq=7, skv=17, h_kv=2),
        Case(
            "bshd_bs2hd", "padding", "fp32", sq=17, skv=7, bias="post_scale_bias", bias_shape="bhss"
        ),
    ],
    "qkvpacked": [
        Case("bs3hd", "causal", "fp32", bias="post_scale_bias", bias_shape="b1ss"),
        Case("bs3hd", "padding_causal_bottom_right", "bf16", window=(2, 0)),
    ],
    "thd": [
        Case("thd_thd_thd", "padding_causal", "bf16", h_kv=2, m=3),
        Case("thd_t2hd", "causal_bottom_right", "fp16", sq=13, skv=17, m=2, desc="offsets"),
        Case("t3hd", "no_mask", "fp32", m=3, window=(3, 1)),
    ],
}


def _check_attention_vs_torch(case: Case, monkeypatch, dropout: float) -> None:
    for k in _ATTN_SWITCHES:  # JAX's flash backend, whatever the CI attention mode
        monkeypatch.delenv(k, raising=False)
    prob = make_problem(case)
    key = jnp.asarray([7, 2024], jnp.uint32) if dropout > 0 else None  # raw key: both words used
    got = run_jax(case, prob, seed=key, dropout=dropout)
    want = _torch_attention(case, prob, key, dropout)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), got, want):
        if b is None:
            assert a is None, name
            continue
        bits = [np.asarray(x, np.float32).view(np.uint32) for x in (a, b)]  # bit for bit
        np.testing.assert_array_equal(bits[0], bits[1], err_msg=f"JAX vs PyTorch: {name}")


@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("case", ATTN_VS_TORCH["bshd"], ids=lambda c: c.id())
def test_attention_bshd_equals_pytorch(case, dropout, monkeypatch):
    _check_attention_vs_torch(case, monkeypatch, dropout)


@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("case", ATTN_VS_TORCH["kvpacked"], ids=lambda c: c.id())
def test_attention_kvpacked_equals_pytorch(case, dropout, monkeypatch):
    _check_attention_vs_torch(case, monkeypatch, dropout)


@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("case", ATTN_VS_TORCH["qkvpacked"], ids=lambda c: c.id())
def test_attention_qkvpacked_equals_pytorch(case, dropout, monkeypatch):
    _check_attention_vs_torch(case, monkeypatch, dropout)


@pytest.mark.parametrize("dropout", [0.0, 0.25])
@pytest.mark.parametrize("case", ATTN_VS_TORCH["thd"], ids=lambda c: c.id())
def test_attention_thd_equals_pytorch(case, dropout, monkeypatch):
    _check_attention_vs_torch(case, monkeypatch, dropout)


def test_attention_floor_matches_pytorch_suite():
    """attention_utils.ATTENTION_FLOOR is a copy of tests/pytorch/utils.py's (the JAX suite must
    run without torch): the two tables stay equal."""
    import importlib.util
    from pathlib import Path

    from attention_utils import ATTENTION_FLOOR

    path = Path(__file__).resolve().parent.parent / "pytorch" / "utils.py"
    spec = importlib.util.spec_from_file_location("pytorch_test_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    theirs = {str(k).removeprefix("torch."): v for k, v in mod.ATTENTION_FLOOR.items()}
    assert theirs == ATTENTION_FLOOR
