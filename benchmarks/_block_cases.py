"""bench_core.py's block-scaled cases (issue #24): Float8BlockScaling (1x128 tiles, E4M3, power-of-2
scales) and NVFP4 (1x16 blocks of E2M1 with E4M3 scales under a per-tensor fp32 scale) quantization
against a plain-torch implementation of the same format, whose bytes must be ours exactly; and the
GEMM with block-scaled operands against torch's bf16 matmul of the same matrices, checked against
the fp64 product of the dequantized operands.

The references are vectorised torch written here from the formats' definitions (README, "Block
scaling"); they are what a user without this library would run, so the ratio says what the fused
kernels buy."""

from __future__ import annotations

import torch
from _common import Case, first_error

from transformer_engine_lite.pytorch import NVFP4Quantizer
from transformer_engine_lite.pytorch.cpp_extensions import general_gemm
from transformer_engine_lite.pytorch.tensor.float8_blockwise_tensor import Float8BlockQuantizer

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# E2M1's magnitudes by code, the midpoints between neighbours, and which midpoints round up (the
# even code of the two is the upper one): ties go to the even code.
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_MID = (E2M1[1:] + E2M1[:-1]) / 2
E2M1_TIE_UP = torch.tensor([False, True, False, True, False, True, False])


def _sizes(quick: bool) -> tuple[int, int]:
    return (1024, 1024) if quick else (4096, 4096)


