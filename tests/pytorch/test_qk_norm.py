"""QK normalization (MultiheadAttention / TransformerLayer qk_norm_type, qk_norm_eps,
qk_norm_before_rope), ops.L2Normalization and pytorch.jit (the L2-normalization, GeLU and
bias-dropout-add functions, lazy_compile, no_torch_dynamo, the warm-ups), against fp64
re-implementations written here."""

from __future__ import annotations

import warnings

import pytest
import torch
from attention_ref import ref_attention
from utils import _gelu_tanh, assert_close, ref_layernorm, ref_linear, ref_rmsnorm

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch import jit, ops
from transformer_engine_lite.pytorch.module.layernorm import LayerNorm
from transformer_engine_lite.pytorch.module.rmsnorm import RMSNorm
from transformer_engine_lite.pytorch.ops.op import OperationContext

S, B, HIDDEN, HEADS = 9, 2, 64, 4
NORMS = ("L2Normalization", "RMSNorm", "LayerNorm")


def _rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def _leaf64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double().requires_grad_(True)


def ref_l2(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


# ----------------------------------------------------------------------------- pytorch.jit
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_l2normalization_fused_functions(dtype, eps):
    # eps = 0.5 is large against sum(x^2) of the small rows below: a wrong eps placement
    # (outside the sqrt, or left out of the backward's recomputed norm) shows.
    x = _rand(3, 5, 24, dtype=dtype, seed=1, scale=0.2)
    y, r = jit.l2normalization_fwd_fused(x, eps)
    x64 = _leaf64(x)
    ref = ref_l2(x64, eps)
    assert y.dtype == dtype and r.dtype == torch.float32 and r.shape == (3, 5, 1)
    assert_close(y, ref, dtype, "y")
    # r is kept in fp32 from the input's exact values: fp32 accuracy whatever the dtype
    r_ref = 1.0 / torch.sqrt((x64.detach() ** 2).sum(-1, keepdim=True) + eps)
    assert_close(r, r_ref, torch.float32, "rsqrt_norm")
    assert_close(jit.l2normalization_fused(x, eps), ref, dtype, "inference y")
    dy = _rand(3, 5, 24, dtype=dtype, seed=2)
    dx = jit.l2normalization_backward_fused(dy, x, r, eps)
    ref.backward(dy.double())
    assert dx.dtype == dtype
    assert_close(dx, x64.grad, dtype, "dx")


def test_l2normalization_fused_ignores_autocast():
    # TE's wrappers switch autocast off: fp32 in, fp32 out at fp32 accuracy under a bf16 autocast
    x = _rand(7, 32, seed=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = jit.l2normalization_fused(x, 1e-6)
        y2, _ = jit.l2normalization_fwd_fused(x, 1e-6)
    assert y.dtype == y2.dtype == torch.float32
    assert_close(y, ref_l2(x, 1e-6), torch.float32, "y")
    assert_close(y2, ref_l2(x, 1e-6), torch.float32, "y (training)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gelu_functions(dtype):
    x, bias = _rand(6, 40, dtype=dtype, seed=4, scale=2.0), _rand(40, dtype=dtype, seed=5)
    x64, b64 = _leaf64(x), _leaf64(bias)
    ref = _gelu_tanh(x64 + b64)
    assert_close(jit.bias_gelu_fused(x, bias), ref, dtype, "bias_gelu")
    assert_close(jit.bias_gelu_fused(x, None), _gelu_tanh(x64.detach()), dtype, "gelu")
    assert_close(jit.gelu_fused_(x), _gelu_tanh(x64.detach()), dtype, "gelu_fused_")
    dy = _rand(6, 40, dtype=dtype, seed=6)
    ref.backward(dy.double())
    dbias, dx = jit.bgrad_dgelu_fused(dy, x, bias)
    assert_close(dx, x64.grad, dtype, "dgelu")
    assert_close(dbias, b64.grad, dtype, "dbias")
    none_bias, dx0 = jit.bgrad_dgelu_fused(dy, x, torch.empty(0, dtype=dtype))
    assert none_bias is None
    x64b = _leaf64(x)
    _gelu_tanh(x64b).backward(dy.double())
    assert_close(dx0, x64b.grad, dtype, "dgelu without bias")
    assert_close(jit.dgelu_fused_(dy, x), x64b.grad, dtype, "dgelu_fused_")


def test_bias_dropout_add():
    x, bias, res = _rand(64, 32, seed=7), _rand(32, seed=8), _rand(64, 32, seed=9)
    expect = res + (x + bias)
    assert_close(jit.bias_dropout_add_fused_inference(x, bias, res, 0.5), expect, torch.float32)
    assert torch.equal(jit.get_bias_dropout_add(False)(x, bias, res, 0.5), expect)
    assert_close(jit.bias_dropout_add_fused_train(x, bias, res, 0.0), expect, torch.float32)
    with torch.no_grad():  # the training version turns grad on (activation recompute needs it)
        xr = x.clone().requires_grad_(True)
        out = jit.bias_dropout_add_fused_train(xr, bias, res, 0.5)
    assert out.requires_grad
    kept = (out - res) != 0
    assert 0.35 < kept.float().mean().item() < 0.65
    assert_close(out[kept], (res + 2.0 * (x + bias))[kept], torch.float32, "kept")


def test_lazy_compile_defers_and_inlines():
    def f(x):
        return x * 2 + 1

    lazy = jit.lazy_compile(f)
    assert lazy.lazy_compiled == [] and lazy.__name__ == "f"
    x = torch.arange(6.0)
    assert torch.equal(lazy(x), x * 2 + 1)
    assert len(lazy.lazy_compiled) == 1
    assert lazy.lazy_compiled[0]._torchdynamo_orig_callable is f  # a torch.compile of f

    lazy2 = jit.lazy_compile(f)
    outer = torch.compile(lambda t: lazy2(t) - 1)
    assert torch.equal(outer(x), x * 2)
    assert lazy2.lazy_compiled == [], "inside torch.compile it must be inlined, not compiled"
    # the library's functions are lazily compiled unless NVTE_TORCH_COMPILE=0
    assert hasattr(jit.l2normalization_fwd_fused_, "lazy_compiled") == jit.compile_enabled()


def test_compile_switch(monkeypatch):
    monkeypatch.setenv("NVTE_TORCH_COMPILE", "0")
    assert jit.compile_enabled() is False
    monkeypatch.setenv("NVTE_TORCH_COMPILE", "1")
    assert jit.compile_enabled() is True
    monkeypatch.setenv("NVTE_TORCH_COMPILE", "yes")
    with pytest.raises(ValueError, match="NVTE_TORCH_COMPILE: expected an integer"):
        jit.compile_enabled()


def test_no_torch_dynamo():
    def body(x, flag=False):
        return x.sin() + (1 if flag else 0)

    f = jit.no_torch_dynamo(when=lambda call: "flag" if call.get("flag") else None)(body)
    x = torch.arange(4.0)
    assert torch.equal(f(x, flag=True), body(x, True))  # eager: no warning, as is
    g = torch.compile(lambda t: f(t, flag=True) * 2)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = g(x)
    assert torch.equal(out, body(x, True) * 2)
    assert any("Falling back to eager execution" in str(m.message) for m in w)
    plain = jit.no_torch_dynamo()(body)
    assert torch.equal(torch.compile(lambda t: plain(t))(x), body(x))
    with pytest.raises(TypeError, match="takes \\*args"):
        jit.no_torch_dynamo(when=lambda c: None)(lambda *a: a)


def test_warmup_keeps_rng_state(monkeypatch):
    # The warm-ups draw random inputs (and dropout masks); training must not see a different
    # stream. The functions run eagerly here: compiling them is not what is tested (and costs
    # half a minute on a CPU).
    for name in jit.__all__:
        f = getattr(jit, name)
        if hasattr(f, "lazy_compiled"):
            monkeypatch.setattr(jit, name, f.__wrapped__)
    torch.manual_seed(123)
    expect = torch.rand(4)
    torch.manual_seed(123)
    jit.warmup_jit_l2normalization(16, torch.float32, 2, 3)
    jit.warmup_jit_bias_gelu(16, torch.float32, 2, 3)
    jit.warmup_jit_bias_dropout_add(16, torch.float32, 2, 3)
    assert torch.equal(torch.rand(4), expect), "warm-up changed the RNG stream"
    with pytest.raises(ValueError, match="seq_length: expected an int >= 1"):
        jit.warmup_jit_l2normalization(16, torch.float32, 0, 3)


# ----------------------------------------------------------------------------- the op
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_l2normalization_op(dtype):
    op = ops.L2Normalization(eps=1e-3)
    base = _rand(4, 3, 2, 16, dtype=dtype, seed=10)
    x = base.transpose(0, 1).requires_grad_(True)  # non-contiguous, as q / k views are
    y = op(x)
    x64 = _leaf64(x)
    ref = ref_l2(x64, 1e-3)
    assert y.dtype == dtype
    assert_close(y, ref, dtype, "y")
    dy = _rand(*y.shape, dtype=dtype, seed=11)
    y.backward(dy)
    ref.backward(dy.double())
    assert_close(x.grad, x64.grad, dtype, "dx")
    with torch.no_grad():
        assert_close(op(x), ref, dtype, "inference y")


def test_l2normalization_op_interface_and_compile():
    # TE's op_forward / op_backward, driven by hand as TE code does
    op = ops.L2Normalization(eps=1e-4)
    x = _rand(5, 12, seed=12)
    x64 = _leaf64(x)
    ref = ref_l2(x64, 1e-4)
    ctx = OperationContext()
    y = op.op_forward(ctx, x, None, None)
    ctx.saved_tensors = ctx.to_save
    dy = _rand(5, 12, seed=13)
    dx, dparams = op.op_backward(ctx, dy)
    ref.backward(dy.double())
    assert_close(y, ref, torch.float32, "op_forward")
    assert_close(dx, x64.grad, torch.float32, "op_backward")
    assert tuple(dparams) == ()
    ctx = OperationContext()
    ctx.requires_grad = False
    assert_close(op.op_forward(ctx, x, None, None), ref, torch.float32, "inference op_forward")
    assert ctx.to_save is None
    # under torch.compile the jit functions are traced into the caller's graph: same results
    seq = ops.Sequential(op)
    xc = x.clone().requires_grad_(True)
    yc = torch.compile(seq)(xc)
    yc.backward(dy)
    assert_close(yc, ref, torch.float32, "compiled forward")
    assert_close(xc.grad, x64.grad, torch.float32, "compiled dx")


@pytest.mark.parametrize(
    "call,err,match",
    [
        (lambda: ops.L2Normalization(eps=-1.0), ValueError, "eps: expected a float >= 0"),
        (lambda: ops.L2Normalization(seq_length="4"), ValueError, "seq_length: expected None"),
        (lambda: ops.L2Normalization()(torch.ones(3, 4, dtype=torch.int32)), TypeError,
         "input: expected a floating-point tensor"),
    ],
    ids=["eps", "seq_length", "int input"],
)
def test_l2normalization_op_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


# ----------------------------------------------------------------------------- MHA reference
def _params(m: torch.nn.Module, prefix: str, names: tuple[str, ...], kind: str, p: dict):
    if f"{prefix}{kind}" in p:
        return p[f"{prefix}{kind}"]
    parts = [p.get(f"{prefix}{n}_{kind}") for n in names]
    return None if parts[0] is None else torch.cat(parts)


def _project(m, p, prefix, x, names):
    w, b = (_params(m, prefix, names, kind, p) for kind in ("weight", "bias"))
    return ref_linear(x, w, b)


def _split_heads(m, y, n_q):
    """[..., (n_q + 2 g) d] or [..., 2 g d] (n_q = 0) -> q (if n_q), k, v as [..., heads, d]."""
    d, g = m.hidden_size_per_attention_head, m.num_gqa_groups
    lead = y.shape[:-1]
    if m.qkv_weight_interleaved:  # per KV group: its n_q / g query heads, then k, then v
        y = y.view(*lead, g, n_q // g + 2, d)
        parts = [y[..., : n_q // g, :].reshape(*lead, n_q, d)] if n_q else []
        return parts + [y[..., n_q // g, :], y[..., n_q // g + 1, :]]
    sizes = [n_q * d, g * d, g * d] if n_q else [g * d, g * d]
    return [t.view(*lead, -1, d) for t in y.split(sizes, -1)]


def _rope(x, freqs):
    """Non-interleaved RoPE of the first d2 features, x [s, b, h, d], freqs [s, 1, 1, d2]."""
    f = freqs[: x.shape[0]].double()
    d2 = f.shape[-1]
    t, rest = x[..., :d2], x[..., d2:]
    a, b = t.chunk(2, -1)
    return torch.cat((t * f.cos() + torch.cat((-b, a), -1) * f.sin(), rest), -1)


def _qk_norm(kind, p, which, t, eps):
    if kind == "L2Normalization":
        return ref_l2(t, eps)
    if kind == "RMSNorm":
        return ref_rmsnorm(t, p[f"{which}.weight"], eps)
    return ref_layernorm(t, p[f"{which}.weight"], p[f"{which}.bias"], eps)


def ref_mha(m, kind, eps, before_rope, p, x, enc=None, freqs=None):
    """fp64 sbhd MultiheadAttention with QK normalization (TE's placement)."""
    h = m.num_attention_heads
    if m.attention_type == "self":
        q, k, v = _split_heads(m, _project(m, p, "qkv.", x, ("query", "key", "value")), h)
    else:
        q = _project(m, p, "query_layer.", x, ("query",)).unflatten(-1, (h, -1))
        k, v = _split_heads(m, _project(m, p, "key_value.", enc, ("key", "value")), 0)
    if before_rope:
        q, k = _qk_norm(kind, p, "q_norm", q, eps), _qk_norm(kind, p, "k_norm", k, eps)
    if freqs is not None:
        q, k = _rope(q, freqs), _rope(k, freqs)
    if not before_rope:
        q, k = _qk_norm(kind, p, "q_norm", q, eps), _qk_norm(kind, p, "k_norm", k, eps)
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    b, sq, skv = q.shape[0], q.shape[1], k.shape[1]
    ctx = ref_attention(q, k, v, mask=m.attn_mask_type, window=None, scale=q.shape[-1] ** -0.5,
                        lens_q=[sq] * b, lens_kv=[skv] * b)
    ctx = ctx.transpose(0, 1).flatten(-2)
    return ref_linear(ctx, p["proj.weight"], p.get("proj.bias"))


MHA_CASES = {
    "self": {"attention_type": "self"},
    "self-fused-gqa": {"attention_type": "self", "fuse_qkv_params": True, "num_gqa_groups": 2},
    "cross": {"attention_type": "cross", "attn_mask_type": "no_mask"},
}


# bf16 on the self case only: the layouts do not depend on the dtype
MHA_PARAMS = [
    pytest.param(dtype, kind, before, case, id=f"{str(dtype)[6:]}-{kind}-{case}-{before_id}")
    for dtype in (torch.float32, torch.bfloat16)
    for kind in NORMS
    for before, before_id in ((False, "after-rope"), (True, "before-rope"))
    for case in MHA_CASES
    if dtype == torch.float32 or case == "self"
]


@pytest.mark.parametrize("dtype,kind,before_rope,case", MHA_PARAMS)
def test_mha_qk_norm_vs_reference(dtype, kind, before_rope, case):
    kw = MHA_CASES[case]
    cross = kw["attention_type"] == "cross"
    eps = 1e-2  # large enough for a misplaced eps to show against the head rows' magnitudes
    torch.manual_seed(0)
    m = te.MultiheadAttention(HIDDEN, HEADS, attention_dropout=0.0, params_dtype=dtype,
                              qk_norm_type=kind, qk_norm_eps=eps, qk_norm_before_rope=before_rope,
                              **kw)
    with torch.no_grad():  # non-trivial norm parameters, so their use (and gradients) is checked
        for n, prm in m.named_parameters():
            if "norm" in n:
                prm.copy_(_rand(*prm.shape, seed=len(n)) * 0.3 + (1.0 if "weight" in n else 0.0))
    x = _rand(S, B, HIDDEN, dtype=dtype, seed=20).requires_grad_(True)
    enc = _rand(S + 3, B, HIDDEN, dtype=dtype, seed=21).requires_grad_(True) if cross else None
    freqs = None if cross else te.RotaryPositionEmbedding(HIDDEN // HEADS // 2)(S)
    out = m(x, encoder_output=enc) if cross else m(x, rotary_pos_emb=freqs)
    dy = _rand(*out.shape, dtype=dtype, seed=22)
    out.backward(dy)
    p64 = {n: _leaf64(t) for n, t in m.named_parameters()}
    x64 = _leaf64(x)
    enc64 = _leaf64(enc) if cross else None
    ref = ref_mha(m, kind, eps, before_rope, p64, x64, enc64, freqs)
    ref.backward(dy.double())
    assert_close(out, ref, dtype, "output")
    assert_close(x.grad, x64.grad, dtype, "dx")
    if cross:
        assert_close(enc.grad, enc64.grad, dtype, "d encoder_output")
    for n, prm in m.named_parameters():
        assert_close(prm.grad, p64[n].grad, dtype, f"grad of {n}")


# ----------------------------------------------------------------------------- structure
@pytest.mark.parametrize("kind", NORMS)
def test_qk_norm_modules_and_state_dict(kind):
    m = te.MultiheadAttention(HIDDEN, HEADS, qk_norm_type=kind, params_dtype=torch.bfloat16)
    names = {n for n in m.state_dict() if "norm" in n}
    if kind == "L2Normalization":
        assert isinstance(m.q_norm, ops.L2Normalization) and m.q_norm is m.k_norm
        assert names == set() and m.q_norm.eps == 1e-6  # TE's default qk_norm_eps
    else:
        cls = RMSNorm if kind == "RMSNorm" else LayerNorm
        assert isinstance(m.q_norm, cls) and isinstance(m.k_norm, cls) and m.q_norm is not m.k_norm
        assert m.q_norm.hidden_size == HIDDEN // HEADS and m.q_norm.eps == 1e-6
        assert m.q_norm.weight.dtype == torch.bfloat16
        expect = {"q_norm.weight", "k_norm.weight"}
        if kind == "LayerNorm":
            expect |= {"q_norm.bias", "k_norm.bias"}
        assert names == expect
    assert te.MultiheadAttention(HIDDEN, HEADS).q_norm is None
    assert te.MultiheadAttention(HIDDEN, HEADS).k_norm is None


def test_transformer_layer_passes_qk_norm():
    layer = te.TransformerLayer(HIDDEN, 2 * HIDDEN, HEADS, layer_type="decoder",
                                qk_norm_type="LayerNorm", qk_norm_eps=1e-4,
                                qk_norm_before_rope=True)
    for att in (layer.self_attention, layer.inter_attention):
        assert isinstance(att.q_norm, LayerNorm) and att.q_norm.eps == 1e-4
        assert att.qk_norm_before_rope is True
    keys = layer.state_dict()
    assert "self_attention.q_norm.weight" in keys and "inter_attention.k_norm.bias" in keys
    # a state dict round trip restores the QK-norm parameters
    other = te.TransformerLayer(HIDDEN, 2 * HIDDEN, HEADS, layer_type="decoder",
                                qk_norm_type="LayerNorm")
    with torch.no_grad():
        layer.self_attention.q_norm.weight.add_(0.5)
    other.load_state_dict(layer.state_dict())
    assert torch.equal(other.self_attention.q_norm.weight, layer.self_attention.q_norm.weight)


@pytest.mark.parametrize(
    "call,err,match",
    [
        (lambda: te.MultiheadAttention(HIDDEN, HEADS, qk_norm_type="l2"), ValueError,
         "qk_norm_type: expected None or one of"),
        (lambda: te.TransformerLayer(HIDDEN, HIDDEN, HEADS, qk_norm_type="RMS"), ValueError,
         "qk_norm_type: expected None or one of"),
        (lambda: te.MultiheadAttention(HIDDEN, HEADS, qk_norm_type="RMSNorm", qk_norm_eps=-1.0),
         ValueError, "eps: expected a number >= 0"),
        (lambda: te.MultiheadAttention(HIDDEN, HEADS, qk_norm_type="L2Normalization",
                                       qk_norm_eps=-1.0), ValueError, "eps: expected a float"),
    ],
    ids=["mha type", "layer type", "rms eps", "l2 eps"],
)
def test_qk_norm_bad_arguments(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_mha_l2_qk_norm_compiles_fullgraph():
    # the attention modules trace as one graph (README); the QK norm must not break it
    torch.manual_seed(0)
    m = te.MultiheadAttention(HIDDEN, HEADS, attention_dropout=0.0,
                              qk_norm_type="L2Normalization")
    x = _rand(S, B, HIDDEN, seed=30).requires_grad_(True)
    freqs = te.RotaryPositionEmbedding(HIDDEN // HEADS // 2)(S)
    y = m(x, rotary_pos_emb=freqs)
    dy = _rand(*y.shape, seed=31)
    y.backward(dy)
    dx = x.grad.clone()
    x.grad = None
    yc = torch.compile(m, fullgraph=True)(x, rotary_pos_emb=freqs)
    yc.backward(dy)
    assert_close(yc, y, torch.float32, "compiled output")
    assert_close(x.grad, dx, torch.float32, "compiled dx")
