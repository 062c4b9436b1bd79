// GPU launchers of fused RoPE (fused_rope.cu). Plain C++: no runtime headers, streams as void*.
// Arguments arrive validated by fused_rope.cpp except the thd offsets' values, which stay on the
// device (see fused_rope.h for what the kernel does with malformed ones).
#pragma once

#include "../util/tensor.h"
#include "fused_rope_params.h"

namespace nvte {
namespace gpu {

// output = rope(input); the buffers may be one.
void launch_fused_rope_fwd(const RopeParams &p, DType dtype, const void *input, void *output,
                           void *stream);

// input_grads = rope^T(output_grads); the buffers may be one.
void launch_fused_rope_bwd(const RopeParams &p, DType dtype, const void *output_grads,
                           void *input_grads, void *stream);

}  // namespace gpu
}  // namespace nvte
