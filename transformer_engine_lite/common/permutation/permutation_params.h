// MoE token permutation: kernel parameters and the per-expert / per-token math, shared by the CPU
// kernels (one expert or token per task) and the GPU kernels (one per thread or block), so both
// write the same rows and sum in the same order (bit-identical results).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../platform/host_device.h"
#include "../util/half.h"

namespace nvte {

struct PermuteParams {
  size_t tokens = 0;       // rows of the unpermuted tensor (routing_map's rows)
  size_t experts = 0;      // columns of routing_map / probs
  size_t hidden = 0;       // elements per row
  int64_t out_rows = 0;    // rows of the permuted tensor (num_out_tokens)
  size_t in_rows = 0;      // rows of the permuted tensor read by unpermute
  int64_t splits = 0;      // chunk sort: number of chunks
};

// Width of a row of row_id_map: E destinations, E experts, the count.
NVTE_HOST_DEVICE size_t row_id_map_width(size_t experts) { return 2 * experts + 1; }

// Kept routes of a row of row_id_map, clamped so a corrupt count never indexes past the row.
NVTE_HOST_DEVICE int routes_of(const int32_t *row, size_t experts) {
  const int32_t n = row[2 * experts];
  return n < 0 ? 0 : (static_cast<size_t>(n) > experts ? static_cast<int>(experts) : n);
}

// Map pass 1, expert e: rank of each routed token within the expert (-1: not routed); the
// expert's count goes to row 0's slot E + e (free until pass 3). Needs tokens >= 1.
template <typename M>
NVTE_HOST_DEVICE void row_id_map_rank_expert(const PermuteParams &p, const M *routing_map,
                                             int32_t *map, size_t e) {
  const size_t w = row_id_map_width(p.experts);
  int32_t count = 0;
  for (size_t t = 0; t < p.tokens; ++t) {
    const bool routed = routing_map[t * p.experts + e] != M(0);
    map[t * w + e] = routed ? count : -1;
    count += routed ? 1 : 0;
  }
  map[p.experts + e] = count;
}

// Map pass 2, expert e: rank -> destination row (experts before e come first), -1 past
// out_rows. Reads the counts of pass 1 (row 0, slots E..2E), writes only column e.
NVTE_HOST_DEVICE void row_id_map_place_expert(const PermuteParams &p, int32_t *map, size_t e) {
  const size_t w = row_id_map_width(p.experts);
  int64_t offset = 0;
  for (size_t j = 0; j < e; ++j) offset += map[p.experts + j];
  for (size_t t = 0; t < p.tokens; ++t) {
    const int32_t rank = map[t * w + e];
    if (rank < 0) continue;
    const int64_t dst = offset + rank;
    map[t * w + e] = dst < p.out_rows ? static_cast<int32_t>(dst) : -1;
  }
}

// Map pass 3, one token: sparse row -> TE's dense row (destinations descending, their experts,
// -1 padding, count last). In place: destinations grow with the expert, so the kept experts are
// listed first (at E..), then each destination moves down to its slot (source index >= slot).
NVTE_HOST_DEVICE void row_id_map_compact_token(size_t experts, int32_t *row) {
  int n = 0;
  for (size_t e = 0; e < experts; ++e) {
    if (row[e] >= 0) row[experts + n++] = static_cast<int32_t>(e);
  }
  for (int i = 0; i < n; ++i) row[i] = row[row[experts + i]];
  for (int i = 0, j = n - 1; i < j; ++i, --j) {  // ascending -> TE's descending order
    const int32_t d = row[i], x = row[experts + i];
    row[i] = row[j];
    row[experts + i] = row[experts + j];
    row[j] = d;
    row[experts + j] = x;
  }
  for (size_t i = static_cast<size_t>(n); i < experts; ++i) row[i] = row[experts + i] = -1;
  row[2 * experts] = n;
}

// Expert of route i of a row, or -1 when out of range.
NVTE_HOST_DEVICE int64_t route_expert(const int32_t *row, size_t experts, int i) {
  const int32_t e = row[experts + i];
  return e >= 0 && static_cast<size_t>(e) < experts ? e : -1;
}

// Chunk sort, input row t: destination row (-1 when split_sizes / sorted_index are inconsistent).
NVTE_HOST_DEVICE int32_t chunk_sort_dst(const PermuteParams &p, const int64_t *split_sizes,
                                        const int64_t *sorted_index, size_t t) {
  int64_t start = 0, chunk = -1;
  for (int64_t c = 0; c < p.splits; ++c) {
    if (static_cast<int64_t>(t) < start + split_sizes[c]) {
      chunk = c;
      break;
    }
    start += split_sizes[c];
  }
  if (chunk < 0) return -1;
  int64_t dst = static_cast<int64_t>(t) - start;
  for (int64_t j = 0; j < p.splits; ++j) {
    const int64_t c = sorted_index[j];
    if (c == chunk) return static_cast<int32_t>(dst);
    if (c < 0 || c >= p.splits) return -1;
    dst += split_sizes[c];
  }
  return -1;
}

// merging_probs_grad of one token: zero row, then each route's dot product over the hidden
// dimension in order, accumulated in fp64 and rounded once (an fp32 running sum over thousands of
// elements drifts by ~1e-6 relative, past TE's fp32 tolerance; TE's GPU block reduction and
// torch's pairwise sum stay close to the exact value, and so does this).
template <typename T, typename P>
NVTE_HOST_DEVICE void unpermute_probs_grad_token(const PermuteParams &p, const int32_t *row,
                                                 const T *grad, const T *fwd_input, P *probs_grad,
                                                 size_t t) {
  for (size_t e = 0; e < p.experts; ++e) probs_grad[t * p.experts + e] = from_float<P>(0.0f);
  const int n = routes_of(row, p.experts);
  for (int i = 0; i < n; ++i) {
    const int32_t src = row[i];
    const int64_t e = route_expert(row, p.experts, i);
    if (src < 0 || static_cast<size_t>(src) >= p.in_rows || e < 0) continue;
    double acc = 0.0;
    for (size_t h = 0; h < p.hidden; ++h) {
      acc += static_cast<double>(to_float(fwd_input[src * p.hidden + h])) *
             static_cast<double>(to_float(grad[t * p.hidden + h]));
    }
    probs_grad[t * p.experts + e] = from_float<P>(static_cast<float>(acc));
  }
}

}  // namespace nvte

