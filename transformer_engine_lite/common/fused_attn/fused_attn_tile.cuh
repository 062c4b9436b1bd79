// Device building blocks shared by the GPU flash attention forward (fused_attn.cu) and backward
// (fused_attn_bwd.cu): fp32 shared-memory tiles staged from any layout, the register-tiled dot
// products over them, and the per-logit rules of attn_params.h (mask, bias, ALiBi, dropout).
#pragma once

#include <cstdint>
#include <type_traits>

#include "../platform/device.h"
#include "../util/error.h"
#include "../util/half.h"
#include "../util/math.h"
#include "attn_params.h"

namespace nvte {
namespace gpu {
namespace attn {

// Shared tiles are fp32 rows padded by 4 floats: rows stay 16-byte aligned for float4 reads, and
// consecutive rows start 4 banks apart, so the 8 rows a quarter-warp reads hit all 32 banks once.
constexpr int kPad = 4;

// Largest head dim served; heads are bucketed to 64, 128 or 256 (tile sizes below) and padded
// with zeros up to the bucket.
constexpr int64_t kMaxHeadDim = 256;

// Four elements of T moved as one 8- or 16-byte access when rows allow it (rows_vec4).
template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

// Row 0 of sequence bi, head `head` of a Q-like (token_q) or K-like (token_kv) tensor. Consecutive
// tokens of one sequence are st.tok apart in every format, so row i is at + i * st.tok: a tile
// needs one pointer and one stride, not the per-row layout arithmetic.
template <typename T>
__device__ __forceinline__ T *seq_rows_q(const AttnParams &p, T *ptr, const AttnStrides &st,
                                         int64_t bi, int64_t head) {
  return ptr + p.token_q(st, bi, 0) + head * st.head;
}
template <typename T>
__device__ __forceinline__ T *seq_rows_kv(const AttnParams &p, T *ptr, const AttnStrides &st,
                                          int64_t bi, int64_t head) {
  return ptr + p.token_kv(st, bi, 0) + head * st.head;
}

__device__ __forceinline__ float comp(const float4 &v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// Max that lets NaN through (as warp_reduce_max does), so a NaN logit poisons its row like the CPU.
__device__ __forceinline__ float max_nan(float a, float b) { return (b > a || b != b) ? b : a; }

// Rows [0, kRows) of a tile into shared memory as fp32 (row stride kStride): row r < nrows comes
// from src + r * src_stride, columns >= width and rows >= nrows become 0, so padding adds exact
// zeros to every dot product and never carries garbage (0 * NaN) into them. vec4: every row start
// is 4-element aligned (rows_vec4), so full 4-element chunks load as one 8- or 16-byte access.
template <int kRows, int kWidth, int kStride, int kThreads, typename T>
__device__ __forceinline__ void stage_rows(float *dst, const T *src0, int64_t src_stride,
                                           int nrows, int width, bool vec4) {
  constexpr int kChunks = kWidth / 4;
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < nrows && c < width) {
      const T *src = src0 + r * src_stride + c;
      if (vec4 && c + 4 <= width) {
        const Pack4<T> pk = *reinterpret_cast<const Pack4<T> *>(src);
        v = make_float4(to_float(pk.v[0]), to_float(pk.v[1]), to_float(pk.v[2]),
                        to_float(pk.v[3]));
      } else {
        v.x = to_float(src[0]);
        v.y = c + 1 < width ? to_float(src[1]) : 0.0f;
        v.z = c + 2 < width ? to_float(src[2]) : 0.0f;
        v.w = c + 3 < width ? to_float(src[3]) : 0.0f;
      }
    }
    *reinterpret_cast<float4 *>(dst + r * kStride + c) = v;
  }
}

// Stores columns [c, min(c + 4, width)) of one output row from fp32.
template <typename T>
__device__ __forceinline__ void store4(T *dst, const float4 &v, int c, int width, bool vec4) {
  if (c >= width) return;
  if (vec4 && c + 4 <= width) {
    Pack4<T> pk;
    pk.v[0] = from_float<T>(v.x);
    pk.v[1] = from_float<T>(v.y);
    pk.v[2] = from_float<T>(v.z);
    pk.v[3] = from_float<T>(v.w);
    *reinterpret_cast<Pack4<T> *>(dst + c) = pk;
    return;
  }
  dst[c] = from_float<T>(v.x);
  if (c + 1 < width) dst[c + 1] = from_float<T>(v.y);
  if (c + 2 < width) dst[c + 2] = from_float<T>(v.z);
  if (c + 3 < width) dst[c + 3] = from_float<T>(v.w);
}

// s[r][k] = dot(a row ty + r * kTM, b row tx + k * kTN) over the first width4 columns (a multiple
// of 4; the staged padding is zero). Rows are interleaved across threads rather than contiguous so
// that the distinct rows one warp reads at a time (kWarpSize / kTN of a, kTN of b) are
// consecutive, 4 banks apart.
template <int kRM, int kRN, int kTM, int kTN, int kStrideA, int kStrideB>
__device__ __forceinline__ void tile_dot(const float *a, const float *b, int ty, int tx,
                                         int width4, float (&s)[kRM][kRN]) {
#pragma unroll
  for (int r = 0; r < kRM; ++r) {
#pragma unroll
    for (int k = 0; k < kRN; ++k) s[r][k] = 0.0f;
  }
  // Not unrolled: one step already issues kRM * kRN * 4 independent FMAs on kRM + kRN float4
  // loads; unrolling keeps several steps' loads live next to the accumulators, and ptxas then
  // spills to reach its occupancy target.
#pragma unroll 1
  for (int d = 0; d < width4; d += 4) {
    float4 av[kRM], bv[kRN];
#pragma unroll
    for (int r = 0; r < kRM; ++r) {
      av[r] = *reinterpret_cast<const float4 *>(a + (ty + r * kTM) * kStrideA + d);
    }
#pragma unroll
    for (int k = 0; k < kRN; ++k) {
      bv[k] = *reinterpret_cast<const float4 *>(b + (tx + k * kTN) * kStrideB + d);
    }
#pragma unroll
    for (int r = 0; r < kRM; ++r) {
#pragma unroll
      for (int k = 0; k < kRN; ++k) {
        float t = s[r][k];
        t = fmaf(av[r].x, bv[k].x, t);
        t = fmaf(av[r].y, bv[k].y, t);
        t = fmaf(av[r].z, bv[k].z, t);
        t = fmaf(av[r].w, bv[k].w, t);
        s[r][k] = t;
      }
    }
  }
}

__device__ __forceinline__ void fma4(float4 &acc, float a, const float4 &b) {
  acc.x = fmaf(a, b.x, acc.x);
  acc.y = fmaf(a, b.y, acc.y);
  acc.z = fmaf(a, b.z, acc.z);
  acc.w = fmaf(a, b.w, acc.w);
}

__device__ __forceinline__ float4 scale4(const float4 &v, float s) {
  return make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
}

// The logit of one (sequence, head) pair: scale, then the post-scale bias or ALiBi. Built once per
// (sequence, head) in a block; logit() is called per (i, j).
template <typename T>
struct LogitRules {
  const T *bias = nullptr;  // post_scale_bias plane of (bi, hi): [s_q, s_kv]
  int64_t bias_ld = 0;      // s_kv
  float slope = 0.0f;       // ALiBi slope of (bi, hi); 0 without ALiBi
  bool alibi = false;
  float scale = 1.0f;
  int sq = 0, skv = 0;  // this sequence's lengths

