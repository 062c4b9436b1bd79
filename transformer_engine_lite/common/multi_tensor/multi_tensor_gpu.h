// GPU launchers of the multi-tensor ops (multi_tensor.cu). Plain C++: no runtime headers, streams
// as void*. Same contracts as multi_tensor_cpu.h; every pointer (noop, scalars, scratch) is a
// device pointer.
#pragma once

#include "multi_tensor_params.h"

namespace nvte {
namespace gpu {

void launch_multi_tensor_scale(const MultiTensorBatch &b, float scale, void *stream);
void launch_multi_tensor_l2norm(const MultiTensorBatch &b, size_t chunk_size, size_t max_chunks,
                                const float *inv_scale, float *output, float *partials,
                                float *ret, float *ret_per_tensor, bool per_tensor, void *stream);
void launch_multi_tensor_adam(const MultiTensorBatch &b, const AdamParams &p, void *stream);
void launch_multi_tensor_sgd(const MultiTensorBatch &b, const SgdParams &p, void *stream);
void launch_multi_tensor_compute_scale(const MultiTensorBatch &b, float max_fp8, bool pow2,
                                       float epsilon, void *stream);

}  // namespace gpu
}  // namespace nvte
