// GPU flash attention forward on tensor cores: the bf16/fp16 forward for head-dim buckets 64 and
// 128 (fused_attn.cu's launcher hands those here; everything else stays on its fp32 kernel). Same
// semantics and the same per-logit rules (fused_attn_tile.cuh: masks, windows, bias, ALiBi,
// dropout, sinks, thd, GQA) as the fp32 kernel; only the two tile products change:
//   S = Q K^T   m16n8k16 products of the 16-bit inputs with fp32 accumulation (exact inputs);
//   O += P V    P, the fp32 online-softmax probabilities, rounded to the input dtype first (as
//               every flash kernel on tensor cores does), V exact, fp32 accumulation.
// The running max / sum, the rescales and O's normalisation stay fp32; the row sum uses P before
// the rounding. One block = 4 groups of 32 lanes, each owning 16 query rows: its Q rows stay in
// registers as A fragments (platform/gpu_mma.h), K and V tiles stream through shared memory as
// 16-bit values (V transposed, so each B fragment register is one 32-bit load).
#include <cmath>

#include "../platform/gpu_mma.h"
#include "../platform/runtime.h"
#include "../util/dtype_dispatch.h"
#include "../util/env.h"
#include "fused_attn_gpu.h"
#include "fused_attn_tile.cuh"

// AMD GPUs keep the fp32 kernel: the portable mma (shuffles, gpu_mma.h) would be slower than it,
// and MFMA's layouts differ from PTX's, so CDNA needs a path of its own. The kernel below is built
// for CUDA and for gpusim (both flavours, so the hipified source runs it too).
#if !defined(__HIP_PLATFORM_AMD__) || defined(NVTE_WITH_GPUSIM)
#define NVTE_FWD_MMA 1
#endif

