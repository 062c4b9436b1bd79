"""TE's fusible-operations API (transformer_engine_lite.pytorch.ops): each op's forward and
backward against fp64 plain-torch references written here, Sequential's extra inputs/outputs and
container methods, FP8 BasicLinear/Linear == te.Linear byte for byte under each recipe, meta-device
init, argument errors, and a Megatron-Core TEFusedMLP-shaped pipeline. The op fuser's fusions:
test_op_fuser.py."""

from __future__ import annotations

import math
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
)
from transformer_engine_lite.pytorch.tensor import Float8Tensor, MXFP8Tensor
from utils import assert_close

ops = te.ops
DTYPES = (torch.float32, torch.bfloat16)
RECIPES = {
    "delayed": DelayedScaling,
    "current": Float8CurrentScaling,
    "mxfp8": MXFP8BlockScaling,
}


def _rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).requires_grad_()


def _leaf64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double().requires_grad_()


# ------------------------------------------------------------------ fp64 references (plain torch)
def _gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


_REF_ACT = {
    "GELU": _gelu,
    "QGELU": lambda x: x * torch.sigmoid(1.702 * x),
    "ReLU": torch.relu,
    "SReLU": lambda x: torch.relu(x) ** 2,
    "SiLU": lambda x: x * torch.sigmoid(x),
}
_GATED = {"GEGLU": "GELU", "QGEGLU": "QGELU", "ReGLU": "ReLU", "SReGLU": "SReLU", "SwiGLU": "SiLU"}


def ref_act(name, x):
    if name in _GATED:  # TE: the activation applies to the first half
        a, b = x.chunk(2, -1)
        return _REF_ACT[_GATED[name]](a) * b
    return _REF_ACT[name](x)


