"""GEMM of two Float8BlockScaling operands in the order TE's block-scaled GEMM accumulates
(cuBLAS on Hopper; TE's reference tests/pytorch/references/blockwise_fp8_gemm_reference.py): for
each 128-wide K block, the FP8 products summed in fp32 (the core GEMM on the FP8 values, unscaled),
multiplied by the 1x128-tiled operand's scale, then fused-multiply-added with the other operand's
scale into an fp32 accumulator; bias in fp32, one rounding to the output dtype, and an accumulated
output added in the output dtype.

check_block_gemm_contract: TE's public contract for block-scaled GEMMs (common/gemm/
cublaslt_gemm.cu and what cuBLAS itself refuses), enforced before any arithmetic so that code
written against TE fails here where it fails there, with TE's message text."""

from __future__ import annotations

from typing import Any

import torch

from ...common.capi import NVTEInvalidArgument, Status
from ..quantization import ops

__all__ = ["block_scaled_gemm", "check_block_gemm_contract"]

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


# cuBLAS's answer to requests it never serves for block-scaled operands (TE forwards it as a
# RuntimeError "cuBLAS Error: ..."); we refuse before computing, naming what TE users see.
_NOT_SUPPORTED = ("cuBLAS returns CUBLAS_STATUS_NOT_SUPPORTED for {} on every GPU TE runs; TE "
                  "refuses {}")


def _refuse(message: str) -> None:
    # TE raises RuntimeError (NVTE_CHECK) and its tests match on that class; our rule for a value
    # TE rejects is ValueError: NVTEInvalidArgument is both.
    raise NVTEInvalidArgument(Status.INVALID_ARGUMENT, message)


def _flat_2d(t: Any) -> tuple[int, int]:
    """TE's flat_2d_dims: (leading dims flattened, last dim)."""
    shape = tuple(int(d) for d in t.shape)
    if not shape:
        return 1, 1
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows, shape[-1]


def _epilogue(bias: bool, gelu: bool, grad: bool) -> str:
    """The cuBLASLt epilogue TE's cublas_gemm picks for these flags."""
    if bias and gelu:
        return "DGELU_BGRAD" if grad else "GELU_AUX_BIAS"
    if bias:
        return "BGRADB" if grad else "BIAS"
    if gelu:
        return "DGELU" if grad else "GELU_AUX"
    return "DEFAULT"


