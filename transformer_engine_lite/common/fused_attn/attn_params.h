// One validated attention problem, as the kernels (CPU and GPU) see it: raw pointers, element
// strides derived from the layout, per-sequence lengths and the mask/window/bias/dropout rules.
// fused_attn.cpp builds it; the kernels only read it. Host+device helpers below define the masking
// and the dropout position once for every backend.
#pragma once

#include <cmath>
#include <cstdint>

#include "../platform/host_device.h"
#include "../util/philox.h"
#include "transformer_engine_lite/fused_attn.h"

namespace nvte {

// Strides in elements. Token i of sequence bi, head hi of a Q/K/V/O-like tensor lives at
//   ptr + tok(bi, i) * stride_tok + hi * stride_h          (element d at + d, contiguous)
// with tok(bi, i) = bi * batch_tokens + i for bshd (batch_tokens = s) ... see AttnParams::token.
struct AttnStrides {
  int64_t tok = 0;    // between consecutive tokens of one sequence
  int64_t batch = 0;  // between sequences (bshd/sbhd); unused for thd (offsets from cu_seqlens)
  int64_t head = 0;   // between heads
};

struct AttnParams {
  // Sizes. s_q / s_kv are max_seqlen_q / max_seqlen_kv; sequence bi has len_q(bi) <= s_q query rows.
  int64_t b = 0, h = 0, h_kv = 0, s_q = 0, s_kv = 0, d_qk = 0, d_v = 0;
  NVTE_QKV_Format format = NVTE_BSHD;
  NVTEDType dtype = kNVTEBFloat16;  // of Q, K, V, O, dO, dQ, dK, dV and a post_scale_bias

  const void *q = nullptr, *k = nullptr, *v = nullptr;
  AttnStrides sq_, sk_, sv_;  // strides of q, k, v (packed layouts interleave them)
  void *o = nullptr;
  AttnStrides so_;  // O, dO, dQ (dense, d_v or d_qk wide: same token/head structure as O)
  float *lse = nullptr;  // [b, h, s_q]; nullptr when not needed

  // Backward.
  const void *d_o = nullptr;
  AttnStrides sdo_;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  AttnStrides sdq_, sdk_, sdv_;

  // Sequence lengths / offsets (int32 [b + 1]); nullptr = every sequence is full length.
  const int32_t *cu_q = nullptr, *cu_kv = nullptr;

  // Masking. Key j of query row i (sequence lengths sq, skv) is kept iff j < skv and
  //   (left < 0 || j >= i + off - left) && (right < 0 || j <= i + off + right),
  // off = bottom_right ? skv - sq : 0. Causal masks arrive here as right = 0.
  bool bottom_right = true;
  int64_t win_left = -1, win_right = -1;

  // Bias: post_scale (bias_ptr, dtype = dtype, [bias_b, bias_h, s_q, s_kv] with bias_b in {1, b},
  // bias_h in {1, h}) or alibi (slopes fp32, slope of (bi, hi) at slopes[bi * slopes_stride_b + hi]).
  NVTE_Bias_Type bias_type = NVTE_NO_BIAS;
  const void *bias = nullptr;
  void *dbias = nullptr;
  int64_t bias_b = 1, bias_h = 1;
  const float *alibi_slopes = nullptr;  // nullptr -> default slopes (alibi_default_slope)
  int64_t slopes_stride_b = 0;

  float scale = 1.0f;
  // Attention sink (fused_attn.h, NVTE_Softmax_Type): off-by-one = a sink logit 0, learnable =
  // softmax_offset[hi] (fp32 [h]). The online softmax starts from it (m = sink, l = 1), so the LSE
  // includes it. d_softmax_offset (fp32 [h], learnable backward only) receives its gradient.
  NVTE_Softmax_Type softmax_type = NVTE_VANILLA_SOFTMAX;
  const float *softmax_offset = nullptr;
  float *d_softmax_offset = nullptr;
  // Dropout: probability p, threshold of util/philox.h, seed/offset read from rng_state.
  float dropout = 0.0f;
  uint32_t dropout_thresh = 0;
  uint64_t seed = 0, offset = 0;
  // GPU tensors: rng_state's device pointer ({seed, offset}, int64). It stays in device memory (the
  // host cannot read it); when set, the GPU kernels take seed and offset from it instead.
  const int64_t *rng_state = nullptr;

