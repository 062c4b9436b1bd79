// GPU flash attention backward (FlashAttention-2 style); semantics of fused_attn_cpu.h. Kernels:
//   delta   delta_i = dO_i . O_i per query row (fp32, workspace);
//   dkdv    one block per (key tile, kv head, sequence): K and V stay in shared memory while the
//           query tiles (of every query head sharing the kv head) that can see the keys stream
//           through; dK, dV accumulate in registers and are written once. Non-deterministic mode
//           also adds the block's dQ share into an fp32 workspace with atomics;
//   dq      deterministic mode: one block per (query tile, head, sequence) recomputes dS over the
//           tile's key range and writes dQ once;
//   dq_out  non-deterministic mode: fp32 workspace -> dQ;
//   dbias   one block per bias tile sums dS over the broadcast sequences / heads in a fixed order
//           and writes dBias once (deterministic in both modes, no workspace).
// The probabilities are recomputed from the forward's LSE: P = exp(x - lse), with dropout
// dS = P (dP z - delta), z = keep / (1 - p), and dV = (P z)^T dO.
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

// Tiles per head-dim bucket. (kTM x kTN) is the thread grid over a kM x kN logit tile (thread
// (ty, tx) owns rows ty + kTM r, keys tx + kTN k); (kKR x kKC) the thread grid over a tile of
// gradient rows x D (rows ty2 + kKR a, float4 columns tx2 + kKC c). Shared memory (fp32 Q, dO, K,
// V tiles + P, dS): D=64: 42.5 KiB, D=128: 35.6 KiB, D=256: 33.3 KiB. D=64 and D=128 run four
// warps (kTN a quarter warp: 128 threads on CUDA, 256 on CDNA, where one block per CU fits in LDS
// and four wavefronts keep its four SIMDs busy); D=256 runs 64 threads, so that each still owns
// whole elements of the 8 x 8 logit tile. kMinBlocks (CUDA launch bound): resident blocks per SM
// that keep the register cap at 170 per thread, what the D=256 dK/dV accumulators (2 x 32
// floats) plus a logit tile need without spilling.
template <int kThreadsT, int kMT, int kNT, int kTNT, int kMinBlocksT>
struct BwdTileConfig {
  static constexpr int kThreads = kThreadsT, kM = kMT, kN = kNT, kTN = kTNT;
  static constexpr int kTM = kThreads / kTN, kKC = 16, kKR = kThreads / kKC;
  static constexpr int kMinBlocks = kMinBlocksT;
};
template <int D>
struct BwdTile;
template <>
struct BwdTile<64> : BwdTileConfig<4 * kWarpSize, 32, 32, kWarpSize / 4, 3> {};
template <>
struct BwdTile<128> : BwdTileConfig<4 * kWarpSize, 16, 16, kWarpSize / 4, 3> {};
template <>
struct BwdTile<256> : BwdTileConfig<64, 8, 8, 8, 6> {};

template <int D>
struct BwdShared {
  using Tile = BwdTile<D>;
  static constexpr int kS = D + kPad, kPS = Tile::kN + kPad;
  float4 q[Tile::kM * kS / 4];
  float4 d_o[Tile::kM * kS / 4];
  float4 k[Tile::kN * kS / 4];
  float4 v[Tile::kN * kS / 4];
  float4 p[Tile::kM * kPS / 4];   // dropped probabilities P z (for dV)
  float4 ds[Tile::kM * kPS / 4];  // dS
  float lse[Tile::kM];
  float delta[Tile::kM];
};

struct BwdAccess {
  bool q_vec4, k_vec4, v_vec4, do_vec4, dq_vec4, dk_vec4, dv_vec4;
};

__device__ __forceinline__ float *fl(float4 *a) { return reinterpret_cast<float *>(a); }

