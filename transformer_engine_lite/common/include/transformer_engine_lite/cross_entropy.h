/* Vocab-parallel cross entropy (TE's parallel_cross_entropy, whose kernels are Triton-only: these
 * names are ours), in steps so that per-rank row statistics can be combined across a
 * tensor-parallel group between them. Each of `world_size` ranks holds the contiguous vocab shard
 * [rank * V, (rank + 1) * V) of the logits, [rows, V] (fp32 / fp16 / bf16); target is int32 or
 * int64 [rows], with values in [0, V * world_size) or equal to ignore_idx. Math in fp32.
 *
 * 1. nvte_cross_entropy_row_stats -> stats, fp32 [rows, 4], per row of this shard:
 *      m = max_j x_j,  d = sum_j exp(x_j - m),
 *      x_t = x[target - rank * V] if the target is in this shard, else -inf,  s = sum_j (x_j - m)
 *    (for a shard of all -inf: m = -inf, d = 0, s = -inf).
 * 2. (caller) gather every rank's stats into [world_size, rows, 4], rank order.
 * 3. nvte_cross_entropy_forward combines them per row: M = max m_r, D = sum d_r exp(m_r - M),
 *    X_t = max x_t,r, S = sum_r (s_r + V (m_r - M)) = sum_j (x_j - M) over the whole vocab,
 *    eps = label_smoothing / (V * world_size), and writes (TE's formulas, in differences to M):
 *      loss[r]    = (1 - label_smoothing) (M - X_t + log D) + label_smoothing log D - eps S  (fp32)
 *      grad[r, j] = c (exp(x_j - M) / D - eps - (1 - label_smoothing) [j is the target]),
 *    with c = 1 / rows if reduce_loss (TE's mean divides by all rows, ignored ones included),
 *    else 1; grad in the logits' dtype. Rows whose target is ignore_idx: loss 0, grad 0.
 * 4. nvte_cross_entropy_backward: dx[r, j] = grad[r, j] * grad_output[r] (or grad_output[0] when
 *    it has one element), in fp32, rounded once to grad's dtype.
 *
 * A target outside [0, V * world_size) that is not ignore_idx: the CPU kernels return
 * NVTE_ERROR_INVALID_ARGUMENT naming the row; the GPU kernels cannot report from the device and
 * write NaN into that row's loss and gradient instead. rows = 0 is valid (nothing is written).
 */
#ifndef TRANSFORMER_ENGINE_LITE_CROSS_ENTROPY_H_
#define TRANSFORMER_ENGINE_LITE_CROSS_ENTROPY_H_

#include <stdint.h>

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! stats (fp32 [rows, 4]) of this rank's logits shard [rows, V]; see above. */
NVTE_API NVTEStatus nvte_cross_entropy_row_stats(const NVTETensor logits, const NVTETensor target,
                                                 int rank, int world_size, int64_t ignore_idx,
                                                 NVTETensor stats, NVTEStream stream);

/*! loss (fp32 [rows]) and grad (logits' dtype, [rows, V]) from every rank's stats
 *  (fp32 [world_size, rows, 4]); see above. grad must not overlap logits. */
NVTE_API NVTEStatus nvte_cross_entropy_forward(const NVTETensor logits, const NVTETensor target,
                                               const NVTETensor stats, int rank,
                                               int64_t ignore_idx, float label_smoothing,
                                               int reduce_loss, NVTETensor loss, NVTETensor grad,
                                               NVTEStream stream);

/*! dx = grad * grad_output per row; grad_output fp32 with rows elements or one. */
NVTE_API NVTEStatus nvte_cross_entropy_backward(const NVTETensor grad,
                                                const NVTETensor grad_output, NVTETensor dx,
                                                NVTEStream stream);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* TRANSFORMER_ENGINE_LITE_CROSS_ENTROPY_H_ */
