"""Empty tensors are valid input wherever torch accepts them: zero tokens (an empty batch, the last
micro-batch, an MoE expert that got no tokens), zero-length sequences. Modules return empty outputs
and zero gradients, in bf16/fp32 and under each FP8 recipe; ops return the documented side outputs
(amax 0, scale_inv = 1 / scale); an FP8 step over an empty batch leaves the scaling state as the
recipes define for amax 0 (ARCHITECTURE.md section 5)."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)

RECIPES = {
    "none": lambda: None,
    "delayed": lambda: DelayedScaling(amax_history_len=4),
    "current": lambda: Float8CurrentScaling(),
    "mxfp8": lambda: MXFP8BlockScaling(),
    "block": lambda: Float8BlockScaling(),
    # the native NVFP4 GEMM decodes [0, K] operands (cpp_extensions/nvfp4_gemm.py)
    "nvfp4": lambda: NVFP4BlockScaling(),
}
MODULES = {
    "Linear": lambda: te.Linear(64, 32),
    "LayerNorm": lambda: te.LayerNorm(64),
    "RMSNorm": lambda: te.RMSNorm(64),
    "LayerNormLinear": lambda: te.LayerNormLinear(64, 32),
    "LayerNormMLP": lambda: te.LayerNormMLP(64, 128, activation="swiglu"),
}
ops = torch.ops.te_lite


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(0, 64), (3, 0, 64)], ids=["rows0", "batch3_seq0"])
def test_module_empty_batch(module, recipe, dtype, shape):
    m = MODULES[module]().to(dtype)
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    r = RECIPES[recipe]()
    with te.fp8_autocast(enabled=r is not None, fp8_recipe=r):
        y = m(x)
    ref = torch.nn.Linear(64, 32)(torch.randn(shape)) if "Linear" in module else x
    assert y.shape[:-1] == x.shape[:-1] and y.numel() == 0 and y.dtype == dtype
    assert y.shape[-1] == (ref.shape[-1] if module != "LayerNormMLP" else 64)
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    for n, p in m.named_parameters():
        assert p.grad is not None, f"{n}: no gradient"
        assert torch.equal(p.grad, torch.zeros_like(p.grad)), f"{n}: gradient of no tokens is not 0"


def test_delayed_scaling_state_after_an_empty_step():
    """An empty step records amax 0, and amax 0 keeps the previous scale: with a one-step history
    (most_recent), the scales after the empty step equal those of the steps around it, and the
    next step's output is finite and the same as before."""
    torch.manual_seed(0)
    m = te.Linear(64, 32)
    r = DelayedScaling(amax_history_len=1, amax_compute_algo="most_recent")
    x = torch.randn(8, 64)

    def step(inp):
        with te.fp8_autocast(fp8_recipe=r):
            y = m(inp)
        y.sum().backward()
        return y.detach()

    step(x)
    y_before = step(x)  # the scales now come from x's amaxes
    fwd, bwd = m.fp8_fwd_scale.clone(), m.fp8_bwd_scale.clone()
    step(torch.randn(0, 64))
    y_after = step(x)
    assert torch.equal(m.fp8_fwd_scale, fwd) and torch.equal(m.fp8_bwd_scale, bwd)
    assert torch.equal(y_after, y_before)


def test_empty_ops_side_outputs():
    x = torch.randn(0, 32)
    assert ops.compute_amax(x).item() == 0.0
    scale = torch.tensor([4.0])
    q, amax, scale_inv = ops.quantize(x, scale, torch.float8_e4m3fn)
    assert q.shape == (0, 32) and q.dtype == torch.float8_e4m3fn
    assert amax.item() == 0.0 and scale_inv.item() == 0.25
    # Current scaling of amax 0: scale 1.
    s, si = ops.compute_scale_from_amax(torch.zeros(1), torch.float8_e4m3fn, 0.0, False)
    assert s.item() == 1.0 and si.item() == 1.0
    row, row_s, col, col_s = ops.quantize_mxfp8(x, torch.float8_e4m3fn, True, True)
    assert row.shape == (0, 32) and row_s.shape == (0, 1) and col.shape == (0, 32)
    assert ops.dequantize(q, scale_inv, torch.float32).shape == (0, 32)
    y, *_ = ops.activation_fwd(x, "gelu")
    assert y.shape == (0, 32)
    assert ops.scaled_softmax_fwd(torch.randn(2, 4, 0, 8), 1.0).shape == (2, 4, 0, 8)
    assert ops.transpose(x).shape == (32, 0)


