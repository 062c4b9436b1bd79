// CPU kernels of the scaled softmax family: one fp32 row kernel per direction shared by all four
// variants; the variant only decides each row's byte mask or valid prefix length.
#include "softmax_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "../cast/emit_cpu.h"
#include "../platform/host_device.h"
#include "../util/dtype_dispatch.h"
#include "../util/math.h"
#include "../util/parallel.h"

namespace nvte {

namespace {

// Megatron/TE: a masked logit becomes this value (unscaled), so a fully masked row is uniform.
constexpr float kMaskedLogit = -10000.0f;
// Independent partial sums per reduction: the lanes map onto one SIMD register, and the rounding
// error of a sum grows with n / kLanes instead of n (1025 terms: 65 adds per lane, not 1024).
constexpr size_t kLanes = 16;

float sum_lanes(const float *acc) {
  float s = 0.0f;
  for (size_t l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// v = scale * v (or kMaskedLogit where mask != 0); returns max(v). The select form `a > m ? a : m`
// is what MAXPS computes, so the lane loop vectorizes.
NVTE_CPU_KERNEL float scale_mask_max(float *v, const uint8_t *mask, size_t n, float scale) {
  float acc[kLanes];
  for (size_t l = 0; l < kLanes; ++l) acc[l] = -INFINITY;
  if (mask != nullptr) {
    for (size_t j = 0; j < n; ++j) v[j] = mask[j] != 0 ? kMaskedLogit : v[j] * scale;
  } else {
    for (size_t j = 0; j < n; ++j) v[j] *= scale;
  }
  size_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (size_t l = 0; l < kLanes; ++l) acc[l] = v[j + l] > acc[l] ? v[j + l] : acc[l];
  float m = -INFINITY;
  for (size_t l = 0; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  for (; j < n; ++j) m = v[j] > m ? v[j] : m;
  return m;
}

// v = exp(v - m); returns sum(v). exp_f32 (util/math.h) is branch-free, so the lane loop
// vectorizes (glibc's expf would stay scalar without -ffast-math).
NVTE_CPU_KERNEL float exp_sum(float *v, size_t n, float m) {
  float acc[kLanes] = {};
  size_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      const float e = exp_f32(v[j + l] - m);
      v[j + l] = e;
      acc[l] += e;
    }
  }
  float tail = 0.0f;
  for (; j < n; ++j) {
    v[j] = exp_f32(v[j] - m);
    tail += v[j];
  }
  return sum_lanes(acc) + tail;
}

NVTE_CPU_KERNEL void divide_by(float *v, size_t n, float d) {
  for (size_t j = 0; j < n; ++j) v[j] /= d;
}

NVTE_CPU_KERNEL float dot(const float *a, const float *b, size_t n) {
  float acc[kLanes] = {};
  size_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (size_t l = 0; l < kLanes; ++l) acc[l] += a[j + l] * b[j + l];
  float tail = 0.0f;
  for (; j < n; ++j) tail += a[j] * b[j];
  return sum_lanes(acc) + tail;
}

// dx = scale * y * (dy - d), written over dy.
NVTE_CPU_KERNEL void softmax_grad(float *dy, const float *y, size_t n, float d, float scale) {
  for (size_t j = 0; j < n; ++j) dy[j] = scale * y[j] * (dy[j] - d);
}

// One row in place: the first `valid` entries become softmax(mask(scale * v)), the rest 0.
NVTE_CPU_KERNEL void softmax_fwd_row(float *v, const uint8_t *mask, size_t n, size_t valid,
                                     float scale) {
  if (valid > 0) {
    const float m = scale_mask_max(v, mask, valid, scale);
    divide_by(v, valid, exp_sum(v, valid, m));
  }
  std::fill(v + valid, v + n, 0.0f);
}

// Rows per parallel chunk: at least ~8K elements of work so threads are worth starting.
size_t row_grain(size_t cols) { return std::max<size_t>(1, 8192 / std::max<size_t>(cols, 1)); }

template <typename T>
void softmax_fwd_kernel(const SoftmaxParams &p, const T *in, T *out) {
  const size_t n = p.cols;
  parallel_for(p.rows, row_grain(n), [&](size_t r0, size_t r1) {
    std::vector<float> row(n);
    for (size_t r = r0; r < r1; ++r) {
      // Load the whole row before storing: input and output may alias.
      load_row(in + r * n, row.data(), n);
      NVTE_CPU_DISPATCH(softmax_fwd_row(row.data(), softmax_mask_row(p, r), n,
                                        softmax_valid_prefix(p, r), p.scale));
      store_row(row.data(), out + r * n, n);
    }
  });
}

template <typename T>
void softmax_bwd_kernel(const SoftmaxParams &p, const T *dy, const T *y, T *dx) {
  const size_t n = p.cols;
  parallel_for(p.rows, row_grain(n), [&](size_t r0, size_t r1) {
    std::vector<float> g(n), yr(n);
    for (size_t r = r0; r < r1; ++r) {
      load_row(dy + r * n, g.data(), n);
      load_row(y + r * n, yr.data(), n);
      // Causal variants write exact zeros past the kept prefix (as the forward did), whatever the
      // incoming gradient holds there; a byte mask needs nothing: y is 0 at masked positions.
      const size_t valid = softmax_valid_prefix(p, r);
      NVTE_CPU_DISPATCH(softmax_grad(g.data(), yr.data(), valid, dot(g.data(), yr.data(), valid),
                                     p.scale));
      std::fill(g.begin() + valid, g.end(), 0.0f);
      store_row(g.data(), dx + r * n, n);
    }
  });
}

}  // namespace

void launch_softmax_fwd(const SoftmaxParams &p, DType dtype, const void *input, void *output) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_fwd_kernel(p, static_cast<const T *>(input), static_cast<T *>(output));
  });
}

void launch_softmax_bwd(const SoftmaxParams &p, DType dtype, const void *incoming_grads,
                        const void *softmax_results, void *output_grads) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "incoming_grads", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_bwd_kernel(p, static_cast<const T *>(incoming_grads),
                       static_cast<const T *>(softmax_results), static_cast<T *>(output_grads));
  });
}

}  // namespace nvte
