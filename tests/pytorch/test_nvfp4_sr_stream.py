"""NVFP4 stochastic rounding, bit for bit: every E2M1 code of both copies equals the one the
documented random stream (README "NVFP4"; nvfp4_math.h nvfp4_sr_block) picks, computed here with an
independent numpy Philox4x32-10. Element idx (row-major in the copy being written, copy 0 row-wise,
1 column-wise) takes lane idx % 4 of the Philox block with counter (q lo, q hi ^ copy << 31, offset
lo, offset hi), q = idx // 4, key (seed lo, seed hi); its top 24 bits u24 round |v| up from the grid
point below to the one above iff u24 < (|v| - lo) / (hi - lo) * 2^24. The kernel computes one
Philox block per four elements; shapes whose row length is not a multiple of 4 make a block span
two rows, which this pins down (the bytes must not depend on how the kernel walks the stream)."""

import numpy as np
import pytest
import torch

from transformer_engine_lite.pytorch import NVFP4Quantizer

GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
M32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c, k0, k1):
    """Philox4x32-10 (Salmon et al. SC'11) over arrays of uint64-held 32-bit words."""
    c = [w.astype(np.uint64) for w in c]
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [((p1 >> np.uint64(32)) ^ c[1] ^ k0) & M32, p1 & M32,
             ((p0 >> np.uint64(32)) ^ c[3] ^ k1) & M32, p0 & M32]
        k0 = (k0 + np.uint64(0x9E3779B9)) & M32
        k1 = (k1 + np.uint64(0xBB67AE85)) & M32
    return c


def philox_known_answer():
    # Random123's published known-answer vector for philox4x32_10 (counter and key all ones).
    ones = np.full(1, 0xFFFFFFFF, dtype=np.uint64)
    out = philox4x32_10([ones] * 4, 0xFFFFFFFF, 0xFFFFFFFF)
    return [int(w[0]) for w in out]


def test_philox_oracle_known_answer():
    assert philox_known_answer() == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def draws(n_rows, n_cols, seed, offset, copy):
    """u24 of every element of an [n_rows, n_cols] copy."""
    idx = np.arange(n_rows * n_cols, dtype=np.uint64)
    q = idx >> np.uint64(2)
    zeros = np.zeros_like(q)
    ctr = [q & M32, (q >> np.uint64(32)) ^ np.uint64(copy << 31),
           zeros + np.uint64(offset & 0xFFFFFFFF), zeros + np.uint64(offset >> 32)]
    words = np.stack(philox4x32_10(ctr, seed & 0xFFFFFFFF, seed >> 32), -1)
    lane = (idx & np.uint64(3)).astype(np.int64)
    return (words[np.arange(idx.size), lane] >> np.uint64(8)).reshape(n_rows, n_cols)


def sr_codes(x, scale_grid, amax, u24):
    """Expected codes of the float64 matrix x (input-dtype values) with the kernel's block scales
    (TE's encode factor 1 / (e4m3 * (1 / S_enc)), S_enc = 2688 / amax, each step one fp32 op)."""
    f32 = lambda a: np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)  # noqa
    m, n = x.shape
    s_enc = f32(2688.0 / amax) if amax > 0 else f32(np.finfo(np.float32).max)
    s_dec = f32(1.0 / s_enc)
    e4m3 = torch.from_numpy(scale_grid[:m, : (n + 15) // 16]).view(torch.float8_e4m3fn)
    sc = e4m3.to(torch.float64).numpy().repeat(16, 1)[:, :n]
    enc = np.minimum(f32(1.0 / f32(sc * s_dec)), np.finfo(np.float32).max)
    v = np.clip(f32(x * enc), -6.0, 6.0)
    mag = np.abs(v)
    k = np.clip((mag[..., None] >= GRID[1:]).sum(-1), 0, 7)
    lo, hi = GRID[k], GRID[np.minimum(k + 1, 7)]
    p = np.where(k < 7, (mag - lo) / np.where(k < 7, hi - lo, 1.0), 0.0)
    up = (k < 7) & (u24.astype(np.float64) < p * 16777216.0)
    code = (k + up).astype(np.uint8)
    code = np.where(np.isnan(v) | (mag == 0), 0, code)
    return (code | np.where(v < 0, 8, 0)).astype(np.uint8)


def unpack(q, n):
    q = q.reshape(-1, n // 2).numpy()
    out = np.empty((q.shape[0], n), dtype=np.uint8)
    out[:, 0::2], out[:, 1::2] = q & 15, q >> 4
    return out


@pytest.mark.parametrize("shape", [(30, 18), (64, 48), (3, 10, 34), (2, 46)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("two_d", [False, True])
def test_sr_codes_follow_the_documented_stream(shape, dtype, two_d):
    torch.manual_seed(11)
    x = (torch.randn(shape) * 4).to(dtype)
    x.view(-1)[5] = 0.0
    x.view(-1)[7] = -0.0
    torch.manual_seed(2024)
    seed, offset = torch.randint(-(2**62), 2**62, (2,), dtype=torch.int64).tolist()
    torch.manual_seed(2024)  # the quantizer draws the same (seed, offset) pair
    t = NVFP4Quantizer(stochastic_rounding=True, with_2d_quantization=two_d)(x)
    seed, offset = seed & (2**64 - 1), offset & (2**64 - 1)
    x2 = x.reshape(-1, shape[-1]).double().numpy()
    rows, cols = x2.shape
    for copy, mat, data, grid, amax in (
            (0, x2, t._rowwise_data, t._rowwise_scale_inv, t._amax_rowwise),
            (1, np.ascontiguousarray(x2.T), t._columnwise_data, t._columnwise_scale_inv,
             t._amax_columnwise)):
        r, c = mat.shape
        want = sr_codes(mat, grid.numpy(), float(amax), draws(r, c, seed, offset, copy))
        got = unpack(data, c)
        bad = np.argwhere(got != want)
        assert bad.size == 0, (copy, bad[:4], got[tuple(bad[0])], want[tuple(bad[0])])
    # the stream matters: another seed changes some codes
    t2 = NVFP4Quantizer(stochastic_rounding=True, with_2d_quantization=two_d)(x)
    assert not torch.equal(t._rowwise_data, t2._rowwise_data)
