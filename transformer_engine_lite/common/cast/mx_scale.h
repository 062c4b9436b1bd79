// MXFP8 block scale rule shared bit for bit by the CPU emitter and the GPU quantize kernels.
#pragma once

#include <cstdint>

#include "../platform/host_device.h"
#include "../util/fp8.h"

namespace nvte {

// Biased E8M0 exponent of 2^ceil(log2(amax / fp8_max)) (TE's round-up rule) from the magnitude bits
// of amax, exactly and without dividing. With amax = a * 2^ea and fp8_max = f * 2^ef (a, f in
// [1, 2)), the quotient lies in (2^(ea-ef-1), 2^(ea-ef)] when a <= f and in
// (2^(ea-ef), 2^(ea-ef+1)) when a > f, so ceil(log2) = ea - ef + (a > f): one compare of mantissa
// fields. (An fp32 division would round quotients just above 2^-127, which are subnormal, onto
// 2^-127 and pick a scale one binade too small.) Zero and subnormal amaxes give quotients below
// 2^-127: byte 0. NaN -> 0xFF; Inf -> 0xFE (saturates, as the GPU's satfinite cvt to ue8m0).
// `amax_bits` is the integer max of (bits & 0x7FFFFFFF) over the block: every NaN pattern sorts
// above +Inf's, so a NaN anywhere in the block gives 0xFF.
template <typename OType>
NVTE_HOST_DEVICE uint8_t mx_scale_byte(uint32_t amax_bits) {
  using F = typename Fp8Traits<OType>::format;
  const uint32_t f = float_bits(fp8_max_value<F>());  // folded to a constant
  const int ef = static_cast<int>(f >> 23) - 127;
  const int k = static_cast<int>(amax_bits >> 23) - ef +
                ((amax_bits & 0x7FFFFFu) > (f & 0x7FFFFFu) ? 1 : 0);  // biased: (ea + 127) - ef
  const uint8_t finite = static_cast<uint8_t>(amax_bits < 0x00800000u ? 0 : (k < 0 ? 0 : k));
  return amax_bits > 0x7F800000u ? 0xFFu : (amax_bits == 0x7F800000u ? 0xFEu : finite);
}

}  // namespace nvte
