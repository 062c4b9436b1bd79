// nvte_transpose (any dtype, odd shapes) against a plain index swap, nvte_cast_transpose against
// nvte_quantize's bytes, and the rejection paths of both.
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cast_reference.h"
#include "test_common.h"
#include "transformer_engine_lite/cast.h"
#include "transformer_engine_lite/transpose.h"

namespace {

using test::Shape;
using test::TestTensor;

// ------------------------------------------------------------------ transpose
using TransposeParam = std::tuple<NVTEDType, Shape>;
class Transpose : public ::testing::TestWithParam<TransposeParam> {};

TEST_P(Transpose, BytesMoveExactly) {
  const auto [dtype, shape] = GetParam();
  const size_t rows = shape[0], cols = shape[1], w = nvte_dtype_size(dtype);
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, dtype);
  // Random bytes: the op moves elements without looking at them (NaN payloads included).
  std::uniform_int_distribution<int> byte(0, 255);
  for (size_t i = 0; i < rows * cols * w; ++i) in.bytes()[i] = static_cast<uint8_t>(byte(rng));
  TestTensor out({cols, rows}, dtype);
  ASSERT_NVTE_OK(nvte_transpose(in, out, nullptr));
  std::vector<uint8_t> ref(rows * cols * w);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c)
      std::memcpy(&ref[(c * rows + r) * w], in.bytes() + (r * cols + c) * w, w);
  EXPECT_TRUE(test::same_bytes(out.bytes(), ref.data(), ref.size()));
}

std::string transpose_name(const ::testing::TestParamInfo<TransposeParam> &info) {
  return test::dtype_tag(std::get<0>(info.param)) + "_" + test::shape_tag(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    OddShapes, Transpose,
    ::testing::Combine(::testing::Values(kNVTEByte, kNVTEInt16, kNVTEInt32, kNVTEInt64,
                                         kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16, kNVTEFloat8E4M3,
                                         kNVTEFloat8E5M2, kNVTEFloat8E4M3FNUZ, kNVTEFloat8E5M2FNUZ,
                                         kNVTEFloat8E8M0),
                       ::testing::Values(Shape{1, 1}, Shape{1, 70}, Shape{70, 1}, Shape{7, 33},
                                         Shape{64, 64}, Shape{129, 257}, Shape{0, 3})),
    transpose_name);
INSTANTIATE_TEST_SUITE_P(Large, Transpose,
                         ::testing::Values(TransposeParam{kNVTEFloat8E4M3, Shape{1023, 4097}},
                                           TransposeParam{kNVTEBFloat16, Shape{1023, 4097}}),
                         transpose_name);

// ------------------------------------------------------------------ cast_transpose
using CastTransposeParam = std::tuple<NVTEDType, NVTEDType, Shape>;
class CastTranspose : public ::testing::TestWithParam<CastTransposeParam> {};

TEST_P(CastTranspose, EqualsQuantizeAndItsTranspose) {
  const auto [in_dtype, fp8, shape] = GetParam();
  const size_t rows = shape[0], cols = shape[1];
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, in_dtype);
  test::fill_spread(in, rng, -14, 2);
  const float scale = static_cast<float>(test::fp8_spec(fp8).max / 3);
  auto make_out = [&](bool transposed) {
    TestTensor out(shape, fp8);
    out.set_scale(scale);
    out.set_amax(-1.0f);
    out.set_scale_inv(-1.0f);
    if (transposed) out.set(kNVTEColumnwiseData, {cols, rows}, fp8);
    return out;
  };
  TestTensor ct = make_out(true), q = make_out(false);
  ASSERT_NVTE_OK(nvte_cast_transpose(in, ct, nullptr));
  ASSERT_NVTE_OK(nvte_quantize(in, q, nullptr));  // pinned bit-exact by test_quantize
  EXPECT_TRUE(test::same_bytes(ct.bytes(), q.bytes(), rows * cols));
  std::vector<uint8_t> ref_t(rows * cols);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) ref_t[c * rows + r] = q.bytes()[r * cols + c];
  EXPECT_TRUE(test::same_bytes(ct.bytes(kNVTEColumnwiseData), ref_t.data(), ref_t.size()));
  EXPECT_EQ(test::fbits(ct.f32(kNVTEAmax)[0]), test::fbits(q.f32(kNVTEAmax)[0]));
  EXPECT_EQ(test::fbits(ct.f32(kNVTERowwiseScaleInv)[0]),
            test::fbits(q.f32(kNVTERowwiseScaleInv)[0]));
}

