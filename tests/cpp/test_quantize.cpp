// nvte_quantize: per-tensor FP8 (row-wise, transposed, both) and MXFP8 (row-wise, column-wise,
// both), bit-exact against references computed in double in this file; and every rejection path.
#include <cfloat>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "cast_reference.h"
#include "test_common.h"
#include "transformer_engine_lite/cast.h"

namespace {

using test::Copies;
using test::Shape;
using test::TestTensor;

// Output tensor with the copies asked for: row-wise data of `shape` (or a null row-wise buffer
// that still names the dtype), and for per-tensor scaling a transposed [cols, rows] copy, for MXFP8
// a column-wise copy of `shape`, each with its scale_inv.
TestTensor make_output(const Shape &shape, NVTEDType fp8, NVTEScalingMode mode, Copies copies) {
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
  } else if (test::has_colwise(copies)) {
    out.set(kNVTEColumnwiseData, {cols, rows}, fp8);
  }
  return out;
}

// The fast reference encoder used below agrees with test::ref_fp8_encode: random values over the
// whole range, every exact midpoint between neighbouring codes (ties), and the specials.
class RefEncoderAgrees : public ::testing::TestWithParam<NVTEDType> {};
TEST_P(RefEncoderAgrees, WithNearestSearch) {
  const NVTEDType fp8 = GetParam();
  const test::RefEncoder encode(fp8);
  std::vector<double> xs = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1e300, -1e-300};
  for (int c = 0; c < 256; ++c) {
    const double v = test::ref_fp8_decode(static_cast<uint8_t>(c), fp8);
    const double w = test::ref_fp8_decode(static_cast<uint8_t>(c + 1), fp8);
    xs.push_back(v);
    if (c % 128 != 127 && std::isfinite(v) && std::isfinite(w)) xs.push_back((v + w) / 2);
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> mant(-2.0, 2.0);
  std::uniform_int_distribution<int> ex(-20, 18);
  for (int i = 0; i < 20000; ++i) xs.push_back(std::ldexp(mant(rng), ex(rng)));
  for (double x : xs) ASSERT_EQ(encode(x), test::ref_fp8_encode(x, fp8)) << "x = " << x;
}
INSTANTIATE_TEST_SUITE_P(AllFormats, RefEncoderAgrees, ::testing::ValuesIn(test::kFp8Types),
                         [](const auto &info) { return test::dtype_tag(info.param); });

// ------------------------------------------------------------------ per-tensor scaling
using PerTensorParam = std::tuple<NVTEDType, NVTEDType, Shape, Copies>;
class QuantizePerTensor : public ::testing::TestWithParam<PerTensorParam> {};

TEST_P(QuantizePerTensor, BytesAmaxScaleInvExact) {
  const auto [in_dtype, fp8, shape, copies] = GetParam();
  const size_t rows = test::rows_of(shape), cols = test::cols_of(shape), n = rows * cols;
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, in_dtype);
  // |x| in [2^-14, 2^3): scaled by ~fp8_max / 2 this reaches FP8 subnormals and saturation.
  const std::vector<double> x = test::fill_spread(in, rng, -14, 2);
  const float scale = static_cast<float>(test::fp8_spec(fp8).max / 2 *
                                         std::uniform_real_distribution<double>(0.5, 2.0)(rng));
  TestTensor out = make_output(shape, fp8, NVTE_DELAYED_TENSOR_SCALING, copies);
  out.set_scale(scale);
  out.set_amax(-1.0f);
  out.set_scale_inv(-1.0f);
  ASSERT_NVTE_OK(nvte_quantize(in, out, nullptr));

  const test::RefEncoder encode(fp8);
  std::vector<uint8_t> ref(n), ref_t(n);
  for (size_t i = 0; i < n; ++i) ref[i] = encode(test::fp32_mul(x[i], scale));
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) ref_t[c * rows + r] = ref[r * cols + c];
  if (test::has_rowwise(copies)) {
    EXPECT_TRUE(test::same_bytes(out.bytes(), ref.data(), n));
  }
  if (test::has_colwise(copies)) {
    EXPECT_TRUE(test::same_bytes(out.bytes(kNVTEColumnwiseData), ref_t.data(), n));
  }
  EXPECT_EQ(test::fbits(out.f32(kNVTEAmax)[0]), test::fbits(test::ref_amax(x)));
  // 1 / scale correctly rounded: a double quotient of floats rounded once to float is.
  EXPECT_EQ(test::fbits(out.f32(kNVTERowwiseScaleInv)[0]),
            test::fbits(static_cast<float>(1.0 / static_cast<double>(scale))));
}

