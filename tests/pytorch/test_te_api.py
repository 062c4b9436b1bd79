"""TE's public PyTorch API beyond the core modules: helpers, GroupedLinear, activation checkpointing,
split backward (delay_wgrad_compute), save_original_input, backward_override, quantized tensors,
general_gemm, and TransformerLayer / attention options TE code uses. References are plain torch
(float64 where values are compared with tolerances); equalities that must be exact are bitwise."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe as rc
from transformer_engine_lite.pytorch import utils as te_utils
from transformer_engine_lite.pytorch.cpp_extensions import general_gemm
from transformer_engine_lite.pytorch.distributed import (
    in_fp8_activation_recompute_phase,
    is_fp8_activation_recompute_enabled,
)
from transformer_engine_lite.pytorch.tensor.utils import replace_raw_data

RECIPES = {
    "bf16": lambda: None,
    "delayed": lambda: rc.DelayedScaling(amax_history_len=4),
    "current": rc.Float8CurrentScaling,
    "mxfp8": rc.MXFP8BlockScaling,
}


def _grads(module, x, r, fn=None, loss_w=None):
    """(out, x.grad, {param: grad}) of one forward/backward under recipe r."""
    x = x.detach().clone().requires_grad_(True)
    with te.autocast(enabled=r is not None, recipe=r):
        y = (fn or module)(x)
    y = y[0] if isinstance(y, tuple) else y
    w = loss_w if loss_w is not None else torch.ones_like(y)
    (y * w).sum().backward()
    grads = {
        n: p.grad.clone() if p.grad is not None else None for n, p in module.named_parameters()
    }
    module.zero_grad(set_to_none=True)
    return y.detach(), x.grad, grads


# ------------------------------------------------------------------ helpers
def test_init_helpers_and_device_queries():
    torch.manual_seed(0)
    t = torch.empty(400, 400)
    te_utils.init_method_normal(0.5)(t)
    assert abs(t.std().item() - 0.5) < 0.01 and abs(t.mean().item()) < 0.01
    te_utils.scaled_init_method_normal(0.5, 8)(t)
    assert abs(t.std().item() - 0.5 / math.sqrt(16)) < 0.005
    with pytest.raises(ValueError, match="num_layers"):
        te_utils.scaled_init_method_normal(0.5, 0)
    s = torch.zeros(2, 3)
    m = torch.tensor([[True, False, False], [False, False, True]])
    assert te_utils.attention_mask_func(s, m) is s and s[0, 0] == -10000.0 and s[0, 1] == 0
    if not torch.cuda.is_available():
        assert te.get_device_compute_capability() == (0, 0)
        assert te.is_bf16_available() is True
        assert te.is_bf16_available(return_reason=True) == (True, "")
        # gpu_autocast_ctx: autocast on the device the kernels run on (here the CPU: bf16).
        x = torch.randn(4, 4)
        with te_utils.gpu_autocast_ctx(enabled=True):
            assert torch.mm(x, x).dtype == torch.bfloat16
        with te_utils.gpu_autocast_ctx(enabled=False):
            assert torch.mm(x, x).dtype == torch.float32


# ------------------------------------------------------------------ GroupedLinear
@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grouped_linear_matches_per_expert_linears(name, dtype):
    torch.manual_seed(1)
    n, k, o = 3, 64, 32
    g = te.GroupedLinear(n, k, o, params_dtype=dtype)
    # TE's registration order (parameters(), state_dict): weight0, bias0, weight1, bias1, ...
    assert [p for p, _ in g.named_parameters()] == [
        f"{kind}{i}" for i in range(n) for kind in ("weight", "bias")
    ]
    with torch.no_grad():
        for i in range(n):
            getattr(g, f"bias{i}").normal_()
    refs = []
    for i in range(n):
        lin = te.Linear(k, o, params_dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(getattr(g, f"weight{i}"))
            lin.bias.copy_(getattr(g, f"bias{i}"))
        refs.append(lin)
    splits = [32, 0, 64]  # an empty expert included
    x = torch.randn(sum(splits), k, dtype=dtype)
    r = RECIPES[name]()
    y, dx, grads = _grads(g, x, r, fn=lambda t: g(t, splits))
    # Same FP8 casts per expert: each expert equals a Linear of its own (current / mxfp8 / bf16
    # bitwise; delayed scaling starts from scale 1 in both).
    for i, (part, lin) in enumerate(zip(torch.split(x, splits), refs)):
        yi, dxi, gi = _grads(lin, part, RECIPES[name]())
        rows = slice(sum(splits[:i]), sum(splits[: i + 1]))
        assert torch.equal(y[rows], yi) and torch.equal(dx[rows], dxi)
        if splits[i]:
            assert torch.equal(grads[f"weight{i}"], gi["weight"])
            assert torch.equal(grads[f"bias{i}"], gi["bias"])
        else:  # no tokens: zero gradients
            assert not grads[f"weight{i}"].any() and not grads[f"bias{i}"].any()


def test_grouped_linear_single_params_return_bias_and_errors(monkeypatch):
    monkeypatch.setenv("NVTE_GROUPED_LINEAR_SINGLE_PARAM", "1")  # TE's gate on the feature
    torch.manual_seed(2)
    g = te.GroupedLinear(2, 16, 8, single_grouped_weight=True, single_grouped_bias=True)
    assert g.weight.shape == (2, 8, 16) and g.bias.shape == (2, 8)
    x = torch.randn(10, 16)
    y = g(x, torch.tensor([4, 6]))
    ref = torch.cat([x[:4] @ g.weight[0].T + g.bias[0], x[4:] @ g.weight[1].T + g.bias[1]])
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    y.sum().backward()
    assert g.weight.grad.shape == (2, 8, 16)
    gb = te.GroupedLinear(2, 16, 8, return_bias=True)
    out, biases = gb(x, [5, 5])
    assert len(biases) == 2 and torch.equal(biases[1], gb.bias1)
    for bad, match in (
        ([5, 4], "summing to the 10"),
        ([5], "2 entries"),
        ([11, -1], ">= 0"),
        (torch.tensor([5.0, 5.0]), "integer tensor"),
    ):
        with pytest.raises(ValueError, match=match):
            g(x, bad)


# ------------------------------------------------------------------ activation checkpointing
@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_matches_plain_run_bitwise(name, use_reentrant):
    """Recompute repeats the forward exactly: same outputs and gradients, and delayed scaling
    records each step once (its scales after the step are those of the plain run)."""
    torch.manual_seed(3)
    a = te.LayerNormMLP(64, 128, activation="swiglu")
    b = te.LayerNormMLP(64, 128, activation="swiglu")
    b.load_state_dict(a.state_dict())
    x = torch.randn(16, 64)
    outs = []
    for m, ckpt in ((a, False), (b, True)):
        r = RECIPES[name]()
        steps = []
        for _ in range(2):  # delayed: the second step uses scales from the first
            fn = (lambda t, m=m: te.checkpoint(m, t, use_reentrant=use_reentrant)) if ckpt else m
            steps.append(_grads(m, x, r, fn=fn))
        outs.append((steps, m.fp8_fwd_scale.clone(), m.fp8_bwd_scale.clone()))
    (s1, f1, b1), (s2, f2, b2) = outs
    for (y1, dx1, g1), (y2, dx2, g2) in zip(s1, s2):
        assert torch.equal(y1, y2) and torch.equal(dx1, dx2)
        assert all(torch.equal(g1[k], g2[k]) for k in g1)
    assert torch.equal(f1, f2) and torch.equal(b1, b2)


@pytest.mark.parametrize("name", list(RECIPES))
def test_layernorm_mlp_checkpoint_flag(name):
    torch.manual_seed(4)
    a = te.LayerNormMLP(32, 64, activation="clamped_swiglu")
    b = te.LayerNormMLP(32, 64, activation="clamped_swiglu", checkpoint=True)
    b.load_state_dict(a.state_dict())
    x = torch.randn(8, 32)
    ya, dxa, ga = _grads(a, x, RECIPES[name]())
    yb, dxb, gb = _grads(b, x, RECIPES[name]())
    assert torch.equal(ya, yb) and torch.equal(dxa, dxb)
    assert all(torch.equal(ga[k], gb[k]) for k in ga)


def test_recompute_queries():
    layer = te.Linear(16, 16, bias=False)
    seen = []

    def body(t):
        outside = is_fp8_activation_recompute_enabled()
        with te.autocast(recipe=rc.DelayedScaling()):
            seen.append(
                (
                    outside,
                    is_fp8_activation_recompute_enabled(),
                    in_fp8_activation_recompute_phase(),
                )
            )
            return layer(t)

    x = torch.randn(4, 16, requires_grad=True)
    te.checkpoint(body, x, use_reentrant=False).sum().backward()
    assert seen == [(False, True, False), (False, True, True)]
    assert not is_fp8_activation_recompute_enabled()
    with pytest.raises(NotImplementedError, match="distribute_saved_activations"):
        te.checkpoint(body, x, distribute_saved_activations=True)


# ------------------------------------------------------------------ split backward
@pytest.mark.parametrize("module", ["Linear", "LayerNormLinear", "LayerNormMLP"])
@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("fuse", [False, True])
def test_delay_wgrad_compute_bitwise(module, name, fuse):
    torch.manual_seed(5)
    cls = getattr(te, module)
    args = (32, 48)
    ref = cls(*args, fuse_wgrad_accumulation=fuse)
    dly = cls(*args, fuse_wgrad_accumulation=fuse, delay_wgrad_compute=True)
    dly.load_state_dict(ref.state_dict())
    weights = [n for n, _ in ref.named_parameters() if n.endswith("weight") and "norm" not in n]
    if fuse:
        for m in (ref, dly):
            for n in weights:
                getattr(m, n).main_grad = torch.zeros_like(getattr(m, n), dtype=torch.float32)
    x = torch.randn(2, 8, 32)
    y1, dx1, g1 = _grads(ref, x, RECIPES[name]())
    x2 = x.clone().requires_grad_(True)
    with te.autocast(enabled=name != "bf16", recipe=RECIPES[name]()):
        y2 = dly(x2)
    y2.sum().backward()
    assert dly.need_backward_dw()
    for n in weights:
        assert getattr(dly, n).grad is None
    dly.backward_dw()
    assert torch.equal(y1, y2.detach()) and torch.equal(dx1, x2.grad)
    for n, p in dly.named_parameters():
        if fuse and n in weights:
            assert p.grad is None and torch.equal(p.main_grad, getattr(ref, n).main_grad)
        else:
            assert torch.equal(p.grad, g1[n]), n


@pytest.mark.parametrize("name", ["bf16", "current", "mxfp8"])
def test_save_original_input_bitwise(name):
    torch.manual_seed(6)
    a = te.Linear(64, 32)
    b = te.Linear(64, 32, save_original_input=True)
    b.load_state_dict(a.state_dict())
    x = torch.randn(32, 64)
    ya, dxa, ga = _grads(a, x, RECIPES[name]())
    yb, dxb, gb = _grads(b, x, RECIPES[name]())
    assert torch.equal(ya, yb) and torch.equal(dxa, dxb)
    assert all(torch.equal(ga[k], gb[k]) for k in ga)
    with pytest.raises(NotImplementedError, match="save_original_input"):
        _grads(b, x, RECIPES["delayed"]())


# ------------------------------------------------------------------ backward_override
@pytest.mark.parametrize("name", ["current", "mxfp8"])
def test_backward_override(name):
    torch.manual_seed(7)
    m = te.Linear(64, 32, bias=False)
    x = torch.randn(16, 64)
    dy = torch.randn(16, 32)
    _, dx_hp, g_hp = _grads(m, x, None, loss_w=dy)
    r = RECIPES[name]()
    r.backward_override = "high_precision"
    y, dx, g = _grads(m, x, r, loss_w=dy)
    # FP8 forward, backward GEMMs on the unquantized x, W and dy: equal to the hp backward.
    assert not torch.equal(y, m(x).detach())
    assert torch.equal(dx, dx_hp) and torch.equal(g["weight"], g_hp["weight"])
    r.backward_override = "dequantized"
    _, dx_dq, g_dq = _grads(m, x, r, loss_w=dy)
    # dgrad = dy @ dequant(W_q): close to the hp result, not equal (W was quantized)
    assert not torch.equal(dx_dq, dx_hp)
    torch.testing.assert_close(dx_dq, dx_hp, rtol=0.1, atol=0.1)
    r.backward_override = "fp32"
    with pytest.raises(ValueError, match="backward_override"):
        _grads(m, x, r)
    with pytest.raises(ValueError, match="backward_override"):
        rc.DelayedScaling(backward_override="high_precision")
    with pytest.raises(ValueError, match="backward_override"):
        rc.Float8CurrentScaling(backward_override="bf16")


# ------------------------------------------------------------------ quantized tensors, general_gemm
def test_float8_quantizers_and_tensor():
    torch.manual_seed(8)
    x = torch.randn(16, 32) * 3
    q = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, device="cpu")
    t = q(x)
    assert isinstance(t, te.Float8Tensor) and isinstance(t, te.QuantizedTensor)
    assert t.shape == x.shape and t.dtype == torch.float32 and t._data.dtype == torch.uint8
    # bytes: the core's quantize with scale = 448 / amax
    scale = torch.tensor([448.0]) / x.abs().max()
    ref = torch.ops.te_lite.quantize(x, scale, torch.float8_e4m3fn)[0]
    assert torch.equal(t._data, ref.view(torch.uint8))
    torch.testing.assert_close(t.dequantize(), x, rtol=0.07, atol=0.0)
    # torch ops on a quantized tensor see its dequantized values
    assert torch.equal(t + 0, t.dequantize()) and torch.equal(
        t.detach().dequantize(), t.dequantize()
    )
    s, amax = torch.ones(1), torch.zeros(1)
    d = te.Float8Quantizer(s, amax, te.DType.kFloat8E5M2)(x)
    assert amax.item() == x.abs().max().item() and d._fp8_dtype == te.DType.kFloat8E5M2
    mx = te.MXFP8Quantizer(te.DType.kFloat8E4M3)(x)
    assert mx._rowwise_scale_inv.shape == (16, 1) and mx._columnwise_scale_inv.shape == (1, 32)
    torch.testing.assert_close(mx.dequantize(), x, rtol=0.07, atol=0.0)
    empty = q.make_empty([8, 8], dtype=torch.bfloat16)
    q.update_quantized(torch.ones(8, 8, dtype=torch.bfloat16), empty)
    assert torch.equal(empty.dequantize(), torch.ones(8, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="fp8_dtype"):
        te.Float8CurrentScalingQuantizer(te.DType.kBFloat16)
    with pytest.raises(TypeError, match="dtype"):
        q(torch.ones(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="scale"):
        te.Float8Quantizer(torch.ones(2), amax, te.DType.kFloat8E4M3)


def test_replace_raw_data():
    q = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)
    t = q(torch.randn(8, 8))
    old, si = t._data, t._scale_inv
    new = torch.empty_like(old)
    replace_raw_data(t, new)
    assert t._data.data_ptr() == new.data_ptr() and torch.equal(t._data, old) and t._scale_inv is si
    with pytest.raises(ValueError, match="shape"):
        replace_raw_data(t, torch.empty(3, dtype=torch.uint8))


@pytest.mark.parametrize("quantizer", ["current", "mxfp8", "none"])
def test_general_gemm(quantizer):
    torch.manual_seed(9)
    make = {
        "current": lambda: te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3),
        "mxfp8": lambda: te.MXFP8Quantizer(te.DType.kFloat8E4M3),
        "none": lambda: None,
    }[quantizer]
    w, x, b = torch.randn(24, 64), torch.randn(16, 64), torch.randn(24)
    qz = make()
    wq, xq = (qz(w), qz(x)) if qz is not None else (w, x)
    out, bias_grad, gelu_in, extra = general_gemm(wq, xq, torch.float32, bias=b)
    deq = (lambda t: t.dequantize()) if qz is not None else (lambda t: t)
    ref = deq(xq).double() @ deq(wq).double().T + b.double()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-4)
    assert bias_grad is None and gelu_in is None and extra is None
    acc = torch.ones(16, 24)
    general_gemm(wq, xq, torch.float32, out=acc, accumulate=True)
    torch.testing.assert_close(acc.double(), ref - b.double() + 1, rtol=1e-5, atol=1e-4)
    oq = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)
    fused, *_ = general_gemm(wq, xq, torch.float32, quantization_params=oq)
    unfused = oq(general_gemm(wq, xq, torch.float32)[0])
    assert torch.equal(fused._data, unfused._data)
    # TE 2.8's workspace argument: by keyword, or third positionally (then out_dtype)
    from transformer_engine_lite.pytorch.module.base import get_workspace

    for call in (lambda: general_gemm(wq, xq, torch.float32, bias=b, workspace=get_workspace()),
                 lambda: general_gemm(wq, xq, get_workspace(), torch.float32, bias=b)):
        assert torch.equal(call()[0], out)
    with pytest.raises(TypeError, match="workspace"):
        general_gemm(w, x, workspace=3)
    with pytest.raises(ValueError, match="layout"):
        general_gemm(w, x, layout="TT")
    with pytest.raises(NotImplementedError, match="userbuffer"):
        general_gemm(w, x, ub=object())


# ------------------------------------------------------------------ TransformerLayer / attention
def test_parallel_attention_mlp_and_drop_path():
    torch.manual_seed(10)
    kw = dict(hidden_dropout=0.0, attention_dropout=0.0, self_attn_mask_type="no_mask")
    layer = te.TransformerLayer(32, 64, 4, parallel_attention_mlp=True, **kw)
    x = torch.randn(6, 2, 32)
    attn, attn_b = layer.self_attention(x)
    mlp, mlp_b = layer.layernorm_mlp(x)
    torch.testing.assert_close(layer(x), x + attn + attn_b + mlp + mlp_b)
    dropped = te.TransformerLayer(32, 64, 4, drop_path_rate=1.0, **kw).train()
    assert torch.equal(dropped(x), x)  # every branch dropped: the block is the identity


def test_mask_with_causal_type_is_unused_and_said_once():
    torch.manual_seed(11)
    dpa = te.DotProductAttention(2, 8, attn_mask_type="causal", attention_dropout=0.0)
    q, k, v = (torch.randn(5, 1, 2, 8) for _ in range(3))
    other = torch.zeros(1, 1, 5, 5, dtype=torch.bool)
    from transformer_engine_lite.pytorch.attention import inputs

    inputs._UNUSED_MASK_WARNED.discard("causal")
    with pytest.warns(UserWarning, match="not used with attn_mask_type 'causal'"):
        out = dpa(q, k, v, attention_mask=other)
    assert torch.equal(out, dpa(q, k, v))  # TE's rule: the type decides
    with pytest.raises(TypeError, match="attention_mask"):
        dpa(q, k, v, attention_mask="causal")


def test_fuse_wgrad_accumulation_with_frozen_weight():
    m = te.Linear(8, 4, fuse_wgrad_accumulation=True)
    m.weight.requires_grad_(False)
    x = torch.randn(3, 8, requires_grad=True)
    m(x).sum().backward()  # no main_grad needed for a frozen weight
    assert x.grad is not None and m.bias.grad is not None


def test_recipe_fields_te_has_are_applied_or_refused(monkeypatch):
    r = rc.Float8CurrentScaling(use_power_2_scales=True)
    assert all(
        getattr(r, q).power_2_scale
        for q in ("fp8_quant_fwd_inp", "fp8_quant_fwd_weight", "fp8_quant_bwd_grad")
    )
    monkeypatch.setenv("NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "1")
    assert rc.Float8CurrentScaling().use_power_2_scales
    monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", "dequantized")
    assert rc.MXFP8BlockScaling().backward_override == "dequantized"
    with pytest.raises(ValueError, match="backward_override"):
        rc.DelayedScaling()  # TE's rule: delayed scaling takes no override
    with pytest.raises(NotImplementedError, match="enable_2d_quantization"):
        rc.MXFP8BlockScaling(enable_2d_quantization=True)
    # power-of-two scales reach the quantized bytes: the weight's scale_inv is a power of two
    m = te.Linear(32, 16)
    seen = {}
    orig = torch.ops.te_lite.quantize

    def spy(x, scale, dt):
        seen.setdefault("scale", scale.clone())
        return orig(x, scale, dt)

    monkeypatch.setattr(torch.ops.te_lite, "quantize", spy, raising=False)
    monkeypatch.delenv("NVTE_BACKWARD_OVERRIDE")
    with te.autocast(recipe=rc.Float8CurrentScaling(use_power_2_scales=True)):
        m(torch.randn(4, 32) * 3)
    s = seen["scale"].item()
    assert s == 2.0 ** round(math.log2(s))


# ------------------------------------------------------------------ MoE padding, RNG, graphs
@pytest.mark.parametrize("name", ["bf16", "mxfp8"])
def test_fp8_padding_round_trip_with_grouped_linear(name):
    torch.manual_seed(12)
    splits = [5, 0, 33]
    x = torch.randn(sum(splits), 32, requires_grad=True)
    g = te.GroupedLinear(3, 32, 16)
    with te.autocast(enabled=name != "bf16", recipe=RECIPES[name]()):
        pad, unpad = te.Fp8Padding(3), te.Fp8Unpadding(3)
        xp, padded = pad(x, splits)
        align = 32 if name == "mxfp8" else 16
        assert padded == [align * ((m + align - 1) // align) for m in splits]
        y = unpad(g(xp, padded), splits)
    assert y.shape == (sum(splits), 16)
    # padding rows are zeros: each row's result is the same as without padding (up to the GEMM's
    # summation order, which may depend on M: not bitwise at every CPU level)
    with te.autocast(enabled=name != "bf16", recipe=RECIPES[name]()):
        ref = g(x, splits)
    if name == "bf16":
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    y.sum().backward()
    assert x.grad.shape == x.shape
    with pytest.raises(ValueError, match="m_splits"):
        te.Fp8Padding(2)(x, [1, 2, 3])


def test_rng_tracker_and_checkpoint_repeat_dropout():
    tracker = te.CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", 123)
    with pytest.raises(ValueError, match="already exists"):
        tracker.add("other", 123)

    def body(t):
        with tracker.fork():
            return torch.nn.functional.dropout(t, 0.5) * 2

    x = torch.randn(64, requires_grad=True)
    out = te.checkpoint(body, x, get_rng_state_tracker=lambda: tracker, use_reentrant=True)
    out.sum().backward()
    # the recompute drew the same mask: gradient is 2 / (1 - p) where kept, 0 where dropped
    kept = out.detach() != 0
    assert torch.equal(x.grad, torch.where(kept, torch.tensor(4.0), torch.tensor(0.0)))
    with pytest.raises(KeyError, match="not added"):
        with tracker.fork("nope"):
            pass


def test_default_recipe_is_delayed_scaling():
    # make_graphed_callables' own tests: test_graphed_callables.py
    assert isinstance(te.get_default_recipe(), rc.DelayedScaling)


@pytest.mark.parametrize("name", ["delayed", "current", "mxfp8"])
def test_quantized_model_init_first_fp8_step_reproduces_weights(name):
    """FP8 parameters hold what the recipe's first forward quantizes the weight to (TE's FP8
    parameters: delayed scaling starts from scale 1), so the first FP8 step of a model built under
    quantized_model_init equals that of the same model with high-precision weights, bitwise."""
    torch.manual_seed(13)
    with te.quantized_model_init(recipe=RECIPES[name]()):
        a = te.Linear(64, 32)
    torch.manual_seed(13)
    b = te.Linear(64, 32)
    assert not torch.equal(a.weight, b.weight)  # a's weights were rounded to FP8 values
    x = torch.randn(8, 64)
    ya, dxa, _ = _grads(a, x, RECIPES[name]())
    yb, dxb, _ = _grads(b, x, RECIPES[name]())
    assert torch.equal(ya, yb) and torch.equal(dxa, dxb)


def test_transformer_layer_under_torch_autocast_outputs_autocast_dtype():
    layer = te.TransformerLayer(32, 64, 4, hidden_dropout=0.0, attention_dropout=0.0)
    x = torch.randn(6, 2, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32
    assert all(p.grad.dtype == torch.float32 for p in layer.parameters())


def test_userbuffers_onnx_and_torch_version_names():
    # TE 2.8's transformer_engine.pytorch names: present; what we do not implement says so.
    assert te.UserBufferQuantizationMode("fp8") is te.UserBufferQuantizationMode.FP8
    with pytest.warns(DeprecationWarning), pytest.raises(RuntimeError, match="torch.distributed"):
        te.initialize_ub([4096, 1024], tp_size=2)  # Userbuffers: test_userbuffers*.py
    te.destroy_ub()  # nothing to tear down
    with te.onnx_export(enabled=False):
        pass
    with pytest.raises(NotImplementedError, match="enabled=True"):
        with te.onnx_export(enabled=True):
            pass
    with pytest.raises(ValueError, match="enabled"):
        with te.onnx_export(enabled="yes"):
            pass
    assert te.torch_version()[:2] == tuple(int(x) for x in torch.__version__.split(".")[:2])


def test_layernorm_mlp_glu_linear_offset():
    """TE main's activation_params["glu_linear_offset"] for clamped SwiGLU: the module equals
    fc2(clamped_swiglu(fc1(norm(x)), offset)) with the same weights, and differs from offset 1."""
    from utils import ref_activation

    torch.manual_seed(5)
    params = {"limit": 2.0, "alpha": 1.702, "glu_linear_offset": 0.25}
    m = te.LayerNormMLP(32, 64, activation="clamped_swiglu", activation_params=params,
                        bias=False, normalization="RMSNorm")
    x = torch.randn(8, 32, dtype=torch.float64).float()
    y = m(x)
    x64 = x.double()
    h = x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + m.eps) * m.layer_norm_weight.double()
    h = h @ m.fc1_weight.double().t()
    ref = ref_activation("clamped_swiglu", h, 2.0, 1.702, 0.25) @ m.fc2_weight.double().t()
    torch.testing.assert_close(y.double(), ref, rtol=2e-5, atol=2e-5)
    one = te.LayerNormMLP(32, 64, activation="clamped_swiglu", bias=False, normalization="RMSNorm",
                          activation_params={"limit": 2.0, "alpha": 1.702})
    one.load_state_dict(m.state_dict())
    assert not torch.allclose(one(x), y)
