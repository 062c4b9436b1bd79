"""Dropout keep mask in Triton, bit for bit the one of common/util/philox.h (Philox4x32-10) at the
positions of AttnParams::dropout_pos (common/fused_attn/attn_params.h), so the Triton kernels, the
CPU flash kernel and the CUDA kernels drop the same logits for the same rng_state.

Every 32x32 -> 64 bit product is done in uint64 and truncated, and the Weyl key increments are
summed in uint64 and masked: no step relies on 32-bit wrap-around, which behaves the same compiled
(LLVM) and interpreted (numpy) without overflow warnings.
"""

import triton
import triton.language as tl

# Philox4x32 multipliers and Weyl key increments (Salmon et al., SC'11), as philox.h.
PHILOX_M0: tl.constexpr = tl.constexpr(0xD2511F53)
PHILOX_M1: tl.constexpr = tl.constexpr(0xCD9E8D57)
PHILOX_W0: tl.constexpr = tl.constexpr(0x9E3779B9)
PHILOX_W1: tl.constexpr = tl.constexpr(0xBB67AE85)
LOW32: tl.constexpr = tl.constexpr(0xFFFFFFFF)


@triton.jit
def dropout_keep(seed, offset, pos, threshold):
    """Whether the logits at linear positions `pos` (uint64 tensor) are kept: draw r.v[pos & 3] of
    the Philox block with counter {g lo, g hi, offset lo, offset hi}, g = pos >> 2, key = seed
    {lo, hi}; kept iff draw >= threshold (uint32). seed, offset: uint64 scalars."""
    g = pos >> 2
    c0 = g.to(tl.uint32)  # uint64 -> uint32 truncates: the low word
    c1 = (g >> 32).to(tl.uint32)
    zero = tl.zeros_like(c0)
    c2 = zero + offset.to(tl.uint32)
    c3 = zero + (offset >> 32).to(tl.uint32)
    k0 = seed & LOW32
    k1 = seed >> 32
    for _ in tl.static_range(10):
        p0 = c0.to(tl.uint64) * PHILOX_M0
        p1 = c2.to(tl.uint64) * PHILOX_M1
        n0 = (p1 >> 32).to(tl.uint32) ^ c1 ^ k0.to(tl.uint32)
        n1 = p1.to(tl.uint32)
        n2 = (p0 >> 32).to(tl.uint32) ^ c3 ^ k1.to(tl.uint32)
        n3 = p0.to(tl.uint32)
        c0, c1, c2, c3 = n0, n1, n2, n3
        k0 = (k0 + PHILOX_W0) & LOW32
        k1 = (k1 + PHILOX_W1) & LOW32
    lane = pos & 3
    draw = tl.where(lane == 0, c0, tl.where(lane == 1, c1, tl.where(lane == 2, c2, c3)))
    return draw >= threshold.to(tl.uint32)


@triton.jit
def load_rng(RngState, enabled):
    """(seed, offset) as uint64 from int64 [2] = {seed, offset}; zeros without reading when not
    enabled (RngState may then be null)."""
    seed = tl.load(RngState, mask=enabled, other=0).to(tl.uint64, bitcast=True)
    offset = tl.load(RngState + 1, mask=enabled, other=0).to(tl.uint64, bitcast=True)
    return seed, offset


@triton.jit
def dropout_positions(bh, max_seqlen_q, max_seqlen_kv, offs_row, offs_col):
    """Positions ((b * H + h) * max_seqlen_q + i) * max_seqlen_kv + j (AttnParams::dropout_pos) of
    the tile rows offs_row (i, as a column vector [R, 1]) and columns offs_col (j, [1, C]); bh is
    b * H + h. Those of a dense [b, h, s_q, s_kv] tensor, whatever the layout or lengths."""
    row = bh.to(tl.int64) * max_seqlen_q + offs_row.to(tl.int64)
    return (row * max_seqlen_kv + offs_col.to(tl.int64)).to(tl.uint64, bitcast=True)


@triton.jit
def attn_dropout_mask(
    RngState,
    Mask,
    dropout_threshold,
    max_seqlen_q,
    max_seqlen_kv,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Test/debug kernel: uint8 keep mask [b, h, max_seqlen_q, max_seqlen_kv] (1 = kept) as the
    attention kernels draw it. Grid (cdiv(max_seqlen_q, BLOCK_M), b * h)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    seed, offset = load_rng(RngState, True)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    for start_n in range(0, max_seqlen_kv, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        pos = dropout_positions(bh, max_seqlen_q, max_seqlen_kv, offs_m[:, None], offs_n[None, :])
        keep = dropout_keep(seed, offset, pos, dropout_threshold)
        inside = (offs_m[:, None] < max_seqlen_q) & (offs_n[None, :] < max_seqlen_kv)
        tl.store(Mask + pos.to(tl.int64, bitcast=True), keep.to(tl.uint8), mask=inside)