def test_empty_gemm_gives_zero_weight_gradient():
    # wgrad = dy^T x over zero tokens: k = 0, an empty sum.
    dy, x = torch.randn(0, 16), torch.randn(0, 8)
    D, *_ = ops.gemm(x, None, False, dy, None, True, torch.float32)
    assert D.shape == (16, 8) and torch.equal(D, torch.zeros(16, 8))


@pytest.mark.parametrize("shape", [(32, 0), (0, 128), (2, 3, 0)], ids=str)
@pytest.mark.parametrize("block_dim", [1, 2])
def test_block_scaled_column_wise_copy_of_an_empty_tensor(shape, block_dim):
    """Dequantized from the column-wise copy alone (the wgrad operand), an empty tensor keeps its
    shape, K = 0 included (its rows cannot be inferred from zero elements)."""
    from transformer_engine_lite.pytorch import Float8BlockQuantizer
    from transformer_engine_lite.pytorch import tex

    q = Float8BlockQuantizer(fp8_dtype=tex.DType.kFloat8E4M3, rowwise=False, columnwise=True,
                             block_scaling_dim=block_dim)
    d = q(torch.randn(shape)).dequantize()
    assert d.shape == shape and d.dtype == torch.float32


@pytest.mark.parametrize("shape", [(64, 0), (33, 0), (2, 3, 0), (0, 64), (0, 0)], ids=str)
def test_mxfp8_quantize_of_an_empty_tensor(shape):
    """MXFP8 of an empty tensor, an empty last dim with rows included ([64, 0] has 64 rows: the
    row-wise scales are [64, 0], the column-wise ones [2, 0]); both copies dequantize to the shape.
    A [64, 0] input used to fail: the rows were computed as numel / cols = 0."""
    from transformer_engine_lite.pytorch import MXFP8Quantizer

    t = MXFP8Quantizer(torch.float8_e4m3fn)(torch.zeros(shape, dtype=torch.bfloat16))
    rows = 1
    for d in shape[:-1]:
        rows *= d
    assert tuple(t._rowwise_scale_inv.shape) == (rows, -(-shape[-1] // 32))
    assert tuple(t._columnwise_scale_inv.shape) == (-(-rows // 32), shape[-1])
    assert t.dequantize().shape == shape
    t.update_usage(rowwise_usage=False)
    assert t.dequantize().shape == shape


@pytest.mark.parametrize("b,s", [(0, 16), (2, 0)])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_transformer_layer_empty(b, s, recipe):
    layer = te.TransformerLayer(64, 128, 4, self_attn_mask_type="causal", hidden_dropout=0.0,
                                attention_dropout=0.0, attn_input_format="bshd")
    x = torch.randn(b, s, 64, requires_grad=True)
    r = RECIPES[recipe]()
    with te.fp8_autocast(enabled=r is not None, fp8_recipe=r):
        y = layer(x)
    assert y.shape == (b, s, 64)
    y.sum().backward()
    for n, p in layer.named_parameters():
        assert p.grad is not None and not p.grad.any(), n


def test_attention_zero_length_sequences_in_cu_seqlens():
    a = te.DotProductAttention(4, 16, qkv_format="thd", attn_mask_type="padding_causal")
    cu = torch.tensor([0, 5, 5, 9], dtype=torch.int32)  # the middle sequence is empty
    q, k, v = (torch.randn(9, 4, 16, requires_grad=True) for _ in range(3))
    o = a(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=5, max_seqlen_kv=5)
    # Same as the two non-empty sequences on their own.
    cu2 = torch.tensor([0, 5, 9], dtype=torch.int32)
    o2 = a(q, k, v, cu_seqlens_q=cu2, cu_seqlens_kv=cu2, max_seqlen_q=5, max_seqlen_kv=5)
    torch.testing.assert_close(o, o2)
    o.sum().backward()
    cu0 = torch.zeros(3, dtype=torch.int32)
    e = torch.randn(0, 4, 16, requires_grad=True)
    out = a(e, e, e, cu_seqlens_q=cu0, cu_seqlens_kv=cu0, max_seqlen_q=1, max_seqlen_kv=1)
    assert out.shape == (0, 64)
