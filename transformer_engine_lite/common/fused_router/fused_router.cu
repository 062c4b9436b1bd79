// GPU kernels of the fused MoE router. Routing: one thread per token (grid-stride), running the
// CPU's per-token math (fused_router_params.h), so experts and values match the CPU up to expf /
// log1pf. Rows are read with a stride of `experts` (uncoalesced; a warp-per-token kernel is the
// next step if routing shows in GPU profiles: not measured yet). Aux loss: one block sums the
// columns in the CPU's row order; its backward is elementwise.
#include <algorithm>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "../util/dtype_dispatch.h"
#include "fused_router_gpu.h"
#include "fused_router_types.h"

namespace nvte {
namespace gpu {

namespace {

constexpr int kThreads = 128;
constexpr int kLossThreads = 256;
// Grid-stride loops bound the grid.
constexpr size_t kMaxBlocks = 65536;

unsigned grid_for(size_t items, int threads) {
  const size_t blocks = (items + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  return static_cast<unsigned>(std::max<size_t>(1, std::min(blocks, kMaxBlocks)));
}

__device__ __forceinline__ size_t global_thread() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t global_stride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    router_topk_fwd_kernel(const RouterParams p, const T *x, T *probs, uint8_t *map,
                           float *inter) {
  const size_t n = p.experts;
  for (size_t t = global_thread(); t < p.tokens; t += global_stride()) {
    router_topk_fwd_token(p, x + t * n, probs + t * n, map + t * n, inter + t * n);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    router_topk_bwd_kernel(const RouterParams p, const uint8_t *map, const float *inter,
                           const T *g, T *dx) {
  const size_t n = p.experts;
  for (size_t t = global_thread(); t < p.tokens; t += global_stride()) {
    router_topk_bwd_token(p, map + t * n, inter + t * n, g + t * n, dx + t * n);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    router_score_fwd_kernel(const RouterParams p, const T *x, float *scores, uint8_t *map,
                            float *inter) {
  const size_t n = p.experts;
  for (size_t t = global_thread(); t < p.tokens; t += global_stride()) {
    router_score_fwd_token(p, x + t * n, scores + t * n, map + t * n, inter + t * n);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    router_score_bwd_kernel(const RouterParams p, const float *inter, const float *g, T *dx) {
  const size_t n = p.experts;
  for (size_t t = global_thread(); t < p.tokens; t += global_stride()) {
    router_score_bwd_token(p, inter + t * n, g + t * n, dx + t * n);
  }
}

// One block: thread j sums columns j, j + blockDim.x, ... over the rows in order; the block sums
// the threads' partial losses in a fixed order (deterministic).
template <typename T, typename C>
__global__ void __launch_bounds__(kLossThreads)
    moe_aux_loss_fwd_kernel(size_t rows, size_t cols, float c, const T *probs, const C *counts,
                            T *aux_loss, float *const_buf) {
  __shared__ float scratch[kLossThreads / kWarpSize];
  float partial = 0.0f;
  for (size_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float s = 0.0f;
    for (size_t r = 0; r < rows; ++r) s += to_float(probs[r * cols + j]);
    partial += s * to_float(counts[j]);
  }
  const float total = block_reduce<false>(partial, scratch);
  if (threadIdx.x == 0) {
    aux_loss[0] = from_float<T>(total * c);
    const_buf[0] = c;
  }
}

template <typename T, typename C>
__global__ void __launch_bounds__(kThreads)
    moe_aux_loss_bwd_kernel(size_t rows, size_t cols, const float *const_buf, const C *counts,
                            const T *grad_aux_loss, T *grad_probs) {
  const float cg = const_buf[0];
  const float g = to_float(grad_aux_loss[0]);
  for (size_t i = global_thread(); i < rows * cols; i += global_stride()) {
    grad_probs[i] = from_float<T>(cg * to_float(counts[i % cols]) * g);
  }
}

}  // namespace

void launch_router_topk_fwd(const RouterParams &p, DType dtype, const void *logits, void *probs,
                            uint8_t *map, float *inter, void *stream) {
  if (p.tokens == 0) return;
  dispatch_dtype<HighPrecisionTypes>(dtype, "logits", [&](auto tag) {
    using T = typename decltype(tag)::type;
    router_topk_fwd_kernel<T><<<grid_for(p.tokens, kThreads), kThreads, 0, as_stream(stream)>>>(
        p, static_cast<const T *>(logits), static_cast<T *>(probs), map, inter);
    NVTE_CHECK_LAUNCH();
  });
}

void launch_router_topk_bwd(const RouterParams &p, DType dtype, const uint8_t *map,
                            const float *inter, const void *grad_probs, void *grad_logits,
                            void *stream) {
  if (p.tokens == 0) return;
  dispatch_dtype<HighPrecisionTypes>(dtype, "grad_probs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    router_topk_bwd_kernel<T><<<grid_for(p.tokens, kThreads), kThreads, 0, as_stream(stream)>>>(
        p, map, inter, static_cast<const T *>(grad_probs), static_cast<T *>(grad_logits));
    NVTE_CHECK_LAUNCH();
  });
}

void launch_router_score_fwd(const RouterParams &p, DType dtype, const void *logits, float *scores,
                             uint8_t *map, float *inter, void *stream) {
  if (p.tokens == 0) return;
  dispatch_dtype<HighPrecisionTypes>(dtype, "logits", [&](auto tag) {
    using T = typename decltype(tag)::type;
    router_score_fwd_kernel<T><<<grid_for(p.tokens, kThreads), kThreads, 0, as_stream(stream)>>>(
        p, static_cast<const T *>(logits), scores, map, inter);
    NVTE_CHECK_LAUNCH();
  });
}

void launch_router_score_bwd(const RouterParams &p, DType dtype, const float *inter,
                             const float *grad_scores, void *grad_logits, void *stream) {
  if (p.tokens == 0) return;
  dispatch_dtype<HighPrecisionTypes>(dtype, "grad_logits", [&](auto tag) {
    using T = typename decltype(tag)::type;
    router_score_bwd_kernel<T><<<grid_for(p.tokens, kThreads), kThreads, 0, as_stream(stream)>>>(
        p, inter, grad_scores, static_cast<T *>(grad_logits));
    NVTE_CHECK_LAUNCH();
  });
}

void launch_moe_aux_loss_fwd(size_t rows, size_t cols, float c, DType dtype, const void *probs,
                             DType count_dtype, const void *counts, void *aux_loss,
                             float *const_buf, void *stream) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "probs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_dtype<RouterCountTypes>(count_dtype, "tokens_per_expert", [&](auto ctag) {
      using C = typename decltype(ctag)::type;
      moe_aux_loss_fwd_kernel<T, C><<<1, kLossThreads, 0, as_stream(stream)>>>(
          rows, cols, c, static_cast<const T *>(probs), static_cast<const C *>(counts),
          static_cast<T *>(aux_loss), const_buf);
      NVTE_CHECK_LAUNCH();
    });
  });
}

void launch_moe_aux_loss_bwd(size_t rows, size_t cols, const float *const_buf, DType count_dtype,
                             const void *counts, DType dtype, const void *grad_aux_loss,
                             void *grad_probs, void *stream) {
  if (rows * cols == 0) return;
  dispatch_dtype<HighPrecisionTypes>(dtype, "grad_probs", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_dtype<RouterCountTypes>(count_dtype, "tokens_per_expert", [&](auto ctag) {
      using C = typename decltype(ctag)::type;
      moe_aux_loss_bwd_kernel<T, C>
          <<<grid_for(rows * cols, kThreads), kThreads, 0, as_stream(stream)>>>(
              rows, cols, const_buf, static_cast<const C *>(counts),
              static_cast<const T *>(grad_aux_loss), static_cast<T *>(grad_probs));
      NVTE_CHECK_LAUNCH();
    });
  });
}

}  // namespace gpu
}  // namespace nvte
