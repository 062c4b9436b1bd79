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

The same path runs a CustomRecipe GEMM with a HybridQuantizer slot (module/_custom.py): the
operands are then HybridQuantizedTensors (or plain quantized tensors), general_gemm reads the
direction each GEMM contracts, and those two directions must share a format, as in TE's cuBLAS
dispatch (ValueError naming the GEMM otherwise). A hybrid weight parameter (quantized_model_init
under the same recipe) enters as it is stored, not re-quantized.
"""

from __future__ import annotations

from typing import Any

import torch

from ..tensor.storage.hybrid_tensor_storage import HybridQuantizedTensorStorage

__all__ = ["custom_linear_backward", "custom_linear_forward"]


def _check(cfg: Any, alpha: float) -> None:
    if alpha != 1.0:
        raise NotImplementedError(f"linear: alpha {alpha!r} (a scaled GEMM) is not implemented "
                                  "for custom quantizers or HybridQuantizer (CustomRecipe)")
    if cfg.delay_wgrad:
        raise NotImplementedError("linear: delay_wgrad_compute=True is not implemented for "
                                  "custom quantizers or HybridQuantizer (CustomRecipe)")


def _format(t: Any) -> str | None:
    """The GEMM format of an operand direction (None: a custom or storage-only tensor, whose own
    GEMM decides)."""
    from ..tensor import (Float8BlockwiseQTensor, Float8Tensor, MXFP8Tensor, NVFP4Tensor,
                          QuantizedTensor)

    if not isinstance(t, torch.Tensor) or getattr(t, "custom", False):
        return None
    for cls, name in ((Float8Tensor, "FP8 per-tensor"), (MXFP8Tensor, "MXFP8"),
                      (Float8BlockwiseQTensor, "FP8 block"), (NVFP4Tensor, "NVFP4")):
        if isinstance(t, cls):
            return name
    return None if isinstance(t, QuantizedTensor) else "high precision"


def check_pair(gemm: str, a_name: str, a: Any, a_rowwise: bool, b_name: str, b: Any,
               b_rowwise: bool) -> None:
    """The two directions a GEMM reads share a format (hybrid operands; TE's cuBLAS refuses
    mixed scaling modes)."""
    from ..cpp_extensions.gemm import hybrid_direction

    fa = _format(hybrid_direction(a_name, a, a_rowwise))
    fb = _format(hybrid_direction(b_name, b, b_rowwise))
    if fa is not None and fb is not None and fa != fb:
        da, db = ("rowwise" if r else "columnwise" for r in (a_rowwise, b_rowwise))
        raise ValueError(f"{gemm} GEMM: {a_name} {da} format ({fa}) does not match {b_name} {db} "
                         f"format ({fb}); a CustomRecipe's HybridQuantizers must give each GEMM's "
                         "two operands one format")


def custom_linear_forward(ctx: Any, x2: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                          out_dtype: torch.dtype, cfg: Any, need_dgrad: bool, need_wgrad: bool,
                          acc: torch.Tensor | None, alpha: float,
                          w_cached: Any = None) -> torch.Tensor:
    """y [tokens, N] (acc's storage when given: added into it); keeps (xq or x, Wq) on ctx.
    w_cached: the module's cached cast of w (its _fp8_workspaces entry), used instead of
    quantizing w."""
    from ..cpp_extensions.gemm import general_gemm

    _check(cfg, alpha)
    qi, qw, _ = cfg.custom
    keep_x = need_wgrad and cfg.save_original_input  # quantized again in the backward
    qi.set_usage(rowwise=True, columnwise=need_wgrad and not keep_x)
    qw.set_usage(rowwise=True, columnwise=need_dgrad)
    xq = qi.quantize(x2)
    if w_cached is not None:
        wq = w_cached
    else:
        wq = w if isinstance(w, HybridQuantizedTensorStorage) else qw.quantize(w)
    check_pair("fprop", "weight", wq, True, "input", xq, True)
    out = None if acc is None else acc.view(-1, acc.shape[-1])
    y = general_gemm(wq, xq, out_dtype=out_dtype, layout="TN", bias=bias, out=out,
                     accumulate=acc is not None)[0]
    ctx.custom_operands = (x2 if keep_x else xq, wq)
    ctx.custom_keep_x = keep_x
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
            check_pair("dgrad", "weight", wq, False, "grad_output", gq, True)
            dgrad = general_gemm(wq, gq, out_dtype=act_dtype, layout="NN", grad=True,
                                 out=into, accumulate=into is not None)[0]
            dgrad = dgrad.reshape(ctx.inp_shape)
        if need_wgrad:
            if ctx.custom_keep_x:  # save_original_input: quantized now
                qi.set_usage(rowwise=False, columnwise=True)
                xq = qi.quantize(xq)
            check_pair("wgrad", "input", xq, False, "grad_output", gq, False)
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
