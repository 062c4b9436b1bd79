"""Flash-attention forward in Triton (FlashAttention-2 schedule) with the conventions of the CPU
flash kernel (common/fused_attn/flash_fwd_cpu.cpp): O and natural-log LSE [b, h, max_seqlen_q], the
masking rule of AttnParams::key_range, the Philox dropout of philox.h; plus the helpers the
backward kernels share (sequence bounds, per-row key ranges, tile pointers).

Numerics: fp32 accumulation; online softmax in base 2 (logits pre-multiplied by
sm_scale * log2(e), so each exponential is one exp2); the probabilities are rounded to the input
dtype before the P.V dot, as FlashAttention-2 and the CPU kernel's bf16 path do; the running sum
takes the probabilities before dropout, the dot the dropped and 1/(1-p)-scaled ones (the CPU
kernel's order). Outputs:
  query row with kept keys   O = softmax . V, LSE = max + log(sum)
  row with no kept key       O = 0, LSE = -inf (e.g. a top-left causal row of s_q > s_kv)
  row past len_q (padding)   O = 0 for bshd / sbhd (thd: no such token, nothing written),
                             LSE = -inf (LSE rows always go up to max_seqlen_q)
Key blocks outside the union of the block's rows' ranges are never visited: a causal mask visits
about half the blocks.
"""

import triton
import triton.language as tl

from .philox import dropout_keep, dropout_positions, load_rng

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def seq_bounds(CuSeqlens, b, max_seqlen, varlen, is_thd):
    """(length, first token index) of sequence b: from CuSeqlens when varlen (read only then),
    else (max_seqlen, 0); the first token is CuSeqlens[b] only for thd (bshd/sbhd padding keeps
    sequence b at its batch stride)."""
    use_cu = varlen != 0
    start = tl.load(CuSeqlens + b, mask=use_cu, other=0)
    end = tl.load(CuSeqlens + b + 1, mask=use_cu, other=0)
    length = tl.where(use_cu, end - start, max_seqlen)
    tok0 = tl.where(is_thd != 0, start, 0)
    return length, tok0


@triton.jit
def key_range(i, seqlen_q, seqlen_kv, window_left, window_right, bottom_right):
    """Kept keys [lo, hi) of query rows i (AttnParams::key_range, clamped to [0, seqlen_kv]);
    empty when lo >= hi. off = seqlen_kv - seqlen_q aligns the window bottom-right. Windows are
    compared before i + off -/+ window is formed (as the CPU kernel does), so a window up to
    INT32_MAX cannot overflow: one longer than the sequences is unbounded."""
    a = i + tl.where(bottom_right != 0, seqlen_kv - seqlen_q, 0)
    lo = tl.where((window_left >= 0) & (window_left < a), a - window_left, 0)
    hi = tl.where(
        (window_right >= 0) & (window_right < seqlen_kv - 1 - a), a + window_right + 1, seqlen_kv
    )
    return lo, hi


@triton.jit
def tile_ptrs(Base, b, tok0, hd, stride_b, stride_h, stride_s, offs_s, offs_d):
    """Pointers [len(offs_s), len(offs_d)] of tokens offs_s of sequence b (first token tok0), head
    hd: Base + b * stride_b + (tok0 + s) * stride_s + hd * stride_h + d, in int64."""
    row = b.to(tl.int64) * stride_b + tl.cast(hd, tl.int64) * stride_h  # hd: a loop index too
    tok = (tok0 + offs_s).to(tl.int64) * stride_s
    return Base + row + tok[:, None] + offs_d[None, :]


