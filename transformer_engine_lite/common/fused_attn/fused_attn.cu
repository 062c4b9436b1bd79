// GPU flash attention forward (FlashAttention-2 style) and the dropout keep mask; semantics of
// attn_params.h / fused_attn_cpu.h. One block per (query tile, head, sequence): the Q tile stays in
// shared memory while K and V tiles of the tile's key range stream through it; online softmax with
// a running max and sum per row, all math in fp32. The backward is in fused_attn_bwd.cu. Head dims
// up to 128 go to the tensor-core forward (fused_attn_fwd_mma.cu) except on AMD GPUs; this kernel
// serves the 256 bucket and AMD.
#include <algorithm>
#include <cmath>

#include "../platform/runtime.h"
#include "../util/dtype_dispatch.h"
#include "fused_attn_gpu.h"
#include "fused_attn_tile.cuh"

namespace nvte {
namespace gpu {

namespace {

using attn::kPad;

// Four warps per block as a 16 x kTN grid over the S tile: thread (ty, tx) owns rows ty + 16 r
// and keys tx + kTN k; the kTN threads of a row are consecutive lanes, so row max / sum are
// kTN-lane shuffles. kTN is a quarter warp: 16 x 8 = 128 threads on CUDA, 16 x 16 = 256 (four
// 64-lane wavefronts) on CDNA, where the shared memory below allows one block per CU and fewer
// than four wavefronts would leave SIMDs idle.
constexpr int kTN = kWarpSize / 4;
constexpr int kTM = 16;
constexpr int kFwdThreads = kTM * kTN;
// At least 3 resident blocks (12 warps) per SM on CUDA: at most 170 registers per thread, which
// the D=64 bucket needs (4 rows x 4 keys of S, 32 accumulator floats, the float4 operands).
constexpr int kFwdMinBlocks = 3;

// Tiles per head-dim bucket, sized for shared memory under 48 KiB (fp32 Q tile + one K/V tile,
// K and V taking turns + P):  D=64: 17.0 + 8.5 + 9.0 KiB; D=128: 16.5 + 16.5 + 4.5 KiB;
// D=256: 16.3 + 16.3 + 1.3 KiB. The O accumulator holds kM * D / kFwdThreads floats per thread:
// 32 on CUDA, 16 on CDNA, in every bucket.
template <int D>
struct FwdTile;
template <>
struct FwdTile<64> {
  static constexpr int kM = 64, kN = 32;
};
template <>
struct FwdTile<128> {
  static constexpr int kM = 32, kN = 32;
};
template <>
struct FwdTile<256> {
  static constexpr int kM = 16, kN = 16;
};

struct FwdAccess {
  bool q_vec4, k_vec4, v_vec4, o_vec4;
};

template <typename T, int D>
__global__ void NVTE_LAUNCH_BOUNDS(kFwdThreads, kFwdMinBlocks)
    flash_attn_fwd_kernel(const AttnParams p, const FwdAccess acc_mode) {
  constexpr int kM = FwdTile<D>::kM, kN = FwdTile<D>::kN;
  constexpr int kS = D + kPad;        // row stride of the Q / K / V tiles
  constexpr int kPS = kN + kPad;      // row stride of the P tile
  constexpr int kRM = kM / kTM;       // rows per thread
  constexpr int kRN = kN / kTN;       // keys per thread
  constexpr int kOC = D / (4 * kTN);  // float4 output chunks per thread and row
  static_assert(kM % kTM == 0 && kN % kTN == 0 && kN % 4 == 0 && D % (4 * kTN) == 0, "tiling");
  static_assert(sizeof(float) * (kM * kS + kN * kS + kM * kPS) <= 48 * 1024, "shared memory");
  // float4 arrays: 16-byte alignment for the vector reads.
  __shared__ float4 q_s4[kM * kS / 4];
  __shared__ float4 kv_s4[kN * kS / 4];
  __shared__ float4 p_s4[kM * kPS / 4];
  float *q_s = reinterpret_cast<float *>(q_s4);
  float *kv_s = reinterpret_cast<float *>(kv_s4);
  float *p_s = reinterpret_cast<float *>(p_s4);

  const int64_t bi = blockIdx.z, hi = blockIdx.y;
  const int64_t hk = hi / (p.h / p.h_kv);
  const int m0 = static_cast<int>(blockIdx.x) * kM;
  const int sq = static_cast<int>(p.len_q(bi)), skv = static_cast<int>(p.len_kv(bi));
  const int tid = threadIdx.x, ty = tid / kTN, tx = tid % kTN;
  float *lse = p.lse != nullptr ? p.lse + (bi * p.h + hi) * p.s_q : nullptr;
  const int dv = static_cast<int>(p.d_v);

  // Rows past the sequence (padding, or a tile past a short thd sequence): O = 0 where the row
  // exists in memory (not for thd, whose tokens stop at the sequence end), LSE = -inf.
  T *const o_seq = attn::seq_rows_q(p, static_cast<T *>(p.o), p.so_, bi, hi);
  if (m0 >= sq) {
    for (int idx = tid; idx < kM * (D / 4); idx += kFwdThreads) {
      const int i = m0 + idx / (D / 4), c = (idx % (D / 4)) * 4;
      if (i >= p.s_q) continue;
      if (c == 0 && lse != nullptr) lse[i] = -INFINITY;
      if (p.format != NVTE_THD) {
        attn::store4(o_seq + i * p.so_.tok, make_float4(0, 0, 0, 0), c, dv, acc_mode.o_vec4);
      }
    }
    return;
  }
  const int mv = sq - m0 < kM ? sq - m0 : kM;

  // Q tile, rows m0 .. m0 + mv.
  const T *q_seq = attn::seq_rows_q(p, static_cast<const T *>(p.q), p.sq_, bi, hi);
  attn::stage_rows<kM, D, kS, kFwdThreads>(q_s, q_seq + m0 * p.sq_.tok, p.sq_.tok, mv,
                                           static_cast<int>(p.d_qk), acc_mode.q_vec4);

  // Key range of the tile: the union of its rows' ranges, [lo(first row), hi(last row)).
  int n_lo, n_hi, unused;
  attn::key_range(p, m0, sq, skv, &n_lo, &unused);
  attn::key_range(p, m0 + mv - 1, sq, skv, &unused, &n_hi);

  // Per-thread row state.
  const attn::LogitRules<T> rules(p, bi, hi, sq, skv);
  const attn::DropoutRule drop(p, bi, hi);
  int row_lo[kRM], row_hi[kRM];
  float m_run[kRM], l_run[kRM];
  float4 acc[kRM][kOC];
#pragma unroll
  for (int r = 0; r < kRM; ++r) {
    const int i = m0 + ty + r * kTM;
    if (i < sq) {
      attn::key_range(p, i, sq, skv, &row_lo[r], &row_hi[r]);
    } else {
      row_lo[r] = row_hi[r] = 0;  // no key kept: contributes nothing, never stored as a row
    }
    // Attention sink (off-by-one / learnable softmax): one more logit without a value row; the
    // running max and sum start from it (l = exp(sink - sink) = 1).
    m_run[r] = p.has_sink() ? p.sink(hi) : -INFINITY;
    l_run[r] = p.has_sink() ? 1.0f : 0.0f;
#pragma unroll
    for (int c = 0; c < kOC; ++c) acc[r][c] = make_float4(0, 0, 0, 0);
  }

  const T *k_seq = attn::seq_rows_kv(p, static_cast<const T *>(p.k), p.sk_, bi, hk);
  const T *v_seq = attn::seq_rows_kv(p, static_cast<const T *>(p.v), p.sv_, bi, hk);
  const int dqk4 = (static_cast<int>(p.d_qk) + 3) & ~3;
  for (int n0 = n_lo; n0 < n_hi; n0 += kN) {
    const int nv = n_hi - n0 < kN ? n_hi - n0 : kN;
    __syncthreads();  // the previous tile's P . V is done with kv_s and p_s
    attn::stage_rows<kN, D, kS, kFwdThreads>(kv_s, k_seq + n0 * p.sk_.tok, p.sk_.tok, nv,
                                             static_cast<int>(p.d_qk), acc_mode.k_vec4);
    __syncthreads();

    float s[kRM][kRN];
    attn::tile_dot<kRM, kRN, kTM, kTN, kS, kS>(q_s, kv_s, ty, tx, dqk4, s);

    // Online softmax: new running max, rescale of the old sum and accumulator by exp(m_old -
    // m_new), unnormalized probabilities exp(x - m_new) into P (dropped ones as 0, kept ones
    // scaled by 1 / (1 - p)); the sum stays un-dropped, as the LSE is of the un-dropped logits.
    // s is overwritten in place: logits, then probabilities.
#pragma unroll
    for (int r = 0; r < kRM; ++r) {
      const int i = m0 + ty + r * kTM;
      float tmax = -INFINITY;
#pragma unroll
      for (int k = 0; k < kRN; ++k) {
        const int j = n0 + tx + k * kTN;
        const bool kept = j >= row_lo[r] && j < row_hi[r];
        s[r][k] = kept ? rules.logit(s[r][k], i, j) : -INFINITY;
        tmax = attn::max_nan(tmax, s[r][k]);
      }
      tmax = warp_reduce_max(tmax, kTN);
      const float m_new = attn::max_nan(m_run[r], tmax);
      // A row with nothing kept yet keeps max -inf; subtracting 0 then leaves every exp at 0
      // instead of NaN from -inf - -inf.
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp_f32(m_run[r] - m_use);
      float tsum = 0.0f;
#pragma unroll
      for (int k = 0; k < kRN; ++k) {
        s[r][k] = exp_f32(s[r][k] - m_use);
        tsum += s[r][k];
      }
      tsum = warp_reduce_sum(tsum, kTN);
      l_run[r] = l_run[r] * alpha + tsum;
      m_run[r] = m_new;
#pragma unroll
      for (int c = 0; c < kOC; ++c) acc[r][c] = attn::scale4(acc[r][c], alpha);
      if (drop.on) {
#pragma unroll
        for (int k = 0; k < kRN; ++k) {
          const int j = n0 + tx + k * kTN;
          if (s[r][k] != 0.0f) s[r][k] = drop.keep(p, i, j) ? s[r][k] * drop.rescale : 0.0f;
        }
      }
    }
    __syncthreads();  // every thread is done reading K from kv_s
#pragma unroll
    for (int r = 0; r < kRM; ++r) {
#pragma unroll
      for (int k = 0; k < kRN; ++k) p_s[(ty + r * kTM) * kPS + tx + k * kTN] = s[r][k];
    }
    attn::stage_rows<kN, D, kS, kFwdThreads>(kv_s, v_seq + n0 * p.sv_.tok, p.sv_.tok, nv, dv,
                                             acc_mode.v_vec4);
    __syncthreads();

    // acc[r] += P[r, :] . V over the tile's keys; P past nv is 0 and V rows past nv are zeros.
    const int nv4 = (nv + 3) & ~3;
    for (int j = 0; j < nv4; j += 4) {
      float4 pv[kRM];
#pragma unroll
      for (int r = 0; r < kRM; ++r) {
        pv[r] = *reinterpret_cast<const float4 *>(p_s + (ty + r * kTM) * kPS + j);
      }
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
        for (int c = 0; c < kOC; ++c) {
          const float4 v =
              *reinterpret_cast<const float4 *>(kv_s + (j + jj) * kS + tx * 4 + c * 4 * kTN);
#pragma unroll
          for (int r = 0; r < kRM; ++r) attn::fma4(acc[r][c], attn::comp(pv[r], jj), v);
        }
      }
    }
  }

