// CPU kernels of the MoE permutation with an index map (permutation_index.h): the row_id_map by a
// stable sort of the routes (the GPU's radix sort gives the same order: a stable sort is unique),
// data kernels one token per task over the shared per-element math.
#include <algorithm>
#include <numeric>
#include <vector>

#include "../util/parallel.h"
#include "permutation_cpu.h"
#include "permutation_types.h"

namespace nvte {

namespace {

size_t token_grain(size_t per_token) {
  return std::max<size_t>(1, 16384 / std::max<size_t>(1, per_token));
}

}  // namespace

void launch_index_make_row_id_map(const IndexPermuteParams &p, const int32_t *indices,
                                  int32_t *workspace, int32_t *row_id_map) {
  (void)workspace;  // the GPU's radix sort buffer
  const size_t n = p.tokens * p.topk;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return index_sort_key(indices[a]) < index_sort_key(indices[b]);
  });
  parallel_for(n, 16384, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      const size_t route = static_cast<size_t>(order[i]);
      const size_t t = route / p.topk, k = route % p.topk;
      row_id_map[k * p.tokens + t] = static_cast<int64_t>(i) < p.out_rows ? static_cast<int32_t>(i)
                                                                          : -1;
    }
  });
}

void launch_permute_with_index_map(const IndexPermuteParams &p, DType dtype, const void *in,
                                   const int32_t *row_id_map, void *out) {
  dispatch_dtype<PermuteDataTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    parallel_for(p.tokens, token_grain(p.hidden * p.topk), [&](size_t t0, size_t t1) {
      for (size_t t = t0; t < t1; ++t) {
        for (size_t h = 0; h < p.hidden; ++h) {
          index_permute_element(p, row_id_map, static_cast<const T *>(in), static_cast<T *>(out),
                                t, h);
        }
      }
    });
  });
}

void launch_unpermute_with_index_map(const IndexPermuteParams &p, DType dtype, const void *in,
                                     const int32_t *row_id_map, const float *probs, void *out) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    parallel_for(p.tokens, token_grain(p.hidden * p.topk), [&](size_t t0, size_t t1) {
      for (size_t t = t0; t < t1; ++t) {
        T *o = static_cast<T *>(out) + t * p.hidden;
        for (size_t h = 0; h < p.hidden; ++h) {
          o[h] = index_unpermute_element(p, row_id_map, static_cast<const T *>(in), probs, t, h);
        }
      }
    });
  });
}

void launch_unpermute_with_index_map_bwd(const IndexPermuteParams &p, DType dtype,
                                         const void *grad, const int32_t *row_id_map,
                                         const void *fwd_input, const float *probs, void *in_grad,
                                         float *probs_grad) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *g = static_cast<const T *>(grad);
    parallel_for(p.tokens, token_grain(2 * p.hidden * p.topk), [&](size_t t0, size_t t1) {
      for (size_t t = t0; t < t1; ++t) {
        for (size_t h = 0; h < p.hidden; ++h) {
          index_unpermute_bwd_element(p, row_id_map, g, probs, static_cast<T *>(in_grad), t, h);
        }
        index_probs_grad_token(p, row_id_map, g, static_cast<const T *>(fwd_input), probs_grad, t);
      }
    });
  });
}

}  // namespace nvte