@triton.jit
def attn_fwd(
    Q,
    K,
    V,
    Out,
    LSE,
    CuSeqlensQ,
    CuSeqlensKV,
    RngState,
    sm_scale,
    keep_scale,
    dropout_threshold,
    stride_q_b,
    stride_q_h,
    stride_q_s,
    stride_k_b,
    stride_k_h,
    stride_k_s,
    stride_v_b,
    stride_v_h,
    stride_v_s,
    stride_o_b,
    stride_o_h,
    stride_o_s,
    num_heads,
    num_heads_kv,
    max_seqlen_q,
    max_seqlen_kv,
    head_dim,
    varlen,
    is_thd,
    window_left,
    window_right,
    bottom_right,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program: BLOCK_M query rows of one (sequence, head). Grid (cdiv(max_seqlen_q,
    BLOCK_M), b * num_heads)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_heads
    h = bh % num_heads
    hk = h // (num_heads // num_heads_kv)
    seqlen_q, tok0_q = seq_bounds(CuSeqlensQ, b, max_seqlen_q, varlen, is_thd)
    seqlen_kv, tok0_kv = seq_bounds(CuSeqlensKV, b, max_seqlen_kv, varlen, is_thd)

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    row_ok = offs_m < seqlen_q

    # Per-row kept ranges (rows past the sequence: empty) and the block's key-block span.
    lo, hi = key_range(offs_m, seqlen_q, seqlen_kv, window_left, window_right, bottom_right)
    hi = tl.where(row_ok, hi, 0)
    lo = tl.where(row_ok, lo, 0)
    last = tl.minimum(start_m + BLOCK_M, seqlen_q) - 1
    blk_lo, _ = key_range(start_m, seqlen_q, seqlen_kv, window_left, window_right, bottom_right)
    _, blk_hi = key_range(last, seqlen_q, seqlen_kv, window_left, window_right, bottom_right)
    blk_hi = tl.where(start_m < seqlen_q, blk_hi, 0)
    blk_lo = (blk_lo // BLOCK_N) * BLOCK_N

    q = tl.load(
        tile_ptrs(Q, b, tok0_q, h, stride_q_b, stride_q_h, stride_q_s, offs_m, offs_d),
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    use_dropout = dropout_threshold != 0
    seed, offset = load_rng(RngState, use_dropout)
    qk_scale = sm_scale * LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(blk_lo, blk_hi, BLOCK_N):
        offs_n = start_n + offs_n0
        kv_ok = (offs_n < seqlen_kv)[:, None] & d_ok[None, :]
        k = tl.load(
            tile_ptrs(K, b, tok0_kv, hk, stride_k_b, stride_k_h, stride_k_s, offs_n, offs_d),
            mask=kv_ok,
            other=0.0,
        )
        qk = tl.dot(q, tl.trans(k))
        kept = (offs_n[None, :] >= lo[:, None]) & (offs_n[None, :] < hi[:, None])
        s = tl.where(kept, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with nothing kept so far keeps m = -inf; subtract 0 instead (exp2(-inf) = 0).
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if use_dropout:
            pos = dropout_positions(
                bh, max_seqlen_q, max_seqlen_kv, offs_m[:, None], offs_n[None, :]
            )
            keep = dropout_keep(seed, offset, pos, dropout_threshold)
            p = tl.where(keep, p * keep_scale, 0.0)
        v = tl.load(
            tile_ptrs(V, b, tok0_kv, hk, stride_v_b, stride_v_h, stride_v_s, offs_n, offs_d),
            mask=kv_ok,
            other=0.0,
        )
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new

    has_keys = l_i > 0.0
    o = acc / tl.where(has_keys, l_i, 1.0)[:, None]  # rows without keys: acc = 0 -> O = 0
    # thd rows past len_q are other sequences' tokens: not ours to write.
    o_rows = tl.where(is_thd != 0, seqlen_q, max_seqlen_q)
    tl.store(
        tile_ptrs(Out, b, tok0_q, h, stride_o_b, stride_o_h, stride_o_s, offs_m, offs_d),
        o.to(Out.dtype.element_ty),
        mask=(offs_m < o_rows)[:, None] & d_ok[None, :],
    )
    lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * LN2, float("-inf"))
    lse_ptrs = LSE + bh.to(tl.int64) * max_seqlen_q + offs_m
    tl.store(lse_ptrs, lse, mask=offs_m < max_seqlen_q)
