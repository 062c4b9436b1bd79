// CPU kernels of LayerNorm / RMSNorm: fp32 row math shared by both norms, OpenMP over rows.
#include <algorithm>
#include <cmath>
#include <vector>

#include "../util/dtype_dispatch.h"
#include "../util/parallel.h"
#include "norm_cpu.h"

#define NVTE_ALWAYS_INLINE inline __attribute__((always_inline))

namespace nvte {

namespace {

// Rows of any high-precision dtype are converted to / from fp32 by functions picked once per call,
// so the row math below is written once for every dtype combination (a call per row of `hidden`
// elements costs nothing next to the row's work).
using LoadFn = void (*)(const void *src, float *dst, size_t n);
using StoreFn = void (*)(const float *src, void *dst, size_t n);

LoadFn row_loader(DType t, const char *arg) {
  LoadFn fn = nullptr;
  dispatch_dtype<HighPrecisionTypes>(t, arg, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fn = [](const void *src, float *dst, size_t n) {
      load_row(static_cast<const T *>(src), dst, n);
    };
  });
  return fn;
}

StoreFn row_storer(DType t, const char *arg) {
  StoreFn fn = nullptr;
  dispatch_dtype<HighPrecisionTypes>(t, arg, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fn = [](const float *src, void *dst, size_t n) { store_row(src, static_cast<T *>(dst), n); };
  });
  return fn;
}

// The weight applied, in fp32: gamma, or 1 + gamma rounded once in fp32 (as TE's kernels).
std::vector<float> effective_weight(const void *gamma, DType w_dtype, size_t n,
                                    bool zero_centered) {
  std::vector<float> w(n);
  row_loader(w_dtype, "gamma")(gamma, w.data(), n);
  if (zero_centered) {
    for (float &v : w) v += 1.0f;
  }
  return w;
}

// ---------------------------------------------------------------- reductions
// Row sums in 16 fixed partial lanes, then the tail, then the lanes in order: the same additions in
// the same order on every ISA clone and in every build (an `omp simd` reduction follows the vector
// width, so AVX-512, AVX2 and baseline clones, or a sanitizer build, rounded differently), and GCC
// vectorizes it without -ffast-math. Shorter dependency chains are also more accurate than one sum.
constexpr size_t kLanes = 16;

template <class F>
NVTE_ALWAYS_INLINE float lane_sum(size_t n, F f) {
  float part[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) part[l] += f(i + l);
  float s = 0.0f;
  for (; i < n; ++i) s += f(i);
  for (size_t l = 0; l < kLanes; ++l) s += part[l];
  return s;
}

// ---------------------------------------------------------------- forward row math
// Two passes over the fp32 row (it sits in L1: 16 KiB at hidden 4096): the mean, then the centered
// sum of squares. Unlike E[x^2] - E[x]^2 this stays accurate when |mean| >> stddev.
template <bool kCentered>
NVTE_ALWAYS_INLINE void norm_fwd_row(float *v, size_t n, const float *w, const float *b, float eps,
                                     float *mean_out, float *rsigma_out) {
  float mean = 0.0f;
  if constexpr (kCentered) {
    mean = lane_sum(n, [&](size_t i) { return v[i]; }) / static_cast<float>(n);
  }
  const float sq = lane_sum(n, [&](size_t i) {
    const float d = v[i] - mean;
    return d * d;
  });
  const float rs = 1.0f / std::sqrt(sq / static_cast<float>(n) + eps);
  if constexpr (kCentered) {
#pragma omp simd
    for (size_t i = 0; i < n; ++i) v[i] = (v[i] - mean) * rs * w[i] + b[i];
  } else {
#pragma omp simd
    for (size_t i = 0; i < n; ++i) v[i] = v[i] * rs * w[i];
  }
  *mean_out = mean;
  *rsigma_out = rs;
}

NVTE_CPU_KERNEL void layernorm_fwd_kernel(float *v, size_t n, const float *w, const float *b,
                                          float eps, float *mean, float *rsigma) {
  norm_fwd_row<true>(v, n, w, b, eps, mean, rsigma);
}

NVTE_CPU_KERNEL void rmsnorm_fwd_kernel(float *v, size_t n, const float *w, float eps,
                                        float *rsigma) {
  float unused;
  norm_fwd_row<false>(v, n, w, nullptr, eps, &unused, rsigma);
}

