// nvte_dequantize: per-tensor (decode * scale_inv) and MXFP8 (row-wise, or column-wise when it is
// the only copy) into fp32/fp16/bf16, bit-exact against double references; rejection paths.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "cast_reference.h"
#include "test_common.h"
#include "transformer_engine_lite/cast.h"
#include "transformer_engine_lite/transpose.h"

namespace {

using test::Copies;
using test::Shape;
using test::TestTensor;

// Fills an FP8 buffer with random codes (NaN and Inf codes included).
std::vector<uint8_t> random_codes(TestTensor &t, NVTETensorParam p, std::mt19937 &rng) {
  std::uniform_int_distribution<int> code(0, 255);
  for (size_t i = 0; i < t.numel(p); ++i) t.bytes(p)[i] = static_cast<uint8_t>(code(rng));
  return std::vector<uint8_t>(t.bytes(p), t.bytes(p) + t.numel(p));
}

// Exact comparison of values (NaN matches NaN, Inf must match): zero tolerance.
constexpr test::Tol kExact{0.0, 0.0};

// ------------------------------------------------------------------ per-tensor
using PerTensorParam = std::tuple<NVTEDType, NVTEDType, Shape>;
class DequantizePerTensor : public ::testing::TestWithParam<PerTensorParam> {};

TEST_P(DequantizePerTensor, DecodeTimesScaleInvExact) {
  const auto [fp8, out_dtype, shape] = GetParam();
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, fp8);
  const std::vector<uint8_t> q = random_codes(in, kNVTERowwiseData, rng);
  const float scale_inv =
      std::ldexp(static_cast<float>(std::uniform_real_distribution<double>(1.0, 2.0)(rng)), -6);
  in.set_scale_inv(scale_inv);
  TestTensor out(shape, out_dtype);
  ASSERT_NVTE_OK(nvte_dequantize(in, out, nullptr));
  std::vector<double> ref(q.size());
  // decode(q) has at most 4 significant bits, so its double product with a float is exact and one
  // rounding to float is the fp32 multiply; then the store into the output dtype.
  for (size_t i = 0; i < q.size(); ++i)
    ref[i] = test::round_to(test::ref_fp8_decode(q[i], fp8) * scale_inv, out_dtype);
  EXPECT_TRUE(test::close(out.to_double(), ref, kExact));
}

INSTANTIATE_TEST_SUITE_P(OddShapes, DequantizePerTensor,
                         ::testing::Combine(::testing::ValuesIn(test::kFp8Types),
                                            ::testing::ValuesIn(test::kHighPrecisionTypes),
                                            ::testing::Values(Shape{1, 1}, Shape{7, 33},
                                                              Shape{129, 257}, Shape{2, 3, 45})),
                         [](const auto &info) {
                           return test::dtype_tag(std::get<0>(info.param)) + "_to_" +
                                  test::dtype_tag(std::get<1>(info.param)) + "_" +
                                  test::shape_tag(std::get<2>(info.param));
                         });

// ------------------------------------------------------------------ MXFP8
using MxParam = std::tuple<NVTEDType, NVTEDType, Shape, Copies>;
class DequantizeMxfp8 : public ::testing::TestWithParam<MxParam> {};

TEST_P(DequantizeMxfp8, DecodeTimesBlockScaleExact) {
  const auto [fp8, out_dtype, shape, copy] = GetParam();
  const size_t rows = test::rows_of(shape), cols = test::cols_of(shape);
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, fp8, NVTE_MXFP8_1D_SCALING);
  const bool row = copy == Copies::kRowwise;
  const NVTETensorParam data = row ? kNVTERowwiseData : kNVTEColumnwiseData;
  const NVTETensorParam scales = row ? kNVTERowwiseScaleInv : kNVTEColumnwiseScaleInv;
  if (!row) {
    in.set_null(kNVTERowwiseData, shape, fp8);
    in.set(kNVTEColumnwiseData, shape, fp8);
  }
  const Shape scale_shape =
      row ? Shape{rows, test::ceil_div(cols, 32)} : Shape{test::ceil_div(rows, 32), cols};
  in.set(scales, scale_shape, kNVTEFloat8E8M0);
  const std::vector<uint8_t> q = random_codes(in, data, rng);
  // Scales 2^-20 .. 2^10 with a NaN scale (0xFF) in the first block.
  std::uniform_int_distribution<int> sbyte(107, 137);
  std::vector<uint8_t> s(test::numel_of(scale_shape));
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(sbyte(rng));
  if (s.size() > 1) s[0] = 0xFF;
  std::copy(s.begin(), s.end(), in.bytes(scales));

  TestTensor out(shape, out_dtype);
  ASSERT_NVTE_OK(nvte_dequantize(in, out, nullptr));
  std::vector<double> ref(rows * cols);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) {
      const uint8_t sb = row ? s[r * scale_shape[1] + c / 32] : s[(r / 32) * cols + c];
      const double v = test::ref_fp8_decode(q[r * cols + c], fp8);
      ref[r * cols + c] =
          sb == 0xFF ? NAN : test::round_to(std::ldexp(v, static_cast<int>(sb) - 127), out_dtype);
    }
  }
  EXPECT_TRUE(test::close(out.to_double(), ref, kExact));
}

