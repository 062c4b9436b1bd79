// Shared support of the attention-sink tests (test_fused_attn_sinks.cpp on the CPU,
// gpu/test_gpu_fused_attn_sinks.cpp GPU vs CPU): one problem (bshd, GQA, optional padding), the
// *_softmax calls with every argument spelled out, and an fp64 reference written from the
// definition in fused_attn.h (full score rows plus the sink logit; shares no code with the kernels).
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/fused_attn.h"

namespace sink_test {

using test::TestTensor;

struct Sizes {
  size_t b = 2, h = 4, h_kv = 2, s_q = 37, s_kv = 29, d = 24;
};

// Same bounds as the rest of the attention tests (fused_attn_reference.h): relative to the largest
// reference magnitude; fp16 / bf16 round what they store and bf16 also P and dS before the GEMMs.
inline double rel_tol(NVTEDType t) { return t == kNVTEFloat32 ? 1e-5 : t == kNVTEFloat16 ? 2e-3 : 2e-2; }

struct SinkRun {
  Sizes z;
  NVTEDType dt;
  NVTE_Mask_Type mask;
  NVTE_Softmax_Type st;
  int64_t left = -1, right = -1;
  std::vector<int32_t> lens_q, lens_kv;  // padding masks only
  std::vector<double> q, k, v, d_o, offset;
  TestTensor tq, tk, tv, to, tlse, tdo, tdq, tdk, tdv, toff, tdoff, tcuq, tcukv;
  float scale = 0.3f;

