// GPU kernels of the cast family and the delayed-scaling recipe against the CPU kernels, bit for
// bit: quantize (per-tensor with and without the transposed copy, MXFP8 row- and column-wise),
// dequantize, amax, scale from amax, transpose, cast_transpose and the delayed-scaling update. Each
// case builds host tensors, mirrors them into device memory (GPU-tagged handles), runs the op on
// both and compares every output buffer byte for byte (ARCHITECTURE.md §5: CPU and GPU produce
// identical bytes). Skipped without a GPU device.
#include <cfloat>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "cast_reference.h"
#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/cast.h"
#include "transformer_engine_lite/recipe.h"
#include "transformer_engine_lite/transpose.h"

namespace {

using test::Copies;
using test::GpuTensor;
using test::Shape;
using test::TestTensor;

// Overwrites a sprinkling of elements with NaN, +-Inf, +-0 and values far below the FP8 range.
void add_specials(TestTensor &t) {
  const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e-30, -3e-39};
  const size_t n = t.numel();
  for (size_t i = 3, k = 0; i < n; i += 37, ++k) t.put(i, specials[k % 7]);
}

void fill_random_bytes(TestTensor &t, std::mt19937 &rng, NVTETensorParam p = kNVTERowwiseData) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t &b : t.buffer(p).bytes) b = static_cast<uint8_t>(byte(rng));
}

std::string mode_tag(NVTEScalingMode m) { return m == NVTE_MXFP8_1D_SCALING ? "mx" : "pertensor"; }

const Shape kShapes[] = {{1, 1}, {7, 33}, {129, 257}, {2, 3, 45}, {0, 5}, {64, 128}};

// ------------------------------------------------------------------ quantize
using QuantizeParam = std::tuple<NVTEDType, NVTEDType, Shape, Copies, NVTEScalingMode, bool>;
class QuantizeGpu : public ::testing::TestWithParam<QuantizeParam> {};

// Output with the copies asked for; every byte poisoned so that each one must be written, and
// written identically on both devices (amax and scale_inv included).
TestTensor make_quantize_output(const Shape &shape, NVTEDType fp8, NVTEScalingMode mode,
                                Copies copies, float scale) {
  const size_t rows = test::rows_of(shape), cols = test::cols_of(shape);
  TestTensor out(shape, fp8, mode);
  if (!test::has_rowwise(copies)) out.set_null(kNVTERowwiseData, shape, fp8);
  if (mode == NVTE_MXFP8_1D_SCALING) {
    if (test::has_rowwise(copies))
      out.set(kNVTERowwiseScaleInv, {rows, test::ceil_div(cols, 32)}, kNVTEFloat8E8M0);
    if (test::has_colwise(copies)) {
      out.set(kNVTEColumnwiseData, shape, fp8);
      out.set(kNVTEColumnwiseScaleInv, {test::ceil_div(rows, 32), cols}, kNVTEFloat8E8M0);
    }
  } else {
    if (test::has_colwise(copies)) out.set(kNVTEColumnwiseData, {cols, rows}, fp8);
    out.set_scale_inv();
  }
  out.set_amax();  // MXFP8 outputs record amax too when they have the buffer
  test::poison(out);
  if (mode != NVTE_MXFP8_1D_SCALING) out.set_scale(scale);
  return out;
}

TEST_P(QuantizeGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [in_dtype, fp8, shape, copies, mode, specials] = GetParam();
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, in_dtype);
  // |x| from 2^-20 to 2^20: with the scales below this reaches FP8 subnormals and saturation.
  test::fill_spread(in, rng, -20, 20);
  if (specials) add_specials(in);
  const float scale = static_cast<float>(test::fp8_spec(fp8).max / 1024 *
                                         std::uniform_real_distribution<double>(0.5, 2.0)(rng));
  TestTensor out = make_quantize_output(shape, fp8, mode, copies, scale);
  TestTensor gout = make_quantize_output(shape, fp8, mode, copies, scale);
  GpuTensor d_in(in), d_out(gout);
  ASSERT_NVTE_OK(nvte_quantize(in, out, nullptr));
  ASSERT_NVTE_OK(nvte_quantize(d_in, d_out, nullptr));
  d_out.download_all(gout);
  EXPECT_TRUE(test::same_buffers(gout, out));
}

std::string quantize_name(const ::testing::TestParamInfo<QuantizeParam> &info) {
  const auto &[in, fp8, shape, copies, mode, specials] = info.param;
  return test::dtype_tag(in) + "_" + test::dtype_tag(fp8) + "_" + test::shape_tag(shape) + "_" +
         test::copies_tag(copies) + "_" + mode_tag(mode) + (specials ? "_specials" : "");
}