// Stages query rows m0 .. m0 + mv of head hi (Q, dO, LSE, delta); rows past mv get LSE = -inf,
// which makes every probability of the row 0.
template <typename T, int D>
__device__ __forceinline__ void stage_query_tile(const AttnParams &p, const BwdAccess &a,
                                                 BwdShared<D> &sm, const float *delta, int64_t bi,
                                                 int64_t hi, int m0, int mv) {
  using Tile = BwdTile<D>;
  constexpr int kS = BwdShared<D>::kS;
  const T *q = attn::seq_rows_q(p, static_cast<const T *>(p.q), p.sq_, bi, hi);
  const T *d_o = attn::seq_rows_q(p, static_cast<const T *>(p.d_o), p.sdo_, bi, hi);
  attn::stage_rows<Tile::kM, D, kS, Tile::kThreads>(fl(sm.q), q + m0 * p.sq_.tok, p.sq_.tok, mv,
                                                    static_cast<int>(p.d_qk), a.q_vec4);
  attn::stage_rows<Tile::kM, D, kS, Tile::kThreads>(fl(sm.d_o), d_o + m0 * p.sdo_.tok,
                                                    p.sdo_.tok, mv, static_cast<int>(p.d_v),
                                                    a.do_vec4);
  const int64_t row0 = (bi * p.h + hi) * p.s_q + m0;
  for (int r = threadIdx.x; r < Tile::kM; r += Tile::kThreads) {
    sm.lse[r] = r < mv ? p.lse[row0 + r] : -INFINITY;
    sm.delta[r] = r < mv ? delta[row0 + r] : 0.0f;
  }
}

// Stages key rows n0 .. n0 + nv of kv head hk (K and V).
template <typename T, int D>
__device__ __forceinline__ void stage_key_tile(const AttnParams &p, const BwdAccess &a,
                                               BwdShared<D> &sm, int64_t bi, int64_t hk, int n0,
                                               int nv) {
  using Tile = BwdTile<D>;
  constexpr int kS = BwdShared<D>::kS;
  const T *k = attn::seq_rows_kv(p, static_cast<const T *>(p.k), p.sk_, bi, hk);
  const T *v = attn::seq_rows_kv(p, static_cast<const T *>(p.v), p.sv_, bi, hk);
  attn::stage_rows<Tile::kN, D, kS, Tile::kThreads>(fl(sm.k), k + n0 * p.sk_.tok, p.sk_.tok, nv,
                                                    static_cast<int>(p.d_qk), a.k_vec4);
  attn::stage_rows<Tile::kN, D, kS, Tile::kThreads>(fl(sm.v), v + n0 * p.sv_.tok, p.sv_.tok, nv,
                                                    static_cast<int>(p.d_v), a.v_vec4);
}

// This thread's elements of the staged tile (rows m0 + ty + kTM r, keys n0 + tx + kTN k):
// pd = P z and ds = P (dP z - delta), both 0 where the key is masked or the row is not live.
template <typename T, int D, int kRM, int kRN>
__device__ __forceinline__ void tile_grads(const AttnParams &p, BwdShared<D> &sm,
                                           const attn::LogitRules<T> &rules,
                                           const attn::DropoutRule &drop, int m0, int n0,
                                           float (&pd)[kRM][kRN], float (&ds)[kRM][kRN]) {
  using Tile = BwdTile<D>;
  constexpr int kS = BwdShared<D>::kS;
  const int ty = threadIdx.x / Tile::kTN, tx = threadIdx.x % Tile::kTN;
  float s[kRM][kRN], dp[kRM][kRN];
  attn::tile_dot<kRM, kRN, Tile::kTM, Tile::kTN, kS, kS>(fl(sm.q), fl(sm.k), ty, tx,
                                                         (static_cast<int>(p.d_qk) + 3) & ~3, s);
  attn::tile_dot<kRM, kRN, Tile::kTM, Tile::kTN, kS, kS>(fl(sm.d_o), fl(sm.v), ty, tx,
                                                         (static_cast<int>(p.d_v) + 3) & ~3, dp);
#pragma unroll
  for (int r = 0; r < kRM; ++r) {
    const int i = m0 + ty + r * Tile::kTM;
    const float lse = sm.lse[ty + r * Tile::kTM], delta = sm.delta[ty + r * Tile::kTM];
    int lo, hi;
    attn::key_range(p, i, rules.sq, rules.skv, &lo, &hi);
#pragma unroll
    for (int k = 0; k < kRN; ++k) {
      const int j = n0 + tx + k * Tile::kTN;
      const bool kept = lse != -INFINITY && j >= lo && j < hi;
      const float prob = kept ? exp_f32(rules.logit(s[r][k], i, j) - lse) : 0.0f;
      float z = 1.0f;
      if (drop.on) z = prob != 0.0f && drop.keep(p, i, j) ? drop.rescale : 0.0f;
      pd[r][k] = prob * z;
      ds[r][k] = prob * (dp[r][k] * z - delta);
    }
  }
}

