// Current scaling: nvte_compute_amax (NaN propagates) and nvte_compute_scale_from_amax (eps clamp,
// 0/Inf/NaN -> 1, Inf scale -> FLT_MAX, power-of-two), bit-exact against references in this file,
// the amax -> scale -> quantize chain end to end, and the rejection paths.
#include <cfloat>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "cast_reference.h"
#include "test_common.h"
#include "transformer_engine_lite/cast.h"

namespace {

using test::Shape;
using test::TestTensor;

// ------------------------------------------------------------------ compute_amax
enum class Special { kNone, kNaN, kInf, kNegZeros };
std::string special_tag(Special s) {
  return s == Special::kNone  ? "plain"
         : s == Special::kNaN ? "nan"
         : s == Special::kInf ? "inf"
                              : "negzeros";
}

using AmaxParam = std::tuple<NVTEDType, Shape, Special>;
class ComputeAmax : public ::testing::TestWithParam<AmaxParam> {};

TEST_P(ComputeAmax, MaxAbsExact) {
  const auto [dtype, shape, special] = GetParam();
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, dtype);
  const size_t n = in.numel();
  test::fill_spread(in, rng, -20, 10);
  if (n > 0) {
    const size_t at = std::uniform_int_distribution<size_t>(0, n - 1)(rng);
    if (special == Special::kNaN) in.put(at, NAN);
    if (special == Special::kInf) in.put(at, -INFINITY);
    if (special == Special::kNegZeros)
      for (size_t i = 0; i < n; ++i) in.put(i, -0.0);
  }
  const std::vector<double> x = in.to_double();
  TestTensor out(shape, kNVTEFloat8E4M3);
  out.set_amax(-7.0f);
  ASSERT_NVTE_OK(nvte_compute_amax(in, out, nullptr));
  const float got = out.f32(kNVTEAmax)[0], ref = test::ref_amax(x);
  if (std::isnan(ref)) {
    EXPECT_TRUE(std::isnan(got)) << got;
  } else {
    EXPECT_EQ(test::fbits(got), test::fbits(ref)) << got << " vs " << ref;  // +0 for -0 inputs
  }
}