  NVTE_HOST_DEVICE bool has_sink() const { return softmax_type != NVTE_VANILLA_SOFTMAX; }
  NVTE_HOST_DEVICE float sink(int64_t hi) const {
    return softmax_type == NVTE_LEARNABLE_SOFTMAX ? softmax_offset[hi] : 0.0f;
  }
  NVTE_HOST_DEVICE int64_t len_q(int64_t bi) const {
    return cu_q ? static_cast<int64_t>(cu_q[bi + 1] - cu_q[bi]) : s_q;
  }
  NVTE_HOST_DEVICE int64_t len_kv(int64_t bi) const {
    return cu_kv ? static_cast<int64_t>(cu_kv[bi + 1] - cu_kv[bi]) : s_kv;
  }
  // Element offset of token i of sequence bi (add head * stride.head) for a tensor with strides st;
  // thd tokens are numbered from the sequence's cu_seqlens entry.
  NVTE_HOST_DEVICE int64_t token_q(const AttnStrides &st, int64_t bi, int64_t i) const {
    return format == NVTE_THD ? (cu_q[bi] + i) * st.tok : bi * st.batch + i * st.tok;
  }
  NVTE_HOST_DEVICE int64_t token_kv(const AttnStrides &st, int64_t bi, int64_t j) const {
    return format == NVTE_THD ? (cu_kv[bi] + j) * st.tok : bi * st.batch + j * st.tok;
  }
  // Kept key range [lo, hi) of query row i (sq, skv: the sequence's lengths); empty when lo >= hi.
  NVTE_HOST_DEVICE void key_range(int64_t i, int64_t sq, int64_t skv, int64_t *lo,
                                  int64_t *hi) const {
    const int64_t off = bottom_right ? skv - sq : 0;
    // Windows may be any size up to INT64_MAX: compare before forming i + off -/+ window, so no
    // signed overflow (a window longer than the sequences is unbounded).
    const int64_t a = i + off;
    int64_t l = 0, r = skv;
    if (win_left >= 0 && win_left < a) l = a - win_left;
    if (win_right >= 0 && win_right < r - 1 - a) r = a + win_right + 1;
    *lo = l;
    *hi = r;
  }
  // ALiBi slope of (bi, hi); TE's default slopes 2^(-8 (hi + 1) / h) when none were given.
  NVTE_HOST_DEVICE float alibi_slope(int64_t bi, int64_t hi) const;
  // Linear dropout position of logit (bi, hi, i, j): positions are those of a dense
  // [b, h, s_q, s_kv] tensor, whatever the layout or lengths.
  NVTE_HOST_DEVICE uint64_t dropout_pos(int64_t bi, int64_t hi, int64_t i, int64_t j) const {
    return ((static_cast<uint64_t>(bi) * h + hi) * s_q + i) * s_kv + j;
  }
};

// TE's default ALiBi slopes: for h a power of two, 2^(-8 (hi + 1) / h); otherwise the slopes of the
// largest power of two m < h, then every other slope of 2m heads for the remaining h - m heads.
// Computed in double on both devices so CPU and GPU agree exactly.
NVTE_HOST_DEVICE float alibi_default_slope(int64_t hi, int64_t h) {
  int64_t m = 1;
  while (m * 2 <= h) m *= 2;
  const double e = hi < m ? 8.0 * static_cast<double>(hi + 1) / static_cast<double>(m)
                          : 8.0 * static_cast<double>(2 * (hi - m) + 1) / static_cast<double>(2 * m);
  return static_cast<float>(exp2(-e));
}

NVTE_HOST_DEVICE float AttnParams::alibi_slope(int64_t bi, int64_t hi) const {
  return alibi_slopes ? alibi_slopes[bi * slopes_stride_b + hi] : alibi_default_slope(hi, h);
}

// ALiBi bias of (i, j): -slope * |i + skv - sq - j| (bottom-right aligned).
NVTE_HOST_DEVICE float alibi_bias(float slope, int64_t i, int64_t j, int64_t sq, int64_t skv) {
  int64_t dist = i + skv - sq - j;
  if (dist < 0) dist = -dist;
  return -slope * static_cast<float>(dist);
}

}  // namespace nvte
