// CPU launchers of the multi-tensor ops (multi_tensor.h). The batch arrives validated by
// multi_tensor.cpp: dtypes per list, equal element counts per tensor, host buffers.
#pragma once

#include "multi_tensor_params.h"

namespace nvte {

// List 1 = list 0 * scale; *b.noop = 1 when an input is not finite.
void launch_multi_tensor_scale(const MultiTensorBatch &b, float scale);
// inv_scale: null, or the unscale factor. partials: num_tensors * max_chunks fp32 (scratch).
void launch_multi_tensor_l2norm(const MultiTensorBatch &b, size_t chunk_size, size_t max_chunks,
                                const float *inv_scale, float *output, float *partials,
                                float *ret, float *ret_per_tensor, bool per_tensor);
// AdamKind::kFp8: lists 5, 6, 7 hold each tensor's scale, amax, scale_inv (fp32 [1]).
void launch_multi_tensor_adam(const MultiTensorBatch &b, const AdamParams &p);
void launch_multi_tensor_sgd(const MultiTensorBatch &b, const SgdParams &p);
void launch_multi_tensor_compute_scale(const MultiTensorBatch &b, float max_fp8, bool pow2,
                                       float epsilon);

}  // namespace nvte
