// FP8 and E8M0 scalar math shared bit for bit by the CPU and GPU kernels (ARCHITECTURE.md §5).
// Encode: round to nearest even, satfinite (NaN -> NaN, anything else beyond range -> +-max finite),
// subnormals kept, -0 kept in OCP formats and turned into +0 in FNUZ formats. Written without
// data-dependent branches (selects only) so CPU loops over it vectorize.
#pragma once

#include <cstdint>

#include "half.h"

namespace nvte {

// Compile-time description of an FP8 format.
template <int kExpBits, int kManBits, int kBias, bool kFnuz>
struct Fp8Format {
  static constexpr int exp_bits = kExpBits;
  static constexpr int man_bits = kManBits;
  static constexpr int bias = kBias;
  static constexpr bool fnuz = kFnuz;
  // Largest finite code's magnitude bits: OCP E4M3 reserves 0x7F for NaN; OCP E5M2 reserves the top
  // exponent for Inf/NaN; FNUZ formats use every code but 0x80.
  static constexpr uint32_t max_code =
      kFnuz ? 0x7Fu : (kExpBits == 4 ? 0x7Eu : 0x7Bu);
  static constexpr uint8_t nan_code = kFnuz ? 0x80u : 0x7Fu;
};

using FormatE4M3 = Fp8Format<4, 3, 7, false>;
using FormatE5M2 = Fp8Format<5, 2, 15, false>;
using FormatE4M3Fnuz = Fp8Format<4, 3, 8, true>;
using FormatE5M2Fnuz = Fp8Format<5, 2, 16, true>;

// Storage types: one byte each, distinct so dtype dispatch can tell them apart.
struct fp8e4m3 { uint8_t x; };
struct fp8e5m2 { uint8_t x; };
struct fp8e4m3fnuz { uint8_t x; };
struct fp8e5m2fnuz { uint8_t x; };

template <typename T> struct Fp8Traits;
template <> struct Fp8Traits<fp8e4m3> { using format = FormatE4M3; };
template <> struct Fp8Traits<fp8e5m2> { using format = FormatE5M2; };
template <> struct Fp8Traits<fp8e4m3fnuz> { using format = FormatE4M3Fnuz; };
template <> struct Fp8Traits<fp8e5m2fnuz> { using format = FormatE5M2Fnuz; };

// Value of the largest finite code, as float.
template <typename F>
NVTE_HOST_DEVICE float fp8_max_value() {
  // exponent field e, mantissa m of max_code
  constexpr int e = static_cast<int>(F::max_code >> F::man_bits);
  constexpr int m = static_cast<int>(F::max_code & ((1u << F::man_bits) - 1));
  constexpr float frac = 1.0f + static_cast<float>(m) / static_cast<float>(1 << F::man_bits);
  float p = 1.0f;
  for (int i = 0; i < e - F::bias; ++i) p *= 2.0f;
  return frac * p;
}

template <typename F>
NVTE_HOST_DEVICE uint8_t fp8_encode(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  uint32_t a = u & 0x7FFFFFFFu;
  const bool is_nan = a > 0x7F800000u;
  // Saturate first: max is representable, so clamping then rounding equals satfinite rounding.
  const uint32_t max_bits = float_bits(fp8_max_value<F>());
  a = a > max_bits ? max_bits : a;
  // Smallest normal of the format: 2^(1 - bias).
  constexpr uint32_t min_normal_bits = static_cast<uint32_t>(127 + 1 - F::bias) << 23;
  constexpr int shift = 23 - F::man_bits;
  // Normal: round the fp32 mantissa to man_bits (nearest even); a carry moves into the exponent.
  const uint32_t rounded = (a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u)) >> shift;
  const uint32_t normal = rounded - (static_cast<uint32_t>(127 - F::bias) << F::man_bits);
  // Subnormal: value / 2^(1 - bias - man_bits) rounded to an integer by the fp32 adder (nearest
  // even); the scaling is by a power of two, so exact.
  constexpr float sub_scale = static_cast<float>(1u << (F::bias - 1 + F::man_bits));
  const float t = bits_float(a) * sub_scale;
  const uint32_t sub = float_bits(t + 8388608.0f) - 0x4B000000u;
  uint32_t mag = a < min_normal_bits ? sub : normal;
  uint32_t code = sign | mag;
  if (F::fnuz) code = mag == 0 ? 0u : code;  // no negative zero in FNUZ
  // NaN keeps no sign: 0x7F in OCP formats (as NVIDIA's satfinite cast), 0x80 in FNUZ.
  return static_cast<uint8_t>(is_nan ? F::nan_code : code);
}