// ---------------------------------------------------------------- backward row math
// One pass computes xhat, dy = dz * w, the two row means and the dgamma/dbeta partial sums of this
// chunk; a second turns the row into dx (in place in `x`).
template <bool kCentered>
NVTE_ALWAYS_INLINE void norm_bwd_row(float *x, float *dz, const float *w, size_t n, float mu,
                                     float rs, float *dgamma, float *dbeta) {
  // The two row sums in fixed lanes, in lane_sum's order (see there).
  auto element = [&](size_t i, float &a_dy, float &a_dyx) {
    const float xh = (x[i] - mu) * rs;
    const float d = dz[i];
    const float dy = d * w[i];
    dgamma[i] += d * xh;
    if constexpr (kCentered) {
      dbeta[i] += d;
      a_dy += dy;
    }
    a_dyx += dy * xh;
    x[i] = xh;
    dz[i] = dy;
  };
  float p_dy[kLanes] = {}, p_dyx[kLanes] = {};
  size_t i0 = 0;
  for (; i0 + kLanes <= n; i0 += kLanes)
    for (size_t l = 0; l < kLanes; ++l) element(i0 + l, p_dy[l], p_dyx[l]);
  float s_dy = 0.0f, s_dyx = 0.0f;
  for (; i0 < n; ++i0) element(i0, s_dy, s_dyx);
  for (size_t l = 0; l < kLanes; ++l) {
    s_dy += p_dy[l];
    s_dyx += p_dyx[l];
  }
  const float m_dy = kCentered ? s_dy / static_cast<float>(n) : 0.0f;
  const float m_dyx = s_dyx / static_cast<float>(n);
#pragma omp simd
  for (size_t i = 0; i < n; ++i) x[i] = rs * (dz[i] - m_dy - x[i] * m_dyx);
}

NVTE_CPU_KERNEL void layernorm_bwd_kernel(float *x, float *dz, const float *w, size_t n, float mu,
                                          float rs, float *dgamma, float *dbeta) {
  norm_bwd_row<true>(x, dz, w, n, mu, rs, dgamma, dbeta);
}

NVTE_CPU_KERNEL void rmsnorm_bwd_kernel(float *x, float *dz, const float *w, size_t n, float rs,
                                        float *dgamma) {
  norm_bwd_row<false>(x, dz, w, n, 0.0f, rs, dgamma, nullptr);
}

// acc[j] += src[j]
NVTE_CPU_KERNEL void add_row(float *acc, const float *src, size_t n) {
  for (size_t j = 0; j < n; ++j) acc[j] += src[j];
}

// Rows per backward chunk: enough that a chunk's partial row (hidden or 2*hidden floats) is cheap
// next to its rows; at most kMaxChunks partial rows (2 MiB at hidden 4096, LayerNorm) to re-read.
constexpr size_t kMinRowsPerChunk = 16;
constexpr size_t kMaxChunks = 64;

}  // namespace

size_t norm_bwd_chunks(size_t rows) {
  return std::clamp<size_t>((rows + kMinRowsPerChunk - 1) / kMinRowsPerChunk, 1, kMaxChunks);
}

size_t norm_bwd_partials_per_chunk(NormKind kind, size_t hidden) {
  return kind == NormKind::kLayerNorm ? 2 * hidden : hidden;
}

// ---------------------------------------------------------------- launchers
void launch_norm_fwd(const NormFwdParams &p, const OutputEmitter &z) {
  const size_t n = p.hidden;
  const bool ln = p.kind == NormKind::kLayerNorm;
  const std::vector<float> w = effective_weight(p.gamma, p.w_dtype, n, p.zero_centered_gamma);
  std::vector<float> b;
  if (ln) {
    b.resize(n);
    row_loader(p.w_dtype, "beta")(p.beta, b.data(), n);
  }
  const LoadFn load_x = row_loader(p.x_dtype, "x");
  const size_t x_row_bytes = n * dtype_size(p.x_dtype);
  const char *x = static_cast<const char *>(p.x);
  // Fused: each block of rows is normalized into fp32 in cache and stored in z's dtype (and FP8
  // scaling mode) by the emitter right away, so x is read once and z written once.
  emit_rows(z, [&](size_t row0, size_t nrows, float *vals) {
    for (size_t r = 0; r < nrows; ++r) {
      const size_t row = row0 + r;
      float *v = vals + r * n;
      load_x(x + row * x_row_bytes, v, n);
      if (ln) {
        NVTE_CPU_DISPATCH(
            layernorm_fwd_kernel(v, n, w.data(), b.data(), p.epsilon, &p.mu[row], &p.rsigma[row]));
      } else {
        NVTE_CPU_DISPATCH(rmsnorm_fwd_kernel(v, n, w.data(), p.epsilon, &p.rsigma[row]));
      }
    }
  });
}