std::string cast_transpose_name(const ::testing::TestParamInfo<CastTransposeParam> &info) {
  return test::dtype_tag(std::get<0>(info.param)) + "_" + test::dtype_tag(std::get<1>(info.param)) +
         "_" + test::shape_tag(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(OddShapes, CastTranspose,
                         ::testing::Combine(::testing::ValuesIn(test::kHighPrecisionTypes),
                                            ::testing::ValuesIn(test::kFp8Types),
                                            ::testing::Values(Shape{1, 1}, Shape{7, 33},
                                                              Shape{40, 16}, Shape{129, 257})),
                         cast_transpose_name);
INSTANTIATE_TEST_SUITE_P(Large, CastTranspose,
                         ::testing::Values(CastTransposeParam{kNVTEBFloat16, kNVTEFloat8E4M3,
                                                              Shape{1023, 4097}}),
                         cast_transpose_name);

// ------------------------------------------------------------------ rejections
TEST(TransposeRejects, Arguments) {
  TestTensor in({7, 33}, kNVTEBFloat16);
  TestTensor out({33, 7}, kNVTEBFloat16);
  test::poison(out);
  test::Snapshot before(out);
  EXPECT_NVTE_ERROR(nvte_transpose(nullptr, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "nvte_transpose", "'input'", "NULL");
  EXPECT_NVTE_ERROR(nvte_transpose(in, nullptr, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'");
  TestTensor wrong_shape({7, 33}, kNVTEBFloat16);
  EXPECT_NVTE_ERROR(nvte_transpose(in, wrong_shape, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'output'", "[33, 7]", "[7, 33]");
  TestTensor wrong_dtype({33, 7}, kNVTEFloat16);
  EXPECT_NVTE_ERROR(nvte_transpose(in, wrong_dtype, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'output'", "bfloat16", "float16");
  TestTensor in3({2, 7, 33}, kNVTEBFloat16);
  EXPECT_NVTE_ERROR(nvte_transpose(in3, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                    "2-D", "3-D");
  TestTensor no_data({7, 33}, kNVTEBFloat16);
  no_data.set_null(kNVTERowwiseData, {7, 33}, kNVTEBFloat16);
  EXPECT_NVTE_ERROR(nvte_transpose(no_data, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                    "null");
  TestTensor mx({7, 33}, kNVTEFloat8E4M3, NVTE_MXFP8_1D_SCALING);
  TestTensor mx_out({33, 7}, kNVTEFloat8E4M3);
  EXPECT_NVTE_ERROR(nvte_transpose(mx, mx_out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                    "MXFP8");
  // In place (output aliasing the input) is rejected, not silently corrupted.
  TestTensor sq({8, 8}, kNVTEFloat32);
  NVTEBasicTensor bt = nvte_get_tensor_param(sq, kNVTERowwiseData);
  TestTensor alias({8, 8}, kNVTEFloat32);
  NVTETensor h = alias.handle();
  ASSERT_NVTE_OK(nvte_set_tensor_param(&h, kNVTERowwiseData, &bt));
  EXPECT_NVTE_ERROR(nvte_transpose(sq, alias, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                    "overlap");
  in.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_transpose(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                    "device");
  out.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_transpose(in, out, nullptr), NVTE_ERROR_UNSUPPORTED, "tensors are on the GPU");
  EXPECT_TRUE(before.unchanged());
}

TEST(CastTransposeRejects, Arguments) {
  std::mt19937 rng(1);
  TestTensor in({7, 33}, kNVTEFloat32);
  in.fill_uniform(rng, -1, 1);
  TestTensor out({7, 33}, kNVTEFloat8E5M2);
  out.set_scale(1.0f);
  out.set_amax();
  test::poison(out);
  test::Snapshot before(out);
  EXPECT_NVTE_ERROR(nvte_cast_transpose(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "nvte_cast_transpose", "'output'", "column-wise", "null");
  TestTensor col_only({7, 33}, kNVTEFloat8E5M2);
  col_only.set_scale(1.0f);
  col_only.set_null(kNVTERowwiseData, {7, 33}, kNVTEFloat8E5M2);
  col_only.set(kNVTEColumnwiseData, {33, 7}, kNVTEFloat8E5M2);
  EXPECT_NVTE_ERROR(nvte_cast_transpose(in, col_only, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'output'", "row-wise", "null");
  TestTensor bad_t({7, 33}, kNVTEFloat8E5M2);
  bad_t.set_scale(1.0f);
  bad_t.set(kNVTEColumnwiseData, {7, 33}, kNVTEFloat8E5M2);
  EXPECT_NVTE_ERROR(nvte_cast_transpose(in, bad_t, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'output'", "[33, 7]", "[7, 33]");
  TestTensor mx({7, 33}, kNVTEFloat8E5M2, NVTE_MXFP8_1D_SCALING);
  mx.set(kNVTEColumnwiseData, {7, 33}, kNVTEFloat8E5M2);
  EXPECT_NVTE_ERROR(nvte_cast_transpose(in, mx, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                    "NVTE_DELAYED_TENSOR_SCALING");
  TestTensor in3({2, 7, 33}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_cast_transpose(in3, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                    "2-D");
  TestTensor not_fp8({7, 33}, kNVTEFloat16);
  not_fp8.set(kNVTEColumnwiseData, {33, 7}, kNVTEFloat16);
  EXPECT_NVTE_ERROR(nvte_cast_transpose(in, not_fp8, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'output'", "FP8", "float16");
  EXPECT_TRUE(before.unchanged());
  TestTensor int_in({7, 33}, kNVTEInt32);
  out.set(kNVTEColumnwiseData, {33, 7}, kNVTEFloat8E5M2);
  test::Snapshot before2(out);
  EXPECT_NVTE_ERROR(nvte_cast_transpose(int_in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'input'", "int32");
  out.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_cast_transpose(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                    "device");
  EXPECT_TRUE(before2.unchanged());
}

}  // namespace
