// GPU kernels of the MoE permutation. row_id_map: one thread per expert for the two column passes
// (each walks all tokens in order: a serial scan, coalesced across experts; a block-scan version is
// the next step if it shows in profiles, not measured yet), then one thread per token. Data
// kernels: one block per token (grid-stride), threads across the hidden dimension, running the
// CPU's per-element math (permutation_params.h); merging-probs gradients one thread per token
// (dot products in the CPU's order, so bit-identical). No shared memory, no barriers.
#include <algorithm>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "permutation_gpu.h"
#include "permutation_types.h"

namespace nvte {
namespace gpu {

namespace {

constexpr int kThreads = 128;
// Grid-stride loops bound the grid.
constexpr size_t kMaxBlocks = 65536;

unsigned grid_for(size_t items, int threads) {
  const size_t blocks = (items + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  return static_cast<unsigned>(std::max<size_t>(1, std::min(blocks, kMaxBlocks)));
}
unsigned blocks_for(size_t tokens) {
  return static_cast<unsigned>(std::max<size_t>(1, std::min(tokens, kMaxBlocks)));
}

__device__ __forceinline__ size_t global_thread() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t global_stride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

template <typename M>
__global__ void __launch_bounds__(kThreads)
    row_id_map_rank_kernel(const PermuteParams p, const M *routing_map, int32_t *map) {
  for (size_t e = global_thread(); e < p.experts; e += global_stride()) {
    row_id_map_rank_expert(p, routing_map, map, e);
  }
}

__global__ void __launch_bounds__(kThreads)
    row_id_map_place_kernel(const PermuteParams p, int32_t *map) {
  for (size_t e = global_thread(); e < p.experts; e += global_stride()) {
    row_id_map_place_expert(p, map, e);
  }
}

__global__ void __launch_bounds__(kThreads)
    row_id_map_compact_kernel(const PermuteParams p, int32_t *map) {
  const size_t w = row_id_map_width(p.experts);
  for (size_t t = global_thread(); t < p.tokens; t += global_stride()) {
    row_id_map_compact_token(p.experts, map + t * w);
  }
}

template <typename T, typename P>
__global__ void __launch_bounds__(kThreads)
    permute_fwd_kernel(const PermuteParams p, const T *in, const int32_t *map, const P *probs,
                       T *out, P *permuted_probs) {
  const size_t w = row_id_map_width(p.experts);
  for (size_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    const int32_t *row = map + t * w;
    for (size_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      permute_element(p, row, in, probs, out, t, h);
    }
    if (probs != nullptr && threadIdx.x == 0) permute_probs_token(p, row, probs, permuted_probs, t);
  }
}

template <typename T, typename P>
__global__ void __launch_bounds__(kThreads)
    unpermute_fwd_kernel(const PermuteParams p, const T *in, const int32_t *map,
                         const P *merging_probs, const P *permuted_probs, T *out,
                         P *unpermuted_probs) {
  const size_t w = row_id_map_width(p.experts);
  for (size_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    const int32_t *row = map + t * w;
    for (size_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      out[t * p.hidden + h] = unpermute_element(p, row, in, merging_probs, t, h);
    }
    if (permuted_probs != nullptr && threadIdx.x == 0) {
      unpermute_probs_token(p, row, permuted_probs, unpermuted_probs, t);
    }
  }
}

template <typename T, typename P>
__global__ void __launch_bounds__(kThreads)
    unpermute_bwd_kernel(const PermuteParams p, const T *grad, const int32_t *map,
                         const P *merging_probs, T *in_grad) {
  const size_t w = row_id_map_width(p.experts);
  for (size_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    for (size_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      unpermute_bwd_element(p, map + t * w, grad, merging_probs, in_grad, t, h);
    }
  }
}

template <typename T, typename P>
__global__ void __launch_bounds__(kThreads)
    unpermute_probs_grad_kernel(const PermuteParams p, const T *grad, const int32_t *map,
                                const T *fwd_input, P *probs_grad) {
  const size_t w = row_id_map_width(p.experts);
  for (size_t t = global_thread(); t < p.tokens; t += global_stride()) {
    unpermute_probs_grad_token(p, map + t * w, grad, fwd_input, probs_grad, t);
  }
}

__global__ void __launch_bounds__(kThreads)
    chunk_sort_map_kernel(const PermuteParams p, const int64_t *split_sizes,
                          const int64_t *sorted_index, int32_t *map) {
  for (size_t t = global_thread(); t < p.tokens; t += global_stride()) {
    map[t] = chunk_sort_dst(p, split_sizes, sorted_index, t);
  }
}

template <typename T, typename P>
__global__ void __launch_bounds__(kThreads)
    sort_chunks_kernel(const PermuteParams p, const T *in, const int32_t *map, const P *probs,
                       bool forward, T *out, P *permuted_probs) {
  for (size_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    const int32_t m = map[t];
    if (m < 0 || static_cast<size_t>(m) >= p.tokens) continue;
    const size_t src = forward ? t : static_cast<size_t>(m);
    const size_t dst = forward ? static_cast<size_t>(m) : t;
    for (size_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      out[dst * p.hidden + h] = in[src * p.hidden + h];
    }
    if (probs != nullptr && threadIdx.x == 0) permuted_probs[dst] = probs[src];
  }
}

template <typename F>
void with_probs_type(DType probs_dtype, F &&f) {
  dispatch_dtype<HighPrecisionTypes>(probs_dtype, "probs", std::forward<F>(f));
}

}  // namespace

void launch_make_row_id_map(const PermuteParams &p, DType map_dtype, const void *routing_map,
                            int32_t *row_id_map, void *stream) {
  if (p.tokens == 0) return;
  dispatch_dtype<RoutingMapTypes>(map_dtype, "routing_map", [&](auto tag) {
    using M = typename decltype(tag)::type;
    row_id_map_rank_kernel<M><<<grid_for(p.experts, kThreads), kThreads, 0, as_stream(stream)>>>(
        p, static_cast<const M *>(routing_map), row_id_map);
    NVTE_CHECK_LAUNCH();
  });
  row_id_map_place_kernel<<<grid_for(p.experts, kThreads), kThreads, 0, as_stream(stream)>>>(
      p, row_id_map);
  NVTE_CHECK_LAUNCH();
  row_id_map_compact_kernel<<<grid_for(p.tokens, kThreads), kThreads, 0, as_stream(stream)>>>(
      p, row_id_map);
  NVTE_CHECK_LAUNCH();
}

void launch_permute_with_mask_map(const PermuteParams &p, DType dtype, const void *in,
                                  const int32_t *row_id_map, DType probs_dtype, const void *probs,
                                  void *out, void *permuted_probs, void *stream) {
  dispatch_dtype<PermuteDataTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_probs_type(probs_dtype, [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      permute_fwd_kernel<T, P><<<blocks_for(p.tokens), kThreads, 0, as_stream(stream)>>>(
          p, static_cast<const T *>(in), row_id_map, static_cast<const P *>(probs),
          static_cast<T *>(out), static_cast<P *>(permuted_probs));
      NVTE_CHECK_LAUNCH();
    });
  });
}

void launch_unpermute_with_mask_map(const PermuteParams &p, DType dtype, const void *in,
                                    const int32_t *row_id_map, DType probs_dtype,
                                    const void *merging_probs, const void *permuted_probs,
                                    void *out, void *unpermuted_probs, void *stream) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_probs_type(probs_dtype, [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      unpermute_fwd_kernel<T, P><<<blocks_for(p.tokens), kThreads, 0, as_stream(stream)>>>(
          p, static_cast<const T *>(in), row_id_map, static_cast<const P *>(merging_probs),
          static_cast<const P *>(permuted_probs), static_cast<T *>(out),
          static_cast<P *>(unpermuted_probs));
      NVTE_CHECK_LAUNCH();
    });
  });
}