template <int D, int kRM, int kRN>
__device__ __forceinline__ void store_tile(float *dst, const float (&x)[kRM][kRN]) {
  using Tile = BwdTile<D>;
  constexpr int kPS = BwdShared<D>::kPS;
  const int ty = threadIdx.x / Tile::kTN, tx = threadIdx.x % Tile::kTN;
#pragma unroll
  for (int r = 0; r < kRM; ++r) {
#pragma unroll
    for (int k = 0; k < kRN; ++k) dst[(ty + r * Tile::kTM) * kPS + tx + k * Tile::kTN] = x[r][k];
  }
}

// acc[a][c] += sum_{j < n} w[row a][j] * rows_src[j][column chunk c] for this thread's gradient
// rows (ty2 + kKR a of the tile w, stored row-major with stride kPS, or column-major when
// kTransposed: w[j][row]) and float4 columns (tx2 + kKC c).
template <int D, int kA, int kC, bool kTransposed>
__device__ __forceinline__ void grad_gemm(const float *w, const float *src, int n,
                                          float4 (&acc)[kA][kC]) {
  using Tile = BwdTile<D>;
  constexpr int kS = BwdShared<D>::kS, kPS = BwdShared<D>::kPS;
  const int ty2 = threadIdx.x / Tile::kKC, tx2 = threadIdx.x % Tile::kKC;
  for (int j = 0; j < n; ++j) {
    float wa[kA];
#pragma unroll
    for (int a = 0; a < kA; ++a) {
      const int row = ty2 + a * Tile::kKR;
      wa[a] = kTransposed ? w[j * kPS + row] : w[row * kPS + j];
    }
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const float4 v = *reinterpret_cast<const float4 *>(src + j * kS + (tx2 + c * Tile::kKC) * 4);
#pragma unroll
      for (int a = 0; a < kA; ++a) attn::fma4(acc[a][c], wa[a], v);
    }
  }
}

// Writes gradient rows (ty2 + kKR a) of a tile starting at row `first` of a sequence, scaled; row
// i goes to seq + i * stride, rows >= limit are skipped.
template <typename T, int D, int kA, int kC>
__device__ __forceinline__ void store_grad_rows(const float4 (&acc)[kA][kC], float scale,
                                                int first, int limit, int width, bool vec4,
                                                T *seq, int64_t stride) {
  using Tile = BwdTile<D>;
  const int ty2 = threadIdx.x / Tile::kKC, tx2 = threadIdx.x % Tile::kKC;
#pragma unroll
  for (int a = 0; a < kA; ++a) {
    const int i = first + ty2 + a * Tile::kKR;
    if (i >= limit) continue;
    T *dst = seq + i * stride;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      attn::store4(dst, attn::scale4(acc[a][c], scale), (tx2 + c * Tile::kKC) * 4, width, vec4);
    }
  }
}

// ---------------------------------------------------------------- delta
constexpr int kRowThreads = 128;
constexpr int64_t kMaxRowBlocks = 65536;

// One warp per query row (b * h * s_q rows): delta = dO . O in fp32, 0 past the sequence.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    flash_attn_bwd_delta_kernel(const AttnParams p, float *delta) {
  constexpr int kWarps = kRowThreads / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t rows = p.b * p.h * p.s_q;
  // Block-uniform trip count (warps past the last row reduce zeros and store nothing): no warp of
  // a block leaves the loop while another still shuffles in it.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps; first < rows;
       first += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t row = first + threadIdx.x / kWarpSize;
    const bool active = row < rows;
    const int64_t i = row % p.s_q, bh = row / p.s_q, hi = bh % p.h, bi = bh / p.h;
    float s = 0.0f;
    if (active && i < p.len_q(bi)) {
      const T *o = static_cast<const T *>(p.o) + p.token_q(p.so_, bi, i) + hi * p.so_.head;
      const T *d_o = static_cast<const T *>(p.d_o) + p.token_q(p.sdo_, bi, i) + hi * p.sdo_.head;
      for (int64_t d = lane; d < p.d_v; d += kWarpSize) s += to_float(d_o[d]) * to_float(o[d]);
    }
    s = warp_reduce_sum(s);
    if (active && lane == 0) delta[row] = s;
  }
}

