"""Flash-attention backward in Triton, the CPU flash kernel's math (common/fused_attn/
flash_bwd_cpu.cpp) in three deterministic kernels (no atomics):
  attn_bwd_preprocess  Delta = rowsum(dO * O), fp32 [b, h, max_seqlen_q] (0 past len_q)
  attn_bwd_dkdv        per (key block, sequence, kv head): dK, dV over every query head of the GQA
                       group and every query block that sees the keys
  attn_bwd_dq          per (query block, sequence, head): dQ over the key blocks it sees
From the forward's natural-log LSE: P = exp(scale q.k - lse) on kept keys (0 elsewhere and on rows
with LSE = -inf), dP = dO.V^T (dropped entries 0, kept ones x keep_scale), dS = P (dP - Delta),
dV = P_dropped^T.dO, dK = scale dS^T.Q, dQ = scale dS.K. P_dropped and dS are rounded to the input
dtype before their dots (FlashAttention-2; the CPU kernel's bf16 path does the same). Rows past
len_q get dQ = 0 and keys past len_kv dK = dV = 0 in bshd / sbhd; thd writes only the sequence's
own tokens. The dropout mask is regenerated from RngState (philox.py), never stored.
"""

import triton
import triton.language as tl

from .flash_fwd import LOG2E, key_range, seq_bounds, tile_ptrs
from .philox import dropout_keep, dropout_positions, load_rng