  SinkRun(NVTEDType dt_, NVTE_Mask_Type m, NVTE_Softmax_Type s, uint32_t seed = 3)
      : dt(dt_), mask(m), st(s) {
    std::mt19937 rng(seed);
    const std::vector<size_t> qs{z.b, z.s_q, z.h, z.d}, ks{z.b, z.s_kv, z.h_kv, z.d};
    tq = TestTensor(qs, dt);
    tk = TestTensor(ks, dt);
    tv = TestTensor(ks, dt);
    to = TestTensor(qs, dt);
    tdo = TestTensor(qs, dt);
    tdq = TestTensor(qs, dt);
    tdk = TestTensor(ks, dt);
    tdv = TestTensor(ks, dt);
    tlse = TestTensor({z.b, z.h, z.s_q}, kNVTEFloat32);
    toff = TestTensor({1, z.h, 1, 1}, kNVTEFloat32);
    tdoff = TestTensor({1, z.h, 1, 1}, kNVTEFloat32);
    q = tq.fill_uniform(rng, -1.5, 1.5);
    k = tk.fill_uniform(rng, -1.5, 1.5);
    v = tv.fill_uniform(rng, -1, 1);
    d_o = tdo.fill_uniform(rng, -1, 1);
    offset = toff.fill_uniform(rng, -1, 2);  // around the logits' range: the sink matters
    if (m == NVTE_PADDING_MASK || m == NVTE_PADDING_CAUSAL_MASK) {
      lens_q = {static_cast<int32_t>(z.s_q), 11};
      lens_kv = {17, static_cast<int32_t>(z.s_kv)};
      tcuq = TestTensor({z.b + 1}, kNVTEInt32);
      tcukv = TestTensor({z.b + 1}, kNVTEInt32);
      for (size_t i = 0; i <= z.b; ++i) {
        int32_t cq = 0, ckv = 0;
        for (size_t j = 0; j < i; ++j) cq += lens_q[j], ckv += lens_kv[j];
        tcuq.put(i, cq);
        tcukv.put(i, ckv);
      }
    }
  }
  NVTETensor cu_q() const { return lens_q.empty() ? nullptr : tcuq.handle(); }
  NVTETensor cu_kv() const { return lens_kv.empty() ? nullptr : tcukv.handle(); }
  NVTEStatus fwd(NVTE_Softmax_Type s, NVTETensor off) {
    return nvte_fused_attn_fwd_softmax(tq, tk, tv, nullptr, off, to, tlse, cu_q(), cu_kv(),
                                       nullptr, z.s_q, z.s_kv, true, scale, 0.0f,
                                       NVTE_BSHD_BSHD_BSHD, NVTE_NO_BIAS, mask, s, left, right,
                                       nullptr, nullptr);
  }
  NVTEStatus bwd(NVTE_Softmax_Type s, NVTETensor off, NVTETensor doff) {
    return nvte_fused_attn_bwd_softmax(tq, tk, tv, to, tdo, tlse, nullptr, off, tdq, tdk, tdv,
                                       nullptr, doff, cu_q(), cu_kv(), nullptr, z.s_q, z.s_kv,
                                       scale, 0.0f, NVTE_BSHD_BSHD_BSHD, NVTE_NO_BIAS, mask, s,
                                       left, right, true, nullptr, nullptr);
  }
};

// fp64 reference, straight from the definition (full score rows, no tiling).
struct Ref {
  std::vector<double> o, lse, dq, dk, dv, doff, doff_mag;
};
inline Ref reference(const SinkRun &r) {
  const Sizes &z = r.z;
  Ref f;
  f.o.assign(z.b * z.s_q * z.h * z.d, 0.0);
  f.lse.assign(z.b * z.h * z.s_q, -INFINITY);
  f.dq.assign(f.o.size(), 0.0);
  f.dk.assign(z.b * z.s_kv * z.h_kv * z.d, 0.0);
  f.dv.assign(f.dk.size(), 0.0);
  f.doff.assign(z.h, 0.0);
  f.doff_mag.assign(z.h, 0.0);
  const bool causal = r.mask == NVTE_CAUSAL_MASK || r.mask == NVTE_PADDING_CAUSAL_MASK ||
                      r.mask == NVTE_CAUSAL_BOTTOM_RIGHT_MASK;
  const bool br = r.mask == NVTE_CAUSAL_BOTTOM_RIGHT_MASK || r.mask == NVTE_NO_MASK ||
                  r.mask == NVTE_PADDING_MASK;
  auto qi = [&](size_t bi, size_t i, size_t hh) { return ((bi * z.s_q + i) * z.h + hh) * z.d; };
  auto ki = [&](size_t bi, size_t j, size_t g) { return ((bi * z.s_kv + j) * z.h_kv + g) * z.d; };
  for (size_t bi = 0; bi < z.b; ++bi) {
    const int64_t sq = r.lens_q.empty() ? z.s_q : r.lens_q[bi];
    const int64_t skv = r.lens_kv.empty() ? z.s_kv : r.lens_kv[bi];
    for (size_t hh = 0; hh < z.h; ++hh) {
      const size_t g = hh / (z.h / z.h_kv);
      const double a = r.st == NVTE_LEARNABLE_SOFTMAX ? r.offset[hh] : 0.0;
      const bool sink = r.st != NVTE_VANILLA_SOFTMAX;
      for (int64_t i = 0; i < sq; ++i) {
        const int64_t off = br ? skv - sq : 0;
        std::vector<double> x(skv, -INFINITY);
        double m = sink ? a : -INFINITY;
        for (int64_t j = 0; j < skv; ++j) {
          if (causal && j > i + off) continue;
          if (r.left >= 0 && j < i + off - r.left) continue;
          if (r.right >= 0 && j > i + off + r.right) continue;
          double s = 0;
          for (size_t d = 0; d < z.d; ++d) s += r.q[qi(bi, i, hh) + d] * r.k[ki(bi, j, g) + d];
          x[j] = r.scale * s;
          m = std::max(m, x[j]);
        }
        if (m == -INFINITY) continue;  // vanilla row with no key: O = 0, LSE = -inf
        double den = sink ? std::exp(a - m) : 0.0;
        for (int64_t j = 0; j < skv; ++j) den += std::exp(x[j] - m);
        const double lse = m + std::log(den);
        f.lse[(bi * z.h + hh) * z.s_q + i] = lse;
        std::vector<double> p(skv), dp(skv, 0.0);
        for (int64_t j = 0; j < skv; ++j) p[j] = std::exp(x[j] - lse);
        double delta = 0, mag = 0;
        for (size_t d = 0; d < z.d; ++d) {
          double o = 0;
          for (int64_t j = 0; j < skv; ++j) o += p[j] * r.v[ki(bi, j, g) + d];
          f.o[qi(bi, i, hh) + d] = o;
          delta += o * r.d_o[qi(bi, i, hh) + d];
          mag += std::fabs(o * r.d_o[qi(bi, i, hh) + d]);
        }
        if (sink) {
          f.doff[hh] -= std::exp(a - lse) * delta;
          f.doff_mag[hh] += std::exp(a - lse) * mag;
        }
        for (int64_t j = 0; j < skv; ++j) {
          if (p[j] == 0) continue;
          for (size_t d = 0; d < z.d; ++d) dp[j] += r.d_o[qi(bi, i, hh) + d] * r.v[ki(bi, j, g) + d];
          const double ds = p[j] * (dp[j] - delta);
          for (size_t d = 0; d < z.d; ++d) {
            f.dq[qi(bi, i, hh) + d] += r.scale * ds * r.k[ki(bi, j, g) + d];
            f.dk[ki(bi, j, g) + d] += r.scale * ds * r.q[qi(bi, i, hh) + d];
            f.dv[ki(bi, j, g) + d] += p[j] * r.d_o[qi(bi, i, hh) + d];
          }
        }
      }
    }
  }
  return f;
}

inline double max_abs(const std::vector<double> &v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

inline void expect_close(const char *what, const TestTensor &got, const std::vector<double> &ref,
                  double tol) {
  const double bound = tol * std::max(1.0, max_abs(ref));
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::fabs(got.get(i) - ref[i]) <= bound)) first = bad++ ? first : i;
  EXPECT_EQ(bad, 0u) << what << ": first mismatch at " << first << ": got " << got.get(first)
                     << ", expected " << ref[first] << " (bound " << bound << ")";
}

}  // namespace sink_test
