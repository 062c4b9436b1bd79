// Dtype lists of the multi-tensor ops, shared by the CPU and GPU launchers.
#pragma once

#include "../util/dtype_dispatch.h"

namespace nvte {

// Model weights written beside fp32 SGD weights (TE: fp16; bf16 too).
using SgdModelOutTypes = TypeList<fp16, bf16>;

}  // namespace nvte