INSTANTIATE_TEST_SUITE_P(OddShapes, DequantizeMxfp8,
                         ::testing::Combine(::testing::ValuesIn(test::kFp8Types),
                                            ::testing::ValuesIn(test::kHighPrecisionTypes),
                                            ::testing::Values(Shape{1, 1}, Shape{7, 33},
                                                              Shape{65, 97}, Shape{2, 33, 70}),
                                            ::testing::Values(Copies::kRowwise,
                                                              Copies::kColumnwise)),
                         [](const auto &info) {
                           return test::dtype_tag(std::get<0>(info.param)) + "_to_" +
                                  test::dtype_tag(std::get<1>(info.param)) + "_" +
                                  test::shape_tag(std::get<2>(info.param)) + "_" +
                                  test::copies_tag(std::get<3>(info.param));
                         });

// ------------------------------------------------------------------ rejections
class DequantizeRejects : public ::testing::Test {
 protected:
  void SetUp() override {
    in_.set_scale_inv(1.0f);
    test::poison(out_);
  }
  void expect_rejected(NVTEStatus status, std::initializer_list<const char *> needles) {
    test::Snapshot before(out_);
    EXPECT_EQ(nvte_dequantize(in_, out_, nullptr), status) << nvte_get_last_error();
    const std::string msg = nvte_get_last_error();
    EXPECT_NE(msg.find("nvte_dequantize"), std::string::npos) << msg;
    for (const char *n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "lacks '" << n << "': " << msg;
    EXPECT_TRUE(before.unchanged());
  }
  TestTensor in_{{7, 33}, kNVTEFloat8E4M3};
  TestTensor out_{{7, 33}, kNVTEBFloat16};
};

// Fuzzing finding (fuzz_cast): a 1-D empty input ([0]: one row of zero columns) reached memcpy with
// the null data() of an empty row buffer (undefined even for 0 bytes; UBSan nonnull-attribute).
TEST(DequantizeEmpty, OneDimensionalEmptyIsANoOp) {
  for (NVTEScalingMode mode : {NVTE_DELAYED_TENSOR_SCALING, NVTE_MXFP8_1D_SCALING}) {
    for (NVTEDType out_t : {kNVTEFloat32, kNVTEBFloat16}) {
      TestTensor in({0}, kNVTEFloat8E4M3, mode);
      if (mode == NVTE_MXFP8_1D_SCALING) in.set(kNVTERowwiseScaleInv, {1, 0}, kNVTEFloat8E8M0);
      else in.set_scale_inv(1.0f);
      TestTensor out({0}, out_t);
      ASSERT_NVTE_OK(nvte_dequantize(in, out, nullptr));
    }
  }
}

// Fuzzing finding (fuzz_cast): an empty tensor may declare any size in its other dim, and
// [2^40, 0] made dequantize (quantize, transpose likewise) loop over 2^40 empty rows, a hang;
// [0, 2^40] made quantize allocate a 2^40-float row buffer (out of memory). Now no-ops that still
// write the documented side outputs (amax 0, scale_inv = 1 / scale).
TEST(CastEmpty, HugeOtherDimIsANoOp) {
  const size_t huge = size_t{1} << 40;
  for (const std::vector<size_t> &shape : {std::vector<size_t>{huge, 0}, std::vector<size_t>{0, huge}}) {
    TestTensor x(shape, kNVTEBFloat16), q(shape, kNVTEFloat8E4M3);
    q.set_scale(4.0f);
    q.set_amax(7.0f);
    q.set_scale_inv(0.0f);
    ASSERT_NVTE_OK(nvte_quantize(x, q, nullptr));
    EXPECT_EQ(q.f32(kNVTEAmax)[0], 0.0f);
    EXPECT_EQ(q.f32(kNVTERowwiseScaleInv)[0], 0.25f);
    TestTensor mx(shape, kNVTEFloat8E5M2, NVTE_MXFP8_1D_SCALING);
    mx.set(kNVTERowwiseScaleInv, {shape[0], (shape[1] + 31) / 32}, kNVTEFloat8E8M0);
    ASSERT_NVTE_OK(nvte_quantize(x, mx, nullptr));
    TestTensor y(shape, kNVTEFloat32);
    ASSERT_NVTE_OK(nvte_dequantize(q, y, nullptr));
    TestTensor t({shape[1], shape[0]}, kNVTEBFloat16);
    ASSERT_NVTE_OK(nvte_transpose(x, t, nullptr));
  }
}

TEST_F(DequantizeRejects, NullHandles) {
  EXPECT_NVTE_ERROR(nvte_dequantize(nullptr, out_, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'input'");
  EXPECT_NVTE_ERROR(nvte_dequantize(in_, nullptr, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'output'");
}
TEST_F(DequantizeRejects, InputNotFp8) {
  in_.set(kNVTERowwiseData, {7, 33}, kNVTEFloat16);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'input'", "FP8", "float16"});
}
TEST_F(DequantizeRejects, InputWithoutData) {
  in_.set_null(kNVTERowwiseData, {7, 33}, kNVTEFloat8E4M3);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'input'", "row-wise", "null"});
}
TEST_F(DequantizeRejects, MissingScaleInv) {
  in_.set_null(kNVTERowwiseScaleInv, {1}, kNVTEFloat32);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'input'", "scale_inv", "null"});
  in_.set(kNVTERowwiseScaleInv, {1}, kNVTEBFloat16);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'input'", "scale_inv", "bfloat16"});
}
TEST_F(DequantizeRejects, OutputDtypeAndShape) {
  out_.set(kNVTERowwiseData, {7, 33}, kNVTEFloat8E5M2);
  test::poison(out_);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT,
                  {"'output'", "float32, float16, bfloat16", "float8_e5m2"});
  out_.set(kNVTERowwiseData, {7, 32}, kNVTEFloat32);
  test::poison(out_);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "[7, 33]", "[7, 32]"});
  out_.set_null(kNVTERowwiseData, {7, 33}, kNVTEFloat32);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "null"});
}
TEST_F(DequantizeRejects, Mxfp8Scales) {
  TestTensor in({7, 33}, kNVTEFloat8E4M3, NVTE_MXFP8_1D_SCALING);
  EXPECT_NVTE_ERROR(nvte_dequantize(in, out_, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                    "row-wise E8M0 scale_inv", "null");
  in.set(kNVTERowwiseScaleInv, {7, 1}, kNVTEFloat8E8M0);
  EXPECT_NVTE_ERROR(nvte_dequantize(in, out_, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                    "[7, 2]", "[7, 1]");
  in.set(kNVTERowwiseScaleInv, {7, 2}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_dequantize(in, out_, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "scale_inv",
                    "float32");
  TestTensor col({7, 33}, kNVTEFloat8E4M3, NVTE_MXFP8_1D_SCALING);
  col.set_null(kNVTERowwiseData, {7, 33}, kNVTEFloat8E4M3);
  EXPECT_NVTE_ERROR(nvte_dequantize(col, out_, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                    "neither");
  col.set(kNVTEColumnwiseData, {7, 33}, kNVTEFloat8E4M3);
  col.set(kNVTEColumnwiseScaleInv, {7, 33}, kNVTEFloat8E8M0);
  EXPECT_NVTE_ERROR(nvte_dequantize(col, out_, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "column-wise scale_inv shape", "[1, 33]");
}
TEST_F(DequantizeRejects, InvalidScalingMode) {
  TestTensor in({7, 33}, kNVTEFloat8E4M3, NVTE_INVALID_SCALING);
  in.set_scale_inv(1.0f);
  EXPECT_NVTE_ERROR(nvte_dequantize(in, out_, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                    "scaling mode", "100");
}
TEST_F(DequantizeRejects, DeviceMixAndGpu) {
  out_.set_device(kNVTEDeviceGPU);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "device", "gpu"});
  in_.set_device(kNVTEDeviceGPU);
  expect_rejected(NVTE_ERROR_UNSUPPORTED, {"tensors are on the GPU"});
}

}  // namespace
