// CPU kernels of the MoE permutation: the row_id_map passes over experts, then tokens, in
// parallel; data kernels one token per task, running the shared per-element math
// (permutation_params.h) so the results equal the GPU's bit for bit.
#include <algorithm>

#include "../util/parallel.h"
#include "permutation_cpu.h"
#include "permutation_types.h"

namespace nvte {

namespace {

// Tokens per task: about 16K elements of work.
size_t token_grain(size_t per_token) {
  return std::max<size_t>(1, 16384 / std::max<size_t>(1, per_token));
}

// Runs f with the probs storage type (float when there are none: the pointer is then null).
template <typename F>
void with_probs_type(DType probs_dtype, F &&f) {
  dispatch_dtype<HighPrecisionTypes>(probs_dtype, "probs", std::forward<F>(f));
}

}  // namespace

void launch_make_row_id_map(const PermuteParams &p, DType map_dtype, const void *routing_map,
                            int32_t *row_id_map) {
  if (p.tokens == 0) return;
  dispatch_dtype<RoutingMapTypes>(map_dtype, "routing_map", [&](auto tag) {
    using M = typename decltype(tag)::type;
    const M *rm = static_cast<const M *>(routing_map);
    parallel_for(p.experts, 1, [&](size_t e0, size_t e1) {
      for (size_t e = e0; e < e1; ++e) row_id_map_rank_expert(p, rm, row_id_map, e);
    });
  });
  parallel_for(p.experts, 1, [&](size_t e0, size_t e1) {
    for (size_t e = e0; e < e1; ++e) row_id_map_place_expert(p, row_id_map, e);
  });
  const size_t w = row_id_map_width(p.experts);
  parallel_for(p.tokens, token_grain(w), [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) row_id_map_compact_token(p.experts, row_id_map + t * w);
  });
}

void launch_permute_with_mask_map(const PermuteParams &p, DType dtype, const void *in,
                                  const int32_t *row_id_map, DType probs_dtype, const void *probs,
                                  void *out, void *permuted_probs) {
  const size_t w = row_id_map_width(p.experts);
  dispatch_dtype<PermuteDataTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_probs_type(probs_dtype, [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      const P *pr = static_cast<const P *>(probs);
      parallel_for(p.tokens, token_grain(p.hidden), [&](size_t t0, size_t t1) {
        for (size_t t = t0; t < t1; ++t) {
          const int32_t *row = row_id_map + t * w;
          for (size_t h = 0; h < p.hidden; ++h) {
            permute_element(p, row, static_cast<const T *>(in), pr, static_cast<T *>(out), t, h);
          }
          if (pr != nullptr) permute_probs_token(p, row, pr, static_cast<P *>(permuted_probs), t);
        }
      });
    });
  });
}

void launch_unpermute_with_mask_map(const PermuteParams &p, DType dtype, const void *in,
                                    const int32_t *row_id_map, DType probs_dtype,
                                    const void *merging_probs, const void *permuted_probs,
                                    void *out, void *unpermuted_probs) {
  const size_t w = row_id_map_width(p.experts);
  dispatch_dtype<HighPrecisionTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_probs_type(probs_dtype, [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      const P *mp = static_cast<const P *>(merging_probs);
      parallel_for(p.tokens, token_grain(p.hidden), [&](size_t t0, size_t t1) {
        for (size_t t = t0; t < t1; ++t) {
          const int32_t *row = row_id_map + t * w;
          T *o = static_cast<T *>(out) + t * p.hidden;
          for (size_t h = 0; h < p.hidden; ++h) {
            o[h] = unpermute_element(p, row, static_cast<const T *>(in), mp, t, h);
          }
          if (permuted_probs != nullptr) {
            unpermute_probs_token(p, row, static_cast<const P *>(permuted_probs),
                                  static_cast<P *>(unpermuted_probs), t);
          }
        }
      });
    });
  });
}

void launch_unpermute_bwd_with_merging_probs(const PermuteParams &p, DType dtype, const void *grad,
                                             const int32_t *row_id_map, const void *fwd_input,
                                             DType probs_dtype, const void *merging_probs,
                                             void *in_grad, void *probs_grad) {
  const size_t w = row_id_map_width(p.experts);
  dispatch_dtype<HighPrecisionTypes>(dtype, "fwd_output_grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_probs_type(probs_dtype, [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      const T *g = static_cast<const T *>(grad);
      const P *mp = static_cast<const P *>(merging_probs);
      parallel_for(p.tokens, token_grain(p.hidden), [&](size_t t0, size_t t1) {
        for (size_t t = t0; t < t1; ++t) {
          const int32_t *row = row_id_map + t * w;
          for (size_t h = 0; h < p.hidden; ++h) {
            unpermute_bwd_element(p, row, g, mp, static_cast<T *>(in_grad), t, h);
          }
          unpermute_probs_grad_token(p, row, g, static_cast<const T *>(fwd_input),
                                     static_cast<P *>(probs_grad), t);
        }
      });
    });
  });
}

void launch_make_chunk_sort_map(const PermuteParams &p, const int64_t *split_sizes,
                                const int64_t *sorted_index, int32_t *row_id_map) {
  parallel_for(p.tokens, token_grain(static_cast<size_t>(p.splits)), [&](size_t t0, size_t t1) {
    for (size_t t = t0; t < t1; ++t) {
      row_id_map[t] = chunk_sort_dst(p, split_sizes, sorted_index, t);
    }
  });
}

void launch_sort_chunks_by_map(const PermuteParams &p, DType dtype, const void *in,
                               const int32_t *row_id_map, DType probs_dtype, const void *probs,
                               bool forward, void *out, void *permuted_probs) {
  dispatch_dtype<PermuteDataTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_probs_type(probs_dtype, [&](auto ptag) {
      using P = typename decltype(ptag)::type;
      parallel_for(p.tokens, token_grain(p.hidden), [&](size_t t0, size_t t1) {
        for (size_t t = t0; t < t1; ++t) {
          const int32_t m = row_id_map[t];
          if (m < 0 || static_cast<size_t>(m) >= p.tokens) continue;
          const size_t src = forward ? t : static_cast<size_t>(m);
          const size_t dst = forward ? static_cast<size_t>(m) : t;
          std::copy_n(static_cast<const T *>(in) + src * p.hidden, p.hidden,
                      static_cast<T *>(out) + dst * p.hidden);
          if (probs != nullptr) {
            static_cast<P *>(permuted_probs)[dst] = static_cast<const P *>(probs)[src];
          }
        }
      });
    });
  });
}

}  // namespace nvte