// ---------------------------------------------------------------- d softmax_offset
// Learnable softmax: d a_h = -sum over (batch, query rows) of exp(a_h - lse) * delta. One block per
// head; each thread sums a fixed stride of rows in fp64, then a fixed tree over the block: the
// result does not depend on scheduling (deterministic).
__global__ void __launch_bounds__(kRowThreads)
    flash_attn_bwd_offset_kernel(const AttnParams p, const float *delta) {
  __shared__ double part[kRowThreads];
  const int64_t hi = blockIdx.x;
  const double a = static_cast<double>(p.sink(hi));
  double acc = 0.0;
  for (int64_t r = threadIdx.x; r < p.b * p.s_q; r += kRowThreads) {
    const int64_t bi = r / p.s_q, i = r % p.s_q;
    if (i >= p.len_q(bi)) continue;
    const int64_t row = (bi * p.h + hi) * p.s_q + i;
    const float lse = p.lse[row];
    if (lse == -INFINITY) continue;
    acc -= exp(a - static_cast<double>(lse)) * static_cast<double>(delta[row]);
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kRowThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.d_softmax_offset[hi] = static_cast<float>(part[0]);
}

// ---------------------------------------------------------------- dK, dV (and dQ atomics)
template <typename T, int D>
__global__ void NVTE_LAUNCH_BOUNDS(BwdTile<D>::kThreads, BwdTile<D>::kMinBlocks)
    flash_attn_bwd_dkdv_kernel(const AttnParams p, const BwdAccess a, const float *delta,
                               float *dq_acc) {
  using Tile = BwdTile<D>;
  constexpr int kRM = Tile::kM / Tile::kTM, kRN = Tile::kN / Tile::kTN;
  constexpr int kA = Tile::kN / Tile::kKR, kAQ = Tile::kM / Tile::kKR, kC = D / (4 * Tile::kKC);
  static_assert(sizeof(BwdShared<D>) <= 48 * 1024, "shared memory");
  static_assert(Tile::kM % Tile::kTM == 0 && Tile::kN % Tile::kTN == 0 &&
                    Tile::kN % Tile::kKR == 0 && Tile::kM % Tile::kKR == 0 &&
                    D % (4 * Tile::kKC) == 0 && Tile::kN % 4 == 0,
                "thread grids must tile the logit and gradient tiles");
  __shared__ BwdShared<D> sm;

  const int64_t bi = blockIdx.z, hk = blockIdx.y, group = p.h / p.h_kv;
  const int n0 = static_cast<int>(blockIdx.x) * Tile::kN;
  const int sq = static_cast<int>(p.len_q(bi)), skv = static_cast<int>(p.len_kv(bi));
  float4 dk[kA][kC], dv[kA][kC];
#pragma unroll
  for (int x = 0; x < kA; ++x) {
#pragma unroll
    for (int c = 0; c < kC; ++c) dk[x][c] = dv[x][c] = make_float4(0, 0, 0, 0);
  }

  if (n0 < skv) {
    const int nv = skv - n0 < Tile::kN ? skv - n0 : Tile::kN;
    stage_key_tile<T, D>(p, a, sm, bi, hk, n0, nv);
    int i0, i1;
    attn::query_range(p, n0, n0 + nv, sq, skv, &i0, &i1);
    for (int64_t g = 0; g < group; ++g) {
      const int64_t hi = hk * group + g;
      const attn::LogitRules<T> rules(p, bi, hi, sq, skv);
      const attn::DropoutRule drop(p, bi, hi);
      for (int m0 = i0; m0 < i1; m0 += Tile::kM) {
        const int mv = i1 - m0 < Tile::kM ? i1 - m0 : Tile::kM;
        __syncthreads();  // the previous query tile is no longer read
        stage_query_tile<T, D>(p, a, sm, delta, bi, hi, m0, mv);
        __syncthreads();
        float pd[kRM][kRN], ds[kRM][kRN];
        tile_grads<T, D>(p, sm, rules, drop, m0, n0, pd, ds);
        store_tile<D>(fl(sm.p), pd);
        store_tile<D>(fl(sm.ds), ds);
        __syncthreads();
        // dV += (P z)^T dO, dK += dS^T Q over the tile's live rows (the others are all zero).
        grad_gemm<D, kA, kC, true>(fl(sm.p), fl(sm.d_o), mv, dv);
        grad_gemm<D, kA, kC, true>(fl(sm.ds), fl(sm.q), mv, dk);
        if (dq_acc != nullptr) {
          float4 dq[kAQ][kC];
#pragma unroll
          for (int x = 0; x < kAQ; ++x) {
#pragma unroll
            for (int c = 0; c < kC; ++c) dq[x][c] = make_float4(0, 0, 0, 0);
          }
          grad_gemm<D, kAQ, kC, false>(fl(sm.ds), fl(sm.k), nv, dq);
          const int ty2 = threadIdx.x / Tile::kKC, tx2 = threadIdx.x % Tile::kKC;
#pragma unroll
          for (int x = 0; x < kAQ; ++x) {
            const int row = ty2 + x * Tile::kKR;
            if (row >= mv) continue;
            float *dst = dq_acc + ((bi * p.h + hi) * p.s_q + m0 + row) * p.d_qk;
#pragma unroll
            for (int c = 0; c < kC; ++c) {
              // Components named, not indexed: an indexed float4 sends the accumulator array to
              // scratch (AMDGPU promotes it to LDS) before unrolling would have resolved it.
              const int col = (tx2 + c * Tile::kKC) * 4;
              const float4 v = attn::scale4(dq[x][c], p.scale);
              if (col < p.d_qk) atomic_add(dst + col, v.x);
              if (col + 1 < p.d_qk) atomic_add(dst + col + 1, v.y);
              if (col + 2 < p.d_qk) atomic_add(dst + col + 2, v.z);
              if (col + 3 < p.d_qk) atomic_add(dst + col + 3, v.w);
            }
          }
        }
      }
    }
  }

  // Rows past the sequence are zero padding for bshd/sbhd and do not exist for thd.
  const int limit = p.format == NVTE_THD ? skv : static_cast<int>(p.s_kv);
  store_grad_rows<T, D>(dk, p.scale, n0, limit, static_cast<int>(p.d_qk), a.dk_vec4,
                        attn::seq_rows_kv(p, static_cast<T *>(p.dk), p.sdk_, bi, hk), p.sdk_.tok);
  store_grad_rows<T, D>(dv, 1.0f, n0, limit, static_cast<int>(p.d_v), a.dv_vec4,
                        attn::seq_rows_kv(p, static_cast<T *>(p.dv), p.sdv_, bi, hk), p.sdv_.tok);
}

// ---------------------------------------------------------------- dQ
// Deterministic: one block per (query tile, head, sequence) sums dS K over the tile's key range in
// key order and writes dQ once.
template <typename T, int D>
__global__ void NVTE_LAUNCH_BOUNDS(BwdTile<D>::kThreads, BwdTile<D>::kMinBlocks)
    flash_attn_bwd_dq_kernel(const AttnParams p, const BwdAccess a, const float *delta) {
  using Tile = BwdTile<D>;
  constexpr int kRM = Tile::kM / Tile::kTM, kRN = Tile::kN / Tile::kTN;
  constexpr int kAQ = Tile::kM / Tile::kKR, kC = D / (4 * Tile::kKC);
  __shared__ BwdShared<D> sm;

  const int64_t bi = blockIdx.z, hi = blockIdx.y, hk = hi / (p.h / p.h_kv);
  const int m0 = static_cast<int>(blockIdx.x) * Tile::kM;
  const int sq = static_cast<int>(p.len_q(bi)), skv = static_cast<int>(p.len_kv(bi));
  float4 dq[kAQ][kC];
#pragma unroll
  for (int x = 0; x < kAQ; ++x) {
#pragma unroll
    for (int c = 0; c < kC; ++c) dq[x][c] = make_float4(0, 0, 0, 0);
  }

  if (m0 < sq) {
    const int mv = sq - m0 < Tile::kM ? sq - m0 : Tile::kM;
    stage_query_tile<T, D>(p, a, sm, delta, bi, hi, m0, mv);
    int n_lo, n_hi, unused;
    attn::key_range(p, m0, sq, skv, &n_lo, &unused);
    attn::key_range(p, m0 + mv - 1, sq, skv, &unused, &n_hi);
    const attn::LogitRules<T> rules(p, bi, hi, sq, skv);
    const attn::DropoutRule drop(p, bi, hi);
    for (int n0 = n_lo; n0 < n_hi; n0 += Tile::kN) {
      const int nv = n_hi - n0 < Tile::kN ? n_hi - n0 : Tile::kN;
      __syncthreads();  // the previous key tile and dS are no longer read
      stage_key_tile<T, D>(p, a, sm, bi, hk, n0, nv);
      __syncthreads();
      float pd[kRM][kRN], ds[kRM][kRN];
      tile_grads<T, D>(p, sm, rules, drop, m0, n0, pd, ds);
      store_tile<D>(fl(sm.ds), ds);
      __syncthreads();
      grad_gemm<D, kAQ, kC, false>(fl(sm.ds), fl(sm.k), nv, dq);
    }
  }
  const int limit = p.format == NVTE_THD ? sq : static_cast<int>(p.s_q);
  store_grad_rows<T, D>(dq, p.scale, m0, limit, static_cast<int>(p.d_qk), a.dq_vec4,
                        attn::seq_rows_q(p, static_cast<T *>(p.dq), p.sdq_, bi, hi), p.sdq_.tok);
}

// Non-deterministic: the fp32 dQ workspace [b, h, s_q, d_qk] (already scaled) to dQ, one warp per
// row; padded bshd/sbhd rows were never touched and write 0.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    flash_attn_bwd_dq_out_kernel(const AttnParams p, const float *dq_acc) {
  constexpr int kWarps = kRowThreads / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t rows = p.b * p.h * p.s_q;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarpSize;
       row < rows; row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t i = row % p.s_q, bh = row / p.s_q, hi = bh % p.h, bi = bh / p.h;
    if (p.format == NVTE_THD && i >= p.len_q(bi)) continue;
    T *dst = static_cast<T *>(p.dq) + p.token_q(p.sdq_, bi, i) + hi * p.sdq_.head;
    const float *src = dq_acc + row * p.d_qk;
    for (int64_t d = lane; d < p.d_qk; d += kWarpSize) dst[d] = from_float<T>(src[d]);
  }
}

