"""ops.L2Normalization and pytorch.jit (the L2-normalization, GeLU and bias-dropout-add
functions, lazy_compile, no_torch_dynamo, the warm-ups) against fp64 re-implementations written
here."""

from __future__ import annotations

import warnings

import pytest
import torch
from utils import _gelu_tanh, assert_close

from transformer_engine_lite.pytorch import jit, ops
from transformer_engine_lite.pytorch.ops.op import OperationContext

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
