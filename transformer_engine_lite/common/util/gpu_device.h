// The current GPU device and its arch name (util/gpu_runtime.cu; GPU builds only).
#pragma once

namespace nvte {

// "sm_90" (CUDA) or "gfx942:sramecc+:xnack-" (ROCm) of the current device, "" when no device is
// usable; *device (may be NULL) gets its index. Cached per device.
const char *gpu_device_arch(int *device);

}  // namespace nvte