// ---------------------------------------------------------------- dBias
// One block per (key tile, query tile, bias plane): dBias[bb, bh] = sum of dS over the sequences
// and heads that read that plane, added in (sequence, head) order in registers.
template <typename T, int D>
__global__ void NVTE_LAUNCH_BOUNDS(BwdTile<D>::kThreads, BwdTile<D>::kMinBlocks)
    flash_attn_bwd_dbias_kernel(const AttnParams p, const BwdAccess a, const float *delta) {
  using Tile = BwdTile<D>;
  constexpr int kRM = Tile::kM / Tile::kTM, kRN = Tile::kN / Tile::kTN;
  __shared__ BwdShared<D> sm;

  const int64_t plane = blockIdx.z, bb = plane / p.bias_h, bh = plane % p.bias_h;
  const int n0 = static_cast<int>(blockIdx.x) * Tile::kN;
  const int m0 = static_cast<int>(blockIdx.y) * Tile::kM;
  const int64_t b_begin = p.bias_b == 1 ? 0 : bb, b_end = p.bias_b == 1 ? p.b : bb + 1;
  const int64_t h_begin = p.bias_h == 1 ? 0 : bh, h_end = p.bias_h == 1 ? p.h : bh + 1;
  float acc[kRM][kRN];
#pragma unroll
  for (int r = 0; r < kRM; ++r) {
#pragma unroll
    for (int k = 0; k < kRN; ++k) acc[r][k] = 0.0f;
  }
  for (int64_t bi = b_begin; bi < b_end; ++bi) {
    const int sq = static_cast<int>(p.len_q(bi)), skv = static_cast<int>(p.len_kv(bi));
    if (m0 >= sq || n0 >= skv) continue;  // the tile is padding for this sequence: dS = 0
    const int mv = sq - m0 < Tile::kM ? sq - m0 : Tile::kM;
    const int nv = skv - n0 < Tile::kN ? skv - n0 : Tile::kN;
    for (int64_t hi = h_begin; hi < h_end; ++hi) {
      const int64_t hk = hi / (p.h / p.h_kv);
      __syncthreads();  // the previous tiles are no longer read
      stage_query_tile<T, D>(p, a, sm, delta, bi, hi, m0, mv);
      stage_key_tile<T, D>(p, a, sm, bi, hk, n0, nv);
      __syncthreads();
      const attn::LogitRules<T> rules(p, bi, hi, sq, skv);
      const attn::DropoutRule drop(p, bi, hi);
      float pd[kRM][kRN], ds[kRM][kRN];
      tile_grads<T, D>(p, sm, rules, drop, m0, n0, pd, ds);
#pragma unroll
      for (int r = 0; r < kRM; ++r) {
#pragma unroll
        for (int k = 0; k < kRN; ++k) acc[r][k] += ds[r][k];
      }
    }
  }
  const int ty = threadIdx.x / Tile::kTN, tx = threadIdx.x % Tile::kTN;
  T *dbias = static_cast<T *>(p.dbias) + plane * p.s_q * p.s_kv;
#pragma unroll
  for (int r = 0; r < kRM; ++r) {
    const int i = m0 + ty + r * Tile::kTM;
    if (i >= p.s_q) continue;
#pragma unroll
    for (int k = 0; k < kRN; ++k) {
      const int j = n0 + tx + k * Tile::kTN;
      if (j < p.s_kv) dbias[i * p.s_kv + j] = from_float<T>(acc[r][k]);
    }
  }
}

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Workspace regions: delta [b, h, s_q] fp32, then the fp32 dQ accumulator [b, h, s_q, d_qk].
size_t delta_bytes(const AttnParams &p) {
  return align_up(static_cast<size_t>(p.b * p.h * p.s_q) * sizeof(float));
}
size_t dq_acc_bytes(const AttnParams &p) {
  return align_up(static_cast<size_t>(p.b * p.h * p.s_q * p.d_qk) * sizeof(float));
}