INSTANTIATE_TEST_SUITE_P(
    All, QuantizeGpu,
    ::testing::Combine(::testing::ValuesIn(test::kHighPrecisionTypes),
                       ::testing::ValuesIn(test::kFp8Types), ::testing::ValuesIn(kShapes),
                       ::testing::Values(Copies::kRowwise, Copies::kBoth, Copies::kColumnwise),
                       ::testing::Values(NVTE_DELAYED_TENSOR_SCALING, NVTE_MXFP8_1D_SCALING),
                       ::testing::Bool()),
    quantize_name);

// Large enough for many blocks per grid-stride step, with every MX block full.
TEST(QuantizeGpuLarge, BothCopiesPerTensorAndMxfp8) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng = test::test_rng();
  const Shape shape{1056, 4128};
  TestTensor in(shape, kNVTEBFloat16);
  test::fill_spread(in, rng, -30, 30);
  for (NVTEScalingMode mode : {NVTE_DELAYED_TENSOR_SCALING, NVTE_MXFP8_1D_SCALING}) {
    TestTensor out = make_quantize_output(shape, kNVTEFloat8E4M3, mode, Copies::kBoth, 3.0f);
    TestTensor gout = make_quantize_output(shape, kNVTEFloat8E4M3, mode, Copies::kBoth, 3.0f);
    GpuTensor d_in(in), d_out(gout);
    ASSERT_NVTE_OK(nvte_quantize(in, out, nullptr));
    ASSERT_NVTE_OK(nvte_quantize(d_in, d_out, nullptr));
    d_out.download_all(gout);
    EXPECT_TRUE(test::same_buffers(gout, out)) << mode_tag(mode);
  }
}

// ------------------------------------------------------------------ cast_transpose
using CastTransposeParam = std::tuple<NVTEDType, NVTEDType, Shape>;
class CastTransposeGpu : public ::testing::TestWithParam<CastTransposeParam> {};

TEST_P(CastTransposeGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [in_dtype, fp8, shape] = GetParam();
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, in_dtype);
  test::fill_spread(in, rng, -12, 12);
  const float scale = static_cast<float>(test::fp8_spec(fp8).max / 64);
  TestTensor out = make_quantize_output(shape, fp8, NVTE_DELAYED_TENSOR_SCALING, Copies::kBoth,
                                        scale);
  TestTensor gout = make_quantize_output(shape, fp8, NVTE_DELAYED_TENSOR_SCALING, Copies::kBoth,
                                         scale);
  GpuTensor d_in(in), d_out(gout);
  ASSERT_NVTE_OK(nvte_cast_transpose(in, out, nullptr));
  ASSERT_NVTE_OK(nvte_cast_transpose(d_in, d_out, nullptr));
  d_out.download_all(gout);
  EXPECT_TRUE(test::same_buffers(gout, out));
}

std::string cast_transpose_name(const ::testing::TestParamInfo<CastTransposeParam> &info) {
  const auto &[in, fp8, shape] = info.param;
  return test::dtype_tag(in) + "_" + test::dtype_tag(fp8) + "_" + test::shape_tag(shape);
}

INSTANTIATE_TEST_SUITE_P(
    All, CastTransposeGpu,
    ::testing::Combine(::testing::ValuesIn(test::kHighPrecisionTypes),
                       ::testing::ValuesIn(test::kFp8Types),
                       ::testing::Values(Shape{1, 1}, Shape{7, 33}, Shape{129, 257},
                                         Shape{64, 64}, Shape{0, 5}, Shape{300, 1})),
    cast_transpose_name);

// ------------------------------------------------------------------ dequantize
enum class DqKind { kPerTensor, kMxRowwise, kMxColwise };
using DequantizeParam = std::tuple<NVTEDType, NVTEDType, DqKind, Shape>;
class DequantizeGpu : public ::testing::TestWithParam<DequantizeParam> {};

