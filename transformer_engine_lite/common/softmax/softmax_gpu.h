// GPU launchers of the fused scaled softmax family (softmax.cu). Plain C++: no runtime headers,
// streams as void*. Arguments arrive validated by softmax.cpp; semantics as softmax_cpu.h.
#pragma once

#include "../util/tensor.h"
#include "softmax_params.h"

namespace nvte {
namespace gpu {

// softmax_results = softmax(mask(scale * input)) row by row; input and output may alias.
void launch_softmax_fwd(const SoftmaxParams &p, DType dtype, const void *input, void *output,
                        void *stream);

// output_grads = scale * y * (dy - sum(dy * y)) row by row, exactly 0 past a causal row's kept
// prefix. Any of the three buffers may alias.
void launch_softmax_bwd(const SoftmaxParams &p, DType dtype, const void *incoming_grads,
                        const void *softmax_results, void *output_grads, void *stream);

}  // namespace gpu
}  // namespace nvte
