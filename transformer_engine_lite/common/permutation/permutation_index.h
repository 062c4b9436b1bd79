// MoE token permutation, index map (TE's map_type="index"): the per-route math shared by the CPU
// kernels (one token per task) and the GPU kernels (one token per block), so both write the same
// rows and sum in the same order (bit-identical results).
//
// row_id_map: int32 [topK * num_tokens], route (t, k) at k * num_tokens + t (TE's layout): the
// route's row in the permuted tensor, or -1 when dropped. The permuted rows are the routes sorted
// stably by expert index (ties: route id t * topK + k ascending); rows at or past out_rows drop.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../platform/host_device.h"
#include "../util/half.h"

namespace nvte {

struct IndexPermuteParams {
  size_t tokens = 0;     // rows of the unpermuted tensor
  size_t topk = 0;       // routes per token (indices' columns)
  size_t hidden = 0;     // elements per row
  int64_t out_rows = 0;  // rows of the permuted tensor
  size_t in_rows = 0;    // rows of the permuted tensor read by unpermute
};

// Sort key of an expert index: signed order as unsigned (TE's radix sort of int32 keys).
NVTE_HOST_DEVICE uint32_t index_sort_key(int32_t expert) {
  return static_cast<uint32_t>(expert) ^ 0x80000000u;
}

// Row of route (t, k), or -1 when dropped or out of [0, rows).
NVTE_HOST_DEVICE int64_t index_route_row(const IndexPermuteParams &p, const int32_t *map,
                                         size_t t, size_t k, int64_t rows) {
  const int32_t r = map[k * p.tokens + t];
  return r >= 0 && r < rows ? r : -1;
}

// Permute, element h of token t: copied to each kept route's row.
template <typename T>
NVTE_HOST_DEVICE void index_permute_element(const IndexPermuteParams &p, const int32_t *map,
                                            const T *in, T *out, size_t t, size_t h) {
  const T x = in[t * p.hidden + h];
  for (size_t k = 0; k < p.topk; ++k) {
    const int64_t dst = index_route_row(p, map, t, k, p.out_rows);
    if (dst >= 0) out[dst * p.hidden + h] = x;
  }
}

// Unpermute, element h of token t: fp32 sum over k in order of the kept routes' rows, each
// weighted by probs[t][k] when given (TE sums in the data type for fp16 / bf16; fp32 is the
// closer result and the same for fp32 data).
template <typename T>
NVTE_HOST_DEVICE T index_unpermute_element(const IndexPermuteParams &p, const int32_t *map,
                                           const T *in, const float *probs, size_t t, size_t h) {
  float acc = 0.0f;
  for (size_t k = 0; k < p.topk; ++k) {
    const int64_t src = index_route_row(p, map, t, k, static_cast<int64_t>(p.in_rows));
    if (src < 0) continue;
    float x = to_float(in[src * p.hidden + h]);
    if (probs != nullptr) x *= probs[t * p.topk + k];
    acc += x;
  }
  return from_float<T>(acc);
}

// Unpermute backward with probs, element h of token t: grad * probs[t][k] to each kept route's row.
template <typename T>
NVTE_HOST_DEVICE void index_unpermute_bwd_element(const IndexPermuteParams &p, const int32_t *map,
                                                  const T *grad, const float *probs, T *in_grad,
                                                  size_t t, size_t h) {
  const float g = to_float(grad[t * p.hidden + h]);
  for (size_t k = 0; k < p.topk; ++k) {
    const int64_t dst = index_route_row(p, map, t, k, static_cast<int64_t>(p.in_rows));
    if (dst >= 0) in_grad[dst * p.hidden + h] = from_float<T>(g * probs[t * p.topk + k]);
  }
}

// probs_grad of token t: per route, the dot product of grad[t] and the route's forward input row
// (0 when dropped), accumulated in fp64 over h in order and rounded once, so a long hidden
// dimension does not build up fp32 rounding (a GPU's tree reduction is close to the exact sum).
template <typename T>
NVTE_HOST_DEVICE void index_probs_grad_token(const IndexPermuteParams &p, const int32_t *map,
                                             const T *grad, const T *fwd_input, float *probs_grad,
                                             size_t t) {
  for (size_t k = 0; k < p.topk; ++k) {
    const int64_t src = index_route_row(p, map, t, k, static_cast<int64_t>(p.in_rows));
    double acc = 0.0;
    if (src >= 0) {
      for (size_t h = 0; h < p.hidden; ++h) {
        acc += static_cast<double>(to_float(fwd_input[src * p.hidden + h])) *
               static_cast<double>(to_float(grad[t * p.hidden + h]));
      }
    }
    probs_grad[t * p.topk + k] = static_cast<float>(acc);
  }
}

}  // namespace nvte