std::string per_tensor_name(const ::testing::TestParamInfo<PerTensorParam> &info) {
  const auto &[in, fp8, shape, copies] = info.param;
  return test::dtype_tag(in) + "_" + test::dtype_tag(fp8) + "_" + test::shape_tag(shape) + "_" +
         test::copies_tag(copies);
}

INSTANTIATE_TEST_SUITE_P(OddShapes, QuantizePerTensor,
                         ::testing::Combine(::testing::ValuesIn(test::kHighPrecisionTypes),
                                            ::testing::ValuesIn(test::kFp8Types),
                                            ::testing::Values(Shape{1, 1}, Shape{7, 33},
                                                              Shape{129, 257}, Shape{2, 3, 45},
                                                              Shape{0, 5}),
                                            ::testing::Values(Copies::kRowwise, Copies::kBoth,
                                                              Copies::kColumnwise)),
                         per_tensor_name);
INSTANTIATE_TEST_SUITE_P(Large, QuantizePerTensor,
                         ::testing::Values(PerTensorParam{kNVTEBFloat16, kNVTEFloat8E4M3,
                                                          Shape{1023, 4097}, Copies::kBoth}),
                         per_tensor_name);

// Outputs without the optional amax / scale_inv buffers are fine, and a scalar input works.
TEST(QuantizePerTensorOptional, NoAmaxNoScaleInvAndScalar) {
  TestTensor in({}, kNVTEFloat32);
  in.put(0, -300.0);
  TestTensor out({}, kNVTEFloat8E4M3);
  out.set_scale(2.0f);
  ASSERT_NVTE_OK(nvte_quantize(in, out, nullptr));
  EXPECT_EQ(out.bytes()[0], test::ref_fp8_encode(-600.0, kNVTEFloat8E4M3));  // saturates to -448
  EXPECT_EQ(out.bytes()[0], 0xFE);
}

// ------------------------------------------------------------------ MXFP8
using MxParam = std::tuple<NVTEDType, NVTEDType, Shape, Copies>;
class QuantizeMxfp8 : public ::testing::TestWithParam<MxParam> {};

// Checks data and E8M0 scales of an MXFP8 output against the references, for input values x.
void expect_mx_exact(const std::vector<double> &x, const Shape &shape, NVTEDType fp8, Copies copies,
                     TestTensor &out) {
  const size_t rows = test::rows_of(shape), cols = test::cols_of(shape);
  const test::RefEncoder encode(fp8);
  if (test::has_rowwise(copies)) {
    const size_t sc = test::ceil_div(cols, 32);
    std::vector<uint8_t> scales(rows * sc), data(rows * cols);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t b = 0; b < sc; ++b) {
        std::vector<double> blk;
        for (size_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c)
          blk.push_back(x[r * cols + c]);
        const uint8_t s = test::ref_e8m0_scale(test::ref_amax(blk), fp8);
        scales[r * sc + b] = s;
        for (size_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c)
          data[r * cols + c] = test::ref_mx_encode(encode, x[r * cols + c], s);
      }
    }
    EXPECT_TRUE(test::same_bytes(out.bytes(kNVTERowwiseScaleInv), scales.data(), scales.size()))
        << "row-wise scales";
    EXPECT_TRUE(test::same_bytes(out.bytes(), data.data(), data.size())) << "row-wise data";
  }
  if (test::has_colwise(copies)) {
    const size_t sr = test::ceil_div(rows, 32);
    std::vector<uint8_t> scales(sr * cols), data(rows * cols);
    for (size_t b = 0; b < sr; ++b) {
      for (size_t c = 0; c < cols; ++c) {
        std::vector<double> blk;
        for (size_t r = b * 32; r < std::min(rows, b * 32 + 32); ++r)
          blk.push_back(x[r * cols + c]);
        const uint8_t s = test::ref_e8m0_scale(test::ref_amax(blk), fp8);
        scales[b * cols + c] = s;
        for (size_t r = b * 32; r < std::min(rows, b * 32 + 32); ++r)
          data[r * cols + c] = test::ref_mx_encode(encode, x[r * cols + c], s);
      }
    }
    EXPECT_TRUE(test::same_bytes(out.bytes(kNVTEColumnwiseScaleInv), scales.data(), scales.size()))
        << "column-wise scales";
    EXPECT_TRUE(test::same_bytes(out.bytes(kNVTEColumnwiseData), data.data(), data.size()))
        << "column-wise data";
  }
}