namespace nvte {
namespace gpu {

#if defined(NVTE_FWD_MMA)
namespace {

constexpr int kGroups = 4;                          // 32-lane mma groups per block
constexpr int kMmaThreads = kGroups * kMmaLanes;    // 128 threads (two wavefronts on CDNA)
constexpr int kGroupRows = 16;                      // query rows per group (the mma's M)
constexpr int kTileM = kGroups * kGroupRows;        // query rows per block
// 16-bit tiles padded by 8 elements (16 bytes) per row: rows stay 8-byte aligned for the staging
// stores, and a fragment load (8 rows x 4 consecutive words) hits 32 distinct banks because row
// starts are 4 banks apart (stride (D + 8) / 2 words = 4 mod 32 for D = 64, 128; (kN + 8) / 2 =
// 20 or 36 words for the V^T tile: also 8 distinct 4-bank groups).
constexpr int kHPad = 8;

// Keys per tile: shared memory (Q + K + V^T, 16-bit) stays under 48 KiB: D=64: 9 + 9 + 9 KiB;
// D=128: 17 + 8.5 + 10 KiB. Registers per thread: Q fragments D/4, O accumulators D/2, S kN/2.
template <int D>
struct MmaTile;
template <>
struct MmaTile<64> {
  static constexpr int kN = 64;
};
template <>
struct MmaTile<128> {
  static constexpr int kN = 32;
};

struct MmaAccess {
  bool q_vec4, k_vec4, v_vec4;
};

template <typename T>
__device__ __forceinline__ uint32_t ld32(const T *p) {
  return *reinterpret_cast<const uint32_t *>(p);
}

// Rows [0, kRows) of a 16-bit tile into shared memory as they are (no conversion): element (r, c)
// at dst[r * kStride + c] (kTransposed: dst[c * kStride + r]); columns >= width and rows >= nrows
// become 0, so padding adds exact zeros to every product and never carries 0 * NaN into them.
template <int kRows, int kWidth, int kStride, bool kTransposed, typename T>
__device__ __forceinline__ void stage16(T *dst, const T *src0, int64_t src_stride, int nrows,
                                        int width, bool vec4) {
  constexpr int kChunks = kWidth / 4;
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kMmaThreads) {
    const int r = idx / kChunks, c = (idx % kChunks) * 4;
    attn::Pack4<T> v;
#pragma unroll
    for (int e = 0; e < 4; ++e) v.v[e] = T{0};
    if (r < nrows && c < width) {
      const T *src = src0 + r * src_stride + c;
      if (vec4 && c + 4 <= width) {
        v = *reinterpret_cast<const attn::Pack4<T> *>(src);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v.v[e] = c + e < width ? src[e] : T{0};
      }
    }
    if (kTransposed) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dst[(c + e) * kStride + r] = v.v[e];
    } else {
      *reinterpret_cast<attn::Pack4<T> *>(dst + r * kStride + c) = v;
    }
  }
}

template <typename T, int D>
__global__ void NVTE_LAUNCH_BOUNDS(kMmaThreads, 2)
    flash_attn_fwd_mma_kernel(const AttnParams p, const MmaAccess acc_mode, const bool o_vec4) {
  constexpr int kN = MmaTile<D>::kN;
  constexpr int kS = D + kHPad;   // row stride of the Q and K tiles
  constexpr int kVS = kN + kHPad;  // row stride of the V^T tile (one row per head-dim column)
  constexpr int kKD = D / 16;      // k steps of Q K^T
  constexpr int kNT = kN / 8;      // 8-key column tiles of S
  constexpr int kKN = kN / 16;     // k steps of P V
  constexpr int kOT = D / 8;       // 8-column tiles of O
  static_assert(sizeof(T) == 2, "16-bit inputs");
  static_assert(2 * (kTileM * kS + kN * kS + D * kVS) <= 48 * 1024, "shared memory");
  // uint4 arrays: 16-byte alignment for the staging stores.
  __shared__ uint4 q_raw[kTileM * kS / 8];
  __shared__ uint4 k_raw[kN * kS / 8];
  __shared__ uint4 v_raw[D * kVS / 8];
  T *q_s = reinterpret_cast<T *>(q_raw);
  T *k_s = reinterpret_cast<T *>(k_raw);
  T *v_s = reinterpret_cast<T *>(v_raw);

  const int64_t bi = blockIdx.z, hi = blockIdx.y;
  const int64_t hk = hi / (p.h / p.h_kv);
  const int m0 = static_cast<int>(blockIdx.x) * kTileM;
  const int sq = static_cast<int>(p.len_q(bi)), skv = static_cast<int>(p.len_kv(bi));
  const int tid = threadIdx.x, grp = tid / kMmaLanes, lane = tid % kMmaLanes;
  const int g = lane / 4, t = lane % 4;  // fragment row group and column pair (gpu_mma.h)
  float *lse = p.lse != nullptr ? p.lse + (bi * p.h + hi) * p.s_q : nullptr;
  const int dv = static_cast<int>(p.d_v), dqk = static_cast<int>(p.d_qk);

  // Rows past the sequence: O = 0 where the row exists in memory (not for thd), LSE = -inf.
  T *const o_seq = attn::seq_rows_q(p, static_cast<T *>(p.o), p.so_, bi, hi);
  if (m0 >= sq) {
    for (int idx = tid; idx < kTileM * (D / 4); idx += kMmaThreads) {
      const int i = m0 + idx / (D / 4), c = (idx % (D / 4)) * 4;
      if (i >= p.s_q) continue;
      if (c == 0 && lse != nullptr) lse[i] = -INFINITY;
      if (p.format != NVTE_THD) {
        attn::store4(o_seq + i * p.so_.tok, make_float4(0, 0, 0, 0), c, dv, o_vec4);
      }
    }
    return;
  }
  const int mv = sq - m0 < kTileM ? sq - m0 : kTileM;

  const T *q_seq = attn::seq_rows_q(p, static_cast<const T *>(p.q), p.sq_, bi, hi);
  stage16<kTileM, D, kS, false>(q_s, q_seq + m0 * p.sq_.tok, p.sq_.tok, mv, dqk, acc_mode.q_vec4);

  // Key range of the tile: the union of its rows' ranges, [lo(first row), hi(last row)).
  int n_lo, n_hi, unused;
  attn::key_range(p, m0, sq, skv, &n_lo, &unused);
  attn::key_range(p, m0 + mv - 1, sq, skv, &unused, &n_hi);

  // This lane's two rows: r = 0 -> row g, r = 1 -> row g + 8 of its group's 16.
  const attn::LogitRules<T> rules(p, bi, hi, sq, skv);
  const attn::DropoutRule drop(p, bi, hi);
  const int row0 = m0 + grp * kGroupRows + g;
  int row_lo[2], row_hi[2];
  float m_run[2], l_run[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + 8 * r;
    if (i < sq) {
      attn::key_range(p, i, sq, skv, &row_lo[r], &row_hi[r]);
    } else {
      row_lo[r] = row_hi[r] = 0;  // no key kept: contributes nothing, never stored as a row
    }
    // Attention sink: the running max and sum start from its logit (l = exp(sink - sink) = 1).
    m_run[r] = p.has_sink() ? p.sink(hi) : -INFINITY;
    l_run[r] = p.has_sink() ? 1.0f : 0.0f;
  }
  float acc[kOT][4];
#pragma unroll
  for (int ot = 0; ot < kOT; ++ot) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[ot][e] = 0.0f;
  }

