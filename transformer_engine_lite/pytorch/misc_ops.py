"""Fake kernels and autograd of the softmax, RoPE and MoE-router ops (C++ in csrc/). te_lite_ops.py
registers them (torch requires the registrations to come from the module named by the schema's
set_python_module); they live here only to keep te_lite_ops.py's size in check. The schemas are
listed in te_lite_ops.py's docstring."""

from __future__ import annotations

import torch

_ops = torch.ops.te_lite


# ------------------------------------------------------------------------------------ softmax
def softmax_kernels(variant: str):
    """(fake fwd, fake bwd, setup_context, backward) of the `variant` softmax op pair."""
    masked = variant == "scaled_masked"

    def fake_fwd(x, *args):
        return x.new_empty(x.shape)

    def fake_bwd(dy, y, scale):
        return y.new_empty(y.shape)

    def setup(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.scale = inputs[-1]

    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dx = getattr(_ops, f"{variant}_softmax_bwd")(dy, y, ctx.scale)
        return (dx, None, None) if masked else (dx, None)

    return fake_fwd, fake_bwd, setup, backward


# ------------------------------------------------------------------------------------ RoPE
def rope_kernels(adjoint: str):
    """(fake, setup_context, backward) of a RoPE op. The rotation is linear in t, so each op's
    backward is the other op (`adjoint`) with the same angles."""

    def fake(t, freqs, tensor_format, interleaved, cu_seqlens=None, start_positions=None,
             cp_size=1, cp_rank=0):
        return t.new_empty(t.shape)

    def setup(ctx, inputs, output):
        _t, freqs, tensor_format, interleaved = inputs[:4]
        rest = list(inputs[4:]) + [None, None, 1, 0][len(inputs) - 4:]
        cu_seqlens, start_positions, cp_size, cp_rank = rest
        ctx.save_for_backward(freqs, cu_seqlens, start_positions)
        ctx.rope = (tensor_format, interleaved, cp_size, cp_rank)

    def backward(ctx, grad):
        freqs, cu_seqlens, start_positions = ctx.saved_tensors
        tensor_format, interleaved, cp_size, cp_rank = ctx.rope
        dt = getattr(_ops, adjoint)(grad, freqs, tensor_format, interleaved, cu_seqlens,
                                    start_positions, cp_size, cp_rank)
        return dt, None, None, None, None, None, None, None

    return fake, setup, backward


# ------------------------------------------------------------------------------------ MoE router
# Autograd lives in pytorch/router.py (TE's autograd Functions); here only the fake kernels.
def _topk_fwd(logits, topk, use_pre_softmax, num_groups, group_topk, scaling_factor,
              score_function, bias):
    return (
        logits.new_empty(logits.shape),
        logits.new_empty(logits.shape, dtype=torch.bool),
        logits.new_empty(logits.shape, dtype=torch.float32),
    )


def _topk_bwd(routing_map, intermediate_output, grad_probs, topk, use_pre_softmax,
              scaling_factor, score):
    return grad_probs.new_empty(grad_probs.shape)


def _aux_score_fwd(logits, topk, score_function):
    f32 = logits.new_empty(logits.shape, dtype=torch.float32)
    return f32, logits.new_empty(logits.shape, dtype=torch.bool), torch.empty_like(f32)


def _aux_score_bwd(intermediate_output, grad_scores, topk, score_function, logits_dtype):
    return grad_scores.new_empty(grad_scores.shape, dtype=logits_dtype)


def _aux_loss_fwd(probs, tokens_per_expert, total_num_tokens, num_experts, topk, coeff):
    return probs.new_empty(()), probs.new_empty((1,), dtype=torch.float32)


def _aux_loss_bwd(const_buf, tokens_per_expert, grad_aux_loss, num_rows, num_cols):
    return grad_aux_loss.new_empty((num_rows, num_cols))


ROUTER_FAKE_KERNELS = {
    "fused_topk_with_score_function_fwd": _topk_fwd,
    "fused_topk_with_score_function_bwd": _topk_bwd,
    "fused_score_for_moe_aux_loss_fwd": _aux_score_fwd,
    "fused_score_for_moe_aux_loss_bwd": _aux_score_bwd,
    "fused_moe_aux_loss_fwd": _aux_loss_fwd,
    "fused_moe_aux_loss_bwd": _aux_loss_bwd,
}


# ------------------------------------------------------------------------------------ NVFP4
def _math_prod(dims):
    p = 1
    for d in dims:
        p *= d
    return p


def _cdiv(a, b):
    return (a + b - 1) // b


def _nvfp4_scale_shape(rows, cols):
    return (_cdiv(rows, 128) * 128, _cdiv(_cdiv(cols, 16), 4) * 4)


def _fake_quantize_nvfp4(x, rowwise, columnwise, two_d, rht, rht_sign_mask, stochastic_rounding,
                         seed, offset, row_scaled=False, four_over_six=0, e4m3_max=448,
                         err_fast_math=False, row_amax_in=None, col_amax_in=None):
    torch._check(rowwise or columnwise, lambda: "quantize_nvfp4: rowwise or columnwise required")
    rows, cols = _math_prod(x.shape[:-1]), x.shape[-1]
    empty = (0,)
    shape = (*x.shape[:-1], x.shape[-1] // 2)
    tshape = (x.shape[-1], *x.shape[:-2], x.shape[-2] // 2) if x.dim() > 1 else (cols,)
    u8 = torch.uint8
    return (
        x.new_empty(shape if rowwise else empty, dtype=u8),
        x.new_empty(_nvfp4_scale_shape(rows, cols) if rowwise else empty, dtype=u8),
        x.new_empty(((rows if row_scaled else 1),) if rowwise else empty, dtype=torch.float32),
        x.new_empty(tshape if columnwise else empty, dtype=u8),
        x.new_empty(_nvfp4_scale_shape(cols, rows) if columnwise else empty, dtype=u8),
        x.new_empty(((cols if row_scaled else 1),) if columnwise else empty, dtype=torch.float32),
    )


def _fake_dequantize_nvfp4(data, scale_inv, amax, out_dtype, row_scaled=False, e4m3_max=448):
    return data.new_empty((*data.shape[:-1], data.shape[-1] * 2), dtype=out_dtype)


NVFP4_FAKE_KERNELS = {
    "quantize_nvfp4": _fake_quantize_nvfp4,
    "dequantize_nvfp4": _fake_dequantize_nvfp4,
}
