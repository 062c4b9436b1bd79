// CPU flash-attention backward. One task per (sequence, kv head): its K and V are packed once, dK and
// dV accumulate in fp32 over every query tile of the heads sharing that kv head (GQA) and are written
// once at the end, so no two tasks touch the same output and the result is deterministic. Per query
// tile and key block the probabilities are recomputed from the saved LSE:
//   P = exp(scale q.k + bias - lse), dP = dO.V^T (dropped entries 0, kept ones x 1/(1-p)),
//   dS = P (dP - delta) with delta = rowsum(dO * O),
//   dQ += dS.K, dK += dS^T.Q (both x scale at the end), dV += P_dropped^T.dO.
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

bool use_bf16_compute(DType dtype);

namespace {

// P = exp(x - lse) over the kept range (0 elsewhere, and for rows without keys: lse = -inf).
NVTE_CPU_CLONES void recompute_probs(int rows, float *S, const float *bias, const int *a,
                                     const int *b, float scale, const float *lse) {
  for (int r = 0; r < rows; ++r) {
    float *s = S + r * kBlockKV;
    const float *bb = bias ? bias + r * kBlockKV : nullptr;
    const int lo = a[r], hi = b[r];
    const float m = lse[r];
    if (lo >= hi || m == kNegInf) {
      for (int c = 0; c < kBlockKV; ++c) s[c] = 0.0f;
      continue;
    }
    for (int c = 0; c < kBlockKV; ++c) {
      float x = s[c] * scale;
      if (bb) x += bb[c];
      s[c] = (c >= lo && c < hi) ? exp_f32(x - m) : 0.0f;
    }
  }
}

// dS = P (dP keep - delta) in place of dP; P becomes P keep. keep == nullptr: no dropout.
NVTE_CPU_CLONES void probs_grad(int rows, float *P, float *dP, const float *keep,
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

// X (fp32 [rows][64]) -> row-major E copy [64][64] and its transpose [64][64] (zeros past `rows`).
template <typename E>
void to_operands(int rows, const float *X, E *row_major, E *transposed) {
  for (int r = 0; r < kBlockQ; ++r)
    for (int c = 0; c < kBlockKV; ++c) {
      const E v = r < rows ? Compute<E>::from_f32(X[r * kBlockKV + c]) : E{};
      if (row_major) row_major[r * kBlockKV + c] = v;
      transposed[c * kBlockQ + r] = v;
    }
}

template <typename E, typename T>
void bwd(const AttnParams &p) {
  const int64_t group = p.h / p.h_kv;
  const int kpad = static_cast<int>(round_up(p.d_qk, Compute<E>::kKAlign));
  const int vpad = static_cast<int>(round_up(p.d_v, Compute<E>::kKAlign));
  const int ldk = static_cast<int>(round_up(p.d_qk, 16)), ldv = static_cast<int>(round_up(p.d_v, 16));
  const int64_t kpanels = ceil_div(p.d_qk, tile::kPanel), vpanels = ceil_div(p.d_v, tile::kPanel);
  const T *Q = static_cast<const T *>(p.q), *K = static_cast<const T *>(p.k);
  const T *V = static_cast<const T *>(p.v), *O = static_cast<const T *>(p.o);
  const T *dO = static_cast<const T *>(p.d_o);
  T *dQ = static_cast<T *>(p.dq), *dK = static_cast<T *>(p.dk), *dV = static_cast<T *>(p.dv);
  const bool has_bias = p.bias_type == NVTE_POST_SCALE_BIAS || p.bias_type == NVTE_ALIBI;
  std::vector<float> dbias_full;
  if (p.dbias) dbias_full.assign(static_cast<size_t>(p.b * p.h * p.s_q * p.s_kv), 0.0f);

#pragma omp parallel
  {
    std::vector<E> qa(static_cast<size_t>(kBlockQ) * kpad), doa(static_cast<size_t>(kBlockQ) * vpad);
    std::vector<E> qd(static_cast<size_t>(kBlockQ) * tile::kPanel * kpanels),
        dod(static_cast<size_t>(kBlockQ) * tile::kPanel * vpanels);
    std::vector<E> ds_rm(kBlockQ * kBlockKV), ds_t(kBlockQ * kBlockKV), pd_t(kBlockQ * kBlockKV);
    std::vector<float> S(kBlockQ * kBlockKV), dP(kBlockQ * kBlockKV),
        bias(has_bias ? kBlockQ * kBlockKV : 0), keep(p.dropout > 0 ? kBlockQ * kBlockKV : 0),
        dq_acc(static_cast<size_t>(kBlockQ) * ldk);
    std::vector<E> kt, kd, vt;
    std::vector<float> dk_acc, dv_acc;
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
      dk_acc.assign(static_cast<size_t>(nblk * kBlockKV) * ldk, 0.0f);
      dv_acc.assign(static_cast<size_t>(nblk * kBlockKV) * ldv, 0.0f);

      for (int64_t hd = g * group; hd < (g + 1) * group; ++hd) {
        for (int64_t q0 = 0; q0 < sq; q0 += kBlockQ) {
          const int rows = static_cast<int>(std::min<int64_t>(kBlockQ, sq - q0));
          token_offsets_q(p, p.sq_, bi, hd, q0, rows, off);
          pack_a<E, T>(qa.data(), kpad, Q, off, rows, rows, static_cast<int>(p.d_qk));
          pack_b_rows_as_k<E, T>(qd.data(), kBlockQ, Q, off, rows, static_cast<int>(p.d_qk));
          token_offsets_q(p, p.sdo_, bi, hd, q0, rows, off);
          pack_a<E, T>(doa.data(), vpad, dO, off, rows, rows, static_cast<int>(p.d_v));
          pack_b_rows_as_k<E, T>(dod.data(), kBlockQ, dO, off, rows, static_cast<int>(p.d_v));
          for (int r = 0; r < rows; ++r) {
            const T *o = O + p.token_q(p.so_, bi, q0 + r) + hd * p.so_.head;
            const T *g_o = dO + off[r];
            float acc = 0.0f;
            for (int64_t d = 0; d < p.d_v; ++d) acc += to_float(o[d]) * to_float(g_o[d]);
            delta[r] = acc;
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
            recompute_probs(rows, S.data(), hb ? bias.data() : nullptr, a, b, p.scale, lse);
            Compute<E>::gemm(rows, kBlockKV, vpad, doa.data(), vpad, vt.data() + blk * vt_blk,
                             vt_blk, dP.data(), kBlockKV, false);
            if (p.dropout > 0) dropout_tile(p, bi, hd, q0, rows, j0, keep.data());
            probs_grad(rows, S.data(), dP.data(), p.dropout > 0 ? keep.data() : nullptr, delta);
            if (p.dbias) {
              float *dst = dbias_full.data() + ((bi * p.h + hd) * p.s_q + q0) * p.s_kv;
              for (int r = 0; r < rows; ++r)
                for (int c = 0; c < kBlockKV && j0 + c < skv; ++c)
                  dst[r * p.s_kv + j0 + c] = dP[r * kBlockKV + c];
            }
            to_operands<E>(rows, dP.data(), ds_rm.data(), ds_t.data());
            to_operands<E>(rows, S.data(), nullptr, pd_t.data());
            Compute<E>::gemm(rows, static_cast<int>(p.d_qk), kBlockKV, ds_rm.data(), kBlockKV,
                             kd.data() + blk * kd_blk, static_cast<size_t>(kBlockKV) * tile::kPanel,
                             dq_acc.data(), ldk, true);
            Compute<E>::gemm(kBlockKV, static_cast<int>(p.d_qk), kBlockQ, ds_t.data(), kBlockQ,
                             qd.data(), static_cast<size_t>(kBlockQ) * tile::kPanel,
                             dk_acc.data() + j0 * ldk, ldk, true);
            Compute<E>::gemm(kBlockKV, static_cast<int>(p.d_v), kBlockQ, pd_t.data(), kBlockQ,
                             dod.data(), static_cast<size_t>(kBlockQ) * tile::kPanel,
                             dv_acc.data() + j0 * ldv, ldv, true);
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
        const bool live = j < skv;
        for (int64_t d = 0; d < p.d_qk; ++d)
          dk[d] = from_float<T>(live ? dk_acc[static_cast<size_t>(j) * ldk + d] * p.scale : 0.0f);
        for (int64_t d = 0; d < p.d_v; ++d)
          dv[d] = from_float<T>(live ? dv_acc[static_cast<size_t>(j) * ldv + d] : 0.0f);
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
