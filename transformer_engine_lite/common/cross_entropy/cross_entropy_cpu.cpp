// CPU kernels of the cross entropy family: rows in parallel (OpenMP), each row's sums in 16 lanes
// (vectorized, fixed order: bit-identical across thread counts), fp32 math from
// cross_entropy_params.h.
#include <algorithm>
#include <cstring>

#include "../util/dtype_dispatch.h"
#include "../util/parallel.h"
#include "cross_entropy_cpu.h"
#include "cross_entropy_types.h"

namespace nvte {

namespace {

constexpr size_t kLanes = 16;

// Rows per task: about 64K logits' worth of work.
size_t row_grain(size_t vocab) { return std::max<size_t>(1, 65536 / std::max<size_t>(1, vocab)); }

// Raises for the first target that is neither ignore_idx nor in the vocab (a serial scan of
// `rows` ints: no exception may leave an OpenMP region).
template <typename I>
void check_targets(const CrossEntropyParams &p, const I *target) {
  for (size_t r = 0; r < p.rows; ++r) {
    const int64_t t = static_cast<int64_t>(target[r]);
    NVTE_CHECK(!target_invalid(p, t), "argument 'target': expected values in [0, ",
               static_cast<int64_t>(p.vocab) * p.world_size, ") (the vocab: ", p.vocab, " x ",
               p.world_size, " ranks) or ignore_idx (", p.ignore_idx, "), got ", t, " at row ", r);
  }
}

// Hot loops: NVTE_CPU_KERNEL, called through NVTE_CPU_DISPATCH so that each is compiled for the
// AVX-512, AVX2 and baseline clones (exp_f32 is branch-free and vectorizes in all three).
template <typename T>
NVTE_CPU_KERNEL void row_stats(const T *x, size_t n, int64_t col, float *st) {
  float lane_max[kLanes];
  std::fill(lane_max, lane_max + kLanes, -INFINITY);
  size_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) lane_max[l] = std::max(lane_max[l], to_float(x[j + l]));
  }
  for (; j < n; ++j) lane_max[0] = std::max(lane_max[0], to_float(x[j]));
  float m = lane_max[0];
  for (size_t l = 1; l < kLanes; ++l) m = std::max(m, lane_max[l]);
  // An all -inf shard: d = 0 (exp(x - m) would be NaN), and combine_row skips it.
  const float shift = m == -INFINITY ? 0.0f : m;
  float lane_d[kLanes] = {}, lane_s[kLanes] = {};
  j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      const float v = to_float(x[j + l]);
      lane_d[l] += exp_f32(v - shift);
      lane_s[l] += v - shift;
    }
  }
  for (; j < n; ++j) {
    const float v = to_float(x[j]);
    lane_d[0] += exp_f32(v - shift);
    lane_s[0] += v - shift;
  }
  float d = 0.0f, s = 0.0f;
  for (size_t l = 0; l < kLanes; ++l) {
    d += lane_d[l];
    s += lane_s[l];
  }
  st[kStatM] = m;
  st[kStatD] = d;
  st[kStatXt] = col >= 0 ? to_float(x[col]) : -INFINITY;
  st[kStatS] = s;
}

template <typename T>
NVTE_CPU_KERNEL void grad_row(const T *x, T *g, size_t n, const RowCombined &c, float scale) {
  for (size_t j = 0; j < n; ++j) g[j] = from_float<T>(grad_of(c, to_float(x[j]), scale));
}

template <typename T>
NVTE_CPU_KERNEL void scale_row(const T *g, T *out, size_t n, float go) {
  for (size_t j = 0; j < n; ++j) out[j] = from_float<T>(to_float(g[j]) * go);
}

}  // namespace

void launch_cross_entropy_stats(const CrossEntropyParams &p, DType dtype, const void *logits,
                                DType target_dtype, const void *target, float *stats) {
  dispatch_dtype<CrossEntropyTargetTypes>(target_dtype, "target", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I *tg = static_cast<const I *>(target);
    check_targets(p, tg);
    dispatch_dtype<HighPrecisionTypes>(dtype, "logits", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T *x = static_cast<const T *>(logits);
      parallel_for(p.rows, row_grain(p.vocab), [&](size_t r0, size_t r1) {
        for (size_t r = r0; r < r1; ++r) {
          const int64_t t = static_cast<int64_t>(tg[r]);
          const int64_t col = t == p.ignore_idx ? -1 : local_column(p, t);
          NVTE_CPU_DISPATCH(row_stats(x + r * p.vocab, p.vocab, col, stats + r * kNumStats));
        }
      });
    });
  });
}

void launch_cross_entropy_fwd(const CrossEntropyParams &p, DType dtype, const void *logits,
                              DType target_dtype, const void *target, float *loss, void *grad) {
  dispatch_dtype<CrossEntropyTargetTypes>(target_dtype, "target", [&](auto itag) {
    using I = typename decltype(itag)::type;
    const I *tg = static_cast<const I *>(target);
    check_targets(p, tg);
    dispatch_dtype<HighPrecisionTypes>(dtype, "logits", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const size_t n = p.vocab;
      parallel_for(p.rows, row_grain(n), [&](size_t r0, size_t r1) {
        for (size_t r = r0; r < r1; ++r) {
          const int64_t t = static_cast<int64_t>(tg[r]);
          const T *x = static_cast<const T *>(logits) + r * n;
          T *g = static_cast<T *>(grad) + r * n;
          if (t == p.ignore_idx) {
            loss[r] = 0.0f;
            std::memset(static_cast<void *>(g), 0, n * sizeof(T));  // +0 in every dtype
            continue;
          }
          const RowCombined c = combine_row(p, r);
          loss[r] = c.loss;
          NVTE_CPU_DISPATCH(grad_row(x, g, n, c, p.grad_scale));
          const int64_t col = local_column(p, t);
          if (col >= 0) {
            // The one-hot term, added in fp32 before the single rounding.
            const float gt = grad_of(c, to_float(x[col]), p.grad_scale);
            g[col] = from_float<T>(gt - (1.0f - p.label_smoothing) * p.grad_scale);
          }
        }
      });
    });
  });
}

void launch_cross_entropy_bwd(size_t rows, size_t vocab, DType dtype, const void *grad,
                              const float *grad_output, bool per_row, void *dx) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    parallel_for(rows, row_grain(vocab), [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; ++r) {
        const float go = grad_output[per_row ? r : 0];
        NVTE_CPU_DISPATCH(scale_row(static_cast<const T *>(grad) + r * vocab,
                                    static_cast<T *>(dx) + r * vocab, vocab, go));
      }
    });
  });
}

}  // namespace nvte
