// CPU launchers of the cross entropy family (cross_entropy.h). Arguments arrive validated by
// cross_entropy.cpp; logits / grad are dense [rows, vocab], stats dense fp32.
#pragma once

#include "../util/tensor.h"
#include "cross_entropy_params.h"

namespace nvte {

// stats: fp32 [rows, kNumStats] of this shard. Raises for a target out of range (names the row).
void launch_cross_entropy_stats(const CrossEntropyParams &p, DType dtype, const void *logits,
                                DType target_dtype, const void *target, float *stats);
// loss: fp32 [rows]; grad: [rows, vocab] of `dtype`; p.stats: [world_size, rows, kNumStats].
void launch_cross_entropy_fwd(const CrossEntropyParams &p, DType dtype, const void *logits,
                              DType target_dtype, const void *target, float *loss, void *grad);
// dx = grad * grad_output[per_row ? r : 0].
void launch_cross_entropy_bwd(size_t rows, size_t vocab, DType dtype, const void *grad,
                              const float *grad_output, bool per_row, void *dx);

}  // namespace nvte