  // The group's Q rows as A fragments, loaded once.
  __syncthreads();
  uint32_t qf[kKD][4];
  {
    const T *qg = q_s + (grp * kGroupRows + g) * kS + 2 * t;
#pragma unroll
    for (int kk = 0; kk < kKD; ++kk) {
      qf[kk][0] = ld32(qg + kk * 16);
      qf[kk][1] = ld32(qg + 8 * kS + kk * 16);
      qf[kk][2] = ld32(qg + kk * 16 + 8);
      qf[kk][3] = ld32(qg + 8 * kS + kk * 16 + 8);
    }
  }

  const T *k_seq = attn::seq_rows_kv(p, static_cast<const T *>(p.k), p.sk_, bi, hk);
  const T *v_seq = attn::seq_rows_kv(p, static_cast<const T *>(p.v), p.sv_, bi, hk);
  for (int n0 = n_lo; n0 < n_hi; n0 += kN) {
    const int nv = n_hi - n0 < kN ? n_hi - n0 : kN;
    __syncthreads();  // every group is done with the previous tile's K and V
    stage16<kN, D, kS, false>(k_s, k_seq + n0 * p.sk_.tok, p.sk_.tok, nv, dqk, acc_mode.k_vec4);
    stage16<kN, D, kVS, true>(v_s, v_seq + n0 * p.sv_.tok, p.sv_.tok, nv, dv, acc_mode.v_vec4);
    __syncthreads();

    // S = Q K^T: B[k][n] = K[n][k], so b[0] = K[n = g][k = 2t, 2t+1] is one load from K's row.
    // k steps wholly past d_qk (zeros) are skipped; the test is uniform over the group.
    float s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kKD; ++kk) {
      if (kk * 16 >= dqk) break;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const T *kr = k_s + (nt * 8 + g) * kS + kk * 16 + 2 * t;
        const uint32_t b[2] = {ld32(kr), ld32(kr + 8)};
        mma_m16n8k16<T>(s[nt], qf[kk], b);
      }
    }

    // Online softmax per row (the fp32 kernel's steps): logits with mask / bias / ALiBi, new
    // running max over the row's 4 lanes, rescale of sum and accumulator by exp(m_old - m_new),
    // unnormalised probabilities; dropped ones become 0 after the un-dropped sum is taken.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = row0 + 8 * r;
      float tmax = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = n0 + nt * 8 + 2 * t + e;
          float &x = s[nt][2 * r + e];
          const bool kept = j >= row_lo[r] && j < row_hi[r];
          x = kept ? rules.logit(x, i, j) : -INFINITY;
          tmax = attn::max_nan(tmax, x);
        }
      }
      tmax = warp_reduce_max(tmax, 4);
      const float m_new = attn::max_nan(m_run[r], tmax);
      // A row with nothing kept yet keeps max -inf; subtracting 0 then leaves every exp at 0.
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp_f32(m_run[r] - m_use);
      float tsum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float &x = s[nt][2 * r + e];
          x = exp_f32(x - m_use);
          tsum += x;
        }
      }
      tsum = warp_reduce_sum(tsum, 4);
      l_run[r] = l_run[r] * alpha + tsum;
      m_run[r] = m_new;
