// fp16 and bf16 storage types with bit-exact round-to-nearest-even conversions, usable on host and
// device. Written branch-light so the CPU loops that use them vectorize.
#pragma once

#include <cstdint>
#include <cstring>

#include "../platform/host_device.h"

namespace nvte {

NVTE_HOST_DEVICE uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

NVTE_HOST_DEVICE float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

struct bf16 {
  uint16_t x;
};
struct fp16 {
  uint16_t x;
};

NVTE_HOST_DEVICE float bf16_to_float(bf16 v) { return bits_float(static_cast<uint32_t>(v.x) << 16); }

// Round to nearest even; NaN stays NaN (quieted).
NVTE_HOST_DEVICE bf16 float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  uint32_t is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return bf16{static_cast<uint16_t>(is_nan ? ((u >> 16) | 0x40u) : rounded)};
}

NVTE_HOST_DEVICE float fp16_to_float(fp16 v) {
  const uint32_t h = v.x;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;
  // Normal and subnormal: shift exponent+mantissa into place and rebias by multiplying by 2^112,
  // which also normalizes subnormals exactly. Inf/NaN: force the float exponent to all ones.
  float mag = bits_float(em << 13) * bits_float(0x77800000u);  // 2^112
  uint32_t out = float_bits(mag);
  if (em >= 0x7C00u) out = 0x7F800000u | (em & 0x3FFu) << 13;
  return bits_float(sign | out);
}

NVTE_HOST_DEVICE fp16 float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  uint32_t h;
  if (a > 0x7F800000u) {
    h = 0x7E00u | ((a >> 13) & 0x3FFu);  // NaN, quiet
  } else if (a >= 0x477FF000u) {
    h = 0x7C00u;  // rounds to >= 65520: Inf
  } else if (a < 0x38800000u) {
    // Result subnormal (or zero): scale so the integer part is the fp16 mantissa, round by the
    // float adder (nearest even), e.g. 2^-24 * 0.5 rounds to 0.
    float t = bits_float(a) * bits_float(0x4B800000u);  // * 2^24
    h = static_cast<uint32_t>(float_bits(t + 8388608.0f) - 0x4B000000u);
  } else {
    uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
    h = (r - 0x38000000u) >> 13;  // rebias 127 -> 15
  }
  return fp16{static_cast<uint16_t>(sign | h)};
}

// Generic load/store between storage types and fp32.
template <typename T>
NVTE_HOST_DEVICE float to_float(T v) {
  return static_cast<float>(v);
}
template <>
NVTE_HOST_DEVICE float to_float<bf16>(bf16 v) {
  return bf16_to_float(v);
}
template <>
NVTE_HOST_DEVICE float to_float<fp16>(fp16 v) {
  return fp16_to_float(v);
}

template <typename T>
NVTE_HOST_DEVICE T from_float(float f) {
  return static_cast<T>(f);
}
template <>
NVTE_HOST_DEVICE bf16 from_float<bf16>(float f) {
  return float_to_bf16(f);
}
template <>
NVTE_HOST_DEVICE fp16 from_float<fp16>(float f) {
  return float_to_fp16(f);
}

}  // namespace nvte
