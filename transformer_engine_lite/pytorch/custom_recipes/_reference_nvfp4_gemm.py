"""The reference NVFP4 / MXFP4 GEMM (NVFP4QuantizerRef.qgemm), in plain torch.

y[m, n] = alpha * sum_k (sx[m, k] * sw[n, k]) * (sum over block k of x_e2m1 * w_e2m1), as an FP4
tensor core forms it: each block's 16 (MXFP4: 32) products of E2M1 values summed exactly (they are
multiples of 1/4 below 2^10), scaled by the product of the two block scales (exact in fp32: two
4-bit significands), the block terms accumulated in fp32 in block order, then multiplied by the
per-tensor factor alpha = (amax_x * amax_w) / (6 * 6 * e4m3_max_x * e4m3_max_w) (NVFP4; MXFP4
has none); accumulate adds `out` in fp32 before the one rounding to out_dtype. Row-scaled operands
make alpha a vector: per output row (FPROP / DGRAD) or per output column (WGRAD).
"""

from __future__ import annotations

from typing import Any

import torch

from . import _reference_nvfp4_math as m
from . import gemm

__all__ = ["nvfp4_qgemm"]


def _e4m3_max(qresult: Any, quantizer: Any) -> float:
    """The E4M3 bound the operand's global scale was formed with (256 for 4over6 with it)."""
    use = getattr(qresult, "nvfp4_use_4over6", quantizer.nvfp4_use_4over6)
    return float(getattr(qresult, "nvfp4_e4m3_max", quantizer.nvfp4_e4m3_max)) if use else 448.0


def _alpha(quantizer: Any, gemm_type: Any, qx: Any, qw: Any) -> torch.Tensor:
    if qx is None or qw is None:
        which = "qresult_x" if qx is None else "qresult_w"
        raise ValueError(f"{which} is required for non-pow_2_scales NVFP4 GEMM (needed for "
                         "global_amax)")
    wgrad = gemm_type == gemm.GEMMType.WGRAD
    attr = "global_amax_col" if wgrad else "global_amax_row"
    ax, aw = getattr(qx, attr), getattr(qw, attr)
    if ax is None:
        raise ValueError(f"qresult_x.{attr} must be set for non-pow_2_scales NVFP4 GEMM")
    if aw is None:
        raise ValueError(f"qresult_w.{attr} must be set for non-pow_2_scales NVFP4 GEMM")
    factor = 36.0 * _e4m3_max(qx, quantizer) * _e4m3_max(qw, quantizer)
    part = ax.to(torch.float32) * aw.to(torch.float32)
    if part.numel() > 1:  # a row-scaled operand: per output row, or per output column (WGRAD)
        part = part.reshape(1, -1) if wgrad else part.reshape(-1, 1)
    else:
        part = part.reshape(())
    return part / factor


def nvfp4_qgemm(
    quantizer: Any,
    qx: torch.Tensor,
    qw: torch.Tensor,
    out_dtype: torch.dtype,
    sx: torch.Tensor,
    sw: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    accumulate: bool,
    gemm_type: Any,
    qresult_x: Any,
    qresult_w: Any,
) -> torch.Tensor:
    """See the module docstring; the checks and messages are TE's reference's."""
    if bias is not None:
        raise ValueError("Bias is not supported in NVFP4QuantizerRef.qgemm")
    if accumulate and out is None:
        raise ValueError("Output tensor must be provided for accumulation.")
    if not accumulate and out is not None:
        raise ValueError("Output tensor should be None when accumulate is False.")
    for name, t in (("qx", qx), ("qw", qw)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 2:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"qgemm: {name}: expected 2-D uint8 packed E2M1 data, got {got}")
    pow2 = quantizer.pow_2_scales
    alpha = None if pow2 else _alpha(quantizer, gemm_type, qresult_x, qresult_w)
    x = m.decode_e2m1(m.unpack_e2m1(qx))
    w = m.decode_e2m1(m.unpack_e2m1(qw))
    rows, k = x.shape
    cols, k_w = w.shape
    if k != k_w:
        raise ValueError(f"K dimension mismatch between qx and qw: qx has K={k}, qw has K={k_w}")
    if k % 32 != 0:
        raise ValueError(f"K dimension must be divisible by 32, got K={k}")
    if cols % 8 != 0:
        raise ValueError(f"N dimension must be divisible by 8, got N={cols}")
    blk = 32 if pow2 else 16
    nk = k // blk
    if pow2 and sx.dtype == torch.uint8:  # E8M0 bytes: 2^(e - 127)
        sx = torch.pow(2.0, sx.to(torch.float32) - 127.0)
        sw = torch.pow(2.0, sw.to(torch.float32) - 127.0)
    sx, sw = sx.to(torch.float32), sw.to(torch.float32)
    if tuple(sx.shape) != (rows, nk):
        raise ValueError(f"sx shape mismatch: expected ({rows}, {nk}), got {sx.shape}")
    if tuple(sw.shape) != (cols, nk):
        raise ValueError(f"sw shape mismatch: expected ({cols}, {nk}), got {sw.shape}")
    y = torch.zeros(rows, cols, dtype=torch.float32, device=qx.device)
    for b in range(nk):
        sl = slice(b * blk, (b + 1) * blk)
        dot = x[:, sl] @ w[:, sl].t()  # exact whatever the summation order
        y = y + torch.outer(sx[:, b], sw[:, b]) * dot
    if alpha is not None and k > 0:
        y = alpha * y
    if accumulate:
        y = y + out.to(torch.float32)
    return y.to(out_dtype)
