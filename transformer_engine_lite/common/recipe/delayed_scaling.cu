// GPU kernel of the delayed-scaling update: amax from the history, roll by -1, new scales. The
// scalar rules are recipe/scaling_math.h, shared with the CPU kernel, so both give identical bits.
#include <algorithm>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "delayed_scaling_gpu.h"
#include "scaling_math.h"

namespace nvte {
namespace gpu {

namespace {

// One thread per scale, blocks of 256 consecutive scales: history rows are read coalesced.
constexpr int kThreads = 256;

// Thread j owns column j of the history and scale j: it reads the whole column (the amax and the
// saved row 0) before writing any of it, and no other thread touches it, so an exact in-place alias
// (updated_* == the input) is safe without barriers.
__global__ void __launch_bounds__(kThreads) delayed_scaling_update_kernel(
    const DelayedScalingParams p) {
  const size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= p.num_scales) return;
  const size_t h = p.history_length, n = p.num_scales;
  const float first = p.amax_history[j];
  float amax = first;
  if (!p.most_recent) {
    amax = 0.0f;  // "max" starts at 0, as the CPU: an all-NaN column keeps the previous scale
    for (size_t i = 0; i < h; ++i) amax = history_max(amax, p.amax_history[i * n + j]);
  }
  const float prev_scale = p.scale[j];
  // Roll by -1, front to back: row i <- row i+1 reads a row not yet written; the last row gets the
  // saved row 0; then row 0 <- 0.
  for (size_t i = 0; i + 1 < h; ++i) {
    p.updated_amax_history[i * n + j] = p.amax_history[(i + 1) * n + j];
  }
  if (h > 1) p.updated_amax_history[(h - 1) * n + j] = first;
  p.updated_amax_history[j] = 0.0f;
  p.updated_scale[j] = delayed_scaling_scale(amax, prev_scale, p.fp8_max, p.margin_factor);
}

}  // namespace

void launch_delayed_scaling_update(const DelayedScalingParams &p, void *stream) {
  if (p.num_scales == 0) return;  // nothing to update (and a grid of 0 blocks is invalid)
  const size_t blocks = (p.num_scales + kThreads - 1) / kThreads;
  // gridDim.x allows 2^31 - 1 blocks: 5e11 scales, far beyond any recipe.
  NVTE_CHECK(blocks <= 0x7FFFFFFFu, "argument 'scale': expected at most ",
             size_t{0x7FFFFFFFu} * kThreads, " scales, got ", p.num_scales);
  const unsigned grid = static_cast<unsigned>(blocks);
  delayed_scaling_update_kernel<<<grid, kThreads, 0, as_stream(stream)>>>(p);
  NVTE_CHECK_LAUNCH();
}

}  // namespace gpu
}  // namespace nvte