TEST_P(DequantizeGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [fp8, out_dtype, kind, shape] = GetParam();
  const size_t rows = test::rows_of(shape), cols = test::cols_of(shape);
  std::mt19937 rng = test::test_rng();
  const bool mx = kind != DqKind::kPerTensor;
  TestTensor in(shape, fp8, mx ? NVTE_MXFP8_1D_SCALING : NVTE_DELAYED_TENSOR_SCALING);
  fill_random_bytes(in, rng);  // every code, NaN codes included
  if (kind == DqKind::kPerTensor) {
    in.set_scale_inv(std::uniform_real_distribution<float>(1e-4f, 1e4f)(rng));
  } else {
    const NVTETensorParam sp =
        kind == DqKind::kMxRowwise ? kNVTERowwiseScaleInv : kNVTEColumnwiseScaleInv;
    const Shape scale_shape = kind == DqKind::kMxRowwise
                                  ? Shape{rows, test::ceil_div(cols, 32)}
                                  : Shape{test::ceil_div(rows, 32), cols};
    if (kind == DqKind::kMxColwise) {  // only the column-wise copy: dequantized from it
      in.set(kNVTEColumnwiseData, shape, fp8);
      fill_random_bytes(in, rng, kNVTEColumnwiseData);
      in.set_null(kNVTERowwiseData, shape, fp8);
    }
    in.set(sp, scale_shape, kNVTEFloat8E8M0);
    // Mostly moderate scales, plus the extremes (2^-127, 2^127) and the NaN scale.
    std::uniform_int_distribution<int> pick(0, 19), moderate(100, 154);
    const uint8_t extremes[] = {0x00, 0xFE, 0xFF};
    for (uint8_t &b : in.buffer(sp).bytes) {
      const int k = pick(rng);
      b = k < 3 ? extremes[k] : static_cast<uint8_t>(moderate(rng));
    }
  }
  TestTensor out(shape, out_dtype), gout(shape, out_dtype);
  test::poison(out);
  test::poison(gout);
  GpuTensor d_in(in), d_out(gout);
  ASSERT_NVTE_OK(nvte_dequantize(in, out, nullptr));
  ASSERT_NVTE_OK(nvte_dequantize(d_in, d_out, nullptr));
  d_out.download_all(gout);
  EXPECT_TRUE(test::same_buffers(gout, out));
}

std::string dequantize_name(const ::testing::TestParamInfo<DequantizeParam> &info) {
  const auto &[fp8, out, kind, shape] = info.param;
  const char *k = kind == DqKind::kPerTensor ? "pertensor"
                  : kind == DqKind::kMxRowwise ? "mxrow"
                                               : "mxcol";
  return test::dtype_tag(fp8) + "_" + test::dtype_tag(out) + "_" + k + "_" +
         test::shape_tag(shape);
}

INSTANTIATE_TEST_SUITE_P(
    All, DequantizeGpu,
    ::testing::Combine(::testing::ValuesIn(test::kFp8Types),
                       ::testing::ValuesIn(test::kHighPrecisionTypes),
                       ::testing::Values(DqKind::kPerTensor, DqKind::kMxRowwise,
                                         DqKind::kMxColwise),
                       ::testing::Values(Shape{1, 1}, Shape{7, 33}, Shape{129, 257},
                                         Shape{2, 3, 45}, Shape{0, 5})),
    dequantize_name);

// ------------------------------------------------------------------ amax
// nvte_compute_amax on `in` into a fresh output on each device; the amax bits must agree (NaN wins,
// as the canonical NaN on both).
void expect_amax_matches(const TestTensor &in) {
  TestTensor out({1}, kNVTEFloat8E4M3), gout({1}, kNVTEFloat8E4M3);
  out.set_amax(-1.0f);
  gout.set_amax(-1.0f);
  GpuTensor d_in(in), d_out(gout);
  ASSERT_NVTE_OK(nvte_compute_amax(in, out, nullptr));
  ASSERT_NVTE_OK(nvte_compute_amax(d_in, d_out, nullptr));
  d_out.download_all(gout);
  EXPECT_TRUE(test::same_buffers(gout, out));
}

using AmaxParam = std::tuple<NVTEDType, Shape, bool>;
class ComputeAmaxGpu : public ::testing::TestWithParam<AmaxParam> {};

TEST_P(ComputeAmaxGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, shape, specials] = GetParam();
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, dtype);
  test::fill_spread(in, rng, -30, 30);
  if (specials) add_specials(in);
  expect_amax_matches(in);
}

std::string amax_name(const ::testing::TestParamInfo<AmaxParam> &info) {
  const auto &[dtype, shape, specials] = info.param;
  return test::dtype_tag(dtype) + "_" + test::shape_tag(shape) + (specials ? "_specials" : "");
}

INSTANTIATE_TEST_SUITE_P(
    All, ComputeAmaxGpu,
    ::testing::Combine(::testing::ValuesIn(test::kHighPrecisionTypes),
                       ::testing::Values(Shape{1}, Shape{7, 33}, Shape{1000, 1037}, Shape{0, 5}),
                       ::testing::Bool()),
    amax_name);

