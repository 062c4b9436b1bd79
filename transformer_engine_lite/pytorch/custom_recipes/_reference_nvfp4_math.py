"""The arithmetic of the NVFP4 reference quantizer (reference_nvfp4.NVFP4QuantizerRef), in plain
torch and fp32, written from the format's definition (TE's NVFP4BlockScaling recipe):

- E2M1 values {0, 0.5, 1, 1.5, 2, 3, 4, 6} and their negatives, two codes per byte (element 2j in
  the low nibble). Rounding is to nearest, ties to the even code; NaN and +-0 give code 0; tiny
  negatives give negative zero (code 8).
- Two-level scaling: a per-tensor (or, row-scaled, per-row) fp32 encode scale S_enc =
  6 * e4m3_max / amax (capped at FLT_MAX; an infinite amax, S_enc 0, becomes 1), and one E4M3
  scale per block of 16 elements (1x16, or 16x16 for 2D quantization): e4m3(block_amax *
  (S_enc * (1/6))) clamped to 448. An element is rounded from x * (1 / (e4m3 scale * (1 /
  S_enc))), clamped to +-6.
- 4over6: each block tries two E4M3 scales, (block_amax / 6) * S_enc ("map to 6") and 1.5 times
  that ("map to 4"), and keeps the one whose dequantized block has the smaller summed error (ties:
  map to 6). 2D blocks sum their 16 row errors pairwise (rows i and i + 8, then i + 4, ...).
- The random Hadamard transform (RHT) of 16 elements: y_j = sum_i x_i * s_i * H[i, j] / 4, with
  H the Sylvester Hadamard matrix and s TE's fixed sign vector, summed in fp32 for i = 0..15 and
  rounded to the input dtype (the transform works in that dtype).

Every step is one fp32 operation in that order, so the bytes equal the native kernels' (the core's
cast/nvfp4_math.h follows the same definition); tests/pytorch/test_nvfp4_reference.py checks it.
"""

from __future__ import annotations

import torch

__all__ = [
    "E2M1_VALUES",
    "WGRAD_SIGNS",
    "decode_e2m1",
    "encode_e2m1",
    "encode_e2m1_stochastic",
    "pack_e2m1",
    "quantize_blocks",
    "quantize_blocks_pow2",
    "rht16",
    "rht16_matrix",
    "unpack_e2m1",
]

# E2M1 magnitude of each 3-bit code; bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# TE's fixed sign vector of the wgrad RHT (s_i above).
WGRAD_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)
_FLT_MAX = torch.finfo(torch.float32).max
_E4M3_MAX = 448.0


def encode_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even E2M1 codes (uint8) of fp32 values already clamped to [-6, 6]. Each
    comparison adds one step up the grid; the midpoints belong to the even code (0.25 -> 0,
    0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). NaN compares False
    everywhere: code 0."""
    m = v.abs()
    code = ((m > 0.25).to(torch.uint8) + (m >= 0.75).to(torch.uint8)
            + (m > 1.25).to(torch.uint8) + (m >= 1.75).to(torch.uint8)
            + (m > 2.5).to(torch.uint8) + (m >= 3.5).to(torch.uint8)
            + (m > 5.0).to(torch.uint8))
    return code | ((v < 0).to(torch.uint8) << 3)


def encode_e2m1_stochastic(v: torch.Tensor, generator: torch.Generator | None = None
                           ) -> torch.Tensor:
    """Stochastic E2M1 codes of fp32 values in [-6, 6]: between the grid neighbours lo <= |v| <=
    hi, round up with probability (|v| - lo) / (hi - lo), so E[value] = v. The draw is a 24-bit
    uniform u per element from torch's generator (`generator`, else the default one of v's
    device), rounding up iff u < p * 2^24, the native kernel's rule on another stream (its Philox
    stream is not reproduced: the bytes agree with the native ones in distribution only). NaN and
    zero give code 0, negative zero code 8."""
    m = v.abs()
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=v.device)
    k = (m.unsqueeze(-1) >= grid[1:]).sum(-1)  # index of lo; NaN compares False: 0
    lo = grid[k]
    hi = grid[torch.clamp(k + 1, max=7)]
    p = torch.where(k < 7, (m - lo) / (hi - lo), torch.zeros_like(m))
    u = torch.randint(0, 1 << 24, v.shape, generator=generator, device=v.device,
                      dtype=torch.int64).to(torch.float32)
    code = (k + (u < p * 16777216.0).to(torch.int64)).to(torch.uint8)
    code = torch.where(m > 0, code, torch.zeros_like(code))  # NaN and zero: 0 (sign kept below)
    return code | ((v < 0).to(torch.uint8) << 3)


def decode_e2m1(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of E2M1 codes (any integer tensor holding 0..15)."""
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=dtype,
                       device=codes.device)
    return lut[codes.to(torch.long)]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2n] codes -> [..., n] bytes, element 2j in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_e2m1: [..., n] bytes -> [..., 2n] codes."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def rht16_matrix(with_random_sign_mask: bool) -> torch.Tensor:
    """fp32 [16, 16]: s_i * H[i, j] (without the 1/4)."""
    i = torch.arange(16)
    parity = torch.zeros(16, 16, dtype=torch.int64)
    for b in range(4):  # H[i, j] = (-1)^popcount(i & j)
        parity ^= ((i[:, None] >> b) & (i[None, :] >> b)) & 1
    signs = torch.tensor(WGRAD_SIGNS if with_random_sign_mask else (1,) * 16)
    return ((1 - 2 * parity) * signs[:, None]).to(torch.float32)