  // O = acc / l, LSE = m + log(l); a row with nothing kept (l = 0) gets O = 0 and LSE = -inf.
#pragma unroll
  for (int r = 0; r < kRM; ++r) {
    const int i = m0 + ty + r * kTM;
    if (i >= p.s_q) continue;
    const bool live = i < sq && l_run[r] > 0.0f;
    if (i >= sq && p.format == NVTE_THD) {
      if (tx == 0 && lse != nullptr) lse[i] = -INFINITY;
      continue;
    }
    const float inv = live ? 1.0f / l_run[r] : 0.0f;
    T *o = o_seq + i * p.so_.tok;
#pragma unroll
    for (int c = 0; c < kOC; ++c) {
      attn::store4(o, attn::scale4(acc[r][c], inv), tx * 4 + c * 4 * kTN, dv, acc_mode.o_vec4);
    }
    if (tx == 0 && lse != nullptr) lse[i] = live ? m_run[r] + logf(l_run[r]) : -INFINITY;
  }
}

// One thread per Philox block of 4 consecutive positions of the dense [b, h, s_q, s_kv] mask:
// the same draws as dropout_keep, one block instead of four.
constexpr int kMaskThreads = 256;
constexpr uint64_t kMaxMaskBlocks = 65536;

__global__ void __launch_bounds__(kMaskThreads)
    dropout_mask_kernel(const int64_t *rng_state, uint64_t seed, uint64_t offset,
                        const uint32_t thresh, const uint64_t total, uint8_t *mask) {
  if (rng_state != nullptr) {  // {seed, offset} in device memory (AttnParams::rng_state)
    seed = static_cast<uint64_t>(rng_state[0]);
    offset = static_cast<uint64_t>(rng_state[1]);
  }
  const uint64_t groups = (total + 3) / 4;
  for (uint64_t g = static_cast<uint64_t>(blockIdx.x) * kMaskThreads + threadIdx.x; g < groups;
       g += static_cast<uint64_t>(gridDim.x) * kMaskThreads) {
    const Philox4 r = dropout_block(seed, offset, g);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint64_t pos = 4 * g + e;
      if (pos < total) mask[pos] = r.v[e] >= thresh ? 1 : 0;
    }
  }
}

}  // namespace

