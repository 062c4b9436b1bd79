// Test-side references shared by the cast-family tests (quantize, dequantize, transpose): MX block
// scales found by exact comparisons in double, the fp32 product the kernels encode, dtype rounding,
// input generators and an "output untouched on error" check. Public C API + test_common.h only.
#pragma once

#include <cfloat>
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "test_common.h"

namespace test {

using Shape = std::vector<size_t>;

inline const NVTEDType kFp8Types[] = {kNVTEFloat8E4M3, kNVTEFloat8E5M2, kNVTEFloat8E4M3FNUZ,
                                      kNVTEFloat8E5M2FNUZ};
inline const NVTEDType kHighPrecisionTypes[] = {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16};

inline size_t rows_of(const Shape &s) {
  size_t n = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) n *= s[i];
  return n;
}
inline size_t cols_of(const Shape &s) { return s.empty() ? 1 : s.back(); }
inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Which copies an FP8 output carries.
enum class Copies { kRowwise, kColumnwise, kBoth };
inline std::string copies_tag(Copies c) {
  return c == Copies::kRowwise ? "rowwise" : c == Copies::kColumnwise ? "colwise" : "both";
}
inline bool has_rowwise(Copies c) { return c != Copies::kColumnwise; }
inline bool has_colwise(Copies c) { return c != Copies::kRowwise; }

// x * scale as the kernels form it in fp32: the double product of two floats is exact, so one
// rounding to float is IEEE fp32 multiplication.
inline float fp32_mul(double x, float scale) {
  return static_cast<float>(x * static_cast<double>(scale));
}

// v rounded to a high-precision output dtype (via float, as a kernel computing in fp32 stores it).
inline double round_to(double v, NVTEDType t) {
  const float f = static_cast<float>(v);
  switch (t) {
    case kNVTEFloat16: return fp16_to_float(float_to_fp16(f));
    case kNVTEBFloat16: return bf16_to_float(float_to_bf16(f));
    default: return f;
  }
}

// max |x| with NaN propagation, as fp32.
inline float ref_amax(const std::vector<double> &x) {
  double m = 0.0;
  for (double v : x) {
    if (std::isnan(v)) return NAN;
    m = std::max(m, std::fabs(v));
  }
  return static_cast<float>(m);
}

// Biased E8M0 byte of 2^ceil(log2(amax / fp8_max)), clamped to [2^-127, 2^127]: the smallest k with
// amax <= fp8_max * 2^k, settled by exact double comparisons (fp8_max * 2^k is exact).
inline uint8_t ref_e8m0_scale(double amax, NVTEDType fp8) {
  if (std::isnan(amax)) return 0xFF;
  if (std::isinf(amax)) return 0xFE;
  if (amax == 0.0) return 0x00;
  const double m = fp8_spec(fp8).max;
  int e;
  std::frexp(amax / m, &e);
  int k = e;
  while (k > -200 && amax <= std::ldexp(m, k - 1)) --k;
  while (amax > std::ldexp(m, k)) ++k;
  k = std::max(-127, std::min(127, k));
  return static_cast<uint8_t>(k + 127);
}

// test::ref_fp8_encode (nearest finite code, ties to the even code, satfinite, NaN -> NaN code,
// -0 kept only in OCP) by binary search over the decoded non-negative codes instead of a linear
// scan: ~100x faster, and checked against ref_fp8_encode in test_quantize (RefEncoderAgrees).
class RefEncoder {
 public:
  explicit RefEncoder(NVTEDType fp8) : fp8_(fp8), spec_(fp8_spec(fp8)) {
    for (int c = 0; c < 128; ++c) {
      const double v = ref_fp8_decode(static_cast<uint8_t>(c), fp8);
      if (!std::isfinite(v)) break;  // codes increase with value up to the largest finite one
      values_.push_back(v);
    }
  }
  uint8_t operator()(double x) const {
    if (std::isnan(x)) return spec_.fnuz ? 0x80 : 0x7F;
    const double a = std::min(std::fabs(x), spec_.max);
    const size_t hi = std::lower_bound(values_.begin(), values_.end(), a) - values_.begin();
    size_t best = hi;
    if (hi > 0) {
      const double dlo = a - values_[hi - 1], dhi = values_[hi] - a;
      if (dlo < dhi || (dlo == dhi && (hi - 1) % 2 == 0)) best = hi - 1;
    }
    if (spec_.fnuz && best == 0) return 0;
    return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
  }

 private:
  NVTEDType fp8_;
  Fp8Spec spec_;
  std::vector<double> values_;
};

// FP8 code of x in a block with E8M0 scale byte s: encode(x / 2^(s - 127)), exact in double.
inline uint8_t ref_mx_encode(const RefEncoder &encode, double x, uint8_t s) {
  if (s == 0xFF) return encode(NAN);
  return encode(std::ldexp(x, 127 - static_cast<int>(s)));
}

// Fills with random signs and magnitudes m * 2^e, m in [1, 2), e uniform in [lo, hi] (plus
// `exp_offset(i)`), rounded to the tensor's dtype; returns the stored values.
template <typename Offset>
std::vector<double> fill_spread(TestTensor &t, std::mt19937 &rng, int lo, int hi,
                                Offset exp_offset) {
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> ex(lo, hi);
  std::bernoulli_distribution neg(0.5);
  for (size_t i = 0; i < t.numel(); ++i)
    t.put(i, (neg(rng) ? -1.0 : 1.0) * std::ldexp(mant(rng), ex(rng) + exp_offset(i)));
  return t.to_double();
}
inline std::vector<double> fill_spread(TestTensor &t, std::mt19937 &rng, int lo, int hi) {
  return fill_spread(t, rng, lo, hi, [](size_t) { return 0; });
}

// Seed from the running test's name, so every case draws different data yet reruns reproduce it.
inline std::mt19937 test_rng() {
  const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  return std::mt19937(static_cast<uint32_t>(std::hash<std::string>{}(name)));
}

// Copy of every buffer of a tensor, to check that a failed call changed no byte.
class Snapshot {
 public:
  explicit Snapshot(const TestTensor &t) : t_(&t) {
    for (int p = 0; p < kNVTENumTensorParams; ++p)
      saved_.push_back(t.buffer(static_cast<NVTETensorParam>(p)).bytes);
  }
  ::testing::AssertionResult unchanged() const {
    for (int p = 0; p < kNVTENumTensorParams; ++p)
      if (t_->buffer(static_cast<NVTETensorParam>(p)).bytes != saved_[p])
        return ::testing::AssertionFailure() << "buffer " << p << " was modified by a failed call";
    return ::testing::AssertionSuccess();
  }

 private:
  const TestTensor *t_;
  std::vector<std::vector<uint8_t>> saved_;
};

// Fills every buffer of a tensor with a sentinel byte.
inline void poison(TestTensor &t, uint8_t v = 0xAB) {
  for (int p = 0; p < kNVTENumTensorParams; ++p) {
    auto &b = t.buffer(static_cast<NVTETensorParam>(p)).bytes;
    std::fill(b.begin(), b.end(), v);
  }
}

}  // namespace test
