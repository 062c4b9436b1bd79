/* MoE token permutation (TE's transformer_engine.pytorch.permutation, mask-map and chunk-sort
 * kernels, C ABI). Data: fp32 / fp16 / bf16, or FP8 bytes (any FP8 dtype or uint8: permuting
 * copies bytes, the scale stays with the caller). Probs: fp32 / fp16 / bf16.
 *
 * row_id_map (int32 [num_tokens, 2 * num_experts + 1], TE's layout): the permuted rows are grouped
 * by expert (expert 0 first), tokens in ascending order within an expert; rows at or past
 * num_out_tokens are dropped. For token t with n = row_id_map[t][2E] kept routes:
 * row_id_map[t][0..n) are its destination rows in descending order, row_id_map[t][E..E+n) the
 * matching experts; the other slots hold -1. routing_map: [num_tokens, num_experts], uint8 / bool,
 * int32 or int64, nonzero = routed.
 *
 * permute:   output[row_id_map[t][i]] = input[t] (zeros where the route's prob is 0: TE's padding),
 *            permuted_probs[row] = probs[t][expert]; rows no route writes are left as they were.
 * unpermute: output[t] = sum_i input[row_id_map[t][i]] * merging_probs[t][expert_i] (fp32 sums in
 *            that order; no merging_probs: weight 1), unpermuted_probs[t][e] = permuted_probs[row]
 *            (0 where not routed).
 * unpermute backward with merging probs: fwd_input_grad[row] = grad[t] * merging_probs[t][e],
 *            merging_probs_grad[t][e] = sum_h fwd_input[row][h] * grad[t][h] (fp32, h in order).
 * chunk sort: input rows form num_splits chunks of split_sizes (int64); chunk sorted_index[j]
 *            (int64) goes to position j. row_id_map (int32 [num_tokens]) = destination row of each
 *            input row; forward: output[map[t]] = input[t], backward: output[t] = input[map[t]].
 *
 * Map entries out of range are skipped (never read or written past a buffer). Split sizes and
 * sorted_index are checked on the CPU (sizes >= 0 summing to num_tokens, a permutation); on a GPU
 * rows of an inconsistent chunk map are -1. Empty inputs are valid and write nothing.
 * MXFP8 / blockwise scales are permuted as uint8 / fp32-as-data rows by the caller.
 *
 * Index map (TE's map_type="index"): indices int32 [num_tokens, topK] (expert of each route).
 * row_id_map int32 [topK * num_tokens], route (t, k) at k * num_tokens + t: the routes sorted
 * stably by expert index (signed order; ties by route id t * topK + k) give the permuted rows; a
 * route's entry is its row, or -1 when the row is at or past num_out_tokens (dropped).
 * permute:   output[row_id_map[k][t]] = input[t].
 * unpermute: output[t] = sum_k input[row_id_map[k][t]] * probs[t][k] (fp32 sum over k in order;
 *            probs fp32 [num_tokens, topK] or NULL: weight 1; dropped routes add nothing).
 * unpermute backward (with probs): fwd_input_grad[row_id_map[k][t]] = grad[t] * probs[t][k],
 *            probs_grad[t][k] = sum_h grad[t][h] * fwd_input[row][h] (fp64 sum, rounded once;
 *            0 for a dropped route).
 */
#ifndef TRANSFORMER_ENGINE_LITE_PERMUTATION_H_
#define TRANSFORMER_ENGINE_LITE_PERMUTATION_H_

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! row_id_map from routing_map (see above); num_out_tokens < 0: keep every route. */
NVTE_API NVTEStatus nvte_permute_make_row_id_map(const NVTETensor routing_map, int num_tokens,
                                                 int num_experts, int num_out_tokens,
                                                 NVTETensor row_id_map, NVTEStream stream);

/*! output [num_out_tokens, hidden_size] (input's dtype) and, with probs [num_tokens,
 *  num_experts] (NULL: none), permuted_probs [num_out_tokens] (probs' dtype). */
NVTE_API NVTEStatus nvte_permute_with_mask_map(const NVTETensor input, const NVTETensor row_id_map,
                                               const NVTETensor probs, int num_tokens,
                                               int num_experts, int num_out_tokens,
                                               int hidden_size, NVTETensor output,
                                               NVTETensor permuted_probs, NVTEStream stream);