unsigned row_blocks(int64_t rows) {
  const int64_t per = kRowThreads / kWarpSize;
  const int64_t blocks = std::min(kMaxRowBlocks, (rows + per - 1) / per);
  return static_cast<unsigned>(std::max<int64_t>(1, blocks));
}

unsigned tiles(int64_t n, int tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

}  // namespace

// Both regions whatever the mode: the size query does not know `deterministic` (the deterministic
// backward leaves the dQ accumulator unused).
size_t flash_attn_bwd_workspace_bytes(const AttnParams &p) {
  return delta_bytes(p) + dq_acc_bytes(p);
}

void zero_softmax_offset_grad(const AttnParams &p, void *stream) {
  if (p.d_softmax_offset == nullptr || p.h == 0) return;
  NVTE_CHECK_CUDA(cudaMemsetAsync(p.d_softmax_offset, 0, static_cast<size_t>(p.h) * sizeof(float),
                                  as_stream(stream)));
}

void launch_flash_attn_bwd(const AttnParams &p, bool deterministic, void *workspace,
                           void *stream) {
  attn::check_gpu_limits(p);
  const bool want_dbias = p.dbias != nullptr && p.bias_type == NVTE_POST_SCALE_BIAS;
  NVTE_CHECK_SUPPORTED(p.dtype == kNVTEFloat16 || p.dtype == kNVTEBFloat16,
                       "GPU flash attention: expected Q/K/V dtype float16 or bfloat16, got ",
                       dtype_name(p.dtype));
  if (p.b == 0 || p.h == 0) {
    zero_softmax_offset_grad(p, stream);
    return;
  }
  NVTE_CHECK(workspace != nullptr || flash_attn_bwd_workspace_bytes(p) == 0,
             "argument 'workspace': expected ", flash_attn_bwd_workspace_bytes(p),
             " bytes of device memory, got none");
  float *delta = static_cast<float *>(workspace);
  float *dq_acc = reinterpret_cast<float *>(static_cast<char *>(workspace) + delta_bytes(p));
  cudaStream_t s = as_stream(stream);
  dispatch_dtype<TypeList<fp16, bf16>>(p.dtype, "Q", [&](auto tag) {
    using T = typename decltype(tag)::type;
    attn::dispatch_head_dim(p, [&](auto dtag) {
      constexpr int D = decltype(dtag)::value;
      using Tile = BwdTile<D>;
      const BwdAccess a{attn::rows_vec4(p.q, p.sq_, sizeof(T)),
                        attn::rows_vec4(p.k, p.sk_, sizeof(T)),
                        attn::rows_vec4(p.v, p.sv_, sizeof(T)),
                        attn::rows_vec4(p.d_o, p.sdo_, sizeof(T)),
                        attn::rows_vec4(p.dq, p.sdq_, sizeof(T)),
                        attn::rows_vec4(p.dk, p.sdk_, sizeof(T)),
                        attn::rows_vec4(p.dv, p.sdv_, sizeof(T))};
      const int64_t rows = p.b * p.h * p.s_q;
      if (rows > 0) {
        flash_attn_bwd_delta_kernel<T><<<row_blocks(rows), kRowThreads, 0, s>>>(p, delta);
        NVTE_CHECK_LAUNCH();
      }
      if (p.d_softmax_offset != nullptr) {
        flash_attn_bwd_offset_kernel<<<static_cast<unsigned>(p.h), kRowThreads, 0, s>>>(p, delta);
        NVTE_CHECK_LAUNCH();
      }
      if (!deterministic && rows > 0) {
        NVTE_CHECK_CUDA(cudaMemsetAsync(dq_acc, 0, dq_acc_bytes(p), s));
      }
      if (p.s_kv > 0) {
        const dim3 grid(tiles(p.s_kv, Tile::kN), static_cast<unsigned>(p.h_kv),
                        static_cast<unsigned>(p.b));
        flash_attn_bwd_dkdv_kernel<T, D><<<grid, Tile::kThreads, 0, s>>>(
            p, a, delta, deterministic ? nullptr : dq_acc);
        NVTE_CHECK_LAUNCH();
      }
      if (rows > 0 && deterministic) {
        const dim3 grid(tiles(p.s_q, Tile::kM), static_cast<unsigned>(p.h),
                        static_cast<unsigned>(p.b));
        flash_attn_bwd_dq_kernel<T, D><<<grid, Tile::kThreads, 0, s>>>(p, a, delta);
        NVTE_CHECK_LAUNCH();
      } else if (rows > 0) {
        flash_attn_bwd_dq_out_kernel<T><<<row_blocks(rows), kRowThreads, 0, s>>>(p, dq_acc);
        NVTE_CHECK_LAUNCH();
      }
      if (want_dbias && p.s_q > 0 && p.s_kv > 0) {
        const int64_t q_tiles = tiles(p.s_q, Tile::kM), planes = p.bias_b * p.bias_h;
        NVTE_CHECK_SUPPORTED(q_tiles <= attn::kMaxGridYZ && planes <= attn::kMaxGridYZ,
                             "GPU flash attention dBias: expected at most ", attn::kMaxGridYZ,
                             " query tiles of ", Tile::kM, " rows and bias planes, got ", q_tiles,
                             " and ", planes);
        const dim3 grid(tiles(p.s_kv, Tile::kN), static_cast<unsigned>(q_tiles),
                        static_cast<unsigned>(planes));
        flash_attn_bwd_dbias_kernel<T, D><<<grid, Tile::kThreads, 0, s>>>(p, a, delta);
        NVTE_CHECK_LAUNCH();
      }
    });
  });
}

}  // namespace gpu
}  // namespace nvte
