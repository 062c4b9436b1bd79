// CPU launchers of the MoE permutation (permutation.h). Arguments arrive validated by
// permutation.cpp; every buffer is dense and row-major; probs pointers may be null (none).
#pragma once

#include "../util/tensor.h"
#include "permutation_index.h"
#include "permutation_params.h"

namespace nvte {

void launch_make_row_id_map(const PermuteParams &p, DType map_dtype, const void *routing_map,
                            int32_t *row_id_map);
void launch_permute_with_mask_map(const PermuteParams &p, DType dtype, const void *in,
                                  const int32_t *row_id_map, DType probs_dtype, const void *probs,
                                  void *out, void *permuted_probs);
void launch_unpermute_with_mask_map(const PermuteParams &p, DType dtype, const void *in,
                                    const int32_t *row_id_map, DType probs_dtype,
                                    const void *merging_probs, const void *permuted_probs,
                                    void *out, void *unpermuted_probs);
void launch_unpermute_bwd_with_merging_probs(const PermuteParams &p, DType dtype, const void *grad,
                                             const int32_t *row_id_map, const void *fwd_input,
                                             DType probs_dtype, const void *merging_probs,
                                             void *in_grad, void *probs_grad);
void launch_make_chunk_sort_map(const PermuteParams &p, const int64_t *split_sizes,
                                const int64_t *sorted_index, int32_t *row_id_map);
void launch_sort_chunks_by_map(const PermuteParams &p, DType dtype, const void *in,
                               const int32_t *row_id_map, DType probs_dtype, const void *probs,
                               bool forward, void *out, void *permuted_probs);

// Index map (permutation_index.h). Sort: row_id_map of indices [tokens, topk]; the GPU's radix sort
// uses workspace (int32 [tokens * topk]).
void launch_index_make_row_id_map(const IndexPermuteParams &p, const int32_t *indices,
                                  int32_t *workspace, int32_t *row_id_map);
void launch_permute_with_index_map(const IndexPermuteParams &p, DType dtype, const void *in,
                                   const int32_t *row_id_map, void *out);
void launch_unpermute_with_index_map(const IndexPermuteParams &p, DType dtype, const void *in,
                                     const int32_t *row_id_map, const float *probs,
                                     void *out);
void launch_unpermute_with_index_map_bwd(const IndexPermuteParams &p, DType dtype,
                                         const void *grad, const int32_t *row_id_map,
                                         const void *fwd_input, const float *probs,
                                         void *in_grad, float *probs_grad);


}  // namespace nvte
