// util/math.h's exp_f32 / tanh_f32: max ulp error over strided sweeps of float bit patterns against
// double-precision std::exp / std::tanh, their special cases, and the library's vectorized
// activation kernels against the same functors compiled here, bit for bit.
// The one test that includes a library-internal header (util/math.h, header-only).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/activation.h"
#include "util/math.h"

namespace {

using test::TestTensor;

// Bounds documented in util/math.h, measured exhaustively over all floats (exp 0.689, tanh 0.975,
// exp's subnormal results 0.78 on the 2^-149 grid); the sweeps here must stay within them.
constexpr double kExpMaxUlp = 0.70;
constexpr double kExpSubnormalMaxUlp = 1.0;
constexpr double kTanhMaxUlp = 1.0;

float bits_f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t f_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Spacing of floats at the float nearest `ref` (subnormals: 2^-149), so |y - ref| / ulp_at(ref)
// is the error in ulps of the correctly rounded result.
double ulp_at(double ref) {
  int e = 0;
  std::frexp(std::fabs(ref), &e);  // |ref| = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0, std::max(e - 1, -126) - 23);
}

struct Sweep {
  double max_ulp = 0, max_ulp_subnormal = 0;
  float worst_x = 0;
  size_t count = 0, bad_class = 0;  // bad_class: not Inf / 0 where the reference is
  std::string first_bad;
};

// Visits every `stride`-th bit pattern of [lo, hi] (an odd stride walks through all low mantissa
// bits) for both signs, comparing f with the double reference rounded to float.
template <typename F, typename R>
Sweep sweep(uint32_t lo, uint32_t hi, uint32_t stride, F f, R ref_fn) {
  Sweep s;
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint64_t b = lo; b <= hi; b += stride) {
      const float x = bits_f(sign | static_cast<uint32_t>(b));
      const float y = f(x);
      const double ref = ref_fn(static_cast<double>(x));
      const float ref_f = static_cast<float>(ref);
      ++s.count;
      if (std::isinf(ref_f) || ref == 0.0) {  // overflow (exp) and x = 0 (tanh): exact
        if (y != ref_f && ++s.bad_class == 1) {
          std::ostringstream os;
          os << "f(" << std::hexfloat << x << ") = " << y << ", expected " << ref_f;
          s.first_bad = os.str();
        }
        continue;
      }
      const double err = std::fabs(static_cast<double>(y) - ref) / ulp_at(ref);
      if (std::fabs(ref_f) < std::numeric_limits<float>::min()) {
        s.max_ulp_subnormal = std::max(s.max_ulp_subnormal, err);
      } else if (err > s.max_ulp) {
        s.max_ulp = err;
        s.worst_x = x;
      }
    }
  }
  return s;
}

double ref_exp(double x) { return std::exp(x); }
double ref_tanh(double x) { return std::tanh(x); }

// ~23M values; all of [-104, 89] (exp(-104) rounds to 0, exp(89) to Inf) and a bit beyond.
TEST(MathAccuracy, ExpSweep) {
  const Sweep s = sweep(0, f_bits(105.0f), 97, nvte::exp_f32, ref_exp);
  EXPECT_EQ(s.bad_class, 0u) << s.first_bad;
  EXPECT_LE(s.max_ulp, kExpMaxUlp) << "worst x = " << std::hexfloat << s.worst_x;
  EXPECT_LE(s.max_ulp_subnormal, kExpSubnormalMaxUlp);
  std::printf("exp_f32: %zu values, max %.4f ulp (at %a), subnormal results max %.4f ulp\n",
              s.count, s.max_ulp, s.worst_x, s.max_ulp_subnormal);
}

