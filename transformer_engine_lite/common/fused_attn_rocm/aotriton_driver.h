// Loading and launching AOTriton images through the GPU driver's module API (aotriton_driver.cpp).
#pragma once

#include "aotriton_index.h"

namespace nvte {
namespace aotriton {

// The image's function on `device` (loaded once per device, then cached); raises naming the kernel.
void *kernel_function(const KernelImage &k, int device);
// One launch: block = num_warps * warp_size threads, k.shared bytes of dynamic shared memory,
// params = one pointer per kernel parameter (the driver's kernelParams convention).
void launch(const KernelImage &k, int device, const unsigned grid[3], void *stream, void **params);

}  // namespace aotriton
}  // namespace nvte
