"""Fake kernels and autograd of the GEMM ops (te_lite::gemm, te_lite::gemm_accumulate_; C++ in
csrc/). te_lite_ops.py registers them (torch requires the registrations to come from the module
named by the schema's set_python_module); they live here only to keep te_lite_ops.py's size in
check. The schemas are listed in te_lite_ops.py's docstring."""

from __future__ import annotations

import math

import torch

_ops = torch.ops.te_lite
# te_lite_ops.py's helpers (this module is imported from inside it, so it cannot import them)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def _rows(t: torch.Tensor) -> int:
    return math.prod(t.shape[:-1])


def _f32(like: torch.Tensor, n: int) -> torch.Tensor:
    return like.new_empty((n,), dtype=torch.float32)


def _side(like: torch.Tensor, fp8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(amax, scale_inv) of an output: float32 [1] when it is FP8, else [0]."""
    n = 1 if fp8 else 0
    return _f32(like, n), _f32(like, n)


def _gemm_dims(A, transa, B, transb):
    a_rows, a_cols = _rows(A), A.shape[-1]
    b_rows, b_cols = _rows(B), B.shape[-1]
    m, k = (a_rows, a_cols) if transa else (a_cols, a_rows)
    n, kb = (b_cols, b_rows) if transb else (b_rows, b_cols)
    torch._check(kb == k, lambda: f"gemm: op(B) inner dim {kb} does not match op(A)'s {k}")
    d_shape = (n, m) if transb else (*B.shape[:-1], m)
    return m, n, d_shape


def gemm_fake(
    A,
    A_scale_inv,
    transa,
    B,
    B_scale_inv,
    transb,
    out_dtype,
    bias=None,
    gelu=False,
    grad=False,
    gelu_input=None,
    out_scale=None,
    alpha=1.0,
):
    _, _, d_shape = _gemm_dims(A, transa, B, transb)
    fp8_out = out_dtype in FP8_DTYPES
    if bias is not None:
        pre_dtype = bias.dtype
    elif not fp8_out:
        pre_dtype = out_dtype
    else:
        pre_dtype = A.dtype if A.dtype not in FP8_DTYPES else torch.bfloat16
    pre = A.new_empty(d_shape, dtype=pre_dtype) if gelu and not grad else _f32(A, 0)
    bias_grad = bias.new_empty(bias.shape) if grad and bias is not None else _f32(A, 0)
    return (A.new_empty(d_shape, dtype=out_dtype), pre, bias_grad, *_side(A, fp8_out))


# gemm autograd: high-precision forward GEMMs (grad=False, no FP8 operand or output) differentiate
# w.r.t. A, B and bias; pre_gelu_out, bias_grad, amax and scale_inv are not differentiable. With
# P = op(A) [k, m], Q = op(B) [n, k], Y = alpha Q P (+ bias), D = Y or gelu(Y), and dY from dD:
#   dA = alpha (transa ? dY^T Q : Q^T dY)   dB = alpha (transb ? P dY^T : dY P^T)   dbias = sum_n dY
# each one te_lite.gemm with the same alpha (transa's dA fuses dbias as its grad-mode bias gradient,
# as TE's wgrad does; that gradient of op(B) = dY is not scaled by alpha, as dbias must not be).
# Positions in the gemm schema of the arguments that can get a gradient (of 13 arguments).
_GEMM_NUM_ARGS, _GEMM_A, _GEMM_B, _GEMM_BIAS, _GEMM_ALPHA = 13, 0, 3, 7, 12


def gemm_setup(ctx, inputs, output):
    a, _, transa, b, _, transb, out_dtype, bias, gelu, grad = inputs[:10]
    d, pre, bias_grad, amax, scale_inv = output
    ctx.mark_non_differentiable(pre, bias_grad, amax, scale_inv)
    fp8 = {a.dtype, b.dtype, out_dtype} & set(FP8_DTYPES)
    if grad or fp8:
        ctx.mark_non_differentiable(d)  # grad-mode GEMMs are backward ops; FP8 has no gradient
    ctx.save_for_backward(a, b, pre if gelu and not grad else None)
    alpha = inputs[_GEMM_ALPHA] if len(inputs) > _GEMM_ALPHA else 1.0
    ctx.gemm = (transa, transb, gelu, None if bias is None else bias.dtype, alpha)


def gemm_backward(ctx, d_grad, *_):
    a, b, pre = ctx.saved_tensors
    transa, transb, gelu, bias_dtype, alpha = ctx.gemm
    needs = ctx.needs_input_grad  # may omit trailing arguments left at their defaults
    need_a, need_b = needs[_GEMM_A], needs[_GEMM_B]
    need_bias = bias_dtype is not None and len(needs) > _GEMM_BIAS and needs[_GEMM_BIAS]
    m = d_grad.shape[-1]
    if gelu:
        d_grad = _ops.activation_bwd(d_grad.to(pre.dtype), pre, "gelu")
    dy = d_grad.reshape(-1, m).to(a.dtype)  # the GEMMs take operands of one dtype
    da = db = dbias = None
    if need_a and transa:
        # Grad mode: a given bias (only its shape and dtype matter) receives sum_n dY.
        bias_like = dy.new_empty((m,), dtype=bias_dtype) if need_bias else None
        da, _, bias_grad, _, _ = _ops.gemm(
            b, None, transb, dy, None, True, a.dtype, bias_like, False, True, alpha=alpha
        )
        dbias = bias_grad if need_bias else None
    elif need_a:
        da = _ops.gemm(dy, None, False, b, None, not transb, a.dtype, alpha=alpha)[0]
    if need_b:
        if transb:
            db = _ops.gemm(dy, None, True, a, None, transa, b.dtype, alpha=alpha)[0]
        else:
            db = _ops.gemm(a, None, not transa, dy, None, False, b.dtype, alpha=alpha)[0]
    if need_bias and dbias is None:
        dbias = dy.sum(0).to(bias_dtype)  # fp32 accumulation inside torch's reduction, no copy
    grads = [None] * _GEMM_NUM_ARGS
    grads[_GEMM_A] = None if da is None else da.reshape(a.shape)
    grads[_GEMM_B] = None if db is None else db.reshape(b.shape)
    grads[_GEMM_BIAS] = dbias
    return tuple(grads)



def gemm_accumulate_fake(D, A, A_scale_inv, transa, B, B_scale_inv, transb, bias=None, alpha=1.0,
                         beta=1.0):
    _gemm_dims(A, transa, B, transb)
