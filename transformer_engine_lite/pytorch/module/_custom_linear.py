"""A linear layer's GEMMs under a CustomRecipe whose quantizers are custom (tensor.utils.is_custom:
the custom_recipes references, NVFP4QuantizerRef / CurrentScalingQuantizerRef, or a user's own):
every GEMM is general_gemm of the quantized operands, which runs the quantizer's qgemm
(custom_recipes.gemm.custom_gemm), as TE's modules do.

Forward: x quantized by the input quantizer (row-wise; column-wise too when the weight gradient
is needed), W by the weight quantizer (row-wise; column-wise when the input gradient is needed),
y = general_gemm(Wq, xq, layout "TN") with the bias (FPROP). Backward: dy quantized by the
grad-output quantizer, dx = general_gemm(Wq, dyq, "NN") (DGRAD), dW = general_gemm(xq, dyq, "NT")
(WGRAD; into main_grad with fuse_wgrad_accumulation), the bias gradient from the unquantized dy.
The quantized operands stay on the autograd node (they are not plain tensors to save).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["custom_linear_backward", "custom_linear_forward"]


def _check(cfg: Any, alpha: float) -> None:
    if alpha != 1.0:
        raise NotImplementedError(f"linear: alpha {alpha!r} (a scaled GEMM) is not implemented "
                                  "for custom quantizers (CustomRecipe with custom quantizers)")
    if cfg.delay_wgrad:
        raise NotImplementedError("linear: delay_wgrad_compute=True is not implemented for "
                                  "custom quantizers (CustomRecipe with custom quantizers)")


def custom_linear_forward(ctx: Any, x2: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                          out_dtype: torch.dtype, cfg: Any, need_dgrad: bool, need_wgrad: bool,
                          acc: torch.Tensor | None, alpha: float) -> torch.Tensor:
    """y [tokens, N] (acc's storage when given: added into it); keeps (xq or x, Wq) on ctx."""
    from ..cpp_extensions.gemm import general_gemm

    _check(cfg, alpha)
    qi, qw, _ = cfg.custom
    keep_x = need_wgrad and cfg.save_original_input  # quantized again in the backward
    qi.set_usage(rowwise=True, columnwise=need_wgrad and not keep_x)
    qw.set_usage(rowwise=True, columnwise=need_dgrad)
    xq, wq = qi.quantize(x2), qw.quantize(w)
    out = None if acc is None else acc.view(-1, acc.shape[-1])
    y = general_gemm(wq, xq, out_dtype=out_dtype, layout="TN", bias=bias, out=out,
                     accumulate=acc is not None)[0]
    ctx.custom_operands = (x2 if keep_x else xq, wq)
    return y


def custom_linear_backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
    """_LinearFn.backward's gradient tuple for a custom-quantizer GEMM."""
    from ..cpp_extensions.gemm import general_gemm

    cfg = ctx.cfg
    qi, _, qg = cfg.custom
    xq, wq = ctx.custom_operands
    dy = grad_out.reshape(-1, grad_out.shape[-1]).contiguous()
    act_dtype = grad_out.dtype
    need_dgrad = ctx.needs_input_grad[0]
    need_wgrad = ctx.needs_input_grad[1] or cfg.fuse_wgrad
    dgrad = wgrad = None
    if need_dgrad or need_wgrad:
        qg.set_usage(rowwise=need_dgrad, columnwise=need_wgrad)
        gq = qg.quantize(dy)
        into = getattr(ctx, "dgrad_into", None)  # the op fuser's BackwardLinearAdd target
        if need_dgrad:
            dgrad = general_gemm(wq, gq, out_dtype=act_dtype, layout="NN", grad=True,
                                 out=into, accumulate=into is not None)[0]
            dgrad = dgrad.reshape(ctx.inp_shape)
        if need_wgrad:
            if isinstance(xq, torch.Tensor):  # save_original_input: quantized now
                qi.set_usage(rowwise=False, columnwise=True)
                xq = qi.quantize(xq)
            if cfg.fuse_wgrad:
                general_gemm(xq, gq, out_dtype=ctx.main_grad.dtype, layout="NT", grad=True,
                             out=ctx.main_grad, accumulate=True)
                param = ctx.weight_param
                if hasattr(param, "grad_added_to_main_grad"):
                    param.grad_added_to_main_grad = True
            else:
                wgrad = general_gemm(xq, gq, out_dtype=ctx.w_dtype, layout="NT", grad=True)[0]
    ctx.custom_operands = None
    dbias = None
    if ctx.has_bias and ctx.needs_input_grad[2]:
        dbias = dy.sum(0).to(ctx.bias_dtype)
    dacc = grad_out if ctx.needs_input_grad[11] else None
    return dgrad, wgrad, dbias, None, None, None, None, None, None, None, None, dacc, None