#pragma unroll
      for (int ot = 0; ot < kOT; ++ot) {
        acc[ot][2 * r] *= alpha;
        acc[ot][2 * r + 1] *= alpha;
      }
      if (drop.on) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = n0 + nt * 8 + 2 * t + e;
            float &x = s[nt][2 * r + e];
            if (x != 0.0f) x = drop.keep(p, i, j) ? x * drop.rescale : 0.0f;
          }
        }
      }
    }

    // O += P V. S's accumulator layout is the A layout of P: key columns 16 kn + 2t (+1) are
    // s[2 kn][0, 1] (row g) and s[2 kn][2, 3] (row g + 8), columns + 8 are s[2 kn + 1]. P is
    // rounded to T here. B[k][n] = V[key k][col n] = V^T[n][k]: one load from the V^T tile. k
    // steps wholly past the tile's keys (P = 0 there) are skipped.
#pragma unroll
    for (int kn = 0; kn < kKN; ++kn) {
      if (kn * 16 >= nv) break;
      const uint32_t a[4] = {mma_pack_f32<T>(s[2 * kn][0], s[2 * kn][1]),
                             mma_pack_f32<T>(s[2 * kn][2], s[2 * kn][3]),
                             mma_pack_f32<T>(s[2 * kn + 1][0], s[2 * kn + 1][1]),
                             mma_pack_f32<T>(s[2 * kn + 1][2], s[2 * kn + 1][3])};
#pragma unroll
      for (int ot = 0; ot < kOT; ++ot) {
        const T *vr = v_s + (ot * 8 + g) * kVS + kn * 16 + 2 * t;
        const uint32_t b[2] = {ld32(vr), ld32(vr + 8)};
        mma_m16n8k16<T>(acc[ot], a, b);
      }
    }
  }

  // O = acc / l, LSE = m + log(l); a row with nothing kept (l = 0) gets O = 0 and LSE = -inf.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + 8 * r;
    if (i >= p.s_q) continue;
    const bool live = i < sq && l_run[r] > 0.0f;
    if (i >= sq && p.format == NVTE_THD) {
      if (t == 0 && lse != nullptr) lse[i] = -INFINITY;
      continue;
    }
    const float inv = live ? 1.0f / l_run[r] : 0.0f;
    T *o = o_seq + i * p.so_.tok;
#pragma unroll
    for (int ot = 0; ot < kOT; ++ot) {
      const int c = ot * 8 + 2 * t;
      if (c < dv) o[c] = from_float<T>(acc[ot][2 * r] * inv);
      if (c + 1 < dv) o[c + 1] = from_float<T>(acc[ot][2 * r + 1] * inv);
    }
    if (t == 0 && lse != nullptr) lse[i] = live ? m_run[r] + logf(l_run[r]) : -INFINITY;
  }
}

}  // namespace
#endif  // NVTE_FWD_MMA

bool launch_flash_attn_fwd_mma(const AttnParams &p, void *stream) {
#if !defined(NVTE_FWD_MMA)
  (void)p;
  (void)stream;
  return false;
#else
  // On by default since an H200 ran it (ci/gpu_check.sh: test_gpu_mma and the fused_attn sweep,
  // README "GPU check"); "0" selects the fp32 FMA kernel.
  if (env_is_zero("NVTE_GPU_FLASH_ATTN_TENSOR_CORES")) return false;
  const int64_t d = p.d_qk > p.d_v ? p.d_qk : p.d_v;
  if (d > 128) return false;  // the 256 bucket's fragments would not fit the register budget
  dispatch_dtype<TypeList<fp16, bf16>>(p.dtype, "Q", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const MmaAccess a{attn::rows_vec4(p.q, p.sq_, sizeof(T)),
                      attn::rows_vec4(p.k, p.sk_, sizeof(T)),
                      attn::rows_vec4(p.v, p.sv_, sizeof(T))};
    const bool o_vec4 = attn::rows_vec4(p.o, p.so_, sizeof(T));
    const dim3 grid(static_cast<unsigned>((p.s_q + kTileM - 1) / kTileM),
                    static_cast<unsigned>(p.h), static_cast<unsigned>(p.b));
    if (d <= 64) {
      flash_attn_fwd_mma_kernel<T, 64><<<grid, kMmaThreads, 0, as_stream(stream)>>>(p, a, o_vec4);
    } else {
      flash_attn_fwd_mma_kernel<T, 128><<<grid, kMmaThreads, 0, as_stream(stream)>>>(p, a, o_vec4);
    }
    NVTE_CHECK_LAUNCH();
  });
  return true;
#endif
}

}  // namespace gpu
}  // namespace nvte