@triton.jit
def attn_bwd_preprocess(
    Out,
    dO,
    Delta,
    CuSeqlensQ,
    stride_o_b,
    stride_o_h,
    stride_o_s,
    stride_do_b,
    stride_do_h,
    stride_do_s,
    num_heads,
    max_seqlen_q,
    head_dim,
    varlen,
    is_thd,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Delta rows of BLOCK_M queries of one (sequence, head); grid (cdiv(max_seqlen_q, BLOCK_M),
    b * num_heads). BLOCK_N is unused (one constexpr set for every kernel)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_heads
    h = bh % num_heads
    seqlen_q, tok0_q = seq_bounds(CuSeqlensQ, b, max_seqlen_q, varlen, is_thd)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (offs_m < seqlen_q)[:, None] & (offs_d < head_dim)[None, :]
    o = tl.load(
        tile_ptrs(Out, b, tok0_q, h, stride_o_b, stride_o_h, stride_o_s, offs_m, offs_d),
        mask=ok,
        other=0.0,
    )
    do = tl.load(
        tile_ptrs(dO, b, tok0_q, h, stride_do_b, stride_do_h, stride_do_s, offs_m, offs_d),
        mask=ok,
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(Delta + bh.to(tl.int64) * max_seqlen_q + offs_m, delta, mask=offs_m < max_seqlen_q)


@triton.jit
def attn_bwd_dkdv(
    Q,
    K,
    V,
    dO,
    LSE,
    Delta,
    dK,
    dV,
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
    stride_do_b,
    stride_do_h,
    stride_do_s,
    stride_dk_b,
    stride_dk_h,
    stride_dk_s,
    stride_dv_b,
    stride_dv_h,
    stride_dv_s,
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
    """dK, dV of BLOCK_N keys of one (sequence, kv head); grid (cdiv(max_seqlen_kv, BLOCK_N),
    b * num_heads_kv). Works on transposed tiles (keys x queries) so dK and dV accumulate without
    transposing P or dS."""
    pid_n = tl.program_id(0)
    bhk = tl.program_id(1)
    b = bhk // num_heads_kv
    hk = bhk % num_heads_kv
    group = num_heads // num_heads_kv
    seqlen_q, tok0_q = seq_bounds(CuSeqlensQ, b, max_seqlen_q, varlen, is_thd)
    seqlen_kv, tok0_kv = seq_bounds(CuSeqlensKV, b, max_seqlen_kv, varlen, is_thd)

    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    kv_ok = (offs_n < seqlen_kv)[:, None] & d_ok[None, :]
    k = tl.load(
        tile_ptrs(K, b, tok0_kv, hk, stride_k_b, stride_k_h, stride_k_s, offs_n, offs_d),
        mask=kv_ok,
        other=0.0,
    )
    v = tl.load(
        tile_ptrs(V, b, tok0_kv, hk, stride_v_b, stride_v_h, stride_v_s, offs_n, offs_d),
        mask=kv_ok,
        other=0.0,
    )

    # Query rows that keep any key of [start_n, last_n]: key_range inverted. Key j is kept by row
    # i iff i + off - left <= j <= i + off + right, i.e. j - off - right <= i <= j - off + left
    # (windows compared before they are added: no int32 overflow, as in key_range).
    off = tl.where(bottom_right != 0, seqlen_kv - seqlen_q, 0)
    first = start_n - off
    last = tl.minimum(start_n + BLOCK_N, seqlen_kv) - 1 - off
    row_lo = tl.where((window_right >= 0) & (window_right < first), first - window_right, 0)
    row_hi = tl.where(
        (window_left >= 0) & (window_left < seqlen_q - 1 - last), last + window_left + 1, seqlen_q
    )
    row_hi = tl.where(start_n < seqlen_kv, row_hi, 0)
    row_lo = (row_lo // BLOCK_M) * BLOCK_M

    use_dropout = dropout_threshold != 0
    seed, offset = load_rng(RngState, use_dropout)
    qk_scale = sm_scale * LOG2E
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for h in range(hk * group, hk * group + group):
        bh = b * num_heads + h
        for start_m in range(row_lo, row_hi, BLOCK_M):
            offs_m = start_m + offs_m0
            row_ok = offs_m < seqlen_q
            q_ok = row_ok[:, None] & d_ok[None, :]
            q = tl.load(
                tile_ptrs(Q, b, tok0_q, h, stride_q_b, stride_q_h, stride_q_s, offs_m, offs_d),
                mask=q_ok,
                other=0.0,
            )
            do = tl.load(
                tile_ptrs(dO, b, tok0_q, h, stride_do_b, stride_do_h, stride_do_s, offs_m, offs_d),
                mask=q_ok,
                other=0.0,
            )
            stat = bh.to(tl.int64) * max_seqlen_q + offs_m
            lse = tl.load(LSE + stat, mask=row_ok, other=0.0)
            delta = tl.load(Delta + stat, mask=row_ok, other=0.0)
            lo, hi = key_range(offs_m, seqlen_q, seqlen_kv, window_left, window_right, bottom_right)
            # Rows past len_q and rows with no kept key (LSE = -inf) contribute nothing.
            row_live = row_ok & (lse != float("-inf"))
            kept = (
                row_live[None, :]
                & (offs_n[:, None] >= lo[None, :])
                & (offs_n[:, None] < hi[None, :])
            )
            qkT = tl.dot(k, tl.trans(q))  # [BLOCK_N, BLOCK_M]
            pT = tl.where(kept, tl.exp2(qkT * qk_scale - (lse * LOG2E)[None, :]), 0.0)
            dpT = tl.dot(v, tl.trans(do))
            pT_drop = pT
            if use_dropout:
                pos = dropout_positions(
                    bh, max_seqlen_q, max_seqlen_kv, offs_m[None, :], offs_n[:, None]
                )
                keep = dropout_keep(seed, offset, pos, dropout_threshold)
                pT_drop = tl.where(keep, pT * keep_scale, 0.0)
                dpT = tl.where(keep, dpT * keep_scale, 0.0)
            dv = tl.dot(pT_drop.to(do.dtype), do, dv)
            dsT = pT * (dpT - delta[None, :])
            dk = tl.dot(dsT.to(q.dtype), q, dk)

    dk = dk * sm_scale
    # thd keys past len_kv are other sequences' tokens; bshd/sbhd padded keys get 0.
    kv_rows = tl.where(is_thd != 0, seqlen_kv, max_seqlen_kv)
    out_ok = (offs_n < kv_rows)[:, None] & d_ok[None, :]
    tl.store(
        tile_ptrs(dK, b, tok0_kv, hk, stride_dk_b, stride_dk_h, stride_dk_s, offs_n, offs_d),
        dk.to(dK.dtype.element_ty),
        mask=out_ok,
    )
    tl.store(
        tile_ptrs(dV, b, tok0_kv, hk, stride_dv_b, stride_dv_h, stride_dv_s, offs_n, offs_d),
        dv.to(dV.dtype.element_ty),
        mask=out_ok,
    )


@triton.jit
def attn_bwd_dq(
    Q,
    K,
    V,
    dO,
    LSE,
    Delta,
    dQ,
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
    stride_do_b,
    stride_do_h,
    stride_do_s,
    stride_dq_b,
    stride_dq_h,
    stride_dq_s,
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
    """dQ of BLOCK_M query rows of one (sequence, head); grid (cdiv(max_seqlen_q, BLOCK_M),
    b * num_heads). Visits the same key blocks as the forward."""
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
    q_ok = row_ok[:, None] & d_ok[None, :]
    q = tl.load(
        tile_ptrs(Q, b, tok0_q, h, stride_q_b, stride_q_h, stride_q_s, offs_m, offs_d),
        mask=q_ok,
        other=0.0,
    )
    do = tl.load(
        tile_ptrs(dO, b, tok0_q, h, stride_do_b, stride_do_h, stride_do_s, offs_m, offs_d),
        mask=q_ok,
        other=0.0,
    )
    stat = bh.to(tl.int64) * max_seqlen_q + offs_m
    lse = tl.load(LSE + stat, mask=row_ok, other=0.0)
    delta = tl.load(Delta + stat, mask=row_ok, other=0.0)
    row_live = row_ok & (lse != float("-inf"))
    lo, hi = key_range(offs_m, seqlen_q, seqlen_kv, window_left, window_right, bottom_right)
    lo = tl.where(row_live, lo, 0)
    hi = tl.where(row_live, hi, 0)
    last = tl.minimum(start_m + BLOCK_M, seqlen_q) - 1
    blk_lo, _ = key_range(start_m, seqlen_q, seqlen_kv, window_left, window_right, bottom_right)
    _, blk_hi = key_range(last, seqlen_q, seqlen_kv, window_left, window_right, bottom_right)
    blk_hi = tl.where(start_m < seqlen_q, blk_hi, 0)
    blk_lo = (blk_lo // BLOCK_N) * BLOCK_N

    use_dropout = dropout_threshold != 0
    seed, offset = load_rng(RngState, use_dropout)
    qk_scale = sm_scale * LOG2E
    lse2 = lse * LOG2E
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(blk_lo, blk_hi, BLOCK_N):
        offs_n = start_n + offs_n0
        kv_ok = (offs_n < seqlen_kv)[:, None] & d_ok[None, :]
        k = tl.load(
            tile_ptrs(K, b, tok0_kv, hk, stride_k_b, stride_k_h, stride_k_s, offs_n, offs_d),
            mask=kv_ok,
            other=0.0,
        )
        v = tl.load(
            tile_ptrs(V, b, tok0_kv, hk, stride_v_b, stride_v_h, stride_v_s, offs_n, offs_d),
            mask=kv_ok,
            other=0.0,
        )
        kept = (offs_n[None, :] >= lo[:, None]) & (offs_n[None, :] < hi[:, None])
        qk = tl.dot(q, tl.trans(k))
        p = tl.where(kept, tl.exp2(qk * qk_scale - lse2[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        if use_dropout:
            pos = dropout_positions(
                bh, max_seqlen_q, max_seqlen_kv, offs_m[:, None], offs_n[None, :]
            )
            keep = dropout_keep(seed, offset, pos, dropout_threshold)
            dp = tl.where(keep, dp * keep_scale, 0.0)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)

    dq = dq * sm_scale
    q_rows = tl.where(is_thd != 0, seqlen_q, max_seqlen_q)
    tl.store(
        tile_ptrs(dQ, b, tok0_q, h, stride_dq_b, stride_dq_h, stride_dq_s, offs_m, offs_d),
        dq.to(dQ.dtype.element_ty),
        mask=(offs_m < q_rows)[:, None] & d_ok[None, :],
    )
