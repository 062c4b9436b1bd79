// Activation functions and their derivatives in fp32, shared by CPU and GPU kernels, and the exp /
// tanh they are built on.
#pragma once

#include <cmath>
#include <cstdint>

#include "../platform/host_device.h"
#include "half.h"

// Every function here is forced inline on the host too: a loop vectorizes only if the whole body is
// inlined, and in a TU with many instantiations gcc stops inlining exp_f32 into tanh_f32 once
// --param inline-unit-growth is reached (the GELU loops then ran scalar). On the device
// NVTE_HOST_DEVICE already means __forceinline__.
#if defined(NVTE_DEVICE_CODE) || !defined(__GNUC__)
#define NVTE_MATH_FN NVTE_HOST_DEVICE
#else
#define NVTE_MATH_FN NVTE_HOST_DEVICE __attribute__((always_inline))
#endif

namespace nvte {

// ---------------------------------------------------------------- exp and tanh in fp32
// Our own exp/tanh instead of libm's expf/tanhf, for two reasons:
//  * speed: glibc vectorizes expf/tanhf only under -ffast-math, so a loop calling them runs scalar
//    (bf16 4096x4096 GELU: ~200 ms); these are branch-free (selects only) and vectorize.
//  * bit-identical results on every device and CPU clone: plain float arithmetic, every fused
//    multiply-add written as fmaf (correctly rounded everywhere) and the library built with
//    -ffp-contract=off, so no compiler fuses a*b+c differently per target (GPU builds need nvcc
//    --fmad=false for the same reason).
// Accuracy, measured exhaustively over every float against double-precision std::exp/std::tanh, in
// ulps of the correctly rounded float result (tests/cpp/test_math_accuracy.cpp re-checks strided
// sweeps of ~23M values each against these bounds):
//   exp_f32:  max 0.689 ulp over normal results (x in [-87.34, 88.72]); subnormal results max
//             0.78 ulp of the 2^-149 grid (a single rounding onto it).
//   tanh_f32: max 0.976 ulp.
// Special cases: NaN -> NaN; exp: x > 88.7228 (and +Inf) -> +Inf, x < -103.98 (and -Inf) -> +0;
// tanh: |x| > 9.01 -> +-1 exactly (+-Inf included), tanh(+-0) = +-0, tiny x -> x exactly.
// Cost: exp ~20 vector ops, tanh ~35 (both forms evaluated, then selected).

// exp(x) = 2^k * exp(r), x = k ln2 + r, |r| <= ln2 / 2.
NVTE_MATH_FN float exp_f32(float x) {
  constexpr float kLog2e = 0x1.715476p+0f;
  // Cody-Waite split ln2 = kLn2Hi + kLn2Lo (float(ln2) and the rest, |error| 9e-17). The fma makes
  // x - k * kLn2Hi exact: for k != 0, |x| > 0.34 so x and k * kLn2Hi are multiples of 2^-25, and
  // the difference, below 0.35, fits in 24 bits.
  constexpr float kLn2Hi = 0x1.62e430p-1f;
  constexpr float kLn2Lo = -0x1.05c610p-29f;
  // Adding 1.5 * 2^23 rounds a float of magnitude < 2^22 to an integer (nearest even) and leaves
  // that integer in the low mantissa bits.
  constexpr float kShifter = 0x1.8p+23f;
  // Clamp so that k stays in [-150, 129]: beyond it exp overflows to +Inf (89 > 88.7228) or
  // underflows to 0 (-104 < -103.98) all the same. NaN fails both compares and passes through.
  x = x > 89.0f ? 89.0f : x;
  x = x < -104.0f ? -104.0f : x;
  const float t = fmaf(x, kLog2e, kShifter);
  const float kf = t - kShifter;  // k = round(x / ln2), exact
  const float r_hi = fmaf(-kf, kLn2Hi, x);  // exact
  const float r_lo = -kf * kLn2Lo;
  const float r = r_hi + r_lo;
  // exp(r) on [-0.347, 0.347] = 1 + r + r^2 (c2 + c3 r + ... + c6 r^4), coefficients from a
  // relative-error minimax fit (approximation error 3.1e-9 = 0.03 ulp).
  float q = 0x1.6a2424p-10f;
  q = fmaf(q, r, 0x1.1239e4p-7f);
  q = fmaf(q, r, 0x1.5558f2p-5f);
  q = fmaf(q, r, 0x1.555492p-3f);
  q = fmaf(q, r, 0x1.fffffcp-2f);
  // Summed as (1 + r_hi) + (err + r_lo + r^2 q), with err the exact rounding error of 1 + r_hi
  // (Fast2Sum: |1| >= |r_hi|): only the last addition rounds at the result's scale. Adding in
  // the plain order instead costs ~0.4 ulp (0.87 ulp max).
  const float h = 1.0f + r_hi;
  const float err = (1.0f - h) + r_hi;
  const float p = h + (err + fmaf(r * r, q, r_lo));
  // 2^k = 2^k1 * 2^k2 with k1 = floor(k / 2): both halves are normal floats for k in [-150, 129],
  // p * 2^k1 is exact, and the second product rounds once (to the subnormal grid, or to +Inf).
  // Unsigned arithmetic on k + 256 (in [106, 385]) keeps NaN's garbage k well defined.
  const uint32_t kb = float_bits(t) - float_bits(kShifter) + 256u;
  const uint32_t k1b = kb >> 1;  // k1 + 128
  const float s1 = bits_float((k1b - 1u) << 23);       // 2^k1: exponent field k1 + 127
  const float s2 = bits_float((kb - k1b - 1u) << 23);  // 2^k2, k2 = k - k1
  return p * s1 * s2;
}

// exp(x) for softmax arguments (a logit minus the running max or the LSE, so x <= 0; -inf for a
// masked logit), at about half exp_f32's cost (17 vector ops): the same reduction and polynomial,
// without exp_f32's subnormal two-step scaling and Fast2Sum. Results below exp(-86.5) = 2.6e-38
// (-inf included) are +0: a probability 2^-125 below the row's largest changes no sum or bf16/fp16
// P. Valid up to x = 88 (k <= 127); NaN -> NaN. Accuracy (tests/cpp/test_math_accuracy.cpp, sweep
// of [-86.5, 0]): max 1.006 ulp.
NVTE_MATH_FN float exp_softmax_f32(float x) {
  constexpr float kLog2e = 0x1.715476p+0f;
  constexpr float kLn2Hi = 0x1.62e430p-1f;
  constexpr float kLn2Lo = -0x1.05c610p-29f;
  constexpr float kShifter = 0x1.8p+23f;
  constexpr float kMin = -86.5f;  // k >= -125: 2^k's exponent field stays >= 1 for p in [0.7, 1.5)
  const bool under = x < kMin;   // -inf included; NaN is not
  const float xc = under ? 0.0f : x;
  const float t = fmaf(xc, kLog2e, kShifter);
  const float kf = t - kShifter;  // k = round(x / ln2), exact
  const float r = fmaf(-kf, kLn2Lo, fmaf(-kf, kLn2Hi, xc));
  // exp_f32's minimax polynomial: exp(r) = 1 + (r + r^2 q(r)), two roundings below one ulp.
  float q = 0x1.6a2424p-10f;
  q = fmaf(q, r, 0x1.1239e4p-7f);
  q = fmaf(q, r, 0x1.5558f2p-5f);
  q = fmaf(q, r, 0x1.555492p-3f);
  q = fmaf(q, r, 0x1.fffffcp-2f);
  const float p = 1.0f + fmaf(r * r, q, r);
  // p * 2^k by adding k to the exponent field (k in [-125, 127], p in [0.7, 1.42]: no overflow of
  // the field into the sign, no subnormal).
  const uint32_t k = float_bits(t) - float_bits(kShifter);
  const float y = bits_float(float_bits(p) + (k << 23));
  return under ? 0.0f : y;
}

// tanh(|x|) = |x| + |x|^3 P(x^2) below 1, 1 - 2 / (exp(2|x|) + 1) above; sign restored last.
// The split point balances the two forms' rounding errors (max 0.976 ulp below 1, 0.958 above;
// splitting at 0.625 instead, the large form reaches 1.34 ulp as 1 - tanh grows to 0.45).
NVTE_MATH_FN float tanh_f32(float x) {
  const uint32_t sign = float_bits(x) & 0x80000000u;
  const float ax = bits_float(float_bits(x) & 0x7FFFFFFFu);
  constexpr float kSmall = 1.0f;
  // P on x^2 in [0, 1]: relative-error minimax fit, approximation error 4.6e-9 = 0.04 ulp.
  const float u = ax * ax;
  float p = -0x1.77db20p-12f;
  p = fmaf(p, u, 0x1.2da410p-9f);
  p = fmaf(p, u, -0x1.046074p-7f);
  p = fmaf(p, u, 0x1.600976p-6f);
  p = fmaf(p, u, -0x1.b9621ep-5f);
  p = fmaf(p, u, 0x1.110be2p-3f);
  p = fmaf(p, u, -0x1.55553cp-2f);
  const float small = fmaf(ax * u, p, ax);  // tiny x: the x^3 term is below half an ulp of x
  // exp(2|x|) = +Inf for |x| > 44.4 (and +Inf): 2 / Inf = 0 gives exactly 1.
  const float large = 1.0f - 2.0f / (exp_f32(2.0f * ax) + 1.0f);
  // Select with bit masks, not ?:. Under the default -ftrapping-math gcc turns `c ? small : large`
  // back into a branch around the division (it may not speculate an op that can trap) and the loop
  // stops vectorizing for AVX2 (AVX-512 could mask it). NaN: the compare is false, large is NaN.
  const uint32_t use_small = 0u - static_cast<uint32_t>(ax < kSmall);
  const uint32_t mag = (float_bits(small) & use_small) | (float_bits(large) & ~use_small);
  return bits_float(mag | sign);
}

NVTE_MATH_FN float sigmoidf(float x) { return 1.0f / (1.0f + exp_f32(-x)); }

// ---------------------------------------------------------------- activation functors
struct Gelu {  // tanh approximation, as TE
  static NVTE_MATH_FN float fwd(float x) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    return 0.5f * x * (1.0f + tanh_f32(k0 * (x + k1 * x * x * x)));
  }
  static NVTE_MATH_FN float bwd(float x) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    const float t = tanh_f32(k0 * (x + k1 * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * x * x);
  }
};