def _input(quick: bool, seed: int) -> torch.Tensor:
    rows, cols = _sizes(quick)
    g = torch.Generator().manual_seed(seed)
    ramp = torch.exp2(torch.arange(cols) // 48 % 9 - 4.0)  # neighbouring blocks, other scales
    return (torch.randn(rows, cols, generator=g) * ramp).to(torch.bfloat16)


# ----------------------------------------------------------------------------- Float8BlockScaling
def block_1x128_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 data, fp32 scale_inv per 1x128 tile) of a bf16 [rows, cols] matrix, cols % 128 == 0:
    scale = 2^floor(log2(448 / amax)) per tile (1 for an all-zero tile)."""
    rows, cols = x.shape
    tiles = x.float().reshape(rows, cols // 128, 128)
    amax = tiles.abs().amax(-1, keepdim=True)
    scale = torch.exp2(torch.floor(torch.log2(E4M3_MAX / amax)))
    scale = torch.where(amax == 0, torch.ones_like(scale), scale)
    q = (tiles * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).reshape(rows, cols)
    return q, (1.0 / scale).reshape(rows, cols // 128)


def case_quantize_block(quick: bool) -> Case:
    x = _input(quick, 11)
    quantizer = Float8BlockQuantizer(E4M3, rowwise=True, columnwise=False, block_scaling_dim=1)

    def check() -> str | None:
        t = quantizer(x)
        q, s = block_1x128_reference(x)
        rows = x.shape[0]
        got_s = t._rowwise_scale_inv  # GEMM_READY: [cols / 128, rows padded to 4]
        return first_error(
            None if torch.equal(t._rowwise_data.view(torch.uint8), q.view(torch.uint8))
            else "data bytes differ from the torch reference",
            None if torch.equal(got_s[:, :rows].t(), s) else "scale_inv differs from 1 / scale")

    return Case(lambda: quantizer(x), lambda: block_1x128_reference(x), check,
                [f"{tuple(x.shape)} bf16 -> E4M3, 1x128 tiles, power-of-2 scales, row-wise"])


# ----------------------------------------------------------------------------- NVFP4
def nvfp4_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed E2M1 codes [rows, cols / 2], E4M3 block scales [rows, cols / 16], fp32 amax) of a
    bf16 [rows, cols] matrix, cols % 16 == 0, each step one fp32 operation: s_enc = 448 * 6 / amax,
    block scale = E4M3(amax_block * (s_enc / 6)), values x / (scale / s_enc) rounded to the
    nearest E2M1 magnitude, ties to the even code."""
    rows, cols = x.shape
    xf = x.float()
    amax = xf.abs().amax()
    s_enc = torch.where(amax > 0, torch.tensor(2688.0) / amax, torch.tensor(torch.finfo(torch.float32).max))
    s_dec = 1.0 / s_enc
    mult = s_enc * torch.tensor(1.0 / 6.0)
    blocks = xf.reshape(rows, cols // 16, 16)
    sc = (blocks.abs().amax(-1) * mult).clamp(max=E4M3_MAX).to(E4M3)
    enc = (1.0 / (sc.float() * s_dec)).clamp(max=torch.finfo(torch.float32).max)
    v = (blocks * enc.unsqueeze(-1)).clamp(-6.0, 6.0)
    a = v.abs().unsqueeze(-1)
    code = ((a > E2M1_MID) | ((a == E2M1_MID) & E2M1_TIE_UP)).sum(-1).to(torch.uint8)
    code = code | ((v < 0).to(torch.uint8) << 3)
    code = code.reshape(rows, cols)
    return code[:, 0::2] | (code[:, 1::2] << 4), sc, amax.reshape(1)


def case_quantize_nvfp4(quick: bool) -> Case:
    x = _input(quick, 12)
    quantizer = NVFP4Quantizer(rowwise=True, columnwise=False)

    def check() -> str | None:
        t = quantizer(x)
        q, sc, amax = nvfp4_reference(x)
        rows, nb = sc.shape
        return first_error(
            None if torch.equal(t._rowwise_data.reshape(q.shape), q)
            else "packed E2M1 bytes differ from the torch reference",
            None if torch.equal(t._rowwise_scale_inv[:rows, :nb], sc.view(torch.uint8))
            else "E4M3 block scales differ",
            None if torch.equal(t._amax_rowwise, amax) else "amax differs")

    return Case(lambda: quantizer(x), lambda: nvfp4_reference(x), check,
                [f"{tuple(x.shape)} bf16 -> NVFP4 (1x16 blocks), row-wise, no RHT / SR"])


# ----------------------------------------------------------------------------- GEMM
def _gemm_case(quick: bool, make_quantizers, what: str) -> Case:
    n = 1024 if quick else 2048
    g = torch.Generator().manual_seed(13)
    x, w = (torch.randn(n, n, generator=g).to(torch.bfloat16) for _ in range(2))
    qx_of, qw_of = make_quantizers()
    qx, qw = qx_of(x), qw_of(w)

    def ours():
        return general_gemm(qw, qx, out_dtype=torch.bfloat16)[0]

    def ref():
        return x @ w.t()

    def check() -> str | None:
        want = qx.dequantize(dtype=torch.float32).double() @ qw.dequantize(
            dtype=torch.float32).double().t()
        err = (ours().double() - want).abs().max().item()
        # bf16 output: half an ulp of the largest value, plus fp32 accumulation over n terms
        bound = want.abs().max().item() * (2.0**-8 + n * 2.0**-24)
        return None if err <= bound else f"{what}: max err {err:.3g} > {bound:.3g} (fp64 of the operands)"

    flops = 2 * n**3
    return Case(ours, ref, check, [f"{n}^3, {what} operands quantized once, bf16 out, vs bf16 "
                                   f"x @ w.T ({flops / 1e9:.0f} GFLOP)"])


def case_gemm_block(quick: bool) -> Case:
    return _gemm_case(quick, lambda: (
        Float8BlockQuantizer(E4M3, rowwise=True, columnwise=False, block_scaling_dim=1),
        Float8BlockQuantizer(E4M3, rowwise=True, columnwise=False, block_scaling_dim=2)),
        "Float8BlockScaling (1x128 x 128x128)")


def case_gemm_nvfp4(quick: bool) -> Case:
    return _gemm_case(quick, lambda: (
        NVFP4Quantizer(rowwise=True, columnwise=False),
        NVFP4Quantizer(rowwise=True, columnwise=False, with_2d_quantization=True)),
        "NVFP4 (1x16 x 16x16)")


CASES = {
    "quantize_block_1x128_e4m3": (case_quantize_block, 1.0),
    "quantize_nvfp4": (case_quantize_nvfp4, 1.0),
    "gemm_block_fp8_vs_bf16": (case_gemm_block, None),
    "gemm_nvfp4_vs_bf16": (case_gemm_nvfp4, None),
}