/*! output [num_tokens, hidden_size] from input [rows, hidden_size] (fp32 / fp16 / bf16);
 *  merging_probs [num_tokens, num_experts] or NULL; permuted_probs [rows] and unpermuted_probs
 *  [num_tokens, num_experts] both or neither. */
NVTE_API NVTEStatus nvte_unpermute_with_mask_map(const NVTETensor input,
                                                 const NVTETensor row_id_map,
                                                 const NVTETensor merging_probs,
                                                 const NVTETensor permuted_probs, int num_tokens,
                                                 int num_experts, int hidden_size,
                                                 NVTETensor output, NVTETensor unpermuted_probs,
                                                 NVTEStream stream);

/*! Backward of unpermute with merging_probs: fwd_input_grad [rows, hidden_size] (grad's dtype;
 *  rows no route reads are left as they were), merging_probs_grad [num_tokens, num_experts]. */
NVTE_API NVTEStatus nvte_unpermute_with_mask_map_bwd_with_merging_probs(
    const NVTETensor fwd_output_grad, const NVTETensor row_id_map, const NVTETensor fwd_input,
    const NVTETensor merging_probs, int num_tokens, int num_experts, int hidden_size,
    NVTETensor fwd_input_grad, NVTETensor merging_probs_grad, NVTEStream stream);

/*! row_id_map (int32 [num_tokens]) of a chunk sort (see above). */
NVTE_API NVTEStatus nvte_make_chunk_sort_map(const NVTETensor split_sizes,
                                             const NVTETensor sorted_index, int num_tokens,
                                             int num_splits, NVTETensor row_id_map,
                                             NVTEStream stream);

/*! output [num_tokens, hidden_size], permuted_probs [num_tokens] with probs [num_tokens] (NULL:
 *  none); is_forward != 0: output[map[t]] = input[t], else output[t] = input[map[t]]. */
NVTE_API NVTEStatus nvte_sort_chunks_by_map(const NVTETensor input, const NVTETensor row_id_map,
                                            const NVTETensor probs, int num_tokens,
                                            int hidden_size, int is_forward, NVTETensor output,
                                            NVTETensor permuted_probs, NVTEStream stream);

/*! row_id_map of an index map (see above); workspace int32 [num_tokens * topK] (the GPU's sort
 *  buffer); num_out_tokens < 0: keep every route. */
NVTE_API NVTEStatus nvte_permute_index_make_row_id_map(const NVTETensor indices, int num_tokens,
                                                       int topK, int num_out_tokens,
                                                       NVTETensor workspace, NVTETensor row_id_map,
                                                       NVTEStream stream);

/*! output [num_out_tokens, hidden_size] (input's dtype: high precision or FP8 bytes); rows no
 *  route writes are left as they were. */
NVTE_API NVTEStatus nvte_permute_with_index_map(const NVTETensor input, const NVTETensor row_id_map,
                                                int num_tokens, int topK, int num_out_tokens,
                                                int hidden_size, NVTETensor output,
                                                NVTEStream stream);

/*! output [num_tokens, hidden_size] from input [rows, hidden_size] (fp32 / fp16 / bf16). */
NVTE_API NVTEStatus nvte_unpermute_with_index_map(const NVTETensor input,
                                                  const NVTETensor row_id_map,
                                                  const NVTETensor probs, int num_tokens, int topK,
                                                  int hidden_size, NVTETensor output,
                                                  NVTEStream stream);

/*! Backward of unpermute with probs: fwd_input_grad [rows, hidden_size] (grad's dtype; rows no
 *  route reads are left as they were), probs_grad fp32 [num_tokens, topK]. */
NVTE_API NVTEStatus nvte_unpermute_with_index_map_bwd(
    const NVTETensor grad, const NVTETensor row_id_map, const NVTETensor fwd_input,
    const NVTETensor probs, int num_tokens, int topK, int hidden_size, NVTETensor fwd_input_grad,
    NVTETensor probs_grad, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_LITE_PERMUTATION_H_ */
