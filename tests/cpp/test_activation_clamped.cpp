// Clamped SwiGLU (nvte_clamped_swiglu / nvte_clamped_dswiglu and their _v2 with glu_linear_offset,
// TE's GPT-OSS activation) vs a double
// reference written from activation.h's formula; FP8 output bytes vs the independent encoder; the
// rejected arguments. The input range straddles the limit so both clamps are exercised.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/activation.h"

namespace {

using test::TestTensor;

constexpr float kLimit = 2.5f, kAlpha = 1.702f;
constexpr double kLo = -4.0, kHi = 4.0;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double gate(double a) {
  const double c = std::min(a, double{kLimit});
  return c * sigmoid(double{kAlpha} * c);
}
double dgate(double a) {
  if (a > kLimit) return 0.0;
  const double s = sigmoid(double{kAlpha} * a);
  return s + double{kAlpha} * a * s * (1.0 - s);
}
double g_offset = 1.0;  // the linear half's glu_linear_offset of the reference (1: GPT-OSS)
double lin(double b) { return std::clamp(b, -double{kLimit}, double{kLimit}) + g_offset; }
double dlin(double b) { return (b >= -kLimit && b <= kLimit) ? 1.0 : 0.0; }

std::vector<double> ref_fwd(const std::vector<double> &x, size_t h) {
  const size_t rows = h ? x.size() / (2 * h) : 0;
  std::vector<double> y(rows * h);
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < h; ++j) y[r * h + j] = gate(x[r * 2 * h + j]) * lin(x[r * 2 * h + h + j]);
  return y;
}

std::vector<double> ref_bwd(const std::vector<double> &g, const std::vector<double> &x, size_t h) {
  std::vector<double> dx(x.size());
  const size_t rows = h ? g.size() / h : 0;
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < h; ++j) {
      const double a = x[r * 2 * h + j], b = x[r * 2 * h + h + j], gv = g[r * h + j];
      dx[r * 2 * h + j] = gv * lin(b) * dgate(a);
      dx[r * 2 * h + h + j] = gv * gate(a) * dlin(b);
    }
  return dx;
}

std::vector<size_t> doubled(std::vector<size_t> s) {
  s.back() *= 2;
  return s;
}

// The reference's derivative is checked against central differences away from the clamp points.
TEST(ClampedSwiGLUReference, DerivativeMatchesFiniteDifferences) {
  for (double a = -3.95; a < 4.0; a += 0.1) {
    if (std::fabs(a - kLimit) < 1e-3) continue;
    const double eps = 1e-6;
    EXPECT_NEAR(dgate(a), (gate(a + eps) - gate(a - eps)) / (2 * eps), 1e-6) << a;
  }
}

using Param = std::tuple<NVTEDType, std::vector<size_t>>;
class ClampedSwiGLUTest : public ::testing::TestWithParam<Param> {};

TEST_P(ClampedSwiGLUTest, ForwardAndBackwardMatchReference) {
  const auto &[dt, shape] = GetParam();
  std::mt19937 rng(7);
  TestTensor in(doubled(shape), dt), grad(shape, dt);
  const std::vector<double> x = in.fill_uniform(rng, kLo, kHi);
  const std::vector<double> g = grad.fill_uniform(rng, -2.0, 2.0);
  TestTensor out(shape, dt), dx(doubled(shape), dt);
  ASSERT_NVTE_OK(nvte_clamped_swiglu(in, out, kLimit, kAlpha, nullptr));
  EXPECT_TRUE(test::close(out.to_double(), ref_fwd(x, shape.back()), test::activation_tolerance(dt)));
  ASSERT_NVTE_OK(nvte_clamped_dswiglu(grad, in, dx, kLimit, kAlpha, nullptr));
  EXPECT_TRUE(
      test::close(dx.to_double(), ref_bwd(g, x, shape.back()), test::activation_tolerance(dt)));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ClampedSwiGLUTest,
    ::testing::Combine(::testing::Values(kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16),
                       ::testing::Values(std::vector<size_t>{1, 1}, std::vector<size_t>{7, 33},
                                         std::vector<size_t>{129, 257},
                                         std::vector<size_t>{2, 3, 17})),
    [](const ::testing::TestParamInfo<Param> &info) {
      return test::dtype_tag(std::get<0>(info.param)) + "_" +
             test::shape_tag(std::get<1>(info.param));
    });

// FP8 output: the bytes are the encoder applied to (fp32 result * scale); amax / scale_inv exact.
TEST(ClampedSwiGLUFp8, PerTensorBytesMatchEncodedFp32Result) {
  for (NVTEDType t : {kNVTEFloat8E4M3, kNVTEFloat8E5M2}) {
    const std::vector<size_t> shape = {41, 71};
    std::mt19937 rng(11);
    TestTensor in(doubled(shape), kNVTEBFloat16), f32(shape, kNVTEFloat32);
    in.fill_uniform(rng, kLo, kHi);
    ASSERT_NVTE_OK(nvte_clamped_swiglu(in, f32, kLimit, kAlpha, nullptr));
    std::vector<float> v(shape[0] * shape[1]);
    std::memcpy(v.data(), f32.bytes(), v.size() * sizeof(float));
    float amax = 0.0f;
    for (float e : v) amax = std::max(amax, std::fabs(e));
    const float scale = static_cast<float>(0.8 * test::fp8_spec(t).max / amax);
    TestTensor q(shape, t);
    q.set_scale(scale);
    q.set_amax(-1.0f);
    q.set_scale_inv(-1.0f);
    ASSERT_NVTE_OK(nvte_clamped_swiglu(in, q, kLimit, kAlpha, nullptr));
    std::vector<uint8_t> expect(v.size());
    for (size_t i = 0; i < v.size(); ++i) expect[i] = test::ref_fp8_encode(v[i] * scale, t);
    EXPECT_TRUE(test::same_bytes(q.bytes(), expect.data(), expect.size()));
    EXPECT_EQ(q.f32(kNVTEAmax)[0], amax);
    EXPECT_EQ(q.f32(kNVTERowwiseScaleInv)[0], 1.0f / scale);
  }
}