def check_block_gemm_contract(
    A: Any, transa: bool, B: Any, transb: bool, out_dtype: torch.dtype,
    bias: torch.Tensor | None, gelu: bool, grad: bool,
    use_split_accumulator: bool | None = None,
) -> bool:
    """Refuse what TE refuses for a GEMM of two Float8BlockwiseQTensors, in TE's order (shapes and
    usages in CanonicalizeGemmInput, then the scaling-mode pair, the epilogue, and what cuBLAS
    answers CUBLAS_STATUS_NOT_SUPPORTED / INVALID_VALUE to), with TE's message text.
    use_split_accumulator: tex.generic_gemm's explicit flag; None where TE's general_gemm forces
    it True (block-scaled operands always take the split accumulator there).
    Returns False for an empty GEMM (m or n zero): TE returns before any check."""
    a0, a1 = _flat_2d(A)
    b0, b1 = _flat_2d(B)
    m, k = (a0, a1) if transa else (a1, a0)
    n, k_b = (b1, b0) if transb else (b0, b1)
    if k_b != k:
        _refuse(f"general_gemm: GEMM inputs have incompatible dimensions (A is {a0}x{a1}, B is "
                f"{b0}x{b1})")
    if m <= 0 or n <= 0:
        return False
    # Hopper runs FP8 GEMMs as TN only: each operand's GEMM reads the copy whose rows run along K.
    for name, t, rowwise in (("A", A, transa), ("B", B, not transb)):
        if (t._rowwise_data if rowwise else t._columnwise_data) is None:
            which = "row-wise" if rowwise else "column-wise"
            _refuse(f"Input {name} is missing {which} usage (general_gemm: this layout reads "
                    f"{name}'s {which} copy, which update_usage dropped)")
    # cuBLAS's tensor-core alignment: 16 bytes of FP8 along K; m and n (1D-scaled B) 16 bytes of a
    # 2-byte output.
    if k % 16:
        _refuse(f"Leading dimension requirement on NVTE_BLOCK_SCALING GEMM. Caller must pad. "
                f"(general_gemm: expected the contraction dim K to be a multiple of 16, got {k})")
    if m % 8:
        _refuse(f"Outer dimension requirement on A for NVTE_BLOCK_SCALING GEMM. Caller must pad. "
                f"(general_gemm: expected op(A)'s outer dim m, the output's last dim, to be a "
                f"multiple of 8, got {m})")
    if not B._is_2D_scaled and n % 8:
        _refuse(f"Outer dimension requirement on B for NVTE_BLOCK_SCALING GEMM. Caller must pad. "
                f"(general_gemm: expected a 1D-scaled op(B)'s outer dim n, the output's rows, to "
                f"be a multiple of 8, got {n})")
    if A._is_2D_scaled and B._is_2D_scaled:
        _refuse("Only 1D by 1D, 1D by 2D, and 2D by 1D block scaling GEMM is supported, but got "
                "2D by 2D (general_gemm: A and B are both 128x128-block scaled)")
    epilogue = _epilogue(bias is not None, gelu, grad)
    if epilogue not in ("DEFAULT", "BIAS", "DGELU"):
        _refuse(f"Epilogue requested outside of the available and tested cuBLAS functionality for "
                f"float8 block scaled GEMM (general_gemm: bias={bias is not None}, gelu={gelu}, "
                f"grad={grad} ask for CUBLASLT_EPILOGUE_{epilogue}; expected no epilogue, bias, "
                f"or DGELU: gelu=True with grad=True and no bias)")
    if A.fp8_data_dtype() == torch.float8_e5m2 and B.fp8_data_dtype() == torch.float8_e5m2:
        _refuse("FP8 block-scaled GEMM: E5M2 x E5M2 operands are not supported ("
                + _NOT_SUPPORTED.format("them", "them") + "); expected at least one E4M3 operand")
    if use_split_accumulator is not None and not use_split_accumulator:
        _refuse("FP8 block-scaled GEMM: use_split_accumulator=False (fast accumulation) is not "
                "supported (" + _NOT_SUPPORTED.format("it", "it") + "; TE's general_gemm always "
                "passes True for block-scaled operands)")
    if epilogue == "DGELU" and out_dtype != torch.bfloat16:
        _refuse(f"cuBLAS Error: an unsupported value or parameter was passed to the function "
                f"(CUBLAS_STATUS_INVALID_VALUE: general_gemm: the DGELU epilogue of an FP8 "
                f"block-scaled GEMM writes bfloat16 only, got out_dtype {out_dtype})")
    return True


def block_scaled_gemm(
    A: Any, transa: bool, B: Any, transb: bool, out_dtype: torch.dtype,
    bias: torch.Tensor | None, out: torch.Tensor | None, accumulate: bool,
    dgelu_in: torch.Tensor | None = None,
) -> torch.Tensor:
    """D = op(B) @ op(A)^T-style product of TE's generic_gemm for two Float8BlockwiseQTensors
    (A the weight-like [N, K] operand when transa, B [M, K] when not transb). dgelu_in: the
    DGELU epilogue (TE's gelu=True, grad=True): D = dgelu(product [+ out], dgelu_in), the
    gradient through GELU of the (accumulated) output, in fp32 with one rounding (the value
    tex.dgelu gives for the plain GEMM's output, as TE's test checks it)."""
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
    if dgelu_in is not None:
        if tuple(dgelu_in.shape) != tuple(d.shape):
            raise ValueError(f"general_gemm: gelu_in: expected the output's shape "
                             f"{tuple(d.shape)} for the DGELU epilogue, got "
                             f"{tuple(dgelu_in.shape)}")
        d = te.activation_bwd(d.float().contiguous(), dgelu_in.float().contiguous(), "gelu")
        d = d.to(out_dtype)
    if out is not None:
        out.copy_(d)
        return out
    return d