TEST_P(QuantizeMxfp8, ScalesAndBytesExact) {
  const auto [in_dtype, fp8, shape, copies] = GetParam();
  const size_t cols = test::cols_of(shape);
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, in_dtype);
  // Magnitudes drift with position so neighbouring row and column blocks get different scales.
  const std::vector<double> x = test::fill_spread(in, rng, -6, 0, [&](size_t i) {
    return static_cast<int>((i / cols + 2 * (i % cols)) % 16) - 8;
  });
  TestTensor out = make_output(shape, fp8, NVTE_MXFP8_1D_SCALING, copies);
  test::poison(out, 0x5A);
  ASSERT_NVTE_OK(nvte_quantize(in, out, nullptr));
  expect_mx_exact(x, shape, fp8, copies, out);
}

std::string mx_name(const ::testing::TestParamInfo<MxParam> &info) {
  const auto &[in, fp8, shape, copies] = info.param;
  return test::dtype_tag(in) + "_" + test::dtype_tag(fp8) + "_" + test::shape_tag(shape) + "_" +
         test::copies_tag(copies);
}

INSTANTIATE_TEST_SUITE_P(
    OddShapes, QuantizeMxfp8,
    ::testing::Combine(::testing::ValuesIn(test::kHighPrecisionTypes),
                       ::testing::ValuesIn(test::kFp8Types),
                       ::testing::Values(Shape{1, 1}, Shape{7, 33}, Shape{64, 96}, Shape{129, 257},
                                         Shape{2, 33, 70}, Shape{0, 5}),
                       ::testing::Values(Copies::kRowwise, Copies::kColumnwise, Copies::kBoth)),
    mx_name);

// Block amaxes at the edges of the E8M0 rule, row-wise and column-wise, every FP8 format.
class QuantizeMxfp8Edges : public ::testing::TestWithParam<NVTEDType> {};

