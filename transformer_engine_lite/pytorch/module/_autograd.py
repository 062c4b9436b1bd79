"""The modules' compute pieces: the FP8-aware linear autograd.Function, norm and activation.

Each calls torch.ops.te_lite only; numerics live in the core (norm and activation ops carry
their own registered autograd). The modules compose them (norm ->
all-gather -> linear -> activation -> linear -> reduce), so each piece stays small and testable.
Static options travel as NamedTuples (compile-time constants under torch.compile); FP8 state is
read from and written to the module's buffers with tensor ops only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..fp8 import FP8GlobalStateManager
from ..quantized_tensor import SavedFloat8, SavedFloat8Block, SavedMXFP8, SavedNVFP4
from ..quantization import (
    nvfp4_quantizer,
    QuantSpec,
    block_dequantized,
    block_rowwise,
    block_rowwise_values,
    mx_dequantized,
    ops,
    quantize_per_tensor,
)
from ..tensor import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    QuantizedTensor,
)
from ..tensor.storage.hybrid_tensor_storage import HybridQuantizedTensorStorage
from ..cpp_extensions.nvfp4_gemm import nvfp4_tagged_gemm as _nvfp4_gemm
from ._custom_linear import custom_linear_backward, custom_linear_forward
from ._stored_operands import stored_block, stored_input, stored_mxfp8, stored_per_tensor
from ._weight_workspace import WeightCast, workspace_operands


class GemmConfig(NamedTuple):
    """Static options of one FP8-aware GEMM y = x @ W^T + b.

    mode: "hp", "calibrate" (hp GEMM, amaxes recorded), "delayed", "current", "mxfp8", "block"
    (Float8BlockScaling) or "custom" (custom quantizers' qgemm, _custom_linear.py).
    inp, weight, grad: how each operand is cast. slot_fwd: this GEMM's input slot in the forward
    meta (weight = slot_fwd + 1). slot_bwd: its grad-output slot in the backward meta. code: value
    written into the backward "ran" flag (delayed scaling). fuse_wgrad: accumulate the weight
    gradient into main_grad instead of returning it.
    bwd_override: the recipe's backward_override (None, "high_precision", "dequantized").
    delay_wgrad: the backward computes dgrad only and queues the weight gradient into the
    module's wgrad store (run by backward_dw()). save_original_input: keep the unquantized input
    for the backward and quantize it again there (same bytes: current scaling and MXFP8 are
    deterministic functions of the input).
    """

    mode: str = "hp"
    inp: QuantSpec = QuantSpec()
    weight: QuantSpec = QuantSpec()
    grad: QuantSpec = QuantSpec()
    slot_fwd: int = 0
    slot_bwd: int = 0
    code: int = 0
    fuse_wgrad: bool = False
    bwd_override: str | None = None
    delay_wgrad: bool = False
    save_original_input: bool = False
    custom: tuple[Any, Any, Any] | None = None  # "custom": the (input, weight, grad) quantizers


def _alpha_kw(alpha: float) -> dict[str, float]:
    # alpha only when it is not 1: the GEMM's default, one code path for both
    return {} if alpha == 1.0 else {"alpha": alpha}


def _gemm_fwd(
    a: torch.Tensor,
    a_si: torch.Tensor | None,
    b: torch.Tensor,
    b_si: torch.Tensor | None,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None,
    acc: torch.Tensor | None,
    alpha: float = 1.0,
) -> torch.Tensor:
    """alpha * b @ a^T (+ bias) as a new tensor, or added into acc ([..., N], out_dtype) by the
    GEMM's accumulate epilogue: one rounding of acc + product + bias, no extra pass."""
    d = _nvfp4_gemm(a, True, b, False, out_dtype, bias,
                    None if acc is None else acc.view(-1, acc.shape[-1]), alpha)
    if d is not None:
        return acc if acc is not None else d
    if acc is None:
        return ops().gemm(a, a_si, True, b, b_si, False, out_dtype, bias, **_alpha_kw(alpha))[0]
    ops().gemm_accumulate_(acc.view(-1, acc.shape[-1]), a, a_si, True, b, b_si, False, bias,
                           **_alpha_kw(alpha))
    return acc


def _gemm_dgrad(
    w: torch.Tensor,
    w_si: torch.Tensor | None,
    g: torch.Tensor,
    g_si: torch.Tensor | None,
    out_dtype: torch.dtype,
    acc: torch.Tensor | None,
    alpha: float = 1.0,
) -> torch.Tensor:
    """dgrad = alpha * g @ W as a new tensor, or added into acc (in place; returned)."""
    d = _nvfp4_gemm(w, False, g, False, out_dtype, None,
                    None if acc is None else acc.view(-1, acc.shape[-1]), alpha)
    if d is not None:
        return acc if acc is not None else d
    if acc is None:
        return ops().gemm(w, w_si, False, g, g_si, False, out_dtype, **_alpha_kw(alpha))[0]
    ops().gemm_accumulate_(acc.view(-1, acc.shape[-1]), w, w_si, False, g, g_si, False,
                           **_alpha_kw(alpha))
    return acc


def _wgrad(a: torch.Tensor, a_si: Any, b: torch.Tensor, b_si: Any, w_dtype: torch.dtype,
           main_grad: torch.Tensor | None, alpha: float) -> torch.Tensor | None:
    """The weight gradient b^T @ a: returned, or added into main_grad (returns None)."""
    d = _nvfp4_gemm(a, False, b, True, w_dtype, None, main_grad, alpha)
    if d is not None:
        return None if main_grad is not None else d
    if main_grad is not None:
        ops().gemm_accumulate_(main_grad, a, a_si, False, b, b_si, True, **_alpha_kw(alpha))
        return None
    return ops().gemm(a, a_si, False, b, b_si, True, w_dtype, **_alpha_kw(alpha))[0]


def _empty_amax(like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(2, dtype=torch.float32, device=like.device)


class _LinearFn(torch.autograd.Function):
    """out[..., N] = inp[..., K] @ weight[N, K]^T + bias, with operands cast per cfg.mode.

    Returns (out, amax[2]): amax of (input, weight) for "delayed"/"calibrate" (the module writes it
    into its history), zeros otherwise.
    """

    @staticmethod
    def forward(
        ctx: Any,
        inp: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        fwd_scale: torch.Tensor,
        bwd_hist: torch.Tensor,
        bwd_scale: torch.Tensor,
        bwd_ran: torch.Tensor,
        main_grad: torch.Tensor | None,
        cfg: GemmConfig,
        wgrad_store: list[Any] | None,
        w_cast: WeightCast | None,
        acc: torch.Tensor | None = None,
        alpha: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        te = ops()
        k = inp.shape[-1]
        x2 = inp.reshape(-1, k).contiguous()
        out_dtype = inp.dtype
        # FP8 weight parameters (quantized_model_init) enter the GEMM as they are stored when the
        # recipe matches; otherwise (other recipe, no autocast) as their dequantized values. A
        # weight cast cached by the module (is_first_microbatch) enters the same way.
        per_tensor = cfg.mode in ("delayed", "current")
        w_op = stored_per_tensor(weight, cfg) if per_tensor else None
        w_col = ctx.needs_input_grad[0] and cfg.bwd_override is None
        w_mx = (stored_mxfp8(weight, cfg, w_col) if cfg.mode == "mxfp8"
                else stored_block(weight, cfg, w_col) if cfg.mode == "block" else None)
        cast_amax = None
        # (a custom GEMM takes its cached weight below, as its quantizer's own tensor)
        cached = w_cast is not None and cfg.mode != "custom" and w_op is None and w_mx is None
        if cached:
            # the module's cached weight (_fp8_workspaces) enters as an FP8 parameter would
            ws = w_cast.tensor
            w_op = stored_per_tensor(ws, cfg) if per_tensor else None
            if cfg.mode in ("mxfp8", "block"):
                w_mx = workspace_operands(ws, cfg, w_col, stored_mxfp8 if cfg.mode == "mxfp8"
                                          else stored_block)
            if w_op is None and w_mx is None:
                raise RuntimeError(f"linear: the cached weight {type(ws).__name__} does not fit "
                                   f"the {cfg.mode!r} cast (module/_weight_workspace.py)")
            cast_amax = w_cast.amax
        w = weight
        if isinstance(weight, QuantizedTensor) and w_op is None and w_mx is None:
            w = weight.dequantize(dtype=out_dtype if cfg.mode in ("hp", "calibrate") else None)
        elif cached or (w_op is None and w_mx is None):
            w = weight.contiguous()
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_wgrad = need_wgrad or cfg.fuse_wgrad
        hp_bwd = cfg.bwd_override == "high_precision"
        if cfg.mode in ("delayed", "current"):
            s = cfg.slot_fwd
            delayed = cfg.mode == "delayed"
            x_op = None if hp_bwd or cfg.save_original_input else stored_input(inp, cfg)
            if x_op is not None:
                # An FP8 input (TE's: a Float8Tensor from an fp8_output producer, e.g. FP8
                # attention's O) enters the GEMM as its bytes; the input slot records 0 (its
                # scale stays put), as TE leaves the input quantizer unused.
                xq, x_amax = x_op, torch.zeros(1, dtype=torch.float32, device=inp.device)
            else:
                xq, x_amax = quantize_per_tensor(
                    x2, cfg.inp, fwd_scale[s : s + 1] if delayed else None
                )
            if w_op is not None:
                # nothing to quantize; an FP8 parameter's or a reused cast's history slot records
                # 0 (its scale stays put), the first microbatch's cast its amax
                wq = w_op
                w_amax = cast_amax if cast_amax is not None else torch.zeros_like(x_amax)
            else:
                wq, w_amax = quantize_per_tensor(
                    w, cfg.weight, fwd_scale[s + 1 : s + 2] if delayed else None
                )
            out = _gemm_fwd(wq.data, wq.scale_inv, xq.data, xq.scale_inv, out_dtype, bias, acc,
                            alpha)
            amax = torch.cat([x_amax, w_amax]) if delayed else _empty_amax(inp)
            if hp_bwd:
                # an FP8 weight is saved as its bytes and dequantized by the backward (a cached
                # cast is not the weight: the weight itself is saved, as uncached)
                stored = w_op is not None and not cached
                w_saved = (wq.data, wq.scale_inv) if stored else (w, None)
                saved = (x2, None, *w_saved)
            elif cfg.save_original_input and cfg.bwd_override is None:
                # ("dequantized" ignores save_original_input: the backward must consume the
                # FP8 input the forward used, as TE)
                saved = (x2, None, wq.data, wq.scale_inv)
            else:
                saved = (xq.data, xq.scale_inv, wq.data, wq.scale_inv)
        elif cfg.mode == "mxfp8":
            # Block-scaled operands enter the per-tensor GEMM dequantized to bf16 (exact; see
            # quantization.py). Forward contracts over K: row-wise blocks of x and W. The
            # column-wise copies (blocks along N for W, along tokens for x) serve dgrad / wgrad.
            dt = cfg.inp.dtype
            quant_bwd = cfg.bwd_override is None
            x_col = need_wgrad and quant_bwd and not cfg.save_original_input
            deq = cfg.bwd_override == "dequantized"
            # "dequantized" saves the row-wise MXFP8 bytes and scales the forward used
            x_mx = te.quantize_mxfp8(x2, dt, True, False)[:2] if deq else None
            if deq:
                xr, xc = te.dequantize_mxfp8(*x_mx, False, torch.bfloat16), None
            else:
                xr, xc = mx_dequantized(x2, dt, True, x_col)
            w_rows = None
            if w_mx is not None:
                wr, wc = w_mx
                w = w if cached else wr  # what hp_bwd uses: the parameter's (exact) values
            elif deq:
                w_rows = te.quantize_mxfp8(w.contiguous(), dt, True, False)[:2]
                wr, wc = te.dequantize_mxfp8(*w_rows, False, torch.bfloat16), None
            else:
                wr, wc = mx_dequantized(w, dt, True, need_dgrad and quant_bwd)
            b = bias.to(torch.bfloat16) if bias is not None else None
            out = _gemm_fwd(wr, None, xr, None, out_dtype, b, acc, alpha)
            amax = _empty_amax(inp)
            if hp_bwd:
                saved = (x2, None, w, None)
            elif deq:
                saved = (*x_mx, *(w_rows if w_rows is not None else (wr, None)))
            else:
                saved = (x2 if cfg.save_original_input else xc, None, wc, None)
        elif cfg.mode == "block":
            # Float8BlockScaling: each operand's copies quantized and dequantized to fp32 (exact
            # for power-of-two scales), fp32 GEMM (quantization.block_dequantized). Forward
            # contracts over K: row-wise tiles of x (1x128) and W (128x128); the column-wise
            # copies (tiles along the tokens for x, the transposed blocks for W) serve wgrad / dgrad.
            quant_bwd = cfg.bwd_override is None
            deq = cfg.bwd_override == "dequantized"
            x_col = need_wgrad and quant_bwd and not cfg.save_original_input
            # "dequantized" saves the row-wise block bytes and scales the forward used (TE's
            # quantized operand; a quarter of fp32's memory) and ignores save_original_input
            x_blk = block_rowwise(x2, cfg.inp) if deq else None
            xr, xc = (block_rowwise_values(x_blk, cfg.inp), None) if deq else \
                block_dequantized(x2, cfg.inp, True, x_col)
            w_blk = None
            if w_mx is not None:
                wr, wc = w_mx
                w = w if cached else wr
            elif deq:
                w_blk = block_rowwise(w, cfg.weight)
                wr, wc = block_rowwise_values(w_blk, cfg.weight), None
            else:
                wr, wc = block_dequantized(w, cfg.weight, True, need_dgrad and quant_bwd)
            out = _gemm_fwd(wr, None, xr, None, out_dtype, bias, acc, alpha)
            amax = _empty_amax(inp)
            if hp_bwd:
                saved = (x2, None, w, None)
            elif deq:  # the values the forward used, as block bytes + scales (+ NVFP4's amax)
                saved = (*x_blk[:2], *(w_blk[:2] if w_blk is not None else (wr, None)))
                if len(x_blk) > 2:  # NVFP4: the per-tensor amaxes decode the block scales
                    ctx.block_amax = (x_blk[2:], w_blk[2:] if w_blk is not None else ())
            else:
                saved = (x2 if cfg.save_original_input else xc, None, wc, None)
        elif cfg.mode == "custom":
            # a hybrid weight parameter enters as stored (its directions are the GEMM operands)
            w_in = weight if isinstance(weight, HybridQuantizedTensorStorage) else w
            out = custom_linear_forward(ctx, x2, w_in, bias, out_dtype, cfg, need_dgrad, need_wgrad,
                                        acc, alpha, None if w_cast is None else w_cast.tensor)
            amax = _empty_amax(inp)
            saved = (None, None, None, None)  # the quantized operands stay on ctx
        else:
            out = _gemm_fwd(w, None, x2, None, out_dtype, bias, acc, alpha)
            if cfg.mode == "calibrate":
                amax = torch.cat([te.compute_amax(x2), te.compute_amax(w)])
            else:
                amax = _empty_amax(inp)
            saved = (x2, None, w, None)
        ctx.cfg = cfg
        ctx.alpha = alpha
        if not torch.compiler.is_compiling():
            _expose_backward_state(ctx, cfg, bwd_scale, bwd_hist)
        ctx.inp_shape = inp.shape
        ctx.w_dtype = weight.dtype
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.bwd = (bwd_hist, bwd_scale, bwd_ran)
        ctx.main_grad = main_grad
        ctx.weight_param = weight if cfg.fuse_wgrad else None
        # delay_wgrad: backward_dw() sends the weight gradient through `weight` (the parameter,
        # or the cast / concatenation of parameters the module passed in).
        ctx.weight_ref = weight if cfg.delay_wgrad else None
        ctx.wgrad_store = wgrad_store
        ctx.save_for_backward(*[t for t in saved if t is not None])
        ctx.saved_mask = tuple(t is not None for t in saved)
        if not torch.compiler.is_compiling():
            # TE's ctx.tensor_objects: how restore_from_saved rebuilds (input, weight) from
            # ctx.saved_tensors: a per-tensor FP8 operand is its (bytes, scale_inv) pair.
            def template(i: int, shape: tuple) -> Any:
                spec = cfg.inp if i == 0 else cfg.weight
                if cfg.mode == "block" and spec.mode == "nvfp4":
                    return SavedNVFP4(shape, out_dtype, ctx.block_amax[i][0], spec.row_scaled,
                                      spec.e4m3_max)
                if cfg.mode == "block":
                    return SavedFloat8Block(shape, out_dtype, spec.dtype, spec.block_dim)
                kind = SavedMXFP8 if cfg.mode == "mxfp8" else SavedFloat8
                return kind(shape, out_dtype, spec.dtype)

            ctx.tensor_objects = [
                template(i, shape) if saved[2 * i + 1] is not None else None
                for i, shape in enumerate((x2.shape, tuple(weight.shape)))
            ]
        ctx.mark_non_differentiable(amax)
        if acc is not None:
            return acc, amax  # the sum was written into acc's storage (fused residual add)
        return out.reshape(*inp.shape[:-1], out.shape[-1]), amax

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, _grad_amax: torch.Tensor):  # type: ignore[override]
        te = ops()
        cfg: GemmConfig = ctx.cfg
        if cfg.mode == "custom":
            return custom_linear_backward(ctx, grad_out)
        it = iter(ctx.saved_tensors)
        x_data, x_si, w_data, w_si = [next(it) if m else None for m in ctx.saved_mask]
        n = grad_out.shape[-1]
        dy = grad_out.reshape(-1, n).contiguous()
        act_dtype = grad_out.dtype
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_wgrad = need_wgrad or cfg.fuse_wgrad
        dgrad = wgrad = None
        # Set on this node by the op fuser: BackwardLinearAdd's tensor the dgrad GEMM adds into;
        # BackwardLinearScale's factor of the output gradient (grad_alpha), applied by the GEMMs.
        dgrad_into = getattr(ctx, "dgrad_into", None)
        alpha = ctx.alpha * getattr(ctx, "grad_alpha", 1.0)
        fp8_bwd = cfg.mode in ("delayed", "current", "mxfp8", "block") and cfg.bwd_override is None
        if fp8_bwd and cfg.mode in ("delayed", "current"):
            bwd_hist, bwd_scale, bwd_ran = ctx.bwd
            s = cfg.slot_bwd
            delayed = cfg.mode == "delayed"
            gq, g_amax = quantize_per_tensor(
                dy, cfg.grad, bwd_scale[s : s + 1] if delayed else None
            )
            if delayed:
                bwd_hist[0, s : s + 1].copy_(g_amax)
                bwd_ran.fill_(cfg.code)
                if not torch.compiler.is_compiling():
                    FP8GlobalStateManager.queue_backward_update()
            if need_dgrad:
                dgrad = _gemm_dgrad(w_data, w_si, gq.data, gq.scale_inv, act_dtype, dgrad_into,
                                    alpha)
            if cfg.save_original_input and need_wgrad:
                x_data, x_si = quantize_per_tensor(x_data, cfg.inp, None)[0]
            wa = (x_data, x_si, gq.data, gq.scale_inv)
        elif fp8_bwd and cfg.mode == "block":
            # Float8BlockScaling: dgrad contracts over N: row-wise 1x128 tiles of dy, the
            # column-wise (transposed) blocks of W; wgrad over tokens: column-wise tiles of dy and x.
            gr, gc = block_dequantized(dy, cfg.grad, need_dgrad, need_wgrad)
            if need_dgrad:
                dgrad = _gemm_dgrad(w_data, None, gr, None, act_dtype, dgrad_into, alpha)
            if cfg.save_original_input and need_wgrad:
                x_data = block_dequantized(x_data, cfg.inp, False, True)[1]
            wa = (x_data, None, gc, None)
        elif fp8_bwd:
            # MXFP8: dgrad contracts over N: row-wise blocks of dy, column-wise of W; wgrad over
            # tokens: column-wise blocks of dy and x.
            gr, gc = mx_dequantized(dy, cfg.grad.dtype, need_dgrad, need_wgrad)
            if need_dgrad:
                dgrad = _gemm_dgrad(w_data, None, gr, None, act_dtype, dgrad_into, alpha)
            if cfg.save_original_input and need_wgrad:
                x_data = mx_dequantized(x_data, cfg.inp.dtype, False, True)[1]
            wa = (x_data, None, gc, None)
        else:
            # High precision, or a backward_override: dequantize what the forward saved (exact)
            # and run both GEMMs on the unquantized gradient.
            if cfg.mode == "mxfp8":  # row-wise MXFP8 bytes ("dequantized"), to bf16 as the fwd
                x_data = x_data if x_si is None else \
                    te.dequantize_mxfp8(x_data, x_si, False, torch.bfloat16)
                w_data = w_data if w_si is None else \
                    te.dequantize_mxfp8(w_data, w_si, False, torch.bfloat16)
            elif cfg.mode == "block":  # row-wise block bytes ("dequantized"), to fp32 as the fwd
                x_amax, w_amax = getattr(ctx, "block_amax", ((), ()))
                x_data = x_data if x_si is None else \
                    block_rowwise_values((x_data, x_si, *x_amax), cfg.inp)
                w_data = w_data if w_si is None else \
                    block_rowwise_values((w_data, w_si, *w_amax), cfg.weight)
            else:
                x_data = x_data if x_si is None else te.dequantize(x_data, x_si, act_dtype)
                w_data = w_data if w_si is None else te.dequantize(w_data, w_si, act_dtype)
            x_data = x_data if x_data.dtype == act_dtype else x_data.to(act_dtype)
            w_data = w_data if w_data.dtype == act_dtype else w_data.to(act_dtype)
            if need_dgrad:
                dgrad = _gemm_dgrad(w_data, None, dy, None, act_dtype, dgrad_into, alpha)
            wa = (x_data, None, dy, None)
        if need_wgrad and cfg.delay_wgrad and ctx.wgrad_store is not None:
            ctx.wgrad_store.append(
                _DelayedWgrad(wa, ctx.w_dtype, ctx.main_grad if cfg.fuse_wgrad else None,
                              ctx.weight_param, ctx.weight_ref, alpha)
            )
        elif need_wgrad:
            if cfg.fuse_wgrad:
                _wgrad(*wa, ctx.w_dtype, ctx.main_grad, alpha)
                if not torch.compiler.is_compiling():
                    param = ctx.weight_param
                    if hasattr(param, "grad_added_to_main_grad"):
                        param.grad_added_to_main_grad = True
            else:
                wgrad = _wgrad(*wa, ctx.w_dtype, None, alpha)
        dbias = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            # Bias gradient from the high-precision dy. torch's reduction already accumulates bf16/fp16
            # in fp32; upcasting dy first would copy the whole tensor (64 ms at [4096, 8192]).
            dbias = (dy.sum(0) if alpha == 1.0 else dy.sum(0) * alpha).to(ctx.bias_dtype)
        if dgrad is not None:
            dgrad = dgrad.reshape(ctx.inp_shape)
        dacc = grad_out if ctx.needs_input_grad[11] else None
        return dgrad, wgrad, dbias, None, None, None, None, None, None, None, None, dacc, None


def _expose_backward_state(
    ctx: Any, cfg: GemmConfig, bwd_scale: torch.Tensor, bwd_hist: torch.Tensor
) -> None:
    """TE's backward-context attributes, for introspection (the backward reads cfg): fp8 (the
    backward GEMMs run quantized), backward_override (the recipe's, None without FP8),
    grad_output_quantizer (how the backward casts the output gradient; None when it does not) and
    reduce_and_update_bwd_fp8_tensors (the backward records the gradient's scaling state)."""
    fp8 = cfg.mode in ("delayed", "current", "mxfp8", "block", "custom")
    ctx.backward_override = cfg.bwd_override if fp8 else None
    ctx.fp8 = fp8 and cfg.bwd_override is None
    ctx.reduce_and_update_bwd_fp8_tensors = ctx.fp8
    q = None
    if ctx.fp8 and cfg.mode == "custom":
        q = cfg.custom[2]
    elif ctx.fp8 and cfg.mode == "mxfp8":
        q = MXFP8Quantizer(cfg.grad.dtype)
    elif ctx.fp8 and cfg.mode == "block" and cfg.grad.mode == "nvfp4":
        q = nvfp4_quantizer(cfg.grad)
    elif ctx.fp8 and cfg.mode == "block":
        q = Float8BlockQuantizer(cfg.grad.dtype, rowwise=True, columnwise=True,
                                 amax_epsilon=cfg.grad.eps, force_pow_2_scales=cfg.grad.pow2,
                                 block_scaling_dim=cfg.grad.block_dim)
    elif ctx.fp8 and cfg.mode == "current":
        q = Float8CurrentScalingQuantizer(cfg.grad.dtype, force_pow_2_scales=cfg.grad.pow2,
                                          amax_epsilon=cfg.grad.eps)
    elif ctx.fp8:
        s = cfg.slot_bwd
        q = Float8Quantizer(bwd_scale[s : s + 1], bwd_hist[0, s : s + 1], cfg.grad.dtype)
    ctx.grad_output_quantizer = q


class _DelayedWgrad:
    """One queued weight gradient (delay_wgrad_compute): the wgrad GEMM's operands and where the
    result goes (main_grad, or back through the weight tensor the forward received)."""

    def __init__(self, operands: tuple[Any, ...], w_dtype: torch.dtype,
                 main_grad: torch.Tensor | None, param: Any, weight_ref: Any,
                 alpha: float = 1.0) -> None:
        self.operands, self.w_dtype, self.alpha = operands, w_dtype, alpha
        self.main_grad, self.param, self.weight_ref = main_grad, param, weight_ref

    def __call__(self) -> None:
        wgrad = _wgrad(*self.operands, self.w_dtype, self.main_grad, self.alpha)
        if self.main_grad is not None:
            if hasattr(self.param, "grad_added_to_main_grad"):
                self.param.grad_added_to_main_grad = True
            return
        ref = self.weight_ref
        if ref is not None and ref.requires_grad:
            torch.autograd.backward([ref], [wgrad])


class NormConfig(NamedTuple):
    """Static options of a LayerNorm / RMSNorm call."""

    kind: str  # "LayerNorm" or "RMSNorm"
    eps: float
    zero_centered_gamma: bool


def linear(
    inp: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    meta: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    main_grad: torch.Tensor | None,
    cfg: GemmConfig,
    wgrad_store: list[Any] | None = None,
    w_cast: WeightCast | None = None,
    acc: torch.Tensor | None = None,
    alpha: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Functional entry of _LinearFn; meta = (fwd_scale, bwd_hist, bwd_scale, bwd_ran);
    wgrad_store: the module's queue of delayed weight gradients (cfg.delay_wgrad); w_cast: a cached
    cast of `weight` to use instead of casting it (gradients still go to `weight`). acc: a
    contiguous tensor of the output's shape and dtype that the GEMM adds its result (and the bias)
    into, in place, and that is returned as the output (the op fuser's ForwardLinearBiasAdd).
    alpha: the product is scaled by it (in the GEMM; ForwardLinearScaleAdd), and so are the
    gradients."""
    return _LinearFn.apply(inp, weight, bias, *meta, main_grad, cfg, wgrad_store, w_cast, acc,
                           alpha)


def norm(
    x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None, cfg: NormConfig
) -> torch.Tensor:
    """z = norm(x) * gamma (+ beta), FP32 statistics; differentiable through the op's registered
    autograd (te_lite_ops.py)."""
    x = x.contiguous()
    if cfg.kind == "LayerNorm":
        return ops().layernorm_fwd(x, gamma, beta, cfg.eps, cfg.zero_centered_gamma)[0]
    return ops().rmsnorm_fwd(x, gamma, cfg.eps, cfg.zero_centered_gamma)[0]


def activation(x: torch.Tensor, name: str) -> torch.Tensor:
    """y = act(x); gated activations take [..., 2H] = [act input | linear] and return [..., H]."""
    return ops().activation_fwd(x.contiguous(), name)[0]
