// CPU flash-attention backward. One task per (sequence, kv head): its K and V are packed once, dK and
// dV accumulate in fp32 over every query tile of the heads sharing that kv head (GQA) and are written
// once at the end, so no two tasks touch the same output and the result is deterministic. Per query
// tile and key block the probabilities are recomputed from the saved LSE:
//   P = exp(scale q.k + bias - lse), dP = dO.V^T (dropped entries 0, kept ones x 1/(1-p)),
//   dS = P (dP - delta) with delta = rowsum(dO * O),
//   dQ += dS.K, dK^T += Q^T.dS (both x scale at the end), dV^T += dO^T.P_dropped
// (the transposed forms take dS and P as B panels, which needs no transpose per block).
// Extra memory: the packed K/V of one task and fp32 dK/dV accumulators (O(S) per head); a bias
// gradient adds one fp32 [b, h, s_q, s_kv] buffer (the size of dS) reduced over broadcast dims.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../util/dtype_dispatch.h"
#include "../util/math.h"
#include "../util/parallel.h"
#include "flash_cpu_common.h"
#include "fused_attn_cpu.h"

namespace nvte {
namespace flash_cpu {
namespace {

// P = exp(x - lse) over the kept range (0 elsewhere, and for rows without keys: lse = -inf).
NVTE_CPU_KERNEL void recompute_probs(int rows, float *S, const float *bias, const int *a,
                                     const int *b, float scale, const float *lse) {
  for (int r = 0; r < rows; ++r) {
    float *s = S + r * kBlockKV;
    const float *bb = bias ? bias + r * kBlockKV : kZeroRow;
    const int lo = a[r], hi = b[r];
    const float m = lse[r];
    if (lo >= hi || m == kNegInf) {
      for (int c = 0; c < kBlockKV; ++c) s[c] = 0.0f;
      continue;
    }
    for (int c = 0; c < kBlockKV; ++c) {
      const float x = s[c] * scale + bb[c];
      s[c] = (c >= lo && c < hi) ? exp_softmax_f32(x - m) : 0.0f;
    }
  }
}

// dS = P (dP keep - delta) in place of dP; P becomes P keep. keep == nullptr: no dropout.
NVTE_CPU_KERNEL void probs_grad(int rows, float *P, float *dP, const float *keep,
                                const float *delta) {
  for (int r = 0; r < rows; ++r) {
    float *pr = P + r * kBlockKV, *dr = dP + r * kBlockKV;
    const float dl = delta[r];
    if (keep) {
      const float *kr = keep + r * kBlockKV;
      for (int c = 0; c < kBlockKV; ++c) {
        dr[c] = pr[c] * (dr[c] * kr[c] - dl);
        pr[c] = pr[c] * kr[c];
      }
    } else {
      for (int c = 0; c < kBlockKV; ++c) dr[c] = pr[c] * (dr[c] - dl);
    }
  }
}

// X (fp32 [rows][64], rows past `rows` read as 0) as GEMM operands: the row-major A copy (dQ = dS.K)
// and the B panel with K index = row (dK^T = Q^T.dS, dV^T = dO^T.P): for bf16 the two rows of a pair
// interleave, for fp32 the panel is the row-major copy. No transposes in the inner loop.
NVTE_CPU_KERNEL void to_operands_bf16(int rows, const float *X, uint16_t *a, uint16_t *bpanel) {
  // Convert row by row (vectorizes), zero the rows past `rows`, then interleave row pairs as
  // 32-bit words: low half from the even row, high half from the odd one.
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < kBlockKV; ++c) a[r * kBlockKV + c] = float_to_bf16(X[r * kBlockKV + c]).x;
  std::memset(a + rows * kBlockKV, 0, sizeof(uint16_t) * (kBlockQ - rows) * kBlockKV);
  for (int r = 0; r < kBlockQ; r += 2) {
    const uint16_t *a0 = a + r * kBlockKV, *a1 = a0 + kBlockKV;
    uint32_t *dst = reinterpret_cast<uint32_t *>(bpanel + r * kBlockKV);
    for (int c = 0; c < kBlockKV; ++c)
      dst[c] = static_cast<uint32_t>(a0[c]) | (static_cast<uint32_t>(a1[c]) << 16);
  }
}
NVTE_CPU_KERNEL void to_operands_f32(int rows, const float *X, float *a, float *bpanel) {
  for (int r = 0; r < kBlockQ; ++r)
    for (int c = 0; c < kBlockKV; ++c) {
      const float v = r < rows ? X[r * kBlockKV + c] : 0.0f;
      bpanel[r * kBlockKV + c] = v;
      if (a) a[r * kBlockKV + c] = v;
    }
}
inline void to_operands(int rows, const float *X, uint16_t *a, uint16_t *b) {
  thread_local std::vector<uint16_t> scratch(kBlockQ * kBlockKV);  // A copy nobody asked for
  NVTE_CPU_DISPATCH(to_operands_bf16(rows, X, a ? a : scratch.data(), b));
}
inline void to_operands(int rows, const float *X, float *a, float *b) {
  NVTE_CPU_DISPATCH(to_operands_f32(rows, X, a, b));
}

// A operand Q^T / dO^T of a query tile: [cols][64] with K index = query row (zero past `rows`).
template <typename E, typename T>
void pack_a_transposed(E *dst, const T *src, const int64_t *row_off, int rows, int cols) {
  for (int c = 0; c < cols; ++c)
    for (int r = 0; r < kBlockQ; ++r)
      dst[c * kBlockQ + r] = r < rows ? Compute<E>::load(src[row_off[r] + c]) : E{};
}

template <typename E, typename T>
void bwd(const AttnParams &p) {
  const int64_t group = p.h / p.h_kv;
  const int kpad = static_cast<int>(round_up(p.d_qk, Compute<E>::kKAlign));
  const int vpad = static_cast<int>(round_up(p.d_v, Compute<E>::kKAlign));
  const int ldk = static_cast<int>(round_up(p.d_qk, 16));
  const int64_t kpanels = ceil_div(p.d_qk, tile::kPanel);
  const T *Q = static_cast<const T *>(p.q), *K = static_cast<const T *>(p.k);
  const T *V = static_cast<const T *>(p.v), *O = static_cast<const T *>(p.o);
  const T *dO = static_cast<const T *>(p.d_o);
  T *dQ = static_cast<T *>(p.dq), *dK = static_cast<T *>(p.dk), *dV = static_cast<T *>(p.dv);
  const bool has_bias = p.bias_type == NVTE_POST_SCALE_BIAS || p.bias_type == NVTE_ALIBI;
  std::vector<float> dbias_full;
  if (p.dbias) dbias_full.assign(static_cast<size_t>(p.b * p.h * p.s_q * p.s_kv), 0.0f);

#pragma omp parallel
  {
    const tile::AmxScope amx(uses_amx<E>());  // the tiles configured once per thread
    std::vector<E> qa(static_cast<size_t>(kBlockQ) * kpad), doa(static_cast<size_t>(kBlockQ) * vpad);
    std::vector<E> qt(static_cast<size_t>(p.d_qk) * kBlockQ), dot(static_cast<size_t>(p.d_v) * kBlockQ);
    std::vector<E> ds_a(kBlockQ * kBlockKV), ds_b(kBlockQ * kBlockKV), pd_b(kBlockQ * kBlockKV);
    std::vector<float> S(kBlockQ * kBlockKV), dP(kBlockQ * kBlockKV),
        bias(has_bias ? kBlockQ * kBlockKV : 0), keep(p.dropout > 0 ? kBlockQ * kBlockKV : 0),
        dq_acc(static_cast<size_t>(kBlockQ) * ldk);
    std::vector<E> kt, kd, vt;
    std::vector<float> dkt_acc, dvt_acc;  // per key block: [d][64], transposed once at the end
    std::vector<float> o_row(static_cast<size_t>(p.d_v));
    float delta[kBlockQ], lse[kBlockQ];
    int64_t off[kBlockQ], lo[kBlockQ], hi[kBlockQ];
    int a[kBlockQ], b[kBlockQ];
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < p.b * p.h_kv; ++task) {
      const int64_t bi = task / p.h_kv, g = task % p.h_kv;
      const int64_t sq = p.len_q(bi), skv = p.len_kv(bi), nblk = ceil_div(skv, kBlockKV);
      // Pack this kv head: K^T panels (S), K rows (dQ), V^T panels (dP).
      const size_t kt_blk = static_cast<size_t>(kpad) * tile::kPanel,
                   kd_blk = static_cast<size_t>(kBlockKV) * tile::kPanel * kpanels,
                   vt_blk = static_cast<size_t>(vpad) * tile::kPanel;
      kt.resize(nblk * kt_blk);
      kd.resize(nblk * kd_blk);
      vt.resize(nblk * vt_blk);
      for (int64_t blk = 0; blk < nblk; ++blk) {
        const int n = static_cast<int>(std::min<int64_t>(kBlockKV, skv - blk * kBlockKV));
        token_offsets_kv(p, p.sk_, bi, g, blk * kBlockKV, n, off);
        pack_b_rows_as_columns<E, T>(kt.data() + blk * kt_blk, kpad, K, off, n, static_cast<int>(p.d_qk));
        pack_b_rows_as_k<E, T>(kd.data() + blk * kd_blk, kBlockKV, K, off, n, static_cast<int>(p.d_qk));
        token_offsets_kv(p, p.sv_, bi, g, blk * kBlockKV, n, off);
        pack_b_rows_as_columns<E, T>(vt.data() + blk * vt_blk, vpad, V, off, n, static_cast<int>(p.d_v));
      }
      dkt_acc.assign(static_cast<size_t>(nblk * kBlockKV * p.d_qk), 0.0f);
      dvt_acc.assign(static_cast<size_t>(nblk * kBlockKV * p.d_v), 0.0f);

      for (int64_t hd = g * group; hd < (g + 1) * group; ++hd) {
        for (int64_t q0 = 0; q0 < sq; q0 += kBlockQ) {
          const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, sq - q0));
          token_offsets_q(p, p.sq_, bi, hd, q0, rows, off);
          pack_a<E, T>(qa.data(), kpad, Q, off, rows, rows, static_cast<int>(p.d_qk));
          pack_a_transposed<E, T>(qt.data(), Q, off, rows, static_cast<int>(p.d_qk));
          token_offsets_q(p, p.sdo_, bi, hd, q0, rows, off);
          pack_a<E, T>(doa.data(), vpad, dO, off, rows, rows, static_cast<int>(p.d_v));
          pack_a_transposed<E, T>(dot.data(), dO, off, rows, static_cast<int>(p.d_v));
          for (int r = 0; r < rows; ++r) {
            const T *o = O + p.token_q(p.so_, bi, q0 + r) + hd * p.so_.head;
            const T *g_o = dO + off[r];
            if constexpr (std::is_same<E, float>::value) {
              // The fp32 tiles' rounding (FMA at v3/v4): delta == dP where P is one-hot.
              for (int64_t d = 0; d < p.d_v; ++d) o_row[d] = to_float(o[d]);
              delta[r] = tile::dot_f32_cloned(o_row.data(), doa.data() + static_cast<size_t>(r) * vpad,
                                              static_cast<int>(p.d_v));
            } else {
              float acc = 0.0f;
              for (int64_t d = 0; d < p.d_v; ++d) acc += to_float(o[d]) * to_float(g_o[d]);
              delta[r] = acc;
            }
            lse[r] = p.lse[(bi * p.h + hd) * p.s_q + q0 + r];
          }
          int64_t ulo, uhi;
          tile_key_ranges(p, q0, rows, sq, skv, lo, hi, &ulo, &uhi);
          std::fill(dq_acc.begin(), dq_acc.end(), 0.0f);
          for (int64_t blk = ulo / kBlockKV; blk * kBlockKV < uhi; ++blk) {
            const int64_t j0 = blk * kBlockKV;
            for (int r = 0; r < rows; ++r) {
              a[r] = static_cast<int>(std::clamp<int64_t>(lo[r] - j0, 0, kBlockKV));
              b[r] = static_cast<int>(std::clamp<int64_t>(hi[r] - j0, 0, kBlockKV));
            }
            Compute<E>::gemm(rows, kBlockKV, kpad, qa.data(), kpad, kt.data() + blk * kt_blk,
                             kt_blk, S.data(), kBlockKV, false);
            const bool hb =
                has_bias && load_bias_tile<T>(p, bi, hd, q0, rows, j0, sq, skv, bias.data());
            NVTE_CPU_DISPATCH(
                recompute_probs(rows, S.data(), hb ? bias.data() : nullptr, a, b, p.scale, lse));
            Compute<E>::gemm(rows, kBlockKV, vpad, doa.data(), vpad, vt.data() + blk * vt_blk,
                             vt_blk, dP.data(), kBlockKV, false);
            if (p.dropout > 0) dropout_tile(p, bi, hd, q0, rows, j0, keep.data());
            NVTE_CPU_DISPATCH(
                probs_grad(rows, S.data(), dP.data(), p.dropout > 0 ? keep.data() : nullptr,
                           delta));
            if (p.dbias) {
              float *dst = dbias_full.data() + ((bi * p.h + hd) * p.s_q + q0) * p.s_kv;
              for (int r = 0; r < rows; ++r)
                for (int c = 0; c < kBlockKV && j0 + c < skv; ++c)
                  dst[r * p.s_kv + j0 + c] = dP[r * kBlockKV + c];
            }
            to_operands(rows, dP.data(), ds_a.data(), ds_b.data());
            to_operands(rows, S.data(), static_cast<E *>(nullptr), pd_b.data());
            Compute<E>::gemm(rows, static_cast<int>(p.d_qk), kBlockKV, ds_a.data(), kBlockKV,
                             kd.data() + blk * kd_blk, static_cast<size_t>(kBlockKV) * tile::kPanel,
                             dq_acc.data(), ldk, true);
            // dK^T [d_qk][64 keys] += Q^T.dS and dV^T [d_v][64 keys] += dO^T.P_dropped.
            Compute<E>::gemm(static_cast<int>(p.d_qk), kBlockKV, kBlockQ, qt.data(), kBlockQ,
                             ds_b.data(), 0, dkt_acc.data() + blk * kBlockKV * p.d_qk, kBlockKV,
                             true);
            Compute<E>::gemm(static_cast<int>(p.d_v), kBlockKV, kBlockQ, dot.data(), kBlockQ,
                             pd_b.data(), 0, dvt_acc.data() + blk * kBlockKV * p.d_v, kBlockKV,
                             true);
          }
          token_offsets_q(p, p.sdq_, bi, hd, q0, rows, off);
          for (int r = 0; r < rows; ++r) {
            T *dst = dQ + off[r];
            for (int64_t d = 0; d < p.d_qk; ++d)
              dst[d] = from_float<T>(dq_acc[static_cast<size_t>(r) * ldk + d] * p.scale);
          }
        }
        // Padded query rows of bshd/sbhd get dQ = 0.
        if (p.format != NVTE_THD)
          for (int64_t i = sq; i < p.s_q; ++i) {
            T *dst = dQ + p.token_q(p.sdq_, bi, i) + hd * p.sdq_.head;
            for (int64_t d = 0; d < p.d_qk; ++d) dst[d] = from_float<T>(0.0f);
          }
      }
      const int64_t kv_rows = p.format == NVTE_THD ? skv : p.s_kv;
      for (int64_t j = 0; j < kv_rows; ++j) {
        T *dk = dK + p.token_kv(p.sdk_, bi, j) + g * p.sdk_.head;
        T *dv = dV + p.token_kv(p.sdv_, bi, j) + g * p.sdv_.head;
        if (j >= skv) {  // padded keys get 0; the accumulators cover only the skv live ones
          for (int64_t d = 0; d < p.d_qk; ++d) dk[d] = from_float<T>(0.0f);
          for (int64_t d = 0; d < p.d_v; ++d) dv[d] = from_float<T>(0.0f);
          continue;
        }
        const float *kt_j = dkt_acc.data() + (j / kBlockKV) * kBlockKV * p.d_qk + j % kBlockKV;
        const float *vt_j = dvt_acc.data() + (j / kBlockKV) * kBlockKV * p.d_v + j % kBlockKV;
        for (int64_t d = 0; d < p.d_qk; ++d) dk[d] = from_float<T>(kt_j[d * kBlockKV] * p.scale);
        for (int64_t d = 0; d < p.d_v; ++d) dv[d] = from_float<T>(vt_j[d * kBlockKV]);
      }
    }
  }
  if (p.dbias) {
    // Sum over the broadcast dims in a fixed order: batch, then head.
    T *db = static_cast<T *>(p.dbias);
    const int64_t plane = p.s_q * p.s_kv;
    parallel_for(static_cast<size_t>(p.bias_b * p.bias_h), 1, [&](size_t begin, size_t end) {
      std::vector<float> sum(plane);
      for (size_t t = begin; t < end; ++t) {
        const int64_t bb = static_cast<int64_t>(t) / p.bias_h, hh = static_cast<int64_t>(t) % p.bias_h;
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int64_t bi = 0; bi < p.b; ++bi) {
          if (p.bias_b != 1 && bi != bb) continue;
          for (int64_t hd = 0; hd < p.h; ++hd) {
            if (p.bias_h != 1 && hd != hh) continue;
            const float *src = dbias_full.data() + (bi * p.h + hd) * plane;
            for (int64_t e = 0; e < plane; ++e) sum[e] += src[e];
          }
        }
        T *dst = db + t * plane;
        for (int64_t e = 0; e < plane; ++e) dst[e] = from_float<T>(sum[e]);
      }
    });
  }
}

}  // namespace
}  // namespace flash_cpu

void flash_attn_bwd_cpu(const AttnParams &p) {
  dispatch_dtype<TypeList<float, fp16, bf16>>(p.dtype, "Q", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same<T, bf16>::value) {
      if (flash_cpu::use_bf16_compute(p.dtype)) return flash_cpu::bwd<uint16_t, T>(p);
    }
    flash_cpu::bwd<float, T>(p);
  });
}

}  // namespace nvte