// Inf among finite values and no NaN: the amax is Inf, not NaN.
TEST(ComputeAmaxGpuInf, InfWithoutNan) {
  SKIP_WITHOUT_GPU();
  TestTensor in({5, 40}, kNVTEFloat32);
  for (size_t i = 0; i < in.numel(); ++i) in.put(i, i == 77 ? -INFINITY : 0.5 * double(i));
  expect_amax_matches(in);
}

// ------------------------------------------------------------------ scale from amax
class ScaleFromAmaxGpu : public ::testing::TestWithParam<NVTEDType> {};

TEST_P(ScaleFromAmaxGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const NVTEDType fp8 = GetParam();
  const float amaxes[] = {0.0f,  -0.0f, -1.0f,  1e-45f,  1e-39f,   1e-30f, 0.3f,
                          1.0f, 448.0f, 3.0e38f, FLT_MAX, INFINITY, NAN};
  const float epsilons[] = {0.0f, 1e-12f, 1.0f};
  auto make_out = [&](float a, bool with_scale_inv) {
    TestTensor out({1}, fp8);
    out.set_amax(a);
    out.set_scale(-1.0f);
    if (with_scale_inv) out.set_scale_inv(-1.0f);
    return out;
  };
  for (const bool pow2 : {false, true}) {
    for (const float eps : epsilons) {
      NVTEQuantizationConfig cfg = nvte_create_quantization_config();
      ASSERT_NVTE_OK(nvte_set_quantization_config_attribute(
          cfg, kNVTEQuantizationConfigForcePow2Scales, &pow2, sizeof(pow2)));
      ASSERT_NVTE_OK(nvte_set_quantization_config_attribute(
          cfg, kNVTEQuantizationConfigAmaxEpsilon, &eps, sizeof(eps)));
      for (const float a : amaxes) {
        for (const bool with_scale_inv : {false, true}) {
          SCOPED_TRACE("amax " + std::to_string(a) + ", eps " + std::to_string(eps) +
                       (pow2 ? ", pow2" : ""));
          TestTensor out = make_out(a, with_scale_inv), gout = make_out(a, with_scale_inv);
          GpuTensor d_out(gout);
          ASSERT_NVTE_OK(nvte_compute_scale_from_amax(out, cfg, nullptr));
          ASSERT_NVTE_OK(nvte_compute_scale_from_amax(d_out, cfg, nullptr));
          d_out.download_all(gout);
          EXPECT_TRUE(test::same_buffers(gout, out));
        }
      }
      nvte_destroy_quantization_config(cfg);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, ScaleFromAmaxGpu, ::testing::ValuesIn(test::kFp8Types),
                         [](const auto &info) { return test::dtype_tag(info.param); });

// ------------------------------------------------------------------ transpose
using TransposeParam = std::tuple<NVTEDType, Shape>;
class TransposeGpu : public ::testing::TestWithParam<TransposeParam> {};

TEST_P(TransposeGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [dtype, shape] = GetParam();
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, dtype);
  fill_random_bytes(in, rng);  // raw bytes: NaN payloads must survive the move
  TestTensor out({shape[1], shape[0]}, dtype), gout({shape[1], shape[0]}, dtype);
  test::poison(out);
  test::poison(gout);
  GpuTensor d_in(in), d_out(gout);
  ASSERT_NVTE_OK(nvte_transpose(in, out, nullptr));
  ASSERT_NVTE_OK(nvte_transpose(d_in, d_out, nullptr));
  d_out.download_all(gout);
  EXPECT_TRUE(test::same_buffers(gout, out));
}

std::string transpose_name(const ::testing::TestParamInfo<TransposeParam> &info) {
  const auto &[dtype, shape] = info.param;
  return test::dtype_tag(dtype) + "_" + test::shape_tag(shape);
}

INSTANTIATE_TEST_SUITE_P(
    All, TransposeGpu,
    ::testing::Combine(::testing::Values(kNVTEByte, kNVTEFloat8E4M3, kNVTEBFloat16, kNVTEFloat32,
                                         kNVTEInt64),
                       ::testing::Values(Shape{1, 1}, Shape{7, 33}, Shape{129, 257},
                                         Shape{64, 64}, Shape{1, 100}, Shape{100, 1},
                                         Shape{0, 5}, Shape{1000, 1033})),
    transpose_name);

// ------------------------------------------------------------------ delayed-scaling update
using RecipeParam = std::tuple<size_t, size_t, bool, bool, NVTEDType>;
class DelayedScalingGpu : public ::testing::TestWithParam<RecipeParam> {};

// History and scales (seeded, so two builds are identical): amaxes from subnormal to large, and the
// entries the rule must handle: NaN (ignored by "max"), Inf, zeros, negatives; an infinite previous
// scale (it becomes FLT_MAX when kept).
struct RecipeState {
  TestTensor hist, scale, new_hist, new_scale;
  RecipeState(size_t length, size_t num_scales, uint32_t seed)
      : hist({length, num_scales}, kNVTEFloat32),
        scale({num_scales}, kNVTEFloat32),
        new_hist({length, num_scales}, kNVTEFloat32),
        new_scale({num_scales}, kNVTEFloat32) {
    std::mt19937 rng(seed);
    test::fill_spread(hist, rng, -140, 20);
    const double specials[] = {NAN, INFINITY, 0.0, -0.0, -2.0};
    for (size_t i = 1, k = 0; i < hist.numel(); i += 11, ++k) hist.put(i, specials[k % 5]);
    test::fill_spread(scale, rng, -10, 10);
    if (num_scales > 2) scale.put(2, INFINITY);
    test::poison(new_hist);
    test::poison(new_scale);
  }
};

NVTEStatus run_update(NVTETensor hist, NVTETensor scale, NVTETensor new_hist, NVTETensor new_scale,
                      bool in_place, const char *algo, NVTEDType fp8, float margin) {
  if (in_place) {
    return nvte_delayed_scaling_recipe_amax_and_scale_update(hist, scale, hist, scale, algo, fp8,
                                                             margin, nullptr);
  }
  return nvte_delayed_scaling_recipe_amax_and_scale_update(hist, scale, new_hist, new_scale, algo,
                                                           fp8, margin, nullptr);
}

TEST_P(DelayedScalingGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [length, num_scales, most_recent, in_place, fp8] = GetParam();
  const uint32_t seed = static_cast<uint32_t>(test::test_rng()());
  RecipeState cpu(length, num_scales, seed), gpu(length, num_scales, seed);
  const char *algo = most_recent ? "most_recent" : "max";
  const float margin = num_scales % 2 ? 0.0f : 1.5f;
  GpuTensor d_hist(gpu.hist), d_scale(gpu.scale), d_new_hist(gpu.new_hist),
      d_new_scale(gpu.new_scale);
  ASSERT_NVTE_OK(
      run_update(cpu.hist, cpu.scale, cpu.new_hist, cpu.new_scale, in_place, algo, fp8, margin));
  ASSERT_NVTE_OK(
      run_update(d_hist, d_scale, d_new_hist, d_new_scale, in_place, algo, fp8, margin));
  d_hist.download_all(gpu.hist);
  d_scale.download_all(gpu.scale);
  d_new_hist.download_all(gpu.new_hist);
  d_new_scale.download_all(gpu.new_scale);
  EXPECT_TRUE(test::same_buffers(gpu.hist, cpu.hist)) << "amax_history";
  EXPECT_TRUE(test::same_buffers(gpu.scale, cpu.scale)) << "scale";
  EXPECT_TRUE(test::same_buffers(gpu.new_hist, cpu.new_hist)) << "updated_amax_history";
  EXPECT_TRUE(test::same_buffers(gpu.new_scale, cpu.new_scale)) << "updated_scale";
}

std::string recipe_name(const ::testing::TestParamInfo<RecipeParam> &info) {
  const auto &[length, n, most_recent, in_place, fp8] = info.param;
  return "h" + std::to_string(length) + "_n" + std::to_string(n) +
         (most_recent ? "_most_recent" : "_max") + (in_place ? "_inplace" : "") + "_" +
         test::dtype_tag(fp8);
}

INSTANTIATE_TEST_SUITE_P(
    All, DelayedScalingGpu,
    ::testing::Combine(::testing::Values(size_t{1}, size_t{2}, size_t{5}, size_t{16}),
                       ::testing::Values(size_t{1}, size_t{7}, size_t{300}), ::testing::Bool(),
                       ::testing::Bool(), ::testing::ValuesIn(test::kFp8Types)),
    recipe_name);

// ------------------------------------------------------------------ routing
// Mixed devices stay an argument error in GPU builds (checked before any routing).
TEST(CastGpuRouting, MixedDevicesRejected) {
  SKIP_WITHOUT_GPU();
  TestTensor in({4, 4}, kNVTEFloat32);
  TestTensor out({4, 4}, kNVTEFloat8E4M3);
  out.set_scale(1.0f);
  GpuTensor d_out(out);
  EXPECT_NVTE_ERROR(nvte_quantize(in, d_out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "device");
}

}  // namespace