// _v2: the linear half's offset is an argument (TE's glu_linear_offset); offset 1 is the v1 op bit
// for bit.
TEST(ClampedSwiGLUV2, OffsetMatchesReferenceAndOneIsV1) {
  const std::vector<size_t> shape = {33, 65};
  for (NVTEDType dt : {kNVTEFloat32, kNVTEBFloat16}) {
    std::mt19937 rng(5);
    TestTensor in(doubled(shape), dt), grad(shape, dt);
    const std::vector<double> x = in.fill_uniform(rng, kLo, kHi);
    const std::vector<double> g = grad.fill_uniform(rng, -2.0, 2.0);
    for (float off : {0.0f, 0.5f, -1.25f}) {
      g_offset = off;
      TestTensor out(shape, dt), dx(doubled(shape), dt);
      ASSERT_NVTE_OK(nvte_clamped_swiglu_v2(in, out, kLimit, kAlpha, off, nullptr));
      EXPECT_TRUE(test::close(out.to_double(), ref_fwd(x, shape.back()),
                              test::activation_tolerance(dt)))
          << off;
      ASSERT_NVTE_OK(nvte_clamped_dswiglu_v2(grad, in, dx, kLimit, kAlpha, off, nullptr));
      EXPECT_TRUE(test::close(dx.to_double(), ref_bwd(g, x, shape.back()),
                              test::activation_tolerance(dt)))
          << off;
    }
    g_offset = 1.0;
    TestTensor v1(shape, dt), v2(shape, dt), d1(doubled(shape), dt), d2(doubled(shape), dt);
    ASSERT_NVTE_OK(nvte_clamped_swiglu(in, v1, kLimit, kAlpha, nullptr));
    ASSERT_NVTE_OK(nvte_clamped_swiglu_v2(in, v2, kLimit, kAlpha, 1.0f, nullptr));
    const size_t n = shape[0] * shape[1] * (dt == kNVTEFloat32 ? 4 : 2);
    EXPECT_TRUE(test::same_bytes(v1.bytes(), v2.bytes(), n));
    ASSERT_NVTE_OK(nvte_clamped_dswiglu(grad, in, d1, kLimit, kAlpha, nullptr));
    ASSERT_NVTE_OK(nvte_clamped_dswiglu_v2(grad, in, d2, kLimit, kAlpha, 1.0f, nullptr));
    EXPECT_TRUE(test::same_bytes(d1.bytes(), d2.bytes(), 2 * n));
  }
}

TEST(ClampedSwiGLUErrors, RejectedArguments) {
  constexpr NVTEStatus kInvalid = NVTE_ERROR_INVALID_ARGUMENT;
  TestTensor in({4, 8}, kNVTEFloat32), out({4, 4}, kNVTEFloat32), g({4, 4}, kNVTEFloat32);
  TestTensor odd({4, 7}, kNVTEFloat32), dx({4, 8}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_clamped_swiglu(in, out, 0.0f, kAlpha, nullptr), kInvalid, "'limit'", "> 0");
  EXPECT_NVTE_ERROR(nvte_clamped_swiglu(in, out, -1.0f, kAlpha, nullptr), kInvalid, "'limit'");
  EXPECT_NVTE_ERROR(nvte_clamped_swiglu(in, out, INFINITY, kAlpha, nullptr), kInvalid, "'limit'");
  EXPECT_NVTE_ERROR(nvte_clamped_swiglu(in, out, kLimit, NAN, nullptr), kInvalid, "'alpha'");
  EXPECT_NVTE_ERROR(nvte_clamped_swiglu(odd, out, kLimit, kAlpha, nullptr), kInvalid, "'input'",
                    "even");
  EXPECT_NVTE_ERROR(nvte_clamped_swiglu(nullptr, out, kLimit, kAlpha, nullptr), kInvalid,
                    "nvte_clamped_swiglu", "'input'");
  EXPECT_NVTE_ERROR(nvte_clamped_dswiglu(g, in, dx, kLimit, -INFINITY, nullptr), kInvalid,
                    "nvte_clamped_dswiglu", "'alpha'");
  EXPECT_NVTE_ERROR(nvte_clamped_dswiglu(in, in, dx, kLimit, kAlpha, nullptr), kInvalid, "'grad'");
  EXPECT_NVTE_ERROR(nvte_clamped_swiglu_v2(in, out, kLimit, kAlpha, NAN, nullptr), kInvalid,
                    "nvte_clamped_swiglu_v2", "'glu_linear_offset'");
  EXPECT_NVTE_ERROR(nvte_clamped_dswiglu_v2(g, in, dx, kLimit, kAlpha, INFINITY, nullptr), kInvalid,
                    "nvte_clamped_dswiglu_v2", "'glu_linear_offset'");
}

}  // namespace
