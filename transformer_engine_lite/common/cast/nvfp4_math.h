// NVFP4 (TE's NVTE_NVFP4_1D_SCALING, the NVFP4BlockScaling recipe) scalar rules shared by the
// CPU kernel and any later GPU kernel: E2M1 rounding (nearest-even and stochastic), the two-level
// scale (a per-tensor fp32 "global" scale from the tensor's amax times one E4M3 scale per 16
// elements), the 16-point random Hadamard transform, and the stochastic-rounding random stream.
// Plain fp32 arithmetic in the order TE's reference quantizer evaluates it, so every device gives
// the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../platform/host_device.h"
#include "../recipe/scaling_math.h"
#include "../util/fp8.h"
#include "../util/philox.h"

namespace nvte {

constexpr size_t kNvfp4BlockLen = 16;         // elements per E4M3 scale (1x16; 16x16 for 2D)
constexpr float kNvfp4E2M1Max = 6.0f;         // largest E2M1 magnitude
constexpr float kNvfp4E4M3Max = 448.0f;       // largest E4M3 magnitude
constexpr float kNvfp4GlobalNum = 2688.0f;    // 448 * 6: global encode scale = 2688 / amax

// E2M1 magnitudes by 3-bit code; bit 3 of a code is the sign.
NVTE_HOST_DEVICE float e2m1_value(uint8_t code) {
  constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMag[code & 7u];
  return (code & 8u) ? -m : m;
}

// NaN-propagating max of magnitudes (torch.amax semantics, which TE's reference uses): a NaN
// element makes the amax NaN, and the scales derived from it NaN. |x| clears the sign bit, so a
// negative NaN gives a positive NaN amax (torch.abs).
NVTE_HOST_DEVICE float nvfp4_amax_acc(float acc, float x) {
  const float a = bits_float(float_bits(x) & 0x7FFFFFFFu);
  if (a != a || acc != acc) return a != a ? a : acc;
  return a > acc ? a : acc;
}

// Round-to-nearest-even E2M1 code of v, v already clamped to [-6, 6]. Zero, including -0.0, gives
// code 0; tiny negatives give negative zero (code 8); NaN gives code 0 (TE's reference).
NVTE_HOST_DEVICE uint8_t e2m1_rne(float v) {
  const bool neg = v < 0.0f;
  const float m = neg ? -v : v;
  uint8_t c;
  if (!(m > 0.25f)) c = 0;  // [0, 0.25] (tie to even 0) and NaN
  else if (m < 0.75f) c = 1;
  else if (m <= 1.25f) c = 2;
  else if (m < 1.75f) c = 3;
  else if (m <= 2.5f) c = 4;
  else if (m < 3.5f) c = 5;
  else if (m <= 5.0f) c = 6;
  else c = 7;
  return static_cast<uint8_t>(neg ? (c | 8u) : c);
}

// Stochastic E2M1 code of v in [-6, 6]: between the two neighbouring grid points lo <= |v| <= hi
// it rounds up with probability (|v| - lo) / (hi - lo), drawn from the 24-bit uniform `u24`
// (round up iff u24 < p * 2^24), so E[value] = v up to 2^-24 of a step. NaN gives code 0.
NVTE_HOST_DEVICE uint8_t e2m1_stochastic(float v, uint32_t u24) {
  const bool neg = v < 0.0f;
  const float m = neg ? -v : v;
  if (!(m > 0.0f)) return static_cast<uint8_t>(neg ? 8u : 0u);
  constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint8_t k = 0;
  while (k < 7 && kGrid[k + 1] <= m) ++k;
  uint8_t c = k;
  if (k < 7) {
    // The step is a power of two and m - lo is exact (m is within one binade step of lo).
    const float p = (m - kGrid[k]) / (kGrid[k + 1] - kGrid[k]);
    if (static_cast<float>(u24) < p * 16777216.0f) c = static_cast<uint8_t>(k + 1);
  }
  return static_cast<uint8_t>(neg ? (c | 8u) : c);
}

// Per-tensor scales from the global amax (TE's reference: S_enc = 448 * 6 / amax, capped at
// FLT_MAX; an Inf amax gives S_enc 0, which becomes 1; a NaN amax stays NaN).
// `e4m3_max` is the tensor's E4M3 bound (448; 256 with 4over6): S_enc = 6 * e4m3_max / amax.
struct Nvfp4Global {
  float enc;   // S_enc
  float dec;   // 1 / S_enc
  float mult;  // S_enc * (1/6): a block's E4M3 scale is e4m3(block_amax * mult)
  float amax;  // the amax the scales come from (4over6 errors are measured with it)
};
NVTE_HOST_DEVICE Nvfp4Global nvfp4_global(float amax, int e4m3_max = 448) {
  float s = (kNvfp4E2M1Max * static_cast<float>(e4m3_max)) / amax;
  if (s > bits_float(kFloatMaxBits)) s = bits_float(kFloatMaxBits);
  if (s == 0.0f) s = 1.0f;
  const float inv6 = 1.0f / kNvfp4E2M1Max;  // fp32 reciprocal, as the reference's torch.reciprocal
  return Nvfp4Global{s, 1.0f / s, s * inv6, amax};
}

// One block's E4M3 scale byte and the fp32 factor its elements are multiplied by before E2M1
// rounding: 1 / (e4m3 scale * S_dec), capped at FLT_MAX (a zero block scale gives FLT_MAX).
struct Nvfp4BlockScale {
  uint8_t e4m3;
  float enc;
};
NVTE_HOST_DEVICE Nvfp4BlockScale nvfp4_block_scale(float block_amax, const Nvfp4Global &g) {
  float d = block_amax * g.mult;
  if (d > bits_float(kFloatMaxBits)) d = bits_float(kFloatMaxBits);
  if (d > kNvfp4E4M3Max) d = kNvfp4E4M3Max;  // NaN passes through: E4M3 NaN (0x7F)
  const uint8_t b = fp8_encode<FormatE4M3>(d);
  float enc = 1.0f / (fp8_decode<FormatE4M3>(b) * g.dec);
  if (enc > bits_float(kFloatMaxBits)) enc = bits_float(kFloatMaxBits);
  return Nvfp4BlockScale{b, enc};
}

// 4over6 (TE's NVTENVFP44Over6Mode): a block is quantized with two candidate scales, map-to-6
// (block max -> 6, the plain rule's target) and map-to-4 (1.5x that scale: block max -> 4, where
// the E2M1 grid is denser relative to the max), and keeps the one of lower error. TE evaluates the
// candidate scale as (block_amax / 6) * S_enc (not block_amax * (S_enc / 6) as plain NVFP4), then
// x 1.5 for map-to-4, clamped to 448 and rounded to E4M3.
NVTE_HOST_DEVICE Nvfp4BlockScale nvfp4_4over6_scale(float block_amax, const Nvfp4Global &g,
                                                     bool map4) {
  float d = (block_amax / kNvfp4E2M1Max) * g.enc;
  if (map4) d = d * 1.5f;
  if (d > kNvfp4E4M3Max) d = kNvfp4E4M3Max;  // Inf clamps; NaN passes through: E4M3 NaN
  const uint8_t b = fp8_encode<FormatE4M3>(d);
  float enc = 1.0f / (fp8_decode<FormatE4M3>(b) * g.dec);
  if (enc > bits_float(kFloatMaxBits)) enc = bits_float(kFloatMaxBits);
  return Nvfp4BlockScale{b, enc};
}

// One element's 4over6 error term. Exact mode (TE's default) dequantizes in the input domain, one
// fp32 rounding per step: ((e2m1 * scale) * amax) / (6 * e4m3_max) - x. Fast math compares in the
// E4M3-scaled domain: e2m1 * scale (exact: TE forms it as an fp16 product; an E4M3 NaN scale
// becomes the fp16 pattern 0x7E00, which TE's reference decodes as +98304) - x * S_enc. MAE adds
// |diff|, MSE diff * diff; the caller sums the 16 terms of a block in element order.
NVTE_HOST_DEVICE float nvfp4_4over6_err_term(float x, uint8_t code, uint8_t e4m3,
                                             const Nvfp4Global &g, float denom, bool fast,
                                             bool mse) {
  float diff;
  if (!fast) {
    float v = e2m1_value(code) * fp8_decode<FormatE4M3>(e4m3);
    v = v * g.amax;
    v = v / denom;
    diff = v - x;
  } else {
    const float cand =
        (e4m3 & 0x7Fu) == 0x7Fu ? 98304.0f : e2m1_value(code) * fp8_decode<FormatE4M3>(e4m3);
    diff = cand - x * g.enc;
  }
  return mse ? diff * diff : (diff < 0.0f ? -diff : diff);
}

// x * enc clamped to [-6, 6] (NaN stays NaN and rounds to code 0).
NVTE_HOST_DEVICE float nvfp4_scaled(float x, float enc) {
  float v = x * enc;
  v = v > kNvfp4E2M1Max ? kNvfp4E2M1Max : v;
  v = v < -kNvfp4E2M1Max ? -kNvfp4E2M1Max : v;
  return v;
}

// Dequantization factor of a block (TE's dequantize kernel): e4m3 scale * amax * (1 / (6 *
// e4m3_max)), 1 / 2688 for plain NVFP4.
NVTE_HOST_DEVICE float nvfp4_dequant_factor(uint8_t e4m3, float amax, int e4m3_max = 448) {
  const float inv = 1.0f / (kNvfp4E2M1Max * static_cast<float>(e4m3_max));
  return fp8_decode<FormatE4M3>(e4m3) * amax * inv;
}

// 16-point random Hadamard transform of x[0..15] (TE's RHT for the wgrad operand): y = x * S * H
// / 4, S = diag(signs), sign i negative where bit i of `sign_mask` is set, H the Sylvester Hadamard
// matrix H[i][j] = (-1)^popcount(i & j). Every product is exact; the fp32 sum runs i = 0..15.
NVTE_HOST_DEVICE void nvfp4_rht16(const float *x, uint32_t sign_mask, float *y) {
  for (int j = 0; j < 16; ++j) {
    float acc = 0.0f;
    for (int i = 0; i < 16; ++i) {
      unsigned h = static_cast<unsigned>(i & j);  // parity of a 4-bit value: H's sign
      h ^= h >> 2;
      h ^= h >> 1;
      const bool neg = (((sign_mask >> i) & 1u) ^ (h & 1u)) != 0;
      acc += neg ? -x[i] * 0.25f : x[i] * 0.25f;
    }
    y[j] = acc;
  }
}

// The stochastic-rounding stream (README "NVFP4"): element `idx` (row-major index into the copy
// being written: 0 row-wise, 1 column-wise) uses lane idx % 4 of Philox4x32-10 with key (seed low,
// seed high) and counter (q low, q high ^ copy << 31, offset low, offset high), q = idx / 4; its
// top 24 bits are the uniform draw.
NVTE_HOST_DEVICE Philox4 nvfp4_sr_block(uint64_t seed, uint64_t offset, int copy, uint64_t q) {
  Philox4 ctr{{static_cast<uint32_t>(q),
               static_cast<uint32_t>(q >> 32) ^ (static_cast<uint32_t>(copy) << 31),
               static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

}  // namespace nvte