// The softmax exp over its range: every 97th float of [-86.5, 0] (~12M values) within its bound
// (1.0056 ulp measured over every 7th float),
// exactly 0 below (-inf included), exact at 0, NaN through.
TEST(MathAccuracy, ExpSoftmaxSweep) {
  double max_ulp = 0;
  float worst = 0;
  size_t n = 0;
  for (uint32_t b = 0x80000000u; b <= f_bits(-86.5f); b += 97) {
    const float x = bits_f(b);
    const double ref = std::exp(static_cast<double>(x));
    const double err = std::fabs(static_cast<double>(nvte::exp_softmax_f32(x)) - ref) / ulp_at(ref);
    ++n;
    if (err > max_ulp) {
      max_ulp = err;
      worst = x;
    }
  }
  EXPECT_LE(max_ulp, 1.01) << "worst x = " << std::hexfloat << worst;
  std::printf("exp_softmax_f32: %zu values, max %.4f ulp (at %a)\n", n, max_ulp, worst);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(nvte::exp_softmax_f32(0.0f), 1.0f);
  EXPECT_EQ(nvte::exp_softmax_f32(-0.0f), 1.0f);
  EXPECT_EQ(f_bits(nvte::exp_softmax_f32(-inf)), 0u);
  EXPECT_EQ(f_bits(nvte::exp_softmax_f32(-86.6f)), 0u);
  EXPECT_EQ(f_bits(nvte::exp_softmax_f32(-1e30f)), 0u);
  EXPECT_GT(nvte::exp_softmax_f32(-86.5f), 0.0f);
  EXPECT_TRUE(std::isnan(nvte::exp_softmax_f32(std::numeric_limits<float>::quiet_NaN())));
}

// ~22M values over |x| <= 10 (tanh is +-1 beyond 9.01); the split at |x| = 1 swept densely too.
TEST(MathAccuracy, TanhSweep) {
  const Sweep wide = sweep(0, f_bits(10.0f), 97, nvte::tanh_f32, ref_tanh);
  const Sweep split = sweep(f_bits(0.9f), f_bits(1.1f), 3, nvte::tanh_f32, ref_tanh);
  for (const Sweep *s : {&wide, &split}) {
    EXPECT_EQ(s->bad_class, 0u) << s->first_bad;
    EXPECT_LE(s->max_ulp, kTanhMaxUlp) << "worst x = " << std::hexfloat << s->worst_x;
    std::printf("tanh_f32: %zu values, max %.4f ulp (at %a)\n", s->count, s->max_ulp, s->worst_x);
  }
}

TEST(MathAccuracy, ExpSpecialCases) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(nvte::exp_f32(nan)));
  EXPECT_TRUE(std::isnan(nvte::exp_f32(-nan)));
  EXPECT_EQ(nvte::exp_f32(inf), inf);
  EXPECT_EQ(f_bits(nvte::exp_f32(-inf)), 0u);  // +0
  EXPECT_EQ(nvte::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(nvte::exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(nvte::exp_f32(1e-30f), 1.0f);
  EXPECT_EQ(nvte::exp_f32(1.0f), 0x1.5bf0a8p+1f);  // e, correctly rounded
  // Overflow boundary: the largest x with a finite result, and the next float.
  EXPECT_EQ(nvte::exp_f32(0x1.62e42ep+6f), static_cast<float>(std::exp(0x1.62e42ep+6)));
  EXPECT_EQ(nvte::exp_f32(0x1.62e430p+6f), inf);
  EXPECT_EQ(nvte::exp_f32(1e30f), inf);
  EXPECT_EQ(nvte::exp_f32(std::numeric_limits<float>::max()), inf);
  // Underflow: through the subnormals (one rounding) down to +0.
  EXPECT_EQ(nvte::exp_f32(-87.0f), static_cast<float>(std::exp(-87.0)));  // normal
  EXPECT_EQ(nvte::exp_f32(-100.0f), static_cast<float>(std::exp(-100.0)));  // subnormal
  EXPECT_EQ(nvte::exp_f32(-103.9f), bits_f(1u));  // 2^-149, the smallest subnormal
  EXPECT_EQ(f_bits(nvte::exp_f32(-104.0f)), 0u);
  EXPECT_EQ(f_bits(nvte::exp_f32(-1e30f)), 0u);
  EXPECT_EQ(f_bits(nvte::exp_f32(-std::numeric_limits<float>::max())), 0u);
}

TEST(MathAccuracy, TanhSpecialCases) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(nvte::tanh_f32(nan)));
  EXPECT_TRUE(std::isnan(nvte::tanh_f32(-nan)));
  EXPECT_EQ(nvte::tanh_f32(inf), 1.0f);
  EXPECT_EQ(nvte::tanh_f32(-inf), -1.0f);
  EXPECT_EQ(f_bits(nvte::tanh_f32(0.0f)), 0u);
  EXPECT_EQ(f_bits(nvte::tanh_f32(-0.0f)), 0x80000000u);  // -0 keeps its sign
  // Tiny x: tanh(x) = x exactly, subnormals included.
  for (float x : {1e-20f, -3e-10f, bits_f(1u), bits_f(0x807FFFFFu), 1e-38f})
    EXPECT_EQ(f_bits(nvte::tanh_f32(x)), f_bits(x)) << std::hexfloat << x;
  // Saturation: exactly +-1 from 9.01 on, huge values included.
  for (float x : {9.1f, 10.0f, 20.0f, 44.0f, 45.0f, 100.0f, 1e30f, 3.4e38f}) {
    EXPECT_EQ(nvte::tanh_f32(x), 1.0f) << x;
    EXPECT_EQ(nvte::tanh_f32(-x), -1.0f) << x;
  }
  // Odd: tanh(-x) = -tanh(x) bit for bit.
  for (float x = 1e-3f; x < 12.0f; x *= 1.01f)
    EXPECT_EQ(f_bits(nvte::tanh_f32(-x)), f_bits(nvte::tanh_f32(x)) ^ 0x80000000u) << x;
}

