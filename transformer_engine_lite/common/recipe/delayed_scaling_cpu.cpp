// CPU kernel of the delayed-scaling update: amax from the history, roll by -1, new scales.
#include "delayed_scaling_cpu.h"

#include <cstring>
#include <vector>

#include "../platform/host_device.h"
#include "scaling_math.h"

namespace nvte {
namespace {

// Running max over one history row, vectorized across scales. history_max ignores NaN, so a NaN
// entry never wins (TE semantics) and an all-NaN column keeps its start value 0.
NVTE_CPU_KERNEL void max_row(const float *row, float *amax, size_t n) {
  for (size_t j = 0; j < n; ++j) amax[j] = history_max(amax[j], row[j]);
}

}  // namespace

void launch_delayed_scaling_update(const DelayedScalingParams &p) {
  const size_t h = p.history_length, n = p.num_scales;
  // No scales: nothing to read or write (and the memcpy calls below would take the null data() of
  // empty vectors, which memcpy forbids even for 0 bytes).
  if (n == 0) return;
  // 1. amax per scale, read entirely before anything is written (outputs may alias the inputs).
  std::vector<float> amax(n, 0.0f);
  if (p.most_recent) {
    std::memcpy(amax.data(), p.amax_history, n * sizeof(float));
  } else {
    for (size_t i = 0; i < h; ++i) NVTE_CPU_DISPATCH(
        max_row(p.amax_history + i * n, amax.data(), n));
  }
  // 2. Roll by -1: row i <- row i+1, the last row <- old row 0, then row 0 <- 0. Row 0 is saved
  //    first and rows move front to back (memmove), so an in-place update reads no row it wrote.
  std::vector<float> first(p.amax_history, p.amax_history + n);
  if (h > 1) {
    std::memmove(p.updated_amax_history, p.amax_history + n, (h - 1) * n * sizeof(float));
    std::memcpy(p.updated_amax_history + (h - 1) * n, first.data(), n * sizeof(float));
  }
  std::memset(p.updated_amax_history, 0, n * sizeof(float));
  // 3. The scale rule of recipe/scaling_math.h (shared with the GPU kernel).
  for (size_t j = 0; j < n; ++j) {
    p.updated_scale[j] = delayed_scaling_scale(amax[j], p.scale[j], p.fp8_max, p.margin_factor);
  }
}

}  // namespace nvte