struct QGelu {  // x * sigmoid(1.702 x)
  static NVTE_MATH_FN float fwd(float x) { return x * sigmoidf(1.702f * x); }
  static NVTE_MATH_FN float bwd(float x) {
    const float s = sigmoidf(1.702f * x);
    return s + 1.702f * x * s * (1.0f - s);
  }
};

struct Relu {
  static NVTE_MATH_FN float fwd(float x) { return x > 0.0f ? x : 0.0f; }
  static NVTE_MATH_FN float bwd(float x) { return x > 0.0f ? 1.0f : 0.0f; }
};

struct SRelu {  // squared ReLU
  static NVTE_MATH_FN float fwd(float x) { return x > 0.0f ? x * x : 0.0f; }
  static NVTE_MATH_FN float bwd(float x) { return x > 0.0f ? 2.0f * x : 0.0f; }
};

struct Sigmoid {  // the gate of GLU
  static NVTE_MATH_FN float fwd(float x) { return sigmoidf(x); }
  static NVTE_MATH_FN float bwd(float x) {
    const float s = sigmoidf(x);
    return s * (1.0f - s);
  }
};

// TE's clamped SwiGLU (GPT-OSS) on one pair (a, b) of a gated row [a | b]:
//   a' = min(a, limit), b' = clamp(b, -limit, limit), y = a' * sigmoid(alpha * a') * (b' + off),
// off = glu_linear_offset (1 in GPT-OSS and TE's nvte_clamped_swiglu; nvte_clamped_swiglu_v2 takes it).
// Gradients: da = g * (b' + off) * d/da'[a' sigmoid(alpha a')] where a <= limit (else 0);
// db = g * a' sigmoid(alpha a') where -limit <= b <= limit (else 0). Both ends inclusive, as TE.
struct ClampedSwiGLU {
  static NVTE_MATH_FN float gate(float a, float limit, float alpha) {
    const float ac = a < limit ? a : limit;
    return ac * sigmoidf(alpha * ac);
  }
  static NVTE_MATH_FN float linear(float b, float limit, float offset) {
    return (b < -limit ? -limit : (b > limit ? limit : b)) + offset;
  }
  static NVTE_MATH_FN float fwd(float a, float b, float limit, float alpha, float offset) {
    return gate(a, limit, alpha) * linear(b, limit, offset);
  }
  static NVTE_MATH_FN float dgate(float a, float limit, float alpha) {
    if (!(a <= limit)) return 0.0f;
    const float s = sigmoidf(alpha * a);
    return s + alpha * a * s * (1.0f - s);
  }
  static NVTE_MATH_FN float dlinear(float b, float limit) {
    return (b >= -limit && b <= limit) ? 1.0f : 0.0f;
  }
};

struct Silu {  // x * sigmoid(x)
  static NVTE_MATH_FN float fwd(float x) { return x * sigmoidf(x); }
  static NVTE_MATH_FN float bwd(float x) {
    const float s = sigmoidf(x);
    return s + x * s * (1.0f - s);
  }
};

}  // namespace nvte
