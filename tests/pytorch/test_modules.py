"""Modules vs fp64 references written here: forward + backward, fp32/bf16/fp16, odd shapes, FP8
recipes (TE's tolerances, plus exact emulation for Linear), arguments and errors."""

from __future__ import annotations

import pytest
import torch
from utils import (
    DTYPES,
    assert_close,
    current_scale,
    emulate_cast,
    emulate_mx,
    ref_activation,
    ref_linear,
    ref_norm,
)

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8CurrentScaling,
    Format,
    MXFP8BlockScaling,
)
from transformer_engine_lite.pytorch.module.layernorm_mlp import ACTIVATIONS, GATED_ACTIVATIONS

RECIPES = {
    "delayed": lambda: DelayedScaling(amax_history_len=4),
    "current": lambda: Float8CurrentScaling(),
    "mxfp8": lambda: MXFP8BlockScaling(),
}


def ref_forward(m: torch.nn.Module, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fp64 reference of each module from its parameters `p` (fp64 leaves)."""
    if isinstance(m, (te.LayerNorm, te.RMSNorm)):
        return ref_norm(m._kind, x, p["weight"], p.get("bias"), m.eps, m.zero_centered_gamma)
    if isinstance(m, te.Linear):
        return ref_linear(x, p["weight"], p.get("bias"))
    ln = ref_norm(
        m.normalization,
        x,
        p["layer_norm_weight"],
        p.get("layer_norm_bias"),
        m.eps,
        m.zero_centered_gamma,
    )
    if isinstance(m, te.LayerNormLinear):
        return ref_linear(ln, p["weight"], p.get("bias"))
    h = ref_activation(m.activation, ref_linear(ln, p["fc1_weight"], p.get("fc1_bias")))
    return ref_linear(h, p["fc2_weight"], p.get("fc2_bias"))


def check_module(m, x_shape, dtype, kind=None, recipe=None, seed=0):
    """Runs m forward+backward (optionally under fp8_autocast) and compares output, input grad and
    every parameter grad with the fp64 reference."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(x_shape, generator=g).to(dtype).requires_grad_(True)
    with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
        y = m(x)
    dy = torch.randn(y.shape, generator=g).to(dtype)
    y.backward(dy)
    p64 = {n: p.detach().double().requires_grad_(True) for n, p in m.named_parameters()}
    x64 = x.detach().double().requires_grad_(True)
    y64 = ref_forward(m, p64, x64)
    y64.backward(dy.double())
    kind = kind or dtype
    assert y.dtype == dtype
    assert_close(y, y64, kind, "output")
    assert_close(x.grad, x64.grad, kind, "input grad")
    for n, p in m.named_parameters():
        assert p.grad is not None, f"{n}: no gradient"
        assert_close(p.grad, p64[n].grad, kind, f"grad of {n}")


SHAPES = [((7, 33), 17), ((3, 5, 64), 48), ((1, 129), 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,out", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_linear(dtype, shape, out, bias):
    torch.manual_seed(1)
    m = te.Linear(shape[-1], out, bias=bias, params_dtype=dtype, init_method=_init_unit)
    check_module(m, shape, dtype)


def _init_unit(w: torch.Tensor) -> None:
    # Larger weights than TE's std 0.023 so errors are not hidden under atol.
    torch.nn.init.normal_(w, 0.0, 1.0 / w.shape[-1] ** 0.5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cls", [te.LayerNorm, te.RMSNorm])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_norms(dtype, cls, zero_centered):
    m = cls(67, eps=1e-3, params_dtype=dtype, zero_centered_gamma=zero_centered)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    check_module(m, (5, 3, 67), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_layernorm_linear(dtype, normalization):
    m = te.LayerNormLinear(
        65, 31, normalization=normalization, params_dtype=dtype, init_method=_init_unit
    )
    with torch.no_grad():
        m.layer_norm_weight.add_(torch.randn_like(m.layer_norm_weight) * 0.3)
    check_module(m, (2, 9, 65), dtype)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_layernorm_mlp(activation, dtype):
    torch.manual_seed(6)  # weights independent of which tests ran before
    m = te.LayerNormMLP(
        48,
        40,
        activation=activation,
        params_dtype=dtype,
        init_method=_init_unit,
        normalization="RMSNorm" if activation.endswith("glu") else "LayerNorm",
    )
    assert m.fc1_weight.shape[0] == (80 if activation in GATED_ACTIVATIONS else 40)
    check_module(m, (3, 11, 48), dtype)


MODULE_FACTORIES = {
    "Linear": lambda: te.Linear(64, 40, init_method=_init_unit),
    "LayerNormLinear": lambda: te.LayerNormLinear(64, 40, init_method=_init_unit),
    "LayerNormMLP": lambda: te.LayerNormMLP(64, 96, activation="swiglu", init_method=_init_unit),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULE_FACTORIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fp8_recipes_vs_reference(recipe, module, dtype):
    torch.manual_seed(2)
    m = MODULE_FACTORIES[module]().to(dtype)
    r = RECIPES[recipe]()
    # Two steps: delayed scaling's second step uses scales from the first step's amaxes.
    for seed in (0, 1):
        m.zero_grad()
        kind = "fp8_2gemm" if module == "LayerNormMLP" else "fp8"
        check_module(m, (4, 7, 64), dtype, kind=kind, recipe=r, seed=seed)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_fp8_linear_matches_emulation(recipe):
    """Linear under each recipe equals the same quantization emulated in plain torch."""
    torch.manual_seed(3)
    m = te.Linear(96, 40, init_method=_init_unit)
    r = RECIPES[recipe]()
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    x = torch.randn(50, 96)
    dy = torch.randn(50, 40)
    w, b = m.weight.detach(), m.bias.detach()
    for step in range(2):
        xs = x * (step + 1)
        xg = xs.clone().requires_grad_(True)
        scale_x, scale_w = m.fp8_fwd_scale[0].clone(), m.fp8_fwd_scale[1].clone()
        scale_g = m.fp8_bwd_scale[0].clone()
        with te.fp8_autocast(fp8_recipe=r):
            y = m(xg)
        y.backward(dy)
        if recipe == "mxfp8":
            xq, wq = emulate_mx(xs, e4), emulate_mx(w, e4)
            y_ref = xq @ wq.t() + b.double()
            dgrad = emulate_mx(dy, e4) @ emulate_mx(w, e4, columnwise=True)
            wgrad = emulate_mx(dy, e4, columnwise=True).t() @ emulate_mx(xs, e4, columnwise=True)
        else:
            if recipe == "current":
                scale_x, scale_w = current_scale(xs, e4), current_scale(w, e4)
                scale_g = current_scale(dy, e5)
            xq, wq = emulate_cast(xs, e4, scale_x), emulate_cast(w, e4, scale_w)
            gq = emulate_cast(dy, e5, scale_g)
            y_ref = xq @ wq.t() + b.double()
            dgrad, wgrad = gq @ wq, gq.t() @ xq
        assert_close(y, y_ref, "fp8_emulated", f"step {step} output")
        assert_close(xg.grad, dgrad, "fp8_emulated", f"step {step} dgrad")
        assert_close(m.weight.grad, wgrad, "fp8_emulated", f"step {step} wgrad")
        assert_close(m.bias.grad, dy.double().sum(0), "fp8_emulated", f"step {step} dbias")
        m.zero_grad()


def test_linear_return_bias_and_parameters_split():
    torch.manual_seed(4)
    m = te.Linear(16, 12, parameters_split=("query_", "key_", "value_"), return_bias=True)
    names = [n for n, _ in m.named_parameters()]
    assert names == [
        "query_weight",
        "query_bias",
        "key_weight",
        "key_bias",
        "value_weight",
        "value_bias",
    ]
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()
    x = torch.randn(3, 16)
    y, bias = m(x)
    w = torch.cat([m.query_weight, m.key_weight, m.value_weight])
    assert_close(y, ref_linear(x, w), torch.float32, "output without bias")
    assert_close(bias, torch.cat([m.query_bias, m.key_bias, m.value_bias]), torch.float32, "bias")
    m2 = te.Linear(16, 12, parameters_split={"a": 4, "b": 8})
    assert m2.a_weight.shape == (4, 16) and m2.b_weight.shape == (8, 16)


def test_layernorm_linear_and_mlp_outputs():
    m = te.LayerNormLinear(16, 8, return_bias=True, return_layernorm_output=True)
    x = torch.randn(2, 3, 16)
    out, bias, ln = m(x)
    assert out.shape == (2, 3, 8) and bias.shape == (8,) and ln.shape == x.shape
    assert_close(
        ln,
        ref_norm("LayerNorm", x, m.layer_norm_weight, m.layer_norm_bias, m.eps),
        torch.float32,
        "layernorm output",
    )
    mlp = te.LayerNormMLP(16, 32, return_bias=True, return_layernorm_output=True, bias=True)
    out, bias, ln = mlp(x)
    assert out.shape == x.shape and bias.shape == (16,) and ln.shape == x.shape
    assert [n for n, _ in mlp.named_parameters()] == [
        "layer_norm_weight",
        "layer_norm_bias",
        "fc1_weight",
        "fc1_bias",
        "fc2_weight",
        "fc2_bias",
    ]


def test_fuse_wgrad_accumulation():
    torch.manual_seed(5)
    m = te.Linear(8, 4, fuse_wgrad_accumulation=True, bias=False, params_dtype=torch.bfloat16)
    m.weight.main_grad = torch.ones(4, 8)
    x = torch.randn(6, 8, dtype=torch.bfloat16)
    dy = torch.randn(6, 4, dtype=torch.bfloat16)
    m(x).backward(dy)
    assert m.weight.grad is None
    assert_close(
        m.weight.main_grad, 1.0 + dy.double().t() @ x.double(), torch.bfloat16, "main_grad"
    )
    m2 = te.Linear(8, 4, fuse_wgrad_accumulation=True)
    with pytest.raises(RuntimeError, match="main_grad"):
        m2(torch.randn(2, 8))


def test_torch_autocast_bf16_with_fp32_params():
    m = te.LayerNormMLP(32, 64)
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert m.fc1_weight.grad.dtype == torch.float32


def test_quantized_model_init():
    with te.quantized_model_init(
        recipe=Float8CurrentScaling(), preserve_high_precision_init_val=True
    ):
        m = te.Linear(64, 32)
    assert m.primary_weights_in_fp8 and m.weight.fp8_primary
    w = m.weight.detach()
    hp = m.weight.get_high_precision_init_val()
    assert not torch.equal(hp, w)
    assert torch.equal(
        emulate_cast(w, torch.float8_e4m3fn, current_scale(w, torch.float8_e4m3fn)).float(), w
    )
    m.weight.clear_high_precision_init_val()
    assert m.weight.get_high_precision_init_val() is None
    with te.fp8_model_init(recipe=MXFP8BlockScaling()):
        m2 = te.LayerNormMLP(64, 64)
    w2 = m2.fc1_weight.detach()
    assert torch.equal(emulate_mx(w2, torch.float8_e4m3fn).float(), w2)
    assert not te.Linear(4, 4).primary_weights_in_fp8


def test_meta_device_and_reset_parameters():
    m = te.LayerNormLinear(16, 8, device="meta")
    assert m.weight.device.type == "meta"
    m = m.to_empty(device="cpu")
    m.reset_parameters()
    assert torch.all(m.layer_norm_weight == 1) and torch.all(m.bias == 0)
    assert m(torch.randn(2, 16)).shape == (2, 8)


def test_calibration_records_amax_without_fp8():
    m = te.Linear(16, 8)
    x = torch.randn(4, 16)
    with te.fp8_autocast(enabled=False, calibrating=True, fp8_recipe=DelayedScaling()):
        y = m(x)
    assert torch.equal(y, m(x))  # high precision
    amax_row = m.fp8_fwd_amax_history[-1]  # rolled once by the update at exit
    assert amax_row[0] == x.abs().max() and amax_row[1] == m.weight.abs().max()
    # torch.tensor / tensor is one IEEE division (448.0 / tensor multiplies by a reciprocal).
    assert m.fp8_fwd_scale[0] == torch.tensor(448.0) / x.abs().max()


@pytest.mark.parametrize(
    "make,err,match",
    [
        (lambda: te.Linear(8, 4, parallel_mode="column", tp_size=2, sequence_parallel=True,
                           ub_overlap_ag=True, ub_name="qkv"), RuntimeError, "initialize_ub"),
        (lambda: te.Linear(8, 4, symmetric_ar_type="multimem_all_reduce"), NotImplementedError,
         "symmetric_ar_type"),
        (lambda: te.LayerNormMLP(8, 4, activation="gelu", activation_params={"limit": 1.0}),
         ValueError, "activation_params"),
        (lambda: te.LayerNormMLP(8, 4, activation="clamped_swiglu",
                                 activation_params={"limit": -1.0}), ValueError, "limit"),
        (lambda: te.GroupedLinear(2, 8, 4, sequence_parallel=True), NotImplementedError,
         "sequence_parallel"),
        (lambda: te.TransformerLayer(8, 16, 2, parallel_attention_mlp=True,
                                     output_layernorm=True), ValueError, "parallel_attention_mlp"),
        (lambda: te.LayerNormMLP(8, 4, activation="tanh"), ValueError, "activation"),
        (lambda: te.LayerNormLinear(8, 4, normalization="BatchNorm"), ValueError, "normalization"),
        (lambda: te.LayerNormLinear(8, 4, parallel_mode="row"), NotImplementedError, "row"),
        (lambda: te.Linear(8, 4, parallel_mode="diagonal"), ValueError, "parallel_mode"),
        (lambda: te.Linear(0, 4), ValueError, "in_features"),
        (lambda: te.Linear(8, 6, parameters_split=("a", "b", "c", "d")), ValueError, "split"),
        (lambda: te.LayerNorm(8, eps=-1.0), ValueError, "eps"),
        (lambda: te.TransformerLayer(8, 16, 2, drop_path_rate=1.5), ValueError, "drop_path_rate"),
    ],
)
def test_bad_constructor_arguments(make, err, match):
    with pytest.raises(err, match=match):
        make()


def test_bad_inputs():
    m = te.Linear(8, 4)
    with pytest.raises(ValueError, match=r"expected last dim 8"):
        m(torch.randn(3, 7))
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        m(torch.ones(3, 8, dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="fp8_output"):
        m(torch.randn(3, 8), fp8_output=True)
    with pytest.raises(ValueError, match="hidden_size"):
        te.LayerNormMLP(8, 16)(torch.randn(2, 9))
    with pytest.raises(TypeError, match="DelayedScaling"), te.fp8_autocast(fp8_recipe="hybrid"):
        pass
    with pytest.raises(ValueError, match="pure E5M2"):
        DelayedScaling(fp8_format=Format.E5M2)