  __device__ __forceinline__ LogitRules(const AttnParams &p, int64_t bi, int64_t hi, int sq_,
                                        int skv_)
      : scale(p.scale), sq(sq_), skv(skv_) {
    if (p.bias_type == NVTE_POST_SCALE_BIAS && p.bias != nullptr) {
      const int64_t bb = p.bias_b == 1 ? 0 : bi, bh = p.bias_h == 1 ? 0 : hi;
      bias = static_cast<const T *>(p.bias) + (bb * p.bias_h + bh) * p.s_q * p.s_kv;
      bias_ld = p.s_kv;
    } else if (p.bias_type == NVTE_ALIBI) {
      alibi = true;
      slope = p.alibi_slope(bi, hi);
    }
  }

  // Scaled, biased logit of raw dot product `dot` at (i, j), both inside the sequence.
  __device__ __forceinline__ float logit(float dot, int i, int j) const {
    float x = dot * scale;
    if (bias != nullptr) x += to_float(bias[static_cast<int64_t>(i) * bias_ld + j]);
    if (alibi) {
      // alibi_bias in int arithmetic: the same integer distance (|i + skv - sq - j| < 2^31 here)
      // converted to the same float, without the 64-bit add / abs / convert per logit.
      int dist = i + skv - sq - j;
      dist = dist < 0 ? -dist : dist;
      x += -slope * static_cast<float>(dist);
    }
    return x;
  }
};

// Dropout of one (sequence, head): keep() regenerates the forward's decision for (i, j). Seed and
// offset come from rng_state in device memory when the call passed one (AttnParams::rng_state).
struct DropoutRule {
  bool on = false;
  float rescale = 1.0f;  // 1 / (1 - p) on kept entries
  uint64_t seed = 0, offset = 0;
  int64_t bi = 0, hi = 0;

