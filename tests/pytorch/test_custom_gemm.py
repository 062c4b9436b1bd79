"""Custom quantizers in the GEMMs (TE's custom_gemm route): tensor.utils.is_custom,
custom_recipes.gemm.custom_gemm, general_gemm dispatching to it, and Linear / LayerNormLinear /
LayerNormMLP / GroupedLinear under a CustomRecipe of reference quantizers running every GEMM as the
quantizer's qgemm (counted per GEMMType) with the same result as quantizing the operands and
calling qgemm directly (NVFP4QuantizerRef), or as the fp64 dequantize-then-matmul oracle rounded
once (CurrentScalingQuantizerRef, whose GEMM is exact)."""

from __future__ import annotations

import collections

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe
from transformer_engine_lite.pytorch.cpp_extensions import general_gemm
from transformer_engine_lite.pytorch.custom_recipes import reference_utils as ru
from transformer_engine_lite.pytorch.custom_recipes.gemm import GEMMType, custom_gemm
from transformer_engine_lite.pytorch.custom_recipes.reference_current_scaling import (
    CurrentScalingQuantizerRef,
)
from transformer_engine_lite.pytorch.custom_recipes.reference_nvfp4 import NVFP4QuantizerRef
from transformer_engine_lite.pytorch.tensor.float8_tensor import Float8CurrentScalingQuantizer
from transformer_engine_lite.pytorch.tensor.utils import is_custom
from transformer_engine_lite.pytorch.tex import DType

E2M1 = ru.Fp4Formats.E2M1


class _Counting:
    """Mixin: count qgemm calls per GEMMType in a shared Counter."""

    calls: collections.Counter

    def qgemm(self, *args, **kwargs):
        self.calls[kwargs.get("gemm_type")] += 1
        return super().qgemm(*args, **kwargs)


class CountingNVFP4(_Counting, NVFP4QuantizerRef):
    pass


class CountingCS(_Counting, CurrentScalingQuantizerRef):
    pass


def _nvfp4_factory(calls, rht=True):
    def make(role):
        if role is not None and role.tensor_type == "weight":
            q = CountingNVFP4(E2M1, quant_tile_shape=(16, 16))
        else:
            q = CountingNVFP4(E2M1, with_rht=rht)
        q.calls = calls
        return q
    return make


def _cs_factory(calls):
    def make(role):
        grad = role is not None and role.tensor_type == "grad_output"
        q = CountingCS(torch.float8_e5m2 if grad else torch.float8_e4m3fn)
        q.calls = calls
        return q
    return make


def _run(module, x, dy, factory, **fwd):
    x = x.clone().requires_grad_()
    with te.autocast(enabled=True, recipe=recipe.CustomRecipe(qfactory=factory)):
        y = module(x, **fwd)
    y.backward(dy)
    return y.detach(), x.grad


