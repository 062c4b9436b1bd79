"""GEMM of two Float8BlockScaling operands in the order TE's block-scaled GEMM accumulates
(cuBLAS on Hopper; TE's reference tests/pytorch/references/blockwise_fp8_gemm_reference.py): for
each 128-wide K block, the FP8 products summed in fp32 (the core GEMM on the FP8 values, unscaled),
multiplied by the 1x128-tiled operand's scale, then fused-multiply-added with the other operand's
scale into an fp32 accumulator; bias in fp32, one rounding to the output dtype, and an accumulated
output added in the output dtype."""

from __future__ import annotations

from typing import Any

import torch

from ..quantization import ops

__all__ = ["block_scaled_gemm"]

_BLOCK = 128


def _k_major(t: Any, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(FP8 values as fp32 [R, K], scale_inv per (row, K block) [R, ceil(K/128)], 1x128-tiled?)
    of the copy a GEMM contracting over K reads: the row-wise copy of a [R, K] operand, or the
    column-wise copy (stored transposed, [R, K]) of a [K, R] one. Both GEMM_READY grids reduce to
    the same per-row form: 1D [K blocks, R (padded)] transposed; 2D [R blocks, K blocks (padded)]
    repeated over the block's rows."""
    use_col = not rowwise
    data = t._columnwise_data if use_col else t._rowwise_data
    scale = t._columnwise_scale_inv if use_col else t._rowwise_scale_inv
    if data is None:
        which = "column-wise" if use_col else "row-wise"
        raise ValueError(f"general_gemm: a Float8BlockwiseQTensor operand lacks the {which} copy "
                         "this layout reads (update_usage dropped it)")
    k = data.shape[-1]
    q = data.view(t.fp8_data_dtype()).reshape(-1, k).float()
    rows, gk = q.shape[0], -(-k // _BLOCK)
    if t._is_2D_scaled:
        s = scale[:, :gk].repeat_interleave(_BLOCK, 0)[:rows]
    else:
        s = scale[:gk, :rows].t()
    return q, s.contiguous(), not t._is_2D_scaled


def block_scaled_gemm(
    A: Any, transa: bool, B: Any, transb: bool, out_dtype: torch.dtype,
    bias: torch.Tensor | None, out: torch.Tensor | None, accumulate: bool,
) -> torch.Tensor:
    """D = op(B) @ op(A)^T-style product of TE's generic_gemm for two Float8BlockwiseQTensors
    (A the weight-like [N, K] operand when transa, B [M, K] when not transb)."""
    wq, sw, w_1d = _k_major(A, transa)
    xq, sx, x_1d = _k_major(B, not transb)
    if xq.shape[1] != wq.shape[1]:
        raise ValueError(f"general_gemm: operands: contraction dims differ ({xq.shape[1]} vs "
                         f"{wq.shape[1]})")
    te = ops()
    m, n, k = xq.shape[0], wq.shape[0], xq.shape[1]
    y = torch.zeros(m, n, dtype=torch.float32, device=xq.device)
    # The full K blocks of both operands, each made contiguous by one copy ([blocks, rows, 128])
    # rather than one strided-slice copy per block and operand.
    full = k // _BLOCK
    w_blocks = wq[:, : full * _BLOCK].reshape(n, full, _BLOCK).transpose(0, 1).contiguous()
    x_blocks = xq[:, : full * _BLOCK].reshape(m, full, _BLOCK).transpose(0, 1).contiguous()
    for kb in range(-(-k // _BLOCK)):
        if kb < full:
            wk, xk = w_blocks[kb], x_blocks[kb]
        else:  # the last, partial block
            wk, xk = wq[:, kb * _BLOCK :].contiguous(), xq[:, kb * _BLOCK :].contiguous()
        # products of FP8 values are exact in fp32; the core GEMM sums them in fp32
        p = te.gemm(wk, None, True, xk, None, False, torch.float32)[0]
        a_x, a_w = sx[:, kb : kb + 1], sw[:, kb].unsqueeze(0)
        first, second = (a_x, a_w) if x_1d or not w_1d else (a_w, a_x)
        # fma(p * first, second, y): the product is exact in fp64 (24 + 24 bits), one fp64 add,
        # then fp32 (differs from a true fma only on fp64 ties, ~2^-29 of the cases); on the CPU
        # one fused pass of the same arithmetic (te_lite::block_gemm_accumulate_)
        if y.device.type == "cpu":
            te.block_gemm_accumulate_(y, p, first, second)
        else:
            y = (y.double() + (p * first).double() * second.double()).float()
    if bias is not None:
        y = y + bias.reshape(1, -1).float()
    d = y.to(out_dtype)
    if accumulate:
        d = d + out  # TE's epilogue: C converted to the output dtype, then accumulated
        out.copy_(d)
        return out
    if out is not None:
        out.copy_(d)
        return out
    return d
