// GPU kernels of the MoE permutation with an index map (permutation_index.h). row_id_map: one
// block sorts the routes by expert with a stable LSD radix sort (4-bit digits; per pass each
// thread counts the digits of its contiguous slice, a digit-major scan of the counts gives every
// thread its write offsets, each thread scatters its slice in order: stable). Passes where every
// key has the same digit are skipped (expert indices are small, so most are). One block bounds
// the sort's speed (about tokens * topk / 256 steps per pass), fine at MoE sizes. Data kernels:
// one block per token, threads across the hidden dimension, running the CPU's per-element math.
#include <algorithm>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "permutation_gpu.h"
#include "permutation_types.h"

namespace nvte {
namespace gpu {

namespace {

constexpr int kThreads = 128;
constexpr int kSortThreads = 256;
constexpr int kDigitBits = 4;
constexpr int kDigits = 1 << kDigitBits;
constexpr size_t kMaxBlocks = 65536;

unsigned blocks_for(size_t tokens) {
  return static_cast<unsigned>(std::max<size_t>(1, std::min(tokens, kMaxBlocks)));
}

// Routes (t * topk + k) sorted by index_sort_key(indices[route]) into a or b (whichever holds the
// result after the non-skipped passes), then row_id_map written from it. b is row_id_map itself,
// so a final result in b is first copied to a.
__global__ void __launch_bounds__(kSortThreads)
    index_sort_kernel(const IndexPermuteParams p, const int32_t *indices, int32_t *a,
                      int32_t *map) {
  __shared__ int counts[kDigits][kSortThreads];
  __shared__ int base[kDigits];
  __shared__ int skip;
  const size_t n = p.tokens * p.topk;
  const int tid = threadIdx.x;
  const size_t slice = (n + kSortThreads - 1) / kSortThreads;
  const size_t lo = slice * tid < n ? slice * tid : n, hi = lo + slice < n ? lo + slice : n;
  for (size_t i = lo; i < hi; ++i) a[i] = static_cast<int32_t>(i);
  int32_t *src = a, *dst = map;
  __syncthreads();
  for (int shift = 0; shift < 32; shift += kDigitBits) {
    int c[kDigits];
    for (int d = 0; d < kDigits; ++d) c[d] = 0;
    for (size_t i = lo; i < hi; ++i) {
      ++c[(index_sort_key(indices[src[i]]) >> shift) & (kDigits - 1)];
    }
    for (int d = 0; d < kDigits; ++d) counts[d][tid] = c[d];
    __syncthreads();
    if (tid < kDigits) {  // per digit: exclusive scan over the threads
      int run = 0;
      for (int j = 0; j < kSortThreads; ++j) {
        const int v = counts[tid][j];
        counts[tid][j] = run;
        run += v;
      }
      base[tid] = run;
    }
    __syncthreads();
    if (tid == 0) {  // digit totals -> digit bases; one digit holding every key: nothing moves
      int run = 0;
      skip = 0;
      for (int d = 0; d < kDigits; ++d) {
        const int v = base[d];
        if (static_cast<size_t>(v) == n) skip = 1;
        base[d] = run;
        run += v;
      }
    }
    __syncthreads();
    if (!skip) {
      for (int d = 0; d < kDigits; ++d) c[d] = base[d] + counts[d][tid];
      for (size_t i = lo; i < hi; ++i) {
        const int32_t r = src[i];
        dst[c[(index_sort_key(indices[r]) >> shift) & (kDigits - 1)]++] = r;
      }
      int32_t *tmp = src;
      src = dst;
      dst = tmp;
    }
    __syncthreads();
  }
  if (src == map) {
    for (size_t i = lo; i < hi; ++i) a[i] = map[i];
    __syncthreads();
  }
  for (size_t i = lo; i < hi; ++i) {
    const size_t route = static_cast<size_t>(a[i]);
    const size_t t = route / p.topk, k = route % p.topk;
    map[k * p.tokens + t] = static_cast<int64_t>(i) < p.out_rows ? static_cast<int32_t>(i) : -1;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    index_permute_kernel(const IndexPermuteParams p, const T *in, const int32_t *map, T *out) {
  for (size_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    for (size_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      index_permute_element(p, map, in, out, t, h);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    index_unpermute_kernel(const IndexPermuteParams p, const T *in, const int32_t *map,
                           const float *probs, T *out) {
  for (size_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    for (size_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      out[t * p.hidden + h] = index_unpermute_element(p, map, in, probs, t, h);
    }
  }
}

// One block per token: the act grad across threads, then thread 0 the token's probs grad (the
// CPU's order, so bit-identical).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    index_unpermute_bwd_kernel(const IndexPermuteParams p, const T *grad, const int32_t *map,
                               const T *fwd_input, const float *probs, T *in_grad,
                               float *probs_grad) {
  for (size_t t = blockIdx.x; t < p.tokens; t += gridDim.x) {
    for (size_t h = threadIdx.x; h < p.hidden; h += blockDim.x) {
      index_unpermute_bwd_element(p, map, grad, probs, in_grad, t, h);
    }
    if (threadIdx.x == 0) index_probs_grad_token(p, map, grad, fwd_input, probs_grad, t);
  }
}

}  // namespace

void launch_index_make_row_id_map(const IndexPermuteParams &p, const int32_t *indices,
                                  int32_t *workspace, int32_t *row_id_map, void *stream) {
  index_sort_kernel<<<1, kSortThreads, 0, as_stream(stream)>>>(p, indices, workspace, row_id_map);
  NVTE_CHECK_LAUNCH();
}

void launch_permute_with_index_map(const IndexPermuteParams &p, DType dtype, const void *in,
                                   const int32_t *row_id_map, void *out, void *stream) {
  dispatch_dtype<PermuteDataTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    index_permute_kernel<T><<<blocks_for(p.tokens), kThreads, 0, as_stream(stream)>>>(
        p, static_cast<const T *>(in), row_id_map, static_cast<T *>(out));
    NVTE_CHECK_LAUNCH();
  });
}

void launch_unpermute_with_index_map(const IndexPermuteParams &p, DType dtype, const void *in,
                                     const int32_t *row_id_map, const float *probs, void *out,
                                     void *stream) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    index_unpermute_kernel<T><<<blocks_for(p.tokens), kThreads, 0, as_stream(stream)>>>(
        p, static_cast<const T *>(in), row_id_map, probs, static_cast<T *>(out));
    NVTE_CHECK_LAUNCH();
  });
}

void launch_unpermute_with_index_map_bwd(const IndexPermuteParams &p, DType dtype,
                                         const void *grad, const int32_t *row_id_map,
                                         const void *fwd_input, const float *probs, void *in_grad,
                                         float *probs_grad, void *stream) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    index_unpermute_bwd_kernel<T><<<blocks_for(p.tokens), kThreads, 0, as_stream(stream)>>>(
        p, static_cast<const T *>(grad), row_id_map, static_cast<const T *>(fwd_input), probs,
        static_cast<T *>(in_grad), probs_grad);
    NVTE_CHECK_LAUNCH();
  });
}

}  // namespace gpu
}  // namespace nvte