void launch_norm_bwd(const NormBwdParams &p) {
  const size_t n = p.hidden, rows = p.rows, chunks = p.chunks;
  const bool ln = p.kind == NormKind::kLayerNorm;
  const size_t per_chunk = norm_bwd_partials_per_chunk(p.kind, n);
  const std::vector<float> w = effective_weight(p.gamma, p.w_dtype, n, p.zero_centered_gamma);
  const LoadFn load_dz = row_loader(p.dz_dtype, "dz"), load_x = row_loader(p.x_dtype, "x");
  const LoadFn load_add = p.add != nullptr ? row_loader(p.add_dtype, "add") : nullptr;
  const size_t add_row_bytes = n * (p.add != nullptr ? dtype_size(p.add_dtype) : 0);
  const StoreFn store_dx = row_storer(p.dx_dtype, "dx");
  const size_t dz_row = n * dtype_size(p.dz_dtype), x_row = n * dtype_size(p.x_dtype),
               dx_row = n * dtype_size(p.dx_dtype);
  const char *dz = static_cast<const char *>(p.dz), *x = static_cast<const char *>(p.x);
  char *dx = static_cast<char *>(p.dx);

  // Chunks are a fixed split of the rows; threads take whole chunks, so each partial sum is the
  // same whatever the thread count.
  parallel_for(chunks, 1, [&](size_t c0, size_t c1) {
    std::vector<float> xb(n), dzb(n), addb(load_add ? n : 0);
    for (size_t c = c0; c < c1; ++c) {
      float *dgamma = p.workspace + c * per_chunk;
      float *dbeta = ln ? dgamma + n : nullptr;
      std::fill(dgamma, dgamma + per_chunk, 0.0f);
      const size_t r0 = rows * c / chunks, r1 = rows * (c + 1) / chunks;
      for (size_t row = r0; row < r1; ++row) {
        load_x(x + row * x_row, xb.data(), n);
        load_dz(dz + row * dz_row, dzb.data(), n);
        if (ln) {
          NVTE_CPU_DISPATCH(layernorm_bwd_kernel(xb.data(), dzb.data(), w.data(), n, p.mu[row],
                                                 p.rsigma[row], dgamma, dbeta));
        } else {
          NVTE_CPU_DISPATCH(
              rmsnorm_bwd_kernel(xb.data(), dzb.data(), w.data(), n, p.rsigma[row], dgamma));
        }
        if (load_add) {  // the residual gradient, added before dx's one rounding
          load_add(static_cast<const char *>(p.add) + row * add_row_bytes, addb.data(), n);
          NVTE_CPU_DISPATCH(add_row(xb.data(), addb.data(), n));
        }
        store_dx(xb.data(), dx + row * dx_row, n);
      }
    }
  });

  // Sum the chunks' partials in chunk order (parallel over columns): deterministic.
  const StoreFn store_w = row_storer(p.w_dtype, "dgamma");
  const size_t w_size = dtype_size(p.w_dtype);
  parallel_for(per_chunk, 1024, [&](size_t j0, size_t j1) {
    std::vector<float> acc(j1 - j0, 0.0f);
    for (size_t c = 0; c < chunks; ++c) {
      NVTE_CPU_DISPATCH(add_row(acc.data(), p.workspace + c * per_chunk + j0, j1 - j0));
    }
    // Columns [0, n) are dgamma, [n, 2n) dbeta; a column range may straddle the boundary.
    if (j0 < n) {
      const size_t e = std::min(j1, n);
      store_w(acc.data(), static_cast<char *>(p.dgamma) + j0 * w_size, e - j0);
    }
    if (j1 > n) {
      const size_t b = std::max(j0, n);
      store_w(acc.data() + (b - j0), static_cast<char *>(p.dbeta) + (b - n) * w_size, j1 - b);
    }
  });
}

}  // namespace nvte