template <typename F>
NVTE_HOST_DEVICE float fp8_decode(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t mag = v & 0x7Fu;
  const uint32_t e = mag >> F::man_bits;
  const uint32_t m = mag & ((1u << F::man_bits) - 1u);
  constexpr float sub_unit = 1.0f / static_cast<float>(1u << (F::bias - 1 + F::man_bits));
  // Normal: rebias the exponent into fp32; subnormal: m * 2^(1 - bias - man_bits).
  const float normal = bits_float(((e + 127u - F::bias) << 23) | (m << (23 - F::man_bits)));
  const float subnormal = static_cast<float>(m) * sub_unit;
  float r = bits_float(sign | float_bits(e == 0 ? subnormal : normal));
  bool nan;
  bool inf = false;
  if (F::fnuz) {
    nan = v == 0x80u;
  } else if (F::exp_bits == 4) {
    nan = mag == 0x7Fu;
  } else {
    nan = e == 0x1Fu && m != 0;
    inf = e == 0x1Fu && m == 0;
  }
  if (inf) r = bits_float(sign | 0x7F800000u);
  if (nan) r = bits_float(0x7FC00000u);
  return r;
}

// Storage-type front ends used by dtype dispatch.
template <typename T>
NVTE_HOST_DEVICE T fp8_from_float(float x) {
  return T{fp8_encode<typename Fp8Traits<T>::format>(x)};
}
template <typename T>
NVTE_HOST_DEVICE float fp8_to_float(T v) {
  return fp8_decode<typename Fp8Traits<T>::format>(v.x);
}
template <> NVTE_HOST_DEVICE float to_float<fp8e4m3>(fp8e4m3 v) { return fp8_to_float(v); }
template <> NVTE_HOST_DEVICE float to_float<fp8e5m2>(fp8e5m2 v) { return fp8_to_float(v); }
template <> NVTE_HOST_DEVICE float to_float<fp8e4m3fnuz>(fp8e4m3fnuz v) { return fp8_to_float(v); }
template <> NVTE_HOST_DEVICE float to_float<fp8e5m2fnuz>(fp8e5m2fnuz v) { return fp8_to_float(v); }
template <> NVTE_HOST_DEVICE fp8e4m3 from_float<fp8e4m3>(float f) { return fp8_from_float<fp8e4m3>(f); }
template <> NVTE_HOST_DEVICE fp8e5m2 from_float<fp8e5m2>(float f) { return fp8_from_float<fp8e5m2>(f); }
template <> NVTE_HOST_DEVICE fp8e4m3fnuz from_float<fp8e4m3fnuz>(float f) {
  return fp8_from_float<fp8e4m3fnuz>(f);
}
template <> NVTE_HOST_DEVICE fp8e5m2fnuz from_float<fp8e5m2fnuz>(float f) {
  return fp8_from_float<fp8e5m2fnuz>(f);
}

// ---- E8M0 (MX block scales) ----
struct e8m0 { uint8_t x; };

// Biased exponent of 2^ceil(log2(v)) for v >= 0 (TE's round-up rule): NaN -> 0xFF, Inf or beyond
// 2^127 -> 0xFE (saturate), 0 -> 0x00.
NVTE_HOST_DEVICE uint8_t e8m0_ceil_from_float(float v) {
  const uint32_t u = float_bits(v) & 0x7FFFFFFFu;
  if (u > 0x7F800000u) return 0xFFu;
  if (u >= 0x7F000000u) return 0xFEu;  // >= 2^127 (incl. Inf): the largest scale
  uint32_t e = u >> 23;
  const uint32_t m = u & 0x7FFFFFu;
  // Round up unless v is a power of two. A float subnormal v lies in (0, 2^-126): ceil(log2 v) is
  // -127 (byte 0) when v <= 2^-127, else -126 (byte 1).
  if (e == 0) return m > 0x400000u ? 1u : 0u;
  return static_cast<uint8_t>(m != 0 ? e + 1 : e);
}

// 2^(b - 127) as float; b = 0 gives 2^-127 (an fp32 subnormal, exact); 0xFF gives NaN.
NVTE_HOST_DEVICE float e8m0_to_float(uint8_t b) {
  if (b == 0xFFu) return bits_float(0x7FC00000u);
  if (b == 0) return bits_float(0x00400000u);
  return bits_float(static_cast<uint32_t>(b) << 23);
}

// 2^(127 - b): the exact multiplier that applies the inverse of the block scale when quantizing.
NVTE_HOST_DEVICE float e8m0_inverse_to_float(uint8_t b) {
  if (b == 0xFFu) return bits_float(0x7FC00000u);
  if (b == 0xFEu) return bits_float(0x00400000u);  // 2^-127
  return bits_float(static_cast<uint32_t>(254u - b) << 23);
}

}  // namespace nvte
