// GPU kernels of the cross entropy family: one block per row (grid-stride over rows), threads
// striding over the vocab (coalesced), block reductions for the row statistics; the per-row
// combine and loss are cross_entropy_params.h's, as on the CPU. The backward is elementwise.
#include <algorithm>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "../util/dtype_dispatch.h"
#include "cross_entropy_gpu.h"
#include "cross_entropy_types.h"

namespace nvte {
namespace gpu {

namespace {

constexpr int kThreads = 256;
// Grid-stride loops bound the grid.
constexpr size_t kMaxBlocks = 65536;

unsigned grid_for(size_t items) {
  return static_cast<unsigned>(std::max<size_t>(1, std::min(items, kMaxBlocks)));
}

template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_stats_kernel(const CrossEntropyParams p, const T *x, const I *target,
                               float *stats) {
  __shared__ float scratch[kThreads / kWarpSize];
  const size_t n = p.vocab;
  for (size_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T *row = x + r * n;
    float m = -INFINITY;
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, to_float(row[j]));
    m = block_reduce<true>(m, scratch);
    // An all -inf shard: d = 0 (exp(x - m) would be NaN), and combine_row skips it.
    const float shift = m == -INFINITY ? 0.0f : m;
    float d = 0.0f, s = 0.0f;
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = to_float(row[j]);
      d += exp_f32(v - shift);
      s += v - shift;
    }
    d = block_reduce<false>(d, scratch);
    s = block_reduce<false>(s, scratch);
    if (threadIdx.x == 0) {
      const int64_t t = static_cast<int64_t>(target[r]);
      const int64_t col = t == p.ignore_idx ? -1 : local_column(p, t);
      float *st = stats + r * kNumStats;
      st[kStatM] = m;
      st[kStatD] = d;
      st[kStatXt] = col >= 0 ? to_float(row[col]) : -INFINITY;
      st[kStatS] = s;
    }
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_fwd_kernel(const CrossEntropyParams p, const T *x, const I *target, float *loss,
                             T *grad) {
  const size_t n = p.vocab;
  for (size_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const int64_t t = static_cast<int64_t>(target[r]);
    T *g = grad + r * n;
    if (t == p.ignore_idx) {
      for (size_t j = threadIdx.x; j < n; j += blockDim.x) g[j] = from_float<T>(0.0f);
      if (threadIdx.x == 0) loss[r] = 0.0f;
      continue;
    }
    const T *row = x + r * n;
    // Every thread combines the world's stats itself (world_size * 4 floats, from L1/L2): no
    // shared-memory broadcast and no barrier.
    RowCombined c = combine_row(p, r);
    if (target_invalid(p, t)) {
      c.max = NAN;  // no error path from the device: NaN loss and gradient mark the row
      c.loss = NAN;
    }
    const int64_t col = local_column(p, t);
    const float one_hot = (1.0f - p.label_smoothing) * p.grad_scale;
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = grad_of(c, to_float(row[j]), p.grad_scale);
      g[j] = from_float<T>(static_cast<int64_t>(j) == col ? v - one_hot : v);
    }
    if (threadIdx.x == 0) loss[r] = c.loss;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_bwd_kernel(size_t rows, size_t vocab, const T *grad, const float *grad_output,
                             bool per_row, T *dx) {
  const size_t total = rows * vocab;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const float go = grad_output[per_row ? i / vocab : 0];
    dx[i] = from_float<T>(to_float(grad[i]) * go);
  }
}

}  // namespace

void launch_cross_entropy_stats(const CrossEntropyParams &p, DType dtype, const void *logits,
                                DType target_dtype, const void *target, float *stats,
                                void *stream) {
  if (p.rows == 0) return;
  dispatch_dtype<CrossEntropyTargetTypes>(target_dtype, "target", [&](auto itag) {
    using I = typename decltype(itag)::type;
    dispatch_dtype<HighPrecisionTypes>(dtype, "logits", [&](auto tag) {
      using T = typename decltype(tag)::type;
      cross_entropy_stats_kernel<T, I><<<grid_for(p.rows), kThreads, 0, as_stream(stream)>>>(
          p, static_cast<const T *>(logits), static_cast<const I *>(target), stats);
      NVTE_CHECK_LAUNCH();
    });
  });
}

void launch_cross_entropy_fwd(const CrossEntropyParams &p, DType dtype, const void *logits,
                              DType target_dtype, const void *target, float *loss, void *grad,
                              void *stream) {
  if (p.rows == 0) return;
  dispatch_dtype<CrossEntropyTargetTypes>(target_dtype, "target", [&](auto itag) {
    using I = typename decltype(itag)::type;
    dispatch_dtype<HighPrecisionTypes>(dtype, "logits", [&](auto tag) {
      using T = typename decltype(tag)::type;
      cross_entropy_fwd_kernel<T, I><<<grid_for(p.rows), kThreads, 0, as_stream(stream)>>>(
          p, static_cast<const T *>(logits), static_cast<const I *>(target), loss,
          static_cast<T *>(grad));
      NVTE_CHECK_LAUNCH();
    });
  });
}

void launch_cross_entropy_bwd(size_t rows, size_t vocab, DType dtype, const void *grad,
                              const float *grad_output, bool per_row, void *dx, void *stream) {
  const size_t total = rows * vocab;
  if (total == 0) return;
  dispatch_dtype<HighPrecisionTypes>(dtype, "grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cross_entropy_bwd_kernel<T>
        <<<grid_for((total + kThreads - 1) / kThreads), kThreads, 0, as_stream(stream)>>>(
            rows, vocab, static_cast<const T *>(grad), grad_output, per_row,
            static_cast<T *>(dx));
    NVTE_CHECK_LAUNCH();
  });
}

}  // namespace gpu
}  // namespace nvte
