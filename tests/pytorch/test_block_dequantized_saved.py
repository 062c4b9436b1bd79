"""Float8BlockScaling with backward_override="dequantized" (TE's backward_override suites taught
it): the Linear node saves the row-wise FP8 block bytes and scales the forward used -- a quantized
storage, not fp32 values -- ignores save_original_input, and the backward runs on their decode.
Checked against the core's block quantizer and an fp64 reference from the saved operands."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe
from transformer_engine_lite.pytorch.quantization import ops
from transformer_engine_lite.pytorch.quantized_tensor import (
    Float8BlockSavedOperand,
    restore_from_saved,
)


def _decode(t: torch.Tensor, block_dim: int) -> torch.Tensor:
    """Independent path: the core's block quantize (row-wise) and dequantize, fp32."""
    row, s, _, _ = ops().quantize_fp8_block(t.contiguous(), torch.float8_e4m3fn, block_dim, True,
                                            False, True, 0.0)
    return ops().dequantize_fp8_block(row, s, block_dim, False, torch.float32)


@pytest.mark.parametrize("save_original_input", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_saves_block_bytes_and_backward_uses_them(save_original_input, bias):
    torch.manual_seed(0)
    m = te.Linear(256, 128, bias=bias, params_dtype=torch.bfloat16, device="cpu",
                  save_original_input=save_original_input)
    x = torch.randn(64, 256, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(64, 128, dtype=torch.bfloat16)
    rc = recipe.Float8BlockScaling(backward_override="dequantized")
    with te.autocast(enabled=True, recipe=rc):
        y = m(x)
    gf = y.grad_fn
    xs, ws = restore_from_saved(gf.tensor_objects, list(gf.saved_tensors))
    for saved, block_dim, src in ((xs, 1, x.detach()), (ws, 2, m.weight.detach())):
        assert isinstance(saved, Float8BlockSavedOperand)
        assert saved._rowwise_data.dtype in (torch.uint8, torch.float8_e4m3fn)
        assert saved._columnwise_data is None and saved.block_dim == block_dim
        assert tuple(saved.shape) == tuple(src.shape)
        assert torch.equal(saved.dequantize(dtype=torch.float32), _decode(src, block_dim))
    y.backward(dy)
    x64 = xs.dequantize(dtype=torch.bfloat16).double()
    w64 = ws.dequantize(dtype=torch.bfloat16).double()
    # one rounding of the GEMM's output to bf16: a relative 2^-8 plus fp32 accumulation noise
    torch.testing.assert_close(x.grad.double(), dy.double() @ w64, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(m.weight.grad.double(), dy.double().t() @ x64, rtol=1e-2, atol=1e-2)


def test_dequantized_ignores_save_original_input_bit_exact():
    torch.manual_seed(1)
    a = te.Linear(256, 128, params_dtype=torch.bfloat16, device="cpu")
    b = te.Linear(256, 128, params_dtype=torch.bfloat16, device="cpu", save_original_input=True)
    b.load_state_dict(a.state_dict())
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    dy = torch.randn(64, 128, dtype=torch.bfloat16)
    out = []
    for m in (a, b):
        xi = x.clone().requires_grad_(True)
        with te.autocast(enabled=True,
                         recipe=recipe.Float8BlockScaling(backward_override="dequantized")):
            y = m(xi)
        y.backward(dy)
        out.append((y.detach(), xi.grad, m.weight.grad))
    for p, q in zip(*out):
        assert torch.equal(p, q)
