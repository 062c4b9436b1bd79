// CPU launchers of fused RoPE (fused_rope.h). Arguments arrive validated by fused_rope.cpp; thd
// offsets are host memory and well formed, and p.max_seqlen is set.
#pragma once

#include "../util/tensor.h"
#include "fused_rope_params.h"

namespace nvte {

// output = rope(input); input and output share a dtype (fp32/fp16/bf16) and may be one buffer.
void launch_fused_rope_fwd(const RopeParams &p, DType dtype, const void *input, void *output);

// input_grads = rope^T(output_grads); the buffers may be one.
void launch_fused_rope_bwd(const RopeParams &p, DType dtype, const void *output_grads,
                           void *input_grads);

}  // namespace nvte
