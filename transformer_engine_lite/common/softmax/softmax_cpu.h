// CPU launchers of the fused scaled softmax family: one row kernel for all four variants, with the
// variant's mask given as a byte mask or a per-row valid prefix length.
#pragma once

#include "../util/tensor.h"
#include "softmax_params.h"

namespace nvte {

// softmax_results = softmax(mask(scale * input)) row by row; input and output share a dtype
// (fp32/fp16/bf16) and may alias.
void launch_softmax_fwd(const SoftmaxParams &p, DType dtype, const void *input, void *output);

// output_grads = scale * y * (dy - sum(dy * y)) row by row, exactly 0 where the variant's causal
// mask dropped the position. Any of the three buffers may alias.
void launch_softmax_bwd(const SoftmaxParams &p, DType dtype, const void *incoming_grads,
                        const void *softmax_results, void *output_grads);

}  // namespace nvte