TEST_P(QuantizeMxfp8Edges, ScaleRuleAtTheEdges) {
  const NVTEDType fp8 = GetParam();
  const float m = static_cast<float>(test::fp8_spec(fp8).max);
  const float edge = std::ldexp(m, -127);  // amax / fp8_max == 2^-127 exactly: a normal float
  struct Row {
    float amax;
    uint8_t expected;
    const char *what;
  };
  const Row cases[] = {
      {m, 127, "amax == fp8_max -> 2^0"},
      {std::nextafter(m, INFINITY), 128, "just above fp8_max -> 2^1 (round up)"},
      {std::ldexp(m, 5), 132, "fp8_max * 2^5 -> 2^5"},
      {std::ldexp(m, -3) * 1.5f, 125, "1.5 * fp8_max / 8 -> 2^-2"},
      {edge, 0, "ratio exactly 2^-127 -> smallest scale"},
      // The ratio lies just above 2^-127; an fp32 quotient is subnormal there and would round onto
      // 2^-127, giving 0 instead of 1.
      {std::nextafter(edge, INFINITY), 1, "ratio just above 2^-127 -> 2^-126"},
      {std::ldexp(1.0f, -149), 0, "smallest subnormal -> clamps to 2^-127"},
      {FLT_MAX, static_cast<uint8_t>(127 + static_cast<int>(std::ceil(std::log2(FLT_MAX / m)))),
       "FLT_MAX"},
      {0.0f, 0, "all zeros -> 2^-127"},
      {INFINITY, 0xFE, "Inf saturates to 2^127"},
      {NAN, 0xFF, "NaN -> NaN scale"},
  };
  const size_t nrows = sizeof(cases) / sizeof(cases[0]);
  const Shape shape{nrows, 40};
  TestTensor in(shape, kNVTEFloat32);
  // Row r: its amax (signed alternately) in column 3, smaller values elsewhere in its first block,
  // and a quiet second block (columns 32..39).
  std::vector<double> x(nrows * 40);
  for (size_t r = 0; r < nrows; ++r) {
    for (size_t c = 0; c < 40; ++c) {
      const float a = cases[r].amax;
      double v = c < 32 ? (std::isfinite(a) ? a * (0.9 - 0.02 * c) : 0.25 * c) : 1.0 / (c + 1);
      if (c == 3) v = (r % 2 ? -1.0 : 1.0) * a;
      if (a == 0.0f && c < 32) v = 0.0;
      x[r * 40 + c] = static_cast<float>(v);
      in.put(r * 40 + c, x[r * 40 + c]);
    }
  }
  TestTensor out = make_output(shape, fp8, NVTE_MXFP8_1D_SCALING, Copies::kBoth);
  ASSERT_NVTE_OK(nvte_quantize(in, out, nullptr));
  for (size_t r = 0; r < nrows; ++r)
    EXPECT_EQ(out.bytes(kNVTERowwiseScaleInv)[r * 2], cases[r].expected) << cases[r].what;
  expect_mx_exact(x, shape, fp8, Copies::kBoth, out);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, QuantizeMxfp8Edges, ::testing::ValuesIn(test::kFp8Types),
                         [](const auto &info) { return test::dtype_tag(info.param); });