TEST(MathAccuracy, SigmoidLimits) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(nvte::sigmoidf(inf), 1.0f);
  EXPECT_EQ(nvte::sigmoidf(-inf), 0.0f);
  EXPECT_EQ(nvte::sigmoidf(0.0f), 0.5f);
  EXPECT_EQ(nvte::sigmoidf(-200.0f), 0.0f);
  EXPECT_TRUE(std::isnan(nvte::sigmoidf(std::numeric_limits<float>::quiet_NaN())));
}

// The library's kernels run a vectorized clone (AVX-512 / AVX2 where the CPU has them); this TU
// calls the same functors as scalar code through libm's fmaf. Every fma is correctly rounded and
// nothing else is fused, so the results must agree bit for bit.
std::vector<float> probe_inputs() {
  std::vector<float> x;
  for (uint32_t b = 0; b <= f_bits(40.0f); b += 4099) {  // ~265K magnitudes, both signs
    x.push_back(bits_f(b));
    x.push_back(bits_f(b | 0x80000000u));
  }
  for (float v : {0.0f, -0.0f, 1e30f, -1e30f, 3.4e38f, -3.4e38f}) x.push_back(v);
  return x;
}

template <typename Scalar>
void expect_bitwise(const char *name, const TestTensor &out, const std::vector<float> &x,
                    Scalar scalar) {
  const float *y = reinterpret_cast<const float *>(out.buffer().bytes.data());
  size_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = scalar(i);
    const bool same = f_bits(y[i]) == f_bits(want) || (std::isnan(y[i]) && std::isnan(want));
    if (!same && ++bad <= 5)
      ADD_FAILURE() << name << "(" << std::hexfloat << x[i] << "): kernel " << y[i] << ", scalar "
                    << want;
  }
  EXPECT_EQ(bad, 0u) << name << ": " << bad << " of " << x.size() << " differ";
}

TEST(MathAccuracy, KernelsMatchScalarFunctorsBitwise) {
  const std::vector<float> x = probe_inputs();
  const std::vector<size_t> shape{x.size()};
  TestTensor in(shape, kNVTEFloat32), grad(shape, kNVTEFloat32), out(shape, kNVTEFloat32);
  std::memcpy(in.bytes(), x.data(), x.size() * 4);
  std::vector<float> g(x.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.75f + 0.001f * static_cast<float>(i % 997);
  std::memcpy(grad.bytes(), g.data(), g.size() * 4);

  ASSERT_NVTE_OK(nvte_gelu(in, out, nullptr));
  expect_bitwise("gelu", out, x, [&](size_t i) { return nvte::Gelu::fwd(x[i]); });
  ASSERT_NVTE_OK(nvte_dgelu(grad, in, out, nullptr));
  expect_bitwise("dgelu", out, x, [&](size_t i) { return g[i] * nvte::Gelu::bwd(x[i]); });
  ASSERT_NVTE_OK(nvte_silu(in, out, nullptr));
  expect_bitwise("silu", out, x, [&](size_t i) { return nvte::Silu::fwd(x[i]); });
  ASSERT_NVTE_OK(nvte_dsilu(grad, in, out, nullptr));
  expect_bitwise("dsilu", out, x, [&](size_t i) { return g[i] * nvte::Silu::bwd(x[i]); });
  ASSERT_NVTE_OK(nvte_qgelu(in, out, nullptr));
  expect_bitwise("qgelu", out, x, [&](size_t i) { return nvte::QGelu::fwd(x[i]); });
}

}  // namespace
