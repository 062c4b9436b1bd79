// Scalar scale rules shared bit for bit by the CPU and GPU kernels (ARCHITECTURE.md §5): the
// current-scaling scale (nvte_compute_scale_from_amax) and the delayed-scaling update
// (nvte_delayed_scaling_recipe_amax_and_scale_update). Plain fp32 arithmetic and bit tests only, so
// host and device round identically (IEEE division on both; no libm calls that differ per device).
#pragma once

#include <cstdint>

#include "../platform/host_device.h"
#include "../util/half.h"

namespace nvte {

constexpr uint32_t kFloatMaxBits = 0x7F7FFFFFu;  // FLT_MAX

NVTE_HOST_DEVICE bool is_inf_f32(float x) { return (float_bits(x) & 0x7FFFFFFFu) == 0x7F800000u; }
NVTE_HOST_DEVICE bool is_finite_f32(float x) { return (float_bits(x) & 0x7FFFFFFFu) < 0x7F800000u; }

// Current-scaling scale for one tensor (see cast.h): eps clamp, 0/Inf/NaN -> 1, Inf scale ->
// FLT_MAX, optional power-of-two rounding down.
NVTE_HOST_DEVICE float compute_scale_from_amax(float amax, float fp8_max, float eps,
                                               bool force_pow_2_scales) {
  // A negative amax (never produced by the library) is below any eps >= 0 and so acts as eps.
  amax = amax < eps ? eps : amax;                    // NaN stays NaN
  if (!(amax > 0.0f) || is_inf_f32(amax)) return 1.0f;  // 0, NaN, Inf: no information
  float scale = fp8_max / amax;                      // IEEE division: correctly rounded
  if (is_inf_f32(scale)) scale = bits_float(kFloatMaxBits);  // tiny amax
  // fp8_max / amax >= 240 / FLT_MAX is a normal float, so clearing the mantissa gives the largest
  // power of two <= scale, never 0.
  if (force_pow_2_scales) scale = bits_float(float_bits(scale) & 0xFF800000u);
  return scale;
}

// One step of the delayed-scaling "max" over the history: fmax semantics (a NaN entry never wins;
// TE ignores NaN in the history), written as a select so that +0 vs -0 ties resolve the same way on
// every device (fmax may return either) and CPU loops over it vectorize.
NVTE_HOST_DEVICE float history_max(float acc, float v) { return (v > acc || acc != acc) ? v : acc; }

// New scale from the history amax: (fp8_max / amax) / 2^margin if amax is finite and > 0, else the
// previous scale; each division is one correctly rounded fp32 division; an infinite result (tiny
// amax, or an infinite previous scale) becomes FLT_MAX. `margin_factor`: 2^margin rounded to fp32.
NVTE_HOST_DEVICE float delayed_scaling_scale(float amax, float prev_scale, float fp8_max,
                                             float margin_factor) {
  float s = (is_finite_f32(amax) && amax > 0.0f) ? (fp8_max / amax) / margin_factor : prev_scale;
  if (is_inf_f32(s)) s = bits_float(kFloatMaxBits);
  return s;
}

}  // namespace nvte