void launch_unpermute_bwd_with_merging_probs(const PermuteParams &p, DType dtype, const void *grad,
                                             const int32_t *row_id_map, const void *fwd_input,
                                             DType probs_dtype, const void *merging_probs,
                                             void *in_grad, void *probs_grad, void *stream) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "fwd_output_grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_probs_type(probs_dtype, [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      unpermute_bwd_kernel<T, P><<<blocks_for(p.tokens), kThreads, 0, as_stream(stream)>>>(
          p, static_cast<const T *>(grad), row_id_map, static_cast<const P *>(merging_probs),
          static_cast<T *>(in_grad));
      NVTE_CHECK_LAUNCH();
      unpermute_probs_grad_kernel<T, P>
          <<<grid_for(p.tokens, kThreads), kThreads, 0, as_stream(stream)>>>(
              p, static_cast<const T *>(grad), row_id_map, static_cast<const T *>(fwd_input),
              static_cast<P *>(probs_grad));
      NVTE_CHECK_LAUNCH();
    });
  });
}

void launch_make_chunk_sort_map(const PermuteParams &p, const int64_t *split_sizes,
                                const int64_t *sorted_index, int32_t *row_id_map, void *stream) {
  chunk_sort_map_kernel<<<grid_for(p.tokens, kThreads), kThreads, 0, as_stream(stream)>>>(
      p, split_sizes, sorted_index, row_id_map);
  NVTE_CHECK_LAUNCH();
}

void launch_sort_chunks_by_map(const PermuteParams &p, DType dtype, const void *in,
                               const int32_t *row_id_map, DType probs_dtype, const void *probs,
                               bool forward, void *out, void *permuted_probs, void *stream) {
  dispatch_dtype<PermuteDataTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_probs_type(probs_dtype, [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      sort_chunks_kernel<T, P><<<blocks_for(p.tokens), kThreads, 0, as_stream(stream)>>>(
          p, static_cast<const T *>(in), row_id_map, static_cast<const P *>(probs), forward,
          static_cast<T *>(out), static_cast<P *>(permuted_probs));
      NVTE_CHECK_LAUNCH();
    });
  });
}

}  // namespace gpu
}  // namespace nvte
