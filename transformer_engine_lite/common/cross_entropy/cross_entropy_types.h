// Dtype lists of the cross entropy family, shared by the CPU and GPU launchers.
#pragma once

#include "../util/dtype_dispatch.h"

namespace nvte {

// Token ids (torch's int64 labels, int32 from Megatron's data loaders).
using CrossEntropyTargetTypes = TypeList<int32_t, int64_t>;

}  // namespace nvte
