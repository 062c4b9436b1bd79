"""The native NVFP4 GEMM in the FP4 tensor core's summation order (TE's reference qgemm's).

y[m, n] = alpha * sum over 16-element K blocks b, in K order, of
          sB[m, b] * sA[n, b] * (sum over block b of e2m1_B * e2m1_A)

Each block term is exact in fp32: E2M1 x E2M1 products are multiples of 1/4 and a 16-term sum of
them has at most 12 significant bits; the two E4M3 block scales add 4 + 4 more (nothing under- or
overflows: the smallest nonzero term is 2^-9 * 2^-9 / 4). So the only roundings are the running
fp32 block sums, taken in K order starting from 0, then the per-tensor factor alpha =
(amax_B * amax_A) / (6 * 6 * e4m3_max_B * e4m3_max_A) (a vector along the output's rows or columns
for a row-scaled operand), the epilogue (beta * out, then bias, in fp32) and the cast. The order
is fully specified, so this GEMM and TE's reference qgemm (custom_recipes.reference_nvfp4) give
the same bits. TE's cuBLAS path multiplies by a rounded 1 / (6 * 6 * 448 * 448) instead of
dividing, which can move alpha by one ulp; the reference's division is what TE's tests compare to.

How: on the CPU, and on CUDA in a GPU build, each operand's copy whose blocks run along K (packed
codes and E4M3 scales) goes to the core's nvte_nvfp4_block_gemm (te_lite::nvfp4_block_gemm; JAX
calls the same function), which sums the block terms in K order in one pass (register tiles on the
CPU, bf16 tensor-core block terms on the GPU: the same bits); elsewhere the copies are
decoded to their exact block-scaled values (e2m1 * e4m3, no per-tensor factor) and a batched
matmul over single blocks ([KB, M, 16] x [KB, 16, N]) gives the exact block terms (any order sums
them exactly, as all share one scale product), and a loop of in-place adds accumulates them in K
order, a bounded chunk of blocks at a time.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["NVFP4KOperand", "nvfp4_k_operand", "nvfp4_sequential_gemm", "nvfp4_epilogue"]

_BLOCK = 16
# Elements of the [chunk, M, N] block-term buffer per chunk (256 MiB of fp32).
_CHUNK_ELEMS = 1 << 26

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


class NVFP4KOperand:
    """One GEMM operand, [rows, K] with blocks of 16 along K: its packed E2M1 codes (uint8 [rows,
    ceil(K / 2)]) and E4M3 scale bytes (uint8 [rows, ceil(K / 16)]), the amax it was scaled by ([1],
    or [rows] for a row-scaled copy) and the E4M3 bound of its per-tensor scale. `values` is the
    exact block-scaled fp32 copy (e2m1 * e4m3, K zero-padded to a multiple of 16), decoded on
    first use: the CPU GEMM reads the codes and scales directly."""

    def __init__(self, data: torch.Tensor, scales: torch.Tensor, k: int, amax: torch.Tensor,
                 e4m3_max: float) -> None:
        self.data, self.scales, self.k = data, scales, k
        self.amax, self.e4m3_max = amax, e4m3_max
        self._values: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def values(self) -> torch.Tensor:
        if self._values is None:
            self._values = _decode(self.data, self.scales, self.k)
        return self._values


def _decode(data: torch.Tensor, scales: torch.Tensor, cols: int) -> torch.Tensor:
    from ..tensor.storage.nvfp4_tensor_storage import unpack_codes

    rows = data.shape[0]
    nb = -(-cols // _BLOCK)
    codes = unpack_codes(data)[:, :cols]
    lut = torch.tensor(_E2M1, dtype=torch.float32, device=data.device)
    vals = lut[codes.long()]
    if cols != nb * _BLOCK:  # a partial last block: zeros add nothing to its (exact) term
        vals = torch.nn.functional.pad(vals, (0, nb * _BLOCK - cols))
    s = scales.view(torch.float8_e4m3fn).to(torch.float32)
    return (vals.reshape(rows, nb, _BLOCK) * s.unsqueeze(-1)).reshape(rows, nb * _BLOCK)


def nvfp4_k_operand(t: Any, columnwise: bool) -> NVFP4KOperand | None:
    """The copy of NVFP4 tensor t (row-wise: blocks along its last dim, rows the leading dims;
    column-wise: blocks along the leading dims, rows the last dim) as an NVFP4KOperand, or None
    when that copy is not held."""
    data = t._columnwise_data if columnwise else t._rowwise_data
    if data is None:
        return None
    amax = t._amax_columnwise if columnwise else t._amax_rowwise
    if amax is None:
        return None
    shape = t._logical_shape()
    cols = shape[-1] if len(shape) else 1
    rows = shape[:-1].numel()  # not numel // cols: with cols = 0 that would lose the rows
    if columnwise:
        rows, cols = cols, rows
    # Packed bytes per row: from the data when it has rows, else from cols (reshape(0, -1) is
    # ambiguous; an empty group of a GroupedLinear split, or K = 0, gives such a tensor).
    width = data.numel() // rows if rows else -(-cols // 2)
    packed = data.reshape(rows, width)[:, : -(-cols // 2)].contiguous()
    nb = -(-cols // _BLOCK)
    scales = t._scale_grid(columnwise)[:rows, :nb].contiguous().view(torch.uint8)
    e4m3_max = float(t._nvfp4_e4m3_max) if t._nvfp4_use_4over6 else 448.0
    return NVFP4KOperand(packed, scales, cols, amax.to(torch.float32).reshape(-1), e4m3_max)


def nvfp4_sequential_gemm(b: NVFP4KOperand, a: NVFP4KOperand, alpha: float = 1.0) -> torch.Tensor:
    """fp32 [M, N] = alpha_nvfp4 * sum over K blocks in order of the exact block terms of
    b [M, K] . a [N, K]^T (see the module docstring); alpha (the caller's GEMM alpha) multiplies
    the per-tensor factor when it is not 1, as TE folds it into one scale."""
    if b.k != a.k:
        raise ValueError(f"NVFP4 GEMM: K: expected the operands to agree, got {b.k} and {a.k}")
    m, n, k = b.rows, a.rows, b.k
    # (odd K cannot be packed two per byte: the quantizer refuses it; the fallback covers it anyway)
    if k % 2 == 0 and _core_kernel(b.data.device):
        # the same order in one pass on the packed codes (core nvte_nvfp4_block_gemm)
        y = torch.ops.te_lite.nvfp4_block_gemm(b.data, b.scales, a.data, a.scales)
    else:
        y = _blocked_sum(b.values, a.values, m, n, -(-k // _BLOCK))
    return _scaled(y, b, a, m, n, k, alpha)


def _core_kernel(device: torch.device) -> bool:
    """Whether te_lite::nvfp4_block_gemm runs on `device`: the CPU always, CUDA in a GPU build of
    the extension (gemm/nvfp4_gemm.cu, the CPU's bits); elsewhere the batched path below."""
    if not hasattr(torch.ops.te_lite, "nvfp4_block_gemm"):
        return False
    if device.type == "cpu":
        return True
    return device.type == "cuda" and torch._C._dispatch_has_kernel_for_dispatch_key(
        "te_lite::nvfp4_block_gemm", "CUDA")


def _blocked_sum(p: torch.Tensor, q: torch.Tensor, m: int, n: int, kb: int) -> torch.Tensor:
    y = torch.zeros(m, n, dtype=torch.float32, device=p.device)
    if kb and m and n:
        pb = p.reshape(m, kb, _BLOCK).transpose(0, 1)  # [KB, M, 16]
        qb = q.reshape(n, kb, _BLOCK).permute(1, 2, 0)  # [KB, 16, N]
        chunk = max(1, min(kb, _CHUNK_ELEMS // (m * n)))
        for c0 in range(0, kb, chunk):
            terms = torch.bmm(pb[c0 : c0 + chunk], qb[c0 : c0 + chunk])
            for i in range(terms.shape[0]):
                y.add_(terms[i])
    return y


def _scaled(y: torch.Tensor, b: NVFP4KOperand, a: NVFP4KOperand, m: int, n: int, k: int,
            alpha: float) -> torch.Tensor:
    ab, aa = b.amax, a.amax
    if ab.numel() not in (1, m) or aa.numel() not in (1, n):
        raise ValueError(f"NVFP4 GEMM: amax: expected 1 or one per row ({m} and {n}), got "
                         f"{ab.numel()} and {aa.numel()}")
    part = ab.reshape(-1, 1) * aa.reshape(1, -1)  # [1|M, 1|N]
    scale = part / (36.0 * b.e4m3_max * a.e4m3_max)
    if alpha != 1.0:
        scale = scale * alpha
    if k:  # an empty K leaves the zeros unscaled (as the reference)
        y = scale * y
    return y


def nvfp4_epilogue(
    y: torch.Tensor, out_dtype: torch.dtype, bias: torch.Tensor | None,
    out: torch.Tensor | None, accumulate: bool, beta: float | None,
) -> torch.Tensor:
    """TE's cuBLAS epilogue on the fp32 product y: D = y + beta * out (accumulate) + bias, in
    fp32, rounded once to out_dtype; written into out when given."""
    if accumulate:
        c = out.reshape(y.shape).to(torch.float32)
        y = y + (c if beta in (None, 1, 1.0) else c * float(beta))
    if bias is not None:
        y = y + bias.to(torch.float32)
    d = y.to(out_dtype)
    if out is not None:
        out.copy_(d.reshape(out.shape))
        return out
    return d


# The modules' NVFP4 path contracts fp32 dequantized copies (quantization.nvfp4_dequantized,
# module._stored_operands.stored_nvfp4); each such tensor carries, under this attribute, the
# (NVFP4 tensor, columnwise) it was decoded from, so their GEMMs can run in the order above. A
# tensor that lost it (a copy, a saved-tensor hook) is contracted as dequantized instead.
SOURCE_ATTR = "_te_lite_nvfp4_source"


def tag_nvfp4_source(values: torch.Tensor | None, t: Any, columnwise: bool) -> torch.Tensor | None:
    """Records on `values` (t's copy dequantized, in t's logical 2-D shape) where it came from."""
    if values is not None:
        setattr(values, SOURCE_ATTR, (t, columnwise))
    return values


def _source_operand(v: torch.Tensor, columnwise: bool) -> NVFP4KOperand | None:
    src = getattr(v, SOURCE_ATTR, None)
    if src is None or src[1] != columnwise:
        return None
    return nvfp4_k_operand(src[0], columnwise)


def nvfp4_tagged_gemm(
    a: torch.Tensor, transa: bool, b: torch.Tensor, transb: bool, out_dtype: torch.dtype,
    bias: torch.Tensor | None = None, acc: torch.Tensor | None = None, alpha: float = 1.0,
) -> torch.Tensor | None:
    """te_lite.gemm's D = op(b) @ op(a) (+ bias), or added into acc, for two tagged dequantized
    NVFP4 copies whose blocks run along the contracted dim (a's row-wise copy when transa, b's
    column-wise one when transb): the FP4 tensor core's order. None when either is untagged."""
    qa = _source_operand(a, not transa)
    qb = _source_operand(b, transb) if qa is not None else None
    if qb is None:
        return None
    y = nvfp4_sequential_gemm(qb, qa, alpha)
    if acc is not None:
        return nvfp4_epilogue(y, acc.dtype, bias, acc, True, None)
    return nvfp4_epilogue(y, out_dtype, bias, None, False, None)