# ----------------------------------------------------------------------------- Linear, exactly
@pytest.mark.parametrize("rht", [False, True], ids=["no_rht", "rht"])
def test_linear_nvfp4_reference_equals_direct_qgemm(rht):
    torch.manual_seed(0)
    lin = te.Linear(64, 32, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    dy = torch.randn(2, 16, 32, dtype=torch.bfloat16)
    calls = collections.Counter()
    y, dx = _run(lin, x, dy, _nvfp4_factory(calls, rht))
    assert calls == {GEMMType.FPROP: 1, GEMMType.DGRAD: 1, GEMMType.WGRAD: 1}
    # the same GEMMs by hand: quantize, then qgemm
    qa = NVFP4QuantizerRef(E2M1, with_rht=rht)
    qw = NVFP4QuantizerRef(E2M1, quant_tile_shape=(16, 16))
    xq, wq, gq = qa.quantize(x.reshape(32, 64)), qw.quantize(lin.weight.detach()), \
        qa.quantize(dy.reshape(32, 32))
    bf = torch.bfloat16
    y_ref = qa.qgemm(xq.data, wq.data, None, bf, xq.scale, wq.scale, qresult_x=xq, qresult_w=wq)
    dx_ref = qa.qgemm(gq.data, wq.data_t, None, bf, gq.scale, wq.scale_t,
                      gemm_type=GEMMType.DGRAD, qresult_x=gq, qresult_w=wq)
    dw_ref = qa.qgemm(gq.data_t, xq.data_t, None, bf, gq.scale_t, xq.scale_t,
                      gemm_type=GEMMType.WGRAD, qresult_x=gq, qresult_w=xq)
    assert torch.equal(y, y_ref.reshape(2, 16, 32))
    assert torch.equal(dx, dx_ref.reshape(2, 16, 64))
    assert torch.equal(lin.weight.grad, dw_ref)


def _exact(t):
    """The values an FP8 reference tensor holds, in fp64 (exact: FP8 bytes times an fp32 scale)."""
    return t.data.double() * t.scale.double()


def _deq(q, x):
    return _exact(q.quantize(x))


def _fp64_oracle(a, b, qa, qb):
    """dequant(a) @ dequant(b)^T in fp64: CurrentScalingQuantizerRef's exact GEMM, to be rounded
    once."""
    return _deq(qa, a) @ _deq(qb, b).t()


def test_linear_current_scaling_reference_equals_fp64_oracle():
    torch.manual_seed(1)
    lin = te.Linear(48, 32, bias=True, params_dtype=torch.bfloat16)
    x = torch.randn(24, 48, dtype=torch.bfloat16)
    dy = torch.randn(24, 32, dtype=torch.bfloat16)
    calls = collections.Counter()
    y, dx = _run(lin, x, dy, _cs_factory(calls))
    assert calls == {GEMMType.FPROP: 1, GEMMType.DGRAD: 1, GEMMType.WGRAD: 1}
    e4, e5 = (CurrentScalingQuantizerRef(d) for d in (torch.float8_e4m3fn, torch.float8_e5m2))
    w = lin.weight.detach()
    y_ref = (_fp64_oracle(x, w, e4, e4) + lin.bias.detach().double()).to(torch.bfloat16)
    assert torch.equal(y, y_ref)
    # dgrad: dy @ W, wgrad: dy^T @ x, each with the forward's quantized operands
    dx_ref = _deq(e5, dy) @ _deq(e4, w)
    assert torch.equal(dx, dx_ref.to(torch.bfloat16))
    dw_ref = _deq(e5, dy).t() @ _deq(e4, x)
    assert torch.equal(lin.weight.grad, dw_ref.to(torch.bfloat16))
    assert torch.equal(lin.bias.grad, dy.sum(0))


# ----------------------------------------------------------------------------- other modules
def test_layernorm_linear_and_mlp_run_qgemm():
    torch.manual_seed(2)
    calls = collections.Counter()
    ln = te.LayerNormLinear(64, 32, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    _run(ln, x, torch.randn(32, 32, dtype=torch.bfloat16), _nvfp4_factory(calls))
    assert calls == {GEMMType.FPROP: 1, GEMMType.DGRAD: 1, GEMMType.WGRAD: 1}
    assert ln.weight.grad is not None and ln.layer_norm_weight.grad is not None
    calls.clear()
    mlp = te.LayerNormMLP(64, 128, bias=False, params_dtype=torch.bfloat16)
    y, dx = _run(mlp, x, torch.randn(32, 64, dtype=torch.bfloat16), _nvfp4_factory(calls))
    assert calls == {GEMMType.FPROP: 2, GEMMType.DGRAD: 2, GEMMType.WGRAD: 2}
    assert dx is not None and mlp.fc1_weight.grad is not None and mlp.fc2_weight.grad is not None


def test_grouped_linear_runs_qgemm_per_group():
    torch.manual_seed(3)
    calls = collections.Counter()
    gl = te.GroupedLinear(2, 64, 32, bias=False, params_dtype=torch.bfloat16)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    dy = torch.randn(64, 32, dtype=torch.bfloat16)
    y, dx = _run(gl, x, dy, _cs_factory(calls), m_splits=[32, 32])
    assert calls == {GEMMType.FPROP: 2, GEMMType.DGRAD: 2, GEMMType.WGRAD: 2}
    e4 = CurrentScalingQuantizerRef(torch.float8_e4m3fn)
    for g in range(2):
        rows = slice(32 * g, 32 * g + 32)
        want = _fp64_oracle(x[rows], getattr(gl, f"weight{g}").detach(), e4, e4)
        assert torch.equal(y[rows], want.to(torch.bfloat16))


def test_fuse_wgrad_accumulates_into_main_grad():
    torch.manual_seed(4)
    lin = te.Linear(48, 32, bias=False, params_dtype=torch.float32, fuse_wgrad_accumulation=True)
    lin.weight.main_grad = torch.ones(32, 48)
    x, dy = torch.randn(16, 48), torch.randn(16, 32)
    calls = collections.Counter()
    _run(lin, x, dy, _cs_factory(calls))
    e4, e5 = (CurrentScalingQuantizerRef(d) for d in (torch.float8_e4m3fn, torch.float8_e5m2))
    dw = (_deq(e5, dy).t() @ _deq(e4, x)).float()
    assert torch.equal(lin.weight.main_grad, torch.ones(32, 48) + dw)


# ----------------------------------------------------------------------------- refusals
def test_module_refusals():
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    lin = te.Linear(64, 32, bias=True, params_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="Bias is not supported"):
        with te.autocast(enabled=True, recipe=recipe.CustomRecipe(
                qfactory=_nvfp4_factory(collections.Counter()))):
            lin(x)

    def mixed(role):
        if role is not None and role.tensor_type == "weight":
            return Float8CurrentScalingQuantizer(DType.kFloat8E4M3)
        return NVFP4QuantizerRef(E2M1)
    with pytest.raises(NotImplementedError, match="mixing scaling kinds"):
        with te.autocast(enabled=True, recipe=recipe.CustomRecipe(qfactory=mixed)):
            te.Linear(64, 32, bias=False, params_dtype=torch.bfloat16)(x)
    r = recipe.CustomRecipe(qfactory=_cs_factory(collections.Counter()),
                            backward_override="high_precision")
    with pytest.raises(NotImplementedError, match="backward_override"):
        with te.autocast(enabled=True, recipe=r):
            te.Linear(64, 32, bias=False, params_dtype=torch.bfloat16)(x)


def test_is_custom_and_general_gemm_dispatch():
    q = CurrentScalingQuantizerRef(torch.float8_e4m3fn)
    a, b = q.quantize(torch.randn(32, 16)), q.quantize(torch.randn(8, 16))
    assert is_custom(q) and is_custom(a) and not is_custom(None)
    assert not is_custom(torch.zeros(1)) and not is_custom(Float8CurrentScalingQuantizer(
        DType.kFloat8E4M3))
    with pytest.raises(AssertionError, match="Quantizer or QuantizedTensorStorage"):
        is_custom(3)
    y = general_gemm(a, b, out_dtype=torch.float32)[0]  # y = b @ a^T
    want = _exact(b) @ _exact(a).t()
    assert torch.equal(y, want.float())
    out = torch.ones(8, 32)
    general_gemm(a, b, out_dtype=torch.float32, out=out, accumulate=True)
    assert torch.equal(out, torch.ones(8, 32) + want.float())
    with pytest.raises(TypeError, match="two custom tensors"):
        custom_gemm(a, torch.randn(8, 16))
    with pytest.raises(NotImplementedError, match="GELU"):
        general_gemm(a, b, gelu=True)
    with pytest.raises(NotImplementedError, match="alpha"):
        general_gemm(a, b, alpha=2.0)
    with pytest.raises(NotImplementedError, match="bias"):
        general_gemm(a, b, layout="NN", grad=True, bias=torch.zeros(16))
    with pytest.raises(ValueError, match="data_t"):
        no_t = CurrentScalingQuantizerRef(torch.float8_e4m3fn, columnwise=False)
        general_gemm(no_t.quantize(torch.randn(16, 32)), b, layout="NN", grad=True)


def test_save_original_input_same_gradients_and_delay_wgrad_refused():
    torch.manual_seed(6)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    dy = torch.randn(32, 32, dtype=torch.bfloat16)
    grads = []
    for save in (False, True):
        torch.manual_seed(7)
        lin = te.Linear(64, 32, bias=False, params_dtype=torch.bfloat16, save_original_input=save)
        calls = collections.Counter()
        y, dx = _run(lin, x, dy, _nvfp4_factory(calls))
        assert calls == {GEMMType.FPROP: 1, GEMMType.DGRAD: 1, GEMMType.WGRAD: 1}
        grads.append((y, dx, lin.weight.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)  # the backward re-quantizes the same input to the same bytes
    lin = te.Linear(64, 32, bias=False, params_dtype=torch.bfloat16, delay_wgrad_compute=True)
    with pytest.raises(NotImplementedError, match="delay_wgrad_compute"):
        _run(lin, x, dy, _nvfp4_factory(collections.Counter()))
