// GPU launchers of the cross entropy family (cross_entropy.cu). Plain C++: no runtime headers,
// streams as void*. The contracts of cross_entropy_cpu.h, except that an out-of-range target is
// not reported: its row's loss and gradient are NaN.
#pragma once

#include "../util/tensor.h"
#include "cross_entropy_params.h"

namespace nvte {
namespace gpu {

void launch_cross_entropy_stats(const CrossEntropyParams &p, DType dtype, const void *logits,
                                DType target_dtype, const void *target, float *stats,
                                void *stream);
void launch_cross_entropy_fwd(const CrossEntropyParams &p, DType dtype, const void *logits,
                              DType target_dtype, const void *target, float *loss, void *grad,
                              void *stream);
void launch_cross_entropy_bwd(size_t rows, size_t vocab, DType dtype, const void *grad,
                              const float *grad_output, bool per_row, void *dx, void *stream);

}  // namespace gpu
}  // namespace nvte
