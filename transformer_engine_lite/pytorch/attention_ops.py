"""Fake kernels and autograd of the fused-attention ops (C++ in csrc/attention.cpp). ops.py
registers them (torch requires the fake kernels to be registered from the module named by the
schema's set_python_module); they live here only to keep ops.py's size in check.

  fused_attn_fwd(q, k, v, str qkv_layout, Tensor? bias, Tensor? cu_seqlens_q,
      Tensor? cu_seqlens_kv, int max_seqlen_q, int max_seqlen_kv, float attn_scale, float dropout,
      Tensor? rng_state, str bias_type, str mask_type, int window_left, int window_right,
      bool is_training, str softmax_type="vanilla", Tensor? softmax_offset=None)
      -> (out [q's shape with d_v, dense], softmax_lse fp32 [b, h, max_seqlen_q]
      if is_training else [0])
  fused_attn_bwd(q, k, v, out, d_out, softmax_lse, <the forward's arguments>, bool deterministic,
      softmax_type, softmax_offset)
      -> (dq, dk, dv [dense, shapes of q, k, v], dbias [bias's shape for post_scale_bias, else [0]],
      d_softmax_offset [softmax_offset's shape for 'learnable', else [0]])
  fused_attn_dropout_mask(Tensor rng_state, int b, int h, int s_q, int s_kv, float dropout)
      -> uint8 [b, h, s_q, s_kv], 1 = kept

Semantics are fused_attn.h's: q, k, v are the views the layout names (packed layouts: views into
one buffer, strides checked), bias is the post/pre-scale bias tensor or, for 'alibi', the fp32
slopes [h] / [b, h] (None: default slopes), rng_state int64 [2] = (seed, offset) when dropout > 0.
softmax_type: 'vanilla', 'off-by-one' or 'learnable' (attention sinks, fused_attn.h); softmax_offset
fp32 [h] or [1, h, 1, 1], read for 'learnable' only.
fused_attn_fwd is differentiable in q, k, v, a post_scale_bias and a learnable softmax_offset.
"""

from __future__ import annotations

import torch

_ops = torch.ops.te_lite
_FORMATS = {"b": "bshd", "s": "sbhd", "t": "thd"}


def _batch(q: torch.Tensor, qkv_layout: str, cu_seqlens_q: torch.Tensor | None):
    fmt = _FORMATS.get(qkv_layout[:1])
    torch._check(fmt is not None, lambda: f"fused_attn: unknown qkv_layout {qkv_layout!r}")
    if fmt == "bshd":
        return q.shape[0]
    if fmt == "sbhd":
        return q.shape[1]
    torch._check(cu_seqlens_q is not None, lambda: "fused_attn: thd needs cu_seqlens_q")
    return cu_seqlens_q.shape[0] - 1


def fake_fused_attn_fwd(
    q,
    k,
    v,
    qkv_layout,
    bias,
    cu_seqlens_q,
    cu_seqlens_kv,
    max_seqlen_q,
    max_seqlen_kv,
    attn_scale,
    dropout,
    rng_state,
    bias_type,
    mask_type,
    window_left,
    window_right,
    is_training,
    softmax_type="vanilla",
    softmax_offset=None,
):
    b = _batch(q, qkv_layout, cu_seqlens_q)
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse_shape = (b, q.shape[-2], max_seqlen_q) if is_training else (0,)
    return out, q.new_empty(lse_shape, dtype=torch.float32)


def fake_fused_attn_bwd(
    q,
    k,
    v,
    out,
    d_out,
    softmax_lse,
    qkv_layout,
    bias,
    cu_seqlens_q,
    cu_seqlens_kv,
    max_seqlen_q,
    max_seqlen_kv,
    attn_scale,
    dropout,
    rng_state,
    bias_type,
    mask_type,
    window_left,
    window_right,
    deterministic,
    softmax_type="vanilla",
    softmax_offset=None,
):
    _batch(q, qkv_layout, cu_seqlens_q)
    post = bias_type == "post_scale_bias" and bias is not None
    dbias = bias.new_empty(bias.shape) if post else q.new_empty((0,))
    learn = softmax_type == "learnable" and softmax_offset is not None
    doff = softmax_offset.new_empty(softmax_offset.shape) if learn else q.new_empty((0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias, doff


def fake_fused_attn_dropout_mask(rng_state, b, h, s_q, s_kv, dropout):
    return rng_state.new_empty((b, h, s_q, s_kv), dtype=torch.uint8)


# Positions in the forward schema (19 arguments) of the differentiable inputs.
_NUM_ARGS, _BIAS, _OFFSET = 19, 4, 18


def fused_attn_fwd_setup(ctx, inputs, output):
    (
        q,
        k,
        v,
        layout,
        bias,
        cu_q,
        cu_kv,
        max_q,
        max_kv,
        scale,
        dropout,
        rng,
        bias_type,
        mask,
        left,
        right,
        _is_training,
        softmax_type,
        softmax_offset,
    ) = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    # q, k, v keep their view metadata: the backward sees the same layout.
    ctx.save_for_backward(q, k, v, out, lse, bias, cu_q, cu_kv, rng, softmax_offset)
    ctx.args = (layout, max_q, max_kv, scale, dropout, bias_type, mask, left, right, softmax_type)


def fused_attn_fwd_backward(ctx, d_out, _d_lse):
    q, k, v, out, lse, bias, cu_q, cu_kv, rng, offset = ctx.saved_tensors
    layout, max_q, max_kv, scale, dropout, bias_type, mask, left, right, softmax_type = ctx.args
    dq, dk, dv, dbias, doffset = _ops.fused_attn_bwd(
        q,
        k,
        v,
        out,
        d_out,
        lse,
        layout,
        bias,
        cu_q,
        cu_kv,
        max_q,
        max_kv,
        scale,
        dropout,
        rng,
        bias_type,
        mask,
        left,
        right,
        torch.are_deterministic_algorithms_enabled(),
        softmax_type,
        offset,
    )
    grads = [None] * _NUM_ARGS
    grads[0], grads[1], grads[2] = dq, dk, dv
    if bias_type == "post_scale_bias" and bias is not None:
        grads[_BIAS] = dbias
    if softmax_type == "learnable" and offset is not None:
        grads[_OFFSET] = doffset
    return tuple(grads)


# op name -> fake kernel; autograd: fused_attn_fwd only (the backward and the mask are not
# differentiable).
FAKE_KERNELS = {
    "fused_attn_fwd": fake_fused_attn_fwd,
    "fused_attn_bwd": fake_fused_attn_bwd,
    "fused_attn_dropout_mask": fake_fused_attn_dropout_mask,
}