def rht16(x: torch.Tensor, with_random_sign_mask: bool, out_dtype: torch.dtype,
          inverse: bool = False) -> torch.Tensor:
    """The 16-point RHT along the last dim (a multiple of 16) of x, rounded to out_dtype and
    returned as x's dtype (fp32 for the quantizer). Every product x_i * (+-1/4) is exact; the sum
    runs over i in order. inverse: the inverse transform (the transposed matrix: S H / 4 is
    orthogonal), for dequantizing a transformed copy (fp64 x)."""
    if x.shape[-1] % 16:
        raise ValueError(f"rht16: x: expected a last dim divisible by 16 (the Hadamard size), got "
                         f"shape {tuple(x.shape)}")
    sh = rht16_matrix(with_random_sign_mask).to(x.dtype).to(x.device)
    if inverse:
        sh = sh.t().contiguous()
    blocks = x.reshape(-1, 16)
    acc = torch.zeros_like(blocks)
    for k in range(16):
        acc = acc + (blocks[:, k : k + 1] * 0.25) * sh[k]
    return acc.reshape(x.shape).to(out_dtype).to(x.dtype)


def _pad(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    r, c = t.shape
    if r == rows and c == cols:
        return t
    return torch.nn.functional.pad(t, (0, cols - c, 0, rows - r))


def _global_enc(amax: torch.Tensor, e4m3_max: int) -> torch.Tensor:
    """S_enc from an fp32 amax (any shape). NaN stays NaN."""
    s = torch.tensor(6.0 * e4m3_max, dtype=torch.float32, device=amax.device) / amax
    s = torch.where(s > _FLT_MAX, torch.full_like(s, _FLT_MAX), s)
    return torch.where(s == 0, torch.ones_like(s), s)


def _e4m3(d: torch.Tensor) -> torch.Tensor:
    """fp32 -> E4M3 (nearest even), clamped to 448 first; NaN stays NaN."""
    d = torch.where(d > _E4M3_MAX, torch.full_like(d, _E4M3_MAX), d)
    return d.to(torch.float8_e4m3fn)


def _enc_from_scale(scale: torch.Tensor, g_dec: torch.Tensor) -> torch.Tensor:
    """The elements' factor 1 / (e4m3 scale * S_dec), capped at FLT_MAX."""
    e = 1.0 / (scale.to(torch.float32) * g_dec)
    return torch.where(e > _FLT_MAX, torch.full_like(e, _FLT_MAX), e)


def _codes(x: torch.Tensor, enc: torch.Tensor, sr: bool = False) -> torch.Tensor:
    v = torch.clamp(x * enc, -6.0, 6.0)
    return encode_e2m1_stochastic(v) if sr else encode_e2m1(v)


def _block_errors(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor,
                  g_enc: torch.Tensor, g_amax: torch.Tensor, e4m3_max: int, mse: bool,
                  fast: bool) -> torch.Tensor:
    """Summed error of each [rows, blocks, 16] block row under one 4over6 candidate. Exact mode
    dequantizes in the input domain ((e2m1 * scale) * amax / (6 * e4m3_max), one rounding per
    step); fast math compares e2m1 * scale (exact; TE forms it as an fp16 product, and an E4M3
    NaN scale becomes fp16 0x7E00, which decodes as 98304) with x * S_enc."""
    vals = decode_e2m1(codes)
    s = scale.to(torch.float32).unsqueeze(-1)
    err = torch.zeros(x.shape[:-1], dtype=torch.float32, device=x.device)
    denom = torch.tensor(6.0 * e4m3_max, dtype=torch.float32, device=x.device)
    if fast:
        cand = torch.where(torch.isnan(s), torch.full_like(vals, 98304.0), vals * s)
        diff = cand - x * g_enc
    else:
        diff = ((vals * s) * g_amax) / denom - x
    term = diff * diff if mse else diff.abs()
    for k in range(x.shape[-1]):  # element order
        err = err + term[..., k]
    return err


def _tree16(err: torch.Tensor) -> torch.Tensor:
    """[16 * b, n] row errors -> [b, n] block errors: rows i + i+8, then + i+4, i+2, i+1."""
    e = err.reshape(-1, 16, err.shape[-1])
    for h in (8, 4, 2, 1):
        e = e[:, :h] + e[:, h : 2 * h]
    return e[:, 0]


def quantize_blocks(
    t: torch.Tensor,
    amax: torch.Tensor,
    two_d: bool,
    row_scaled: bool = False,
    e4m3_max: int = 448,
    four_over_six: str | None = None,
    fast: bool = False,
    stochastic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 codes of fp32 t [R, C] (C even) and its E4M3 scales. amax: fp32 [1] (per tensor), or
    [R] with row_scaled (one global scale per row; 1x16 blocks only). Returns (packed data uint8 [R, C / 2], scales float8_e4m3fn [R', ceil(C /
    16)]), R' = R (1x16) or R rounded up to 16 (16x16: every row of a block carries the block's
    scale). four_over_six: None, "MAE" or "MSE". stochastic: stochastic rounding of the elements
    (encode_e2m1_stochastic; not with 4over6)."""
    r, c = t.shape
    rp = -(-r // 16) * 16 if two_d else r
    cp = -(-c // 16) * 16
    x = _pad(t, rp, cp).reshape(rp, cp // 16, 16)
    if two_d:
        bam = x.reshape(rp // 16, 16, cp // 16, 16).abs().amax(dim=(1, 3))
        bam = bam.repeat_interleave(16, dim=0)
    else:
        bam = x.abs().amax(dim=-1)
    g_amax = amax.to(torch.float32)
    g_amax = g_amax.reshape(r, 1) if row_scaled else g_amax.reshape(())
    g_enc = _global_enc(g_amax, e4m3_max)
    g_dec = 1.0 / g_enc
    if four_over_six is None:
        mult = g_enc * torch.reciprocal(torch.tensor(6.0, device=t.device))
        d = bam * mult
        d = torch.where(d > _FLT_MAX, torch.full_like(d, _FLT_MAX), d)
        scale = _e4m3(d)
        codes = _codes(x, _enc_from_scale(scale, g_dec).unsqueeze(-1), stochastic)
    else:
        base = (bam / 6.0) * g_enc
        s6, s4 = _e4m3(base), _e4m3(base * 1.5)
        c6 = _codes(x, _enc_from_scale(s6, g_dec).unsqueeze(-1))
        c4 = _codes(x, _enc_from_scale(s4, g_dec).unsqueeze(-1))
        ge = g_enc.unsqueeze(-1) if g_enc.dim() else g_enc
        ga = g_amax.unsqueeze(-1) if g_amax.dim() else g_amax
        mse = four_over_six == "MSE"
        e6 = _block_errors(x, c6, s6, ge, ga, e4m3_max, mse, fast)
        e4 = _block_errors(x, c4, s4, ge, ga, e4m3_max, mse, fast)
        if two_d:
            pick4 = (_tree16(e4) < _tree16(e6)).repeat_interleave(16, dim=0)
        else:
            pick4 = e4 < e6
        scale = torch.where(pick4, s4.view(torch.uint8), s6.view(torch.uint8))
        scale = scale.view(torch.float8_e4m3fn)
        codes = torch.where(pick4.unsqueeze(-1), c4, c6)
    data = pack_e2m1(codes.reshape(rp, cp))[:r, : c // 2].contiguous()
    return data, scale


def quantize_blocks_pow2(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 (pow_2_scales, 1x32 blocks): scale = 2^ceil(log2(block_amax / 6)) with the exponent
    clamped to [-127, 127] (an fp32 scale, TE's reference keeps it unencoded); codes of x / scale.
    Returns (packed data [R, C / 2], fp32 scales [R, ceil(C / 32)])."""
    r, c = t.shape
    cp = -(-c // 32) * 32
    x = _pad(t, r, cp).reshape(r, cp // 32, 32)
    dec = x.abs().amax(dim=-1, keepdim=True) / 6.0
    exp = torch.clamp(torch.ceil(torch.log2(dec)), -127.0, 127.0)
    scale = torch.pow(torch.tensor(2.0, device=t.device), exp)
    codes = encode_e2m1(torch.clamp(x * (1.0 / scale), -6.0, 6.0))
    data = pack_e2m1(codes.reshape(r, cp))[:, : c // 2].contiguous()
    return data, scale.squeeze(-1)