void launch_flash_attn_fwd(const AttnParams &p, void *stream) {
  attn::check_gpu_limits(p);
  NVTE_CHECK_SUPPORTED(p.dtype == kNVTEFloat16 || p.dtype == kNVTEBFloat16,
                       "GPU flash attention: expected Q/K/V dtype float16 or bfloat16, got ",
                       dtype_name(p.dtype));
  if (p.b == 0 || p.h == 0 || p.s_q == 0) return;
  if (launch_flash_attn_fwd_mma(p, stream)) return;  // tensor cores: head dims up to 128
  dispatch_dtype<TypeList<fp16, bf16>>(p.dtype, "Q", [&](auto tag) {
    using T = typename decltype(tag)::type;
    attn::dispatch_head_dim(p, [&](auto dtag) {
      constexpr int D = decltype(dtag)::value;
      const FwdAccess a{attn::rows_vec4(p.q, p.sq_, sizeof(T)),
                        attn::rows_vec4(p.k, p.sk_, sizeof(T)),
                        attn::rows_vec4(p.v, p.sv_, sizeof(T)),
                        attn::rows_vec4(p.o, p.so_, sizeof(T))};
      const dim3 grid(static_cast<unsigned>((p.s_q + FwdTile<D>::kM - 1) / FwdTile<D>::kM),
                      static_cast<unsigned>(p.h), static_cast<unsigned>(p.b));
      flash_attn_fwd_kernel<T, D><<<grid, kFwdThreads, 0, as_stream(stream)>>>(p, a);
      NVTE_CHECK_LAUNCH();
    });
  });
}

void launch_dropout_mask(const AttnParams &p, uint8_t *mask, void *stream) {
  const uint64_t total = static_cast<uint64_t>(p.b) * p.h * p.s_q * p.s_kv;
  if (total == 0) return;
  const uint64_t groups = (total + 3) / 4;
  const uint64_t blocks =
      std::min<uint64_t>(kMaxMaskBlocks, (groups + kMaskThreads - 1) / kMaskThreads);
  dropout_mask_kernel<<<static_cast<unsigned>(blocks), kMaskThreads, 0, as_stream(stream)>>>(
      p.rng_state, p.seed, p.offset, p.dropout_thresh, total, mask);
  NVTE_CHECK_LAUNCH();
}

}  // namespace gpu
}  // namespace nvte
