// Dtype lists of the MoE permutation, shared by the CPU and GPU launchers.
#pragma once

#include "../util/dtype_dispatch.h"

namespace nvte {

// Permuted data: high precision or FP8 bytes (uint8: FP8 payloads of any format).
using PermuteDataTypes =
    TypeList<float, fp16, bf16, fp8e4m3, fp8e5m2, fp8e4m3fnuz, fp8e5m2fnuz, uint8_t>;
// routing_map: bool / uint8, int32 (TE's documented dtype) or int64.
using RoutingMapTypes = TypeList<uint8_t, int32_t, int64_t>;

}  // namespace nvte