namespace nvte {

// Permute, element h of token t: copied to each kept route's row (zero bits where the route's
// prob is 0: TE's padding slots). All zero bits are +0 in every data dtype, FP8 included.
template <typename T, typename P>
NVTE_HOST_DEVICE void permute_element(const PermuteParams &p, const int32_t *row, const T *in,
                                      const P *probs, T *out, size_t t, size_t h) {
  const int n = routes_of(row, p.experts);
  const T x = in[t * p.hidden + h];
  for (int i = 0; i < n; ++i) {
    const int32_t dst = row[i];
    if (dst < 0 || dst >= p.out_rows) continue;
    bool pad = false;
    if (probs != nullptr) {
      const int64_t e = route_expert(row, p.experts, i);
      pad = e < 0 || to_float(probs[t * p.experts + e]) == 0.0f;
    }
    out[dst * p.hidden + h] = pad ? T{} : x;
  }
}

// Permute, token t: permuted_probs of each kept route.
template <typename P>
NVTE_HOST_DEVICE void permute_probs_token(const PermuteParams &p, const int32_t *row,
                                          const P *probs, P *permuted_probs, size_t t) {
  const int n = routes_of(row, p.experts);
  for (int i = 0; i < n; ++i) {
    const int32_t dst = row[i];
    const int64_t e = route_expert(row, p.experts, i);
    if (dst < 0 || dst >= p.out_rows || e < 0) continue;
    permuted_probs[dst] = probs[t * p.experts + e];
  }
}

// Unpermute, element h of token t: fp32 sum over the routes in row order (TE's), each weighted by
// its merging prob when given.
template <typename T, typename P>
NVTE_HOST_DEVICE T unpermute_element(const PermuteParams &p, const int32_t *row, const T *in,
                                     const P *merging_probs, size_t t, size_t h) {
  const int n = routes_of(row, p.experts);
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int32_t src = row[i];
    if (src < 0 || static_cast<size_t>(src) >= p.in_rows) continue;
    float x = to_float(in[src * p.hidden + h]);
    if (merging_probs != nullptr) {
      const int64_t e = route_expert(row, p.experts, i);
      x = e < 0 ? 0.0f : x * to_float(merging_probs[t * p.experts + e]);
    }
    acc += x;
  }
  return from_float<T>(acc);
}

// Unpermute, token t: unpermuted_probs row (0 where no kept route).
template <typename P>
NVTE_HOST_DEVICE void unpermute_probs_token(const PermuteParams &p, const int32_t *row,
                                            const P *permuted_probs, P *unpermuted_probs,
                                            size_t t) {
  for (size_t e = 0; e < p.experts; ++e) unpermuted_probs[t * p.experts + e] = from_float<P>(0.0f);
  const int n = routes_of(row, p.experts);
  for (int i = 0; i < n; ++i) {
    const int32_t src = row[i];
    const int64_t e = route_expert(row, p.experts, i);
    if (src < 0 || static_cast<size_t>(src) >= p.in_rows || e < 0) continue;
    unpermuted_probs[t * p.experts + e] = permuted_probs[src];
  }
}

// Unpermute backward with merging probs, element h of token t: grad * merging prob to each
// kept route's row.
template <typename T, typename P>
NVTE_HOST_DEVICE void unpermute_bwd_element(const PermuteParams &p, const int32_t *row,
                                            const T *grad, const P *merging_probs, T *in_grad,
                                            size_t t, size_t h) {
  const int n = routes_of(row, p.experts);
  const float g = to_float(grad[t * p.hidden + h]);
  for (int i = 0; i < n; ++i) {
    const int32_t dst = row[i];
    const int64_t e = route_expert(row, p.experts, i);
    if (dst < 0 || static_cast<size_t>(dst) >= p.in_rows || e < 0) continue;
    in_grad[dst * p.hidden + h] = from_float<T>(g * to_float(merging_probs[t * p.experts + e]));
  }
}

}  // namespace nvte
