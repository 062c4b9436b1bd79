// Dtype lists of the fused MoE router, shared by the CPU and GPU launchers.
#pragma once

#include "../util/dtype_dispatch.h"

namespace nvte {

// Counts of tokens per expert: integers or floats (TE's list).
using RouterCountTypes = TypeList<int16_t, int32_t, int64_t, float, bf16>;

}  // namespace nvte