  __device__ __forceinline__ DropoutRule(const AttnParams &p, int64_t b, int64_t h)
      : on(p.dropout > 0.0f), bi(b), hi(h) {
    if (!on) return;
    rescale = 1.0f / (1.0f - p.dropout);
    // Fields first, then the override: written as a ternary, AMDGPU's clang selects between the
    // two addresses and copies the fields to a private array (promoted to LDS) to load through.
    seed = p.seed;
    offset = p.offset;
    if (p.rng_state != nullptr) {
      seed = static_cast<uint64_t>(p.rng_state[0]);
      offset = static_cast<uint64_t>(p.rng_state[1]);
    }
  }
  // dropout_keep's decision, with the draw picked by selects: dropout_keep indexes the Philox
  // result with pos & 3, which on the GPU puts the four words in local memory (a 16-byte stack
  // frame and four stores per logit). The params are passed back in rather than pointed to: taking
  // a kernel parameter's address would make the compiler copy the whole struct to local memory.
  __device__ __forceinline__ bool keep(const AttnParams &p, int i, int j) const {
    if (!on) return true;
    const uint64_t pos = p.dropout_pos(bi, hi, i, j);
    const Philox4 r = dropout_block(seed, offset, pos >> 2);
    const uint32_t w = static_cast<uint32_t>(pos & 3);
    const uint32_t draw = w == 0 ? r.v[0] : (w == 1 ? r.v[1] : (w == 2 ? r.v[2] : r.v[3]));
    return draw >= p.dropout_thresh;
  }
};

// Kept key range [*lo, *hi) of row i as ints (AttnParams::key_range; the bounds lie in [0, skv]
// or form an empty range, and sequence lengths are below 2^30, checked by the launchers).
__device__ __forceinline__ void key_range(const AttnParams &p, int i, int sq, int skv, int *lo,
                                          int *hi) {
  int64_t l, h;
  p.key_range(i, sq, skv, &l, &h);
  *lo = static_cast<int>(l < 0 ? 0 : l);
  *hi = static_cast<int>(h < 0 ? 0 : h);
}

// Query rows [*i0, *i1) of a sequence (lengths sq, skv) whose kept key range meets keys [n0, n1)
// (n0 < n1 <= skv), from AttnParams::key_range: lo_i < n1 needs i < n1 - off + left, hi_i > n0
// needs i >= n0 - off - right (both bounds are monotone in i, so the rows form one interval).
__device__ __forceinline__ void query_range(const AttnParams &p, int n0, int n1, int sq, int skv,
                                            int *i0, int *i1) {
  const int64_t off = p.bottom_right ? skv - sq : 0;
  int64_t a = 0, b = sq;
  // Compared as window < bound: no overflow for any int64 window size.
  if (p.win_right >= 0 && p.win_right < n0 - off) a = n0 - off - p.win_right;
  if (p.win_left >= 0 && p.win_left < b - n1 + off) b = n1 - off + p.win_left;
  *i0 = static_cast<int>(a);
  *i1 = static_cast<int>(b > a ? b : a);
}

// ---------------------------------------------------------------- host side
// Whether every row of a tensor starts 4-element aligned: base pointer and all strides.
inline bool rows_vec4(const void *ptr, const AttnStrides &s, size_t elem_bytes) {
  return ptr != nullptr && reinterpret_cast<uintptr_t>(ptr) % (4 * elem_bytes) == 0 &&
         s.tok % 4 == 0 && s.batch % 4 == 0 && s.head % 4 == 0;
}

// Runs f(std::integral_constant<int, D>{}) with the head-dim bucket D (64, 128, 256) that holds
// both head dims of p.
template <typename F>
void dispatch_head_dim(const AttnParams &p, F &&f) {
  const int64_t d = p.d_qk > p.d_v ? p.d_qk : p.d_v;
  NVTE_CHECK_SUPPORTED(p.d_qk >= 1 && p.d_v >= 1 && d <= kMaxHeadDim,
                       "GPU flash attention: expected head dims in [1, ", kMaxHeadDim,
                       "], got d_qk=", p.d_qk, " d_v=", p.d_v);
  if (d <= 64) {
    f(std::integral_constant<int, 64>{});
  } else if (d <= 128) {
    f(std::integral_constant<int, 128>{});
  } else {
    f(std::integral_constant<int, 256>{});
  }
}

// Grid dimension y/z limit of both runtimes.
constexpr int64_t kMaxGridYZ = 65535;
// Sequence-local indices are ints: lengths, and sums of two of them, must fit.
constexpr int64_t kMaxSeqLen = int64_t{1} << 30;

// Limits of the GPU kernels' indexing, as clear errors.
inline void check_gpu_limits(const AttnParams &p) {
  NVTE_CHECK_SUPPORTED(p.h <= kMaxGridYZ && p.b <= kMaxGridYZ, "GPU flash attention: expected at "
                       "most ", kMaxGridYZ, " heads and sequences, got h=", p.h, " b=", p.b);
  NVTE_CHECK_SUPPORTED(p.s_q < kMaxSeqLen && p.s_kv < kMaxSeqLen, "GPU flash attention: expected "
                       "sequence lengths below ", kMaxSeqLen, ", got s_q=", p.s_q, " s_kv=",
                       p.s_kv);
}

}  // namespace attn
}  // namespace gpu
}  // namespace nvte
