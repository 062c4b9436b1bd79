// GPU launcher of the delayed-scaling update (recipe/delayed_scaling.cu). Plain C++: no runtime
// headers, the stream as void*. Arguments are validated by the API entry before it is called.
#pragma once

#include "delayed_scaling_cpu.h"  // DelayedScalingParams: the same plain params on both devices

namespace nvte {
namespace gpu {

// The update of delayed_scaling_cpu.cpp with device pointers in `p` (outputs may alias inputs).
void launch_delayed_scaling_update(const DelayedScalingParams &p, void *stream);

}  // namespace gpu
}  // namespace nvte