// ------------------------------------------------------------------ rejections
// Each bad call fails with the expected status and message, and leaves every output byte as it was.
class QuantizeRejects : public ::testing::Test {
 protected:
  void SetUp() override {
    in_.fill_uniform(rng_, -1, 1);
    out_.set_scale(1.0f);
    out_.set_amax();
    out_.set_scale_inv();
    test::poison(out_);
  }
  void expect_rejected(NVTEStatus status, std::initializer_list<const char *> needles) {
    test::Snapshot before(out_);
    const NVTEStatus st = nvte_quantize(in_, out_, nullptr);
    EXPECT_EQ(st, status) << nvte_get_last_error();
    const std::string msg = nvte_get_last_error();
    EXPECT_NE(msg.find("nvte_quantize"), std::string::npos) << msg;
    for (const char *n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "lacks '" << n << "': " << msg;
    EXPECT_TRUE(before.unchanged());
  }
  std::mt19937 rng_{7};
  TestTensor in_{{7, 33}, kNVTEBFloat16};
  TestTensor out_{{7, 33}, kNVTEFloat8E4M3};
};

TEST_F(QuantizeRejects, NullHandles) {
  EXPECT_NVTE_ERROR(nvte_quantize(nullptr, out_, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                    "NULL");
  EXPECT_NVTE_ERROR(nvte_quantize(in_, nullptr, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                    "NULL");
}
TEST_F(QuantizeRejects, NullInputData) {
  in_.set_null(kNVTERowwiseData, {7, 33}, kNVTEBFloat16);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'input'", "null"});
}
TEST_F(QuantizeRejects, InputDtype) {
  in_.set(kNVTERowwiseData, {7, 33}, kNVTEInt32);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'input'", "float32, float16, bfloat16", "int32"});
  in_.set(kNVTERowwiseData, {7, 33}, kNVTEFloat8E5M2);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'input'", "float8_e5m2"});
}
TEST_F(QuantizeRejects, OutputNotFp8) {
  out_.set(kNVTERowwiseData, {7, 33}, kNVTEBFloat16);
  test::poison(out_);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "FP8", "bfloat16"});
}
TEST_F(QuantizeRejects, NoOutputData) {
  out_.set_null(kNVTERowwiseData, {7, 33}, kNVTEFloat8E4M3);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "neither"});
}
TEST_F(QuantizeRejects, OutputShape) {
  out_.set(kNVTERowwiseData, {33, 7}, kNVTEFloat8E4M3);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "[7, 33]", "[33, 7]"});
}
TEST_F(QuantizeRejects, MissingOrBadScale) {
  out_.set_null(kNVTEScale, {1}, kNVTEFloat32);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "scale", "null"});
  out_.set(kNVTEScale, {1}, kNVTEFloat16);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "scale", "float16"});
  out_.set(kNVTEScale, {2}, kNVTEFloat32);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "scale", "[2]"});
}
TEST_F(QuantizeRejects, BadAmaxOrScaleInv) {
  out_.set(kNVTEAmax, {3}, kNVTEFloat32);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "amax", "[3]"});
  out_.set_amax();
  out_.set(kNVTERowwiseScaleInv, {1}, kNVTEBFloat16);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "scale_inv", "bfloat16"});
}
TEST_F(QuantizeRejects, TransposedCopyShapeAndDtype) {
  out_.set(kNVTEColumnwiseData, {7, 33}, kNVTEFloat8E4M3);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "transposed", "[33, 7]", "[7, 33]"});
  out_.set(kNVTEColumnwiseData, {33, 7}, kNVTEFloat8E5M2);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT,
                  {"'output'", "column-wise", "float8_e4m3", "float8_e5m2"});
}
TEST_F(QuantizeRejects, InvalidScalingMode) {
  TestTensor out({7, 33}, kNVTEFloat8E4M3, NVTE_INVALID_SCALING);
  out.set_scale(1.0f);
  EXPECT_NVTE_ERROR(nvte_quantize(in_, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                    "scaling mode", "100");
}
TEST_F(QuantizeRejects, Mxfp8ScaleInv) {
  TestTensor out({7, 33}, kNVTEFloat8E4M3, NVTE_MXFP8_1D_SCALING);
  test::Snapshot before(out);
  EXPECT_NVTE_ERROR(nvte_quantize(in_, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                    "row-wise E8M0 scale_inv", "null");
  out.set(kNVTERowwiseScaleInv, {7, 1}, kNVTEFloat8E8M0);
  EXPECT_NVTE_ERROR(nvte_quantize(in_, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "row-wise scale_inv shape", "[7, 2]", "[7, 1]");
  out.set(kNVTERowwiseScaleInv, {7, 2}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_quantize(in_, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "float8_e8m0",
                    "float32");
  out.set(kNVTERowwiseScaleInv, {7, 2}, kNVTEFloat8E8M0);
  out.set(kNVTEColumnwiseData, {7, 33}, kNVTEFloat8E4M3);
  out.set(kNVTEColumnwiseScaleInv, {7, 33}, kNVTEFloat8E8M0);
  EXPECT_NVTE_ERROR(nvte_quantize(in_, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "column-wise scale_inv shape", "[1, 33]", "[7, 33]");
  TestTensor bf({7, 33}, kNVTEBFloat16, NVTE_MXFP8_1D_SCALING);
  EXPECT_NVTE_ERROR(nvte_quantize(in_, bf, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                    "FP8");
}
TEST_F(QuantizeRejects, DeviceMixAndGpu) {
  in_.set_device(kNVTEDeviceGPU);
  expect_rejected(NVTE_ERROR_INVALID_ARGUMENT, {"'output'", "device", "gpu", "cpu"});
  out_.set_device(kNVTEDeviceGPU);
  expect_rejected(NVTE_ERROR_UNSUPPORTED, {"GPU", "tensors are on the GPU"});
}
TEST_F(QuantizeRejects, OverlappingBuffers) {
  // Output data placed inside the input buffer.
  NVTEBasicTensor bt{};
  bt.data_ptr = in_.bytes() + 8;
  bt.dtype = kNVTEFloat8E4M3;
  bt.shape.ndim = 2;
  bt.shape.data[0] = 7;
  bt.shape.data[1] = 33;
  NVTETensor h = out_.handle();
  ASSERT_NVTE_OK(nvte_set_tensor_param(&h, kNVTERowwiseData, &bt));
  const std::vector<uint8_t> in_before = in_.buffer().bytes;
  EXPECT_NVTE_ERROR(nvte_quantize(in_, out_, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output",
                    "overlap");
  EXPECT_EQ(in_.buffer().bytes, in_before);
}

}  // namespace