std::string amax_name(const ::testing::TestParamInfo<AmaxParam> &info) {
  return test::dtype_tag(std::get<0>(info.param)) + "_" + test::shape_tag(std::get<1>(info.param)) +
         "_" + special_tag(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(OddShapes, ComputeAmax,
                         ::testing::Combine(::testing::ValuesIn(test::kHighPrecisionTypes),
                                            ::testing::Values(Shape{1, 1}, Shape{7, 33},
                                                              Shape{129, 257}, Shape{2, 3, 45},
                                                              Shape{0, 5}),
                                            ::testing::Values(Special::kNone, Special::kNaN,
                                                              Special::kInf, Special::kNegZeros)),
                         amax_name);
INSTANTIATE_TEST_SUITE_P(
    Large, ComputeAmax,
    ::testing::Values(AmaxParam{kNVTEBFloat16, Shape{1023, 4097}, Special::kNone},
                      AmaxParam{kNVTEBFloat16, Shape{1023, 4097}, Special::kNaN}),
    amax_name);

// ------------------------------------------------------------------ compute_scale_from_amax
// Reference: amax = max(amax, eps) (NaN stays NaN); 0 / Inf / NaN -> 1; fp8_max / amax correctly
// rounded to fp32 (a double quotient of floats rounded once to float is); Inf -> FLT_MAX; power of
// two: the largest 2^k <= scale.
float ref_scale(float amax, float eps, bool pow2, NVTEDType fp8) {
  double a = amax;
  if (a < eps) a = eps;
  if (std::isnan(a) || std::isinf(a) || a == 0.0) return 1.0f;
  float s = static_cast<float>(test::fp8_spec(fp8).max / a);
  if (std::isinf(s)) s = FLT_MAX;
  if (pow2) {
    int e;
    std::frexp(s, &e);
    s = std::ldexp(1.0f, e - 1);
  }
  return s;
}

struct ScaleCase {
  const char *name;
  float amax, eps;
  bool pow2;
};
const ScaleCase kScaleCases[] = {
    {"one", 1.0f, 0.0f, false},
    {"three", 3.0f, 0.0f, false},
    {"odd", 0.7391f, 0.0f, false},
    {"huge", FLT_MAX, 0.0f, false},
    {"zero", 0.0f, 0.0f, false},
    {"nan", NAN, 0.0f, false},
    {"inf", INFINITY, 0.0f, false},
    {"negative", -3.0f, 0.0f, false},
    {"tiny_normal", 1e-37f, 0.0f, false},     // fp8_max / amax overflows: FLT_MAX
    {"tiny_subnormal", 1e-40f, 0.0f, false},  // FLT_MAX
    {"eps_clamps", 1e-10f, 1e-3f, false},
    {"eps_below_amax", 2.0f, 1e-3f, false},
    {"eps_lifts_zero", 0.0f, 0.5f, false},  // amax clamped to eps first: scale fp8_max / eps
    {"eps_keeps_nan", NAN, 0.5f, false},    // NaN is no information: 1
    {"pow2_three", 3.0f, 0.0f, true},
    {"pow2_one", 1.0f, 0.0f, true},
    {"pow2_tiny", 1e-40f, 0.0f, true},  // FLT_MAX rounded down: 2^127
    {"pow2_zero", 0.0f, 0.0f, true},
    {"pow2_huge", FLT_MAX, 0.0f, true},
    {"pow2_eps", 1e-9f, 3e-5f, true},
};

using ScaleParam = std::tuple<ScaleCase, NVTEDType>;
class ComputeScaleFromAmax : public ::testing::TestWithParam<ScaleParam> {};

TEST_P(ComputeScaleFromAmax, ScaleAndScaleInvExact) {
  const auto [c, fp8] = GetParam();
  TestTensor out({4, 4}, fp8);
  out.set_amax(c.amax);
  out.set_scale(-5.0f);
  out.set_scale_inv(-5.0f);
  NVTEQuantizationConfig cfg = nvte_create_quantization_config();
  ASSERT_NVTE_OK(nvte_set_quantization_config_attribute(cfg, kNVTEQuantizationConfigAmaxEpsilon,
                                                        &c.eps, sizeof(float)));
  ASSERT_NVTE_OK(nvte_set_quantization_config_attribute(cfg, kNVTEQuantizationConfigForcePow2Scales,
                                                        &c.pow2, sizeof(bool)));
  ASSERT_NVTE_OK(nvte_compute_scale_from_amax(out, cfg, nullptr));
  nvte_destroy_quantization_config(cfg);
  const float ref = ref_scale(c.amax, c.eps, c.pow2, fp8);
  EXPECT_EQ(test::fbits(out.f32(kNVTEScale)[0]), test::fbits(ref))
      << out.f32(kNVTEScale)[0] << " vs " << ref;
  EXPECT_EQ(test::fbits(out.f32(kNVTERowwiseScaleInv)[0]),
            test::fbits(static_cast<float>(1.0 / static_cast<double>(ref))));
  EXPECT_EQ(test::fbits(out.f32(kNVTEAmax)[0]), test::fbits(c.amax));  // amax is not rewritten
}

INSTANTIATE_TEST_SUITE_P(Cases, ComputeScaleFromAmax,
                         ::testing::Combine(::testing::ValuesIn(kScaleCases),
                                            ::testing::ValuesIn(test::kFp8Types)),
                         [](const auto &info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  test::dtype_tag(std::get<1>(info.param));
                         });

// Spelled-out values the reference above must agree with.
TEST(ComputeScaleFromAmaxPinned, KnownValues) {
  auto scale_of = [](float amax, NVTEDType fp8, bool pow2) {
    TestTensor out({1}, fp8);
    out.set_amax(amax);
    out.set_scale(0.0f);
    NVTEQuantizationConfig cfg = nvte_create_quantization_config();
    EXPECT_EQ(nvte_set_quantization_config_attribute(cfg, kNVTEQuantizationConfigForcePow2Scales,
                                                     &pow2, sizeof(bool)),
              NVTE_SUCCESS);
    EXPECT_EQ(nvte_compute_scale_from_amax(out, cfg, nullptr), NVTE_SUCCESS)
        << nvte_get_last_error();
    nvte_destroy_quantization_config(cfg);
    return out.f32(kNVTEScale)[0];
  };
  EXPECT_EQ(scale_of(2.0f, kNVTEFloat8E4M3, false), 224.0f);
  EXPECT_EQ(scale_of(0.0f, kNVTEFloat8E5M2, false), 1.0f);
  EXPECT_EQ(scale_of(1e-40f, kNVTEFloat8E4M3, false), FLT_MAX);
  EXPECT_EQ(scale_of(3.0f, kNVTEFloat8E4M3, true), 128.0f);
  EXPECT_EQ(scale_of(1.0f, kNVTEFloat8E5M2, true), 32768.0f);
  EXPECT_EQ(scale_of(1.0f, kNVTEFloat8E4M3FNUZ, false), 240.0f);
  EXPECT_EQ(scale_of(1e-40f, kNVTEFloat8E4M3, true), std::ldexp(1.0f, 127));
}

// NULL config (eps 0, no power of two) and no scale_inv buffer.
TEST(ComputeScaleFromAmaxPinned, NullConfigNoScaleInv) {
  TestTensor out({3}, kNVTEFloat8E5M2);
  out.set_amax(7.0f);
  out.set_scale(0.0f);
  ASSERT_NVTE_OK(nvte_compute_scale_from_amax(out, nullptr, nullptr));
  EXPECT_EQ(out.f32(kNVTEScale)[0], static_cast<float>(57344.0 / 7.0));
}

// compute_amax -> compute_scale_from_amax -> quantize gives the bytes of the reference chain.
TEST(CurrentScalingChain, Bf16ToE4M3) {
  const Shape shape{129, 257};
  std::mt19937 rng(5);
  TestTensor in(shape, kNVTEBFloat16);
  const std::vector<double> x = test::fill_spread(in, rng, -12, 4);
  TestTensor out(shape, kNVTEFloat8E4M3);
  out.set_amax();
  out.set_scale(0.0f);
  out.set_scale_inv();
  ASSERT_NVTE_OK(nvte_compute_amax(in, out, nullptr));
  ASSERT_NVTE_OK(nvte_compute_scale_from_amax(out, nullptr, nullptr));
  ASSERT_NVTE_OK(nvte_quantize(in, out, nullptr));
  const float scale = ref_scale(test::ref_amax(x), 0.0f, false, kNVTEFloat8E4M3);
  EXPECT_EQ(out.f32(kNVTEScale)[0], scale);
  const test::RefEncoder encode(kNVTEFloat8E4M3);
  std::vector<uint8_t> ref(x.size());
  for (size_t i = 0; i < x.size(); ++i) ref[i] = encode(test::fp32_mul(x[i], scale));
  EXPECT_TRUE(test::same_bytes(out.bytes(), ref.data(), ref.size()));
  // quantize records the same amax that compute_amax produced.
  EXPECT_EQ(out.f32(kNVTEAmax)[0], test::ref_amax(x));
}

// ------------------------------------------------------------------ rejections
TEST(ComputeAmaxRejects, Arguments) {
  TestTensor in({7, 33}, kNVTEFloat32);
  TestTensor out({7, 33}, kNVTEFloat8E4M3);
  EXPECT_NVTE_ERROR(nvte_compute_amax(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "nvte_compute_amax", "'output'", "amax", "null");
  out.set(kNVTEAmax, {2}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_compute_amax(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "amax",
                    "[2]");
  out.set_amax(3.0f);
  EXPECT_NVTE_ERROR(nvte_compute_amax(nullptr, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'input'");
  EXPECT_NVTE_ERROR(nvte_compute_amax(in, nullptr, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'output'");
  TestTensor q({7, 33}, kNVTEFloat8E4M3);
  EXPECT_NVTE_ERROR(nvte_compute_amax(q, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                    "float8_e4m3");
  in.set_null(kNVTERowwiseData, {7, 33}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_compute_amax(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                    "null");
  in.set(kNVTERowwiseData, {7, 33}, kNVTEFloat32);
  in.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_compute_amax(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                    "device");
  out.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_compute_amax(in, out, nullptr), NVTE_ERROR_UNSUPPORTED, "tensors are on the GPU");
  EXPECT_EQ(out.f32(kNVTEAmax)[0], 3.0f);  // never written by a failed call
}

TEST(ComputeScaleFromAmaxRejects, Arguments) {
  TestTensor out({7, 33}, kNVTEFloat8E4M3);
  out.set_amax(1.0f);
  EXPECT_NVTE_ERROR(nvte_compute_scale_from_amax(out, nullptr, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "nvte_compute_scale_from_amax", "'output'",
                    "scale", "null");
  out.set_scale(9.0f);
  out.set(kNVTERowwiseScaleInv, {1}, kNVTEFloat16);
  EXPECT_NVTE_ERROR(nvte_compute_scale_from_amax(out, nullptr, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "scale_inv", "float16");
  out.set_scale_inv(9.0f);
  out.set(kNVTEAmax, {1}, kNVTEBFloat16);
  EXPECT_NVTE_ERROR(nvte_compute_scale_from_amax(out, nullptr, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "amax", "bfloat16");
  EXPECT_NVTE_ERROR(nvte_compute_scale_from_amax(nullptr, nullptr, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "'output'", "NULL");
  TestTensor bf({7, 33}, kNVTEBFloat16);
  bf.set_amax(1.0f);
  bf.set_scale(9.0f);
  EXPECT_NVTE_ERROR(nvte_compute_scale_from_amax(bf, nullptr, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'output'", "FP8", "bfloat16");
  TestTensor mx({7, 32}, kNVTEFloat8E4M3, NVTE_MXFP8_1D_SCALING);
  mx.set_amax(1.0f);
  mx.set_scale(9.0f);
  EXPECT_NVTE_ERROR(nvte_compute_scale_from_amax(mx, nullptr, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'output'", "NVTE_DELAYED_TENSOR_SCALING");
  TestTensor gpu({7, 33}, kNVTEFloat8E4M3);
  gpu.set_amax(1.0f);
  gpu.set_scale(9.0f);
  gpu.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_compute_scale_from_amax(gpu, nullptr, nullptr), NVTE_ERROR_UNSUPPORTED,
                    "tensors are on the GPU");
  EXPECT_EQ(out.f32(kNVTEScale)[0], 9.0f);
  EXPECT_EQ(gpu.f32(kNVTEScale)[0], 9.0f);
}

}  // namespace