def ref_norm(kind, x, w, b, eps, zc, ndims):
    dims = tuple(range(-ndims, 0))
    g = w + 1.0 if zc else w
    if kind == "LayerNorm":
        mu = x.mean(dims, keepdim=True)
        var = ((x - mu) ** 2).mean(dims, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * g + b
    return x / torch.sqrt((x * x).mean(dims, keepdim=True) + eps) * g


def check_grads(pairs, dtype, what):
    for name, got, ref in pairs:
        assert got is not None, f"{what}: {name} has no gradient"
        assert_close(got, ref, dtype, f"{what}: {name}")


# ------------------------------------------------------------------ single ops
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", [*_REF_ACT, *_GATED])
def test_activation(name, dtype):
    x = _rand(3, 5, 2 * 37, dtype=dtype, seed=1)
    op = getattr(ops, name)()
    y = op(x)
    x64 = _leaf64(x)
    ref = ref_act(name, x64)
    assert y.dtype == dtype
    assert_close(y, ref, dtype, f"{name} forward")
    dy = _rand(*ref.shape, dtype=dtype, seed=2)
    y.backward(dy)
    ref.backward(dy.detach().double())
    assert_close(x.grad, x64.grad, dtype, f"{name} dgrad")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("zc", [False, True], ids=["gamma", "zero_centered"])
@pytest.mark.parametrize("kind", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("shape", [(123,), (3, 41)], ids=["1d", "2d"])
def test_norm(kind, zc, dtype, shape):
    op = getattr(ops, kind)(shape, eps=1e-5, dtype=dtype, zero_centered_gamma=zc)
    with torch.no_grad():  # non-trivial parameters
        op.weight.copy_(torch.rand(shape) * 0.5 + (0.0 if zc else 0.75))
        if kind == "LayerNorm":
            op.bias.copy_(torch.randn(shape) * 0.1)
    x = _rand(7, *shape, dtype=dtype, seed=3, scale=2.0)
    y = op(x)
    x64, w64 = _leaf64(x), _leaf64(op.weight)
    b64 = _leaf64(op.bias) if kind == "LayerNorm" else None
    ref = ref_norm(kind, x64, w64, b64, 1e-5, zc, len(shape))
    assert_close(y, ref, dtype, f"{kind} forward")
    dy = _rand(*y.shape, dtype=dtype, seed=4)
    y.backward(dy)
    ref.backward(dy.detach().double())
    pairs = [("dx", x.grad, x64.grad), ("dweight", op.weight.grad, w64.grad)]
    if kind == "LayerNorm":
        pairs.append(("dbias", op.bias.grad, b64.grad))
    check_grads(pairs, dtype, kind)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("fused", [False, True], ids=["ops", "Linear"])
def test_linear(dtype, bias, fused):
    if fused:
        seq = ops.Sequential(ops.Linear(59, 37, bias=bias, dtype=dtype))
        w, b = seq[0].weight, seq[0].bias
    else:
        seq = ops.Sequential(ops.BasicLinear(59, 37, dtype=dtype))
        if bias:
            seq.append(ops.Bias(37, dtype=dtype))
        w, b = seq[0].weight, (seq[1].bias if bias else None)
    if b is not None:
        with torch.no_grad():
            b.copy_(torch.randn(37))
    x = _rand(2, 11, 59, dtype=dtype, seed=5)
    y = seq(x)
    x64, w64 = _leaf64(x), _leaf64(w)
    b64 = _leaf64(b) if b is not None else None
    ref = x64 @ w64.t() + (b64 if b64 is not None else 0.0)
    assert y.shape == (2, 11, 37) and y.dtype == dtype
    assert_close(y, ref, dtype, "forward")
    dy = _rand(*y.shape, dtype=dtype, seed=6)
    y.backward(dy)
    ref.backward(dy.detach().double())
    pairs = [("dx", x.grad, x64.grad), ("dweight", w.grad, w64.grad)]
    if b is not None:
        pairs.append(("dbias", b.grad, b64.grad))
    check_grads(pairs, dtype, "linear")


def test_shape_and_scale_ops():
    x = _rand(4, 6, 10, seed=7)
    seq = ops.Sequential(
        ops.Reshape((-1, 10)), ops.ConstantScale(0.5), ops.Identity(),
        ops.L2Normalization(eps=1e-6), ops.Dropout(0.0), ops.Reshape((4, 60)),
    )
    y = seq(x)
    x64 = _leaf64(x)
    r = x64.reshape(-1, 10) * 0.5
    ref = (r / torch.sqrt((r * r).sum(-1, keepdim=True) + 1e-6)).reshape(4, 60)
    assert_close(y, ref, torch.float32, "forward")
    dy = _rand(4, 60, seed=8)
    y.backward(dy)
    ref.backward(dy.detach().double())
    assert_close(x.grad, x64.grad, torch.float32, "dx")


def test_dropout_training_and_eval():
    op = ops.Dropout(0.5)
    x = torch.ones(1000)
    y = op(x)
    kept = y != 0
    assert 300 < int(kept.sum()) < 700 and torch.all(y[kept] == 2.0)
    op.eval()
    assert torch.equal(op(x), x)


def test_collectives_are_identities_on_one_process():
    x = _rand(4, 3, seed=9)
    for op in (ops.AllReduce(), ops.ReduceScatter(), ops.AllGather()):
        assert torch.equal(op(x), x)


# ------------------------------------------------------------------ Sequential
def test_extra_inputs_and_outputs():
    """MakeExtraOutput forks the residual, AddExtraInput adds two extra inputs in order."""
    norm, lin = ops.RMSNorm(24), ops.Linear(24, 24)
    seq = ops.Sequential(
        ops.MakeExtraOutput(), norm, lin, ops.AddExtraInput(), ops.GELU(), ops.AddExtraInput(),
        ops.MakeExtraOutput(),
    )
    x, r1, r2 = _rand(5, 24, seed=10), _rand(5, 24, seed=11), _rand(5, 24, seed=12)
    y, e1, e2 = seq(x, r1, r2)
    assert e1 is x or torch.equal(e1, x)
    assert torch.equal(e2, y)
    x64, r164, r264, w64, b64, g64 = map(_leaf64, (x, r1, r2, lin.weight, lin.bias, norm.weight))
    h = ref_norm("RMSNorm", x64, g64, None, 1e-5, False, 1) @ w64.t() + b64 + r164
    ref = _gelu(h) + r264
    assert_close(y, ref, torch.float32, "forward")
    dy, de1, de2 = (_rand(5, 24, seed=s) for s in (13, 14, 15))
    torch.autograd.backward((y, e1, e2), (dy, de1, de2))
    torch.autograd.backward((ref, x64, ref), (dy.double(), de1.double(), de2.double()))
    pairs = [("dx", x.grad, x64.grad), ("dr1", r1.grad, r164.grad), ("dr2", r2.grad, r264.grad),
             ("dweight", lin.weight.grad, w64.grad), ("dgamma", norm.weight.grad, g64.grad)]
    check_grads(pairs, torch.float32, "residual block")
    with pytest.raises(ValueError, match="extra_inputs"):
        seq(x, r1)


def test_sequential_container():
    a, b, c = ops.Identity(), ops.ConstantScale(2.0), torch.nn.Tanh()
    seq = ops.Sequential(a)
    assert seq.append(b) is seq
    seq += [c]
    assert len(seq) == 3 and list(seq) == [a, b, c] and seq[-1] is c
    assert isinstance(seq[0:2], ops.Sequential) and len(seq[0:2]) == 2
    seq.insert(0, ops.ConstantScale(3.0))
    x = torch.randn(4)
    assert torch.allclose(seq(x), torch.tanh(6.0 * x))
    assert seq.pop(-1) is c
    assert torch.allclose(seq(x), 6.0 * x)
    del seq[0]
    assert torch.allclose((seq + [ops.ConstantScale(0.5)])(x), x)
    assert torch.allclose(ops.Sequential({"s": ops.ConstantScale(4.0)})(x), 4.0 * x)


class _Square(ops.BasicOperation):
    """A user op written against TE's op_forward / op_backward interface."""

    def __init__(self):
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.tensor(1.5))

    def op_forward(self, ctx, input_, prev_op_grad_output_quantizer, next_op_input_quantizer):
        ctx.save_for_backward(input_)
        return self.alpha * input_ * input_

    def op_backward(self, ctx, grad_output):
        (x,) = ctx.saved_tensors
        return 2 * self.alpha * x * grad_output, [(grad_output * x * x).sum()]


def test_user_basic_operation():
    op = _Square()
    x = _rand(6, seed=17)
    y = ops.Sequential(ops.ConstantScale(2.0), op)(x)
    y.sum().backward()
    x64 = x.detach().double()
    assert_close(y, 1.5 * (2 * x64) ** 2, torch.float32, "forward")
    assert_close(x.grad, 1.5 * 8 * x64, torch.float32, "dx")
    assert_close(op.alpha.grad, ((2 * x64) ** 2).sum(), torch.float32, "dalpha")


# ------------------------------------------------------------------ FP8
def _te_linear_pair(dtype, bias=True):
    torch.manual_seed(1)
    ref = te.Linear(64, 96, bias=bias, params_dtype=dtype, device="cpu")
    op = ops.Linear(64, 96, bias=bias, dtype=dtype, device="cpu")
    with torch.no_grad():
        op.weight.copy_(ref.weight)
        if bias:
            ref.bias.normal_()
            op.bias.copy_(ref.bias)
    return ref, op


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_fp8_linear_matches_te_linear(recipe, dtype):
    """ops.Linear is te.Linear's FP8 GEMM: same bytes, forward and backward, over 3 steps (the
    delayed-scaling history and scales update between steps)."""
    ref, op = _te_linear_pair(dtype)
    for step in range(3):
        x = _rand(32, 64, dtype=dtype, seed=20 + step, scale=1.0 + step)
        x2 = x.detach().clone().requires_grad_()
        dy = _rand(32, 96, dtype=dtype, seed=30 + step)
        with te.fp8_autocast(enabled=True, fp8_recipe=RECIPES[recipe]()):
            y_ref, y = ref(x), op(x2)
        y_ref.backward(dy)
        y.backward(dy)
        assert torch.equal(y, y_ref), f"step {step}: forward"
        assert torch.equal(x2.grad, x.grad), f"step {step}: dgrad"
        assert torch.equal(op.weight.grad, ref.weight.grad), f"step {step}: wgrad"
        assert torch.equal(op.bias.grad, ref.bias.grad), f"step {step}: bgrad"
    assert_close(y, x2.detach().double() @ op.weight.detach().double().t() + op.bias.double(),
                 "fp8", "FP8 vs fp64")


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_fp8_basic_linear_without_bias_matches(recipe):
    ref, _ = _te_linear_pair(torch.bfloat16, bias=False)
    op = ops.BasicLinear(64, 96, dtype=torch.bfloat16)
    with torch.no_grad():
        op.weight.copy_(ref.weight)
    x = _rand(32, 64, dtype=torch.bfloat16, seed=40)
    with te.fp8_autocast(enabled=True, fp8_recipe=RECIPES[recipe]()):
        assert torch.equal(op(x), ref(x))


def test_quantize_op():
    x = _rand(32, 64, seed=41)
    q = ops.Quantize(forward=True, backward=True)
    assert torch.equal(q(x), x)  # identity outside fp8_autocast
    with te.fp8_autocast(enabled=True, fp8_recipe=Float8CurrentScaling()):
        y = q(x)
        y2 = q(y.detach())
    assert isinstance(y, Float8Tensor) and y.dtype == x.dtype  # TE's type, nominal dtype kept
    assert not torch.equal(y, x) and torch.equal(y2, y)  # FP8 values: a second cast keeps them
    assert_close(y, x.detach().double(), "fp8", "FP8 round trip")
    dy = _rand(32, 64, seed=42)
    y.backward(dy)
    assert isinstance(x.grad, Float8Tensor)  # the gradient was cast too
    assert not torch.equal(x.grad.dequantize(), dy)
    assert_close(x.grad.dequantize(), dy.detach().double(), "fp8", "quantized gradient")
    x = _rand(32, 64, seed=44)
    with te.fp8_autocast(enabled=True, fp8_recipe=MXFP8BlockScaling()):
        y = q(x)
    assert isinstance(y, MXFP8Tensor)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_cache_quantized_input(recipe):
    x = _rand(32, 64, seed=43)
    x2 = x.detach().clone().requires_grad_()
    with te.fp8_autocast(enabled=True, fp8_recipe=RECIPES[recipe]()):
        y1 = ops.SwiGLU(cache_quantized_input=True)(x)
        y2 = ops.SwiGLU()(x2)
    assert torch.equal(y1, y2)  # the forward reads the input itself
    y1.sum().backward()
    y2.sum().backward()
    assert not torch.equal(x.grad, x2.grad)  # the backward read its FP8 values
    assert_close(x.grad, x2.grad.double(), "fp8", "dgrad from FP8 input")


# ------------------------------------------------------------------ parameters and arguments
def test_meta_device_then_reset_parameters():
    lin = ops.BasicLinear(16, 8, device="meta", dtype=torch.bfloat16)
    bias = ops.Bias(8, device="meta")
    ln = ops.LayerNorm(16, device="meta", zero_centered_gamma=True)
    for p in (lin.weight, bias.bias, ln.weight, ln.bias):
        assert p.device.type == "meta"
    with pytest.raises(RuntimeError, match="meta"):
        lin(torch.randn(2, 16, dtype=torch.bfloat16))
    for m in (lin, bias, ln):
        m.reset_parameters()
    assert lin.weight.device.type == "cpu" and lin.weight.dtype == torch.bfloat16
    bound = 1.0 / math.sqrt(16)  # kaiming_uniform(a=sqrt(5)), as TE and torch.nn.Linear
    assert 0 < lin.weight.abs().max() <= bound
    assert torch.equal(bias.bias, torch.zeros(8)) and torch.equal(ln.weight, torch.zeros(16))
    assert ops.RMSNorm(16).weight.eq(1).all()


def test_accumulate_into_main_grad():
    lin = ops.BasicLinear(8, 4, accumulate_into_main_grad=True)
    lin.weight.main_grad = torch.ones(4, 8)
    x = _rand(3, 8, seed=44)
    lin(x).sum().backward()
    ref = 1.0 + torch.ones(3, 4).t().double() @ x.detach().double()
    assert_close(lin.weight.main_grad, ref, torch.float32, "main_grad")


def test_input_cast_to_parameter_dtype():
    lin = ops.BasicLinear(8, 4, dtype=torch.bfloat16)
    assert ops.Sequential(lin)(torch.randn(2, 8)).dtype == torch.bfloat16


@pytest.mark.parametrize(
    "make, exc, arg",
    [
        (lambda: ops.BasicLinear(0, 4), ValueError, "in_features"),
        (lambda: ops.BasicLinear(4, 2.5), TypeError, "out_features"),
        (lambda: ops.BasicLinear(4, 4, tensor_parallel_mode="diagonal"), ValueError,
         "tensor_parallel_mode"),
        (lambda: ops.BasicLinear(4, 4, userbuffers_options={"name": "fc1"}),
         ValueError, "userbuffers_options"),
        (lambda: ops.BasicLinear(4, 4, dtype=torch.int32), TypeError, "dtype"),
        (lambda: ops.Bias(-1), ValueError, "size"),
        (lambda: ops.LayerNorm(8, eps=-1.0), ValueError, "eps"),
        (lambda: ops.RMSNorm((8, 0)), ValueError, "normalized_shape"),
        (lambda: ops.fused.BackwardActivationBias(bias=ops.Bias(4), activation=ops.SReLU()),
         TypeError, "activation"),
        (lambda: ops.Dropout(1.5), ValueError, "p"),
        (lambda: ops.ConstantScale("2"), TypeError, "scale"),
        (lambda: ops.Reshape(3), TypeError, "shape"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_arguments(make, exc, arg):
    with pytest.raises(exc, match=arg):
        make()


def test_bad_inputs():
    with pytest.raises(ValueError, match="in_features"):
        ops.BasicLinear(8, 4)(torch.randn(2, 7))
    with pytest.raises(ValueError, match="even last dim"):
        ops.SwiGLU()(torch.randn(2, 7))
    with pytest.raises(ValueError, match="trailing dims"):
        ops.RMSNorm(8)(torch.randn(2, 7))
    with pytest.raises(TypeError, match="input"):
        ops.Sequential(ops.Identity())([1.0])


# ------------------------------------------------------------------ Megatron-Core TEFusedMLP
@pytest.fixture
def tp1_group():
    """A one-rank gloo group: TP modes "column"/"row" with TP=1, as Megatron builds them."""
    fd, path = tempfile.mkstemp()
    os.close(fd)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    try:
        yield dist.new_group([0], backend="gloo")
    finally:
        dist.destroy_process_group()
        os.unlink(path)


@pytest.mark.parametrize("norm, act", [("RMSNorm", "SwiGLU"), ("LayerNorm", "GELU")])
def test_megatron_fused_mlp(tp1_group, norm, act):
    """TEFusedMLP._make_fused_impl's shape: ops built on "meta", then handed the parameters of
    te.LayerNormLinear (fc1) and te.Linear (fc2); norm -> BasicLinear (column) -> Bias -> act ->
    BasicLinear (row) -> AllReduce -> Bias. Must equal the modules run one after another."""
    torch.manual_seed(2)
    h, f = 32, 48
    gated = act == "SwiGLU"
    fc1 = te.LayerNormLinear(h, f * (2 if gated else 1), normalization=norm, device="cpu")
    fc2 = te.Linear(f, h, device="cpu")
    with torch.no_grad():
        for p in (*fc1.parameters(), fc2.bias):
            p.normal_(0.0, 0.2)
    seq = ops.Sequential()
    kw = {"eps": fc1.eps, "device": "meta", "dtype": fc1.layer_norm_weight.dtype,
          "zero_centered_gamma": fc1.zero_centered_gamma}
    n = getattr(ops, norm)(fc1.weight.size(1), **kw)
    n.weight = fc1.layer_norm_weight
    if norm == "LayerNorm":
        n.bias = fc1.layer_norm_bias
    seq.append(n)
    op = ops.BasicLinear(fc1.weight.size(1), fc1.weight.size(0), device="meta",
                         tensor_parallel_mode="column", tensor_parallel_group=tp1_group)
    op.weight = fc1.weight
    seq.append(op)
    b = ops.Bias(fc1.bias.numel(), device="meta", dtype=fc1.bias.dtype)
    b.bias = fc1.bias
    seq.append(b)
    seq.append(getattr(ops, act)(cache_quantized_input=False))
    op = ops.BasicLinear(fc2.weight.size(1), fc2.weight.size(0), device="meta",
                         tensor_parallel_mode="row", tensor_parallel_group=tp1_group)
    op.weight = fc2.weight
    seq.append(op)
    seq.append(ops.AllReduce(tp1_group))
    b = ops.Bias(fc2.bias.numel(), device="meta", dtype=fc2.bias.dtype)
    b.bias = fc2.bias
    seq.append(b)

    x = _rand(4, 3, h, seed=50)
    x2 = x.detach().clone().requires_grad_()
    y = seq(x)
    y_ref = fc2(getattr(ops, act)()(fc1(x2)))
    assert_close(y, y_ref.detach().double(), torch.float32, "forward")
    dy = _rand(*y.shape, seed=51)
    y.backward(dy)
    grads = [p.grad.clone() for p in (*fc1.parameters(), *fc2.parameters())]
    for p in (*fc1.parameters(), *fc2.parameters()):
        p.grad = None
    y_ref.backward(dy)
    assert_close(x.grad, x2.grad.double(), torch.float32, "dx")
    for g, p in zip(grads, (*fc1.parameters(), *fc2.parameters())):
        assert_close(g, p.grad.double(), torch.float32, "parameter gradient")
