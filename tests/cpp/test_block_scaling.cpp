// Float8BlockScaling (NVTE_BLOCK_SCALING_1D / _2D) through the public C API: nvte_quantize_v2's bytes,
// scales and GEMM_READY layouts against an independent oracle (scales from double arithmetic and
// frexp, bytes from the nearest-code search of cast_reference.h), nvte_dequantize, and the refusals.
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

constexpr size_t kN = 128;
size_t up4(size_t a) { return (a + 3) / 4 * 4; }

// [rows, cols] scale grid shapes (TE's Float8BlockQuantizer::get_scale_shape).
Shape scale_shape(size_t rows, size_t cols, bool two_d, bool colwise) {
  using test::ceil_div;
  if (two_d)
    return colwise ? Shape{ceil_div(cols, kN), up4(ceil_div(rows, kN))}
                   : Shape{ceil_div(rows, kN), up4(ceil_div(cols, kN))};
  return colwise ? Shape{ceil_div(rows, kN), up4(cols)} : Shape{ceil_div(cols, kN), up4(rows)};
}

double max_finite(NVTEDType in) {
  return in == kNVTEFloat16 ? 65504.0 : in == kNVTEBFloat16 ? 0x1.FEp127 : FLT_MAX;
}

// Oracle scale of a tile (TE's recipe): NaN elements ignored in the amax; eps floor; 0/Inf -> 1;
// fp8_max / amax correctly rounded to fp32 (double quotient then one rounding: exact for division),
// overflow -> the input dtype's max; pow2 = 2^floor(log2(scale)) by frexp.
float ref_scale(double amax, double eps, bool pow2, NVTEDType fp8, NVTEDType in) {
  if (amax < eps) amax = eps;
  if (amax == 0.0 || std::isinf(amax)) return 1.0f;
  float s = static_cast<float>(test::fp8_spec(fp8).max / amax);
  if (std::isinf(s)) s = static_cast<float>(max_finite(in));
  if (pow2) {
    int e;
    std::frexp(s, &e);
    s = static_cast<float>(std::ldexp(1.0, e - 1));
  }
  return s;
}

struct Ref {
  std::vector<uint8_t> q, qt;
  std::vector<float> s, st;
};

// Reference quantization of x ([rows, cols] row-major) into both GEMM_READY copies.
Ref reference(const std::vector<double> &x, size_t rows, size_t cols, bool two_d, NVTEDType fp8,
              NVTEDType in, double eps, bool pow2) {
  const test::RefEncoder encode(fp8);
  Ref r;
  r.q.assign(rows * cols, 0);
  r.qt.assign(rows * cols, 0);
  const Shape ss = scale_shape(rows, cols, two_d, false), st = scale_shape(rows, cols, two_d, true);
  r.s.assign(ss[0] * ss[1], 0.0f);
  r.st.assign(st[0] * st[1], 0.0f);
  // One tile: rows [r0, r1) x cols [c0, c1); `put_scale` records 1/scale.
  auto tile = [&](size_t r0, size_t r1, size_t c0, size_t c1, bool to_row, bool to_col,
                  auto &&put_scale) {
    double amax = 0.0;
    for (size_t i = r0; i < r1; ++i)
      for (size_t j = c0; j < c1; ++j)
        if (!std::isnan(x[i * cols + j])) amax = std::max(amax, std::fabs(x[i * cols + j]));
    const float scale = ref_scale(amax, eps, pow2, fp8, in);
    put_scale(static_cast<float>(1.0 / static_cast<double>(scale)));
    for (size_t i = r0; i < r1; ++i)
      for (size_t j = c0; j < c1; ++j) {
        const uint8_t b = encode(test::fp32_mul(x[i * cols + j], scale));
        if (to_row) r.q[i * cols + j] = b;
        if (to_col) r.qt[j * rows + i] = b;
      }
  };
  for (size_t rb = 0; rb * kN < rows; ++rb) {
    const size_t r0 = rb * kN, r1 = std::min(rows, r0 + kN);
    for (size_t kb = 0; kb * kN < cols; ++kb) {
      const size_t c0 = kb * kN, c1 = std::min(cols, c0 + kN);
      if (two_d) {
        tile(r0, r1, c0, c1, true, true, [&](float v) {
          r.s[rb * ss[1] + kb] = v;
          r.st[kb * st[1] + rb] = v;
        });
        continue;
      }
      for (size_t i = r0; i < r1; ++i)  // 1x128 tiles along the rows
        tile(i, i + 1, c0, c1, true, false, [&](float v) { r.s[kb * ss[1] + i] = v; });
      for (size_t j = c0; j < c1; ++j)  // 128x1 tiles down the columns
        tile(r0, r1, j, j + 1, false, true, [&](float v) { r.st[rb * st[1] + j] = v; });
    }
  }
  return r;
}

Shape transposed(const Shape &s) {
  Shape t{s.back()};
  t.insert(t.end(), s.begin(), s.end() - 1);
  return t;
}

TestTensor make_output(const Shape &shape, NVTEDType fp8, bool two_d, test::Copies copies) {
  const size_t rows = test::rows_of(shape), cols = test::cols_of(shape);
  TestTensor out(shape, fp8, two_d ? NVTE_BLOCK_SCALING_2D : NVTE_BLOCK_SCALING_1D);
  if (test::has_rowwise(copies))
    out.set(kNVTERowwiseScaleInv, scale_shape(rows, cols, two_d, false), kNVTEFloat32);
  else
    out.set_null(kNVTERowwiseData, shape, fp8);
  if (test::has_colwise(copies)) {
    out.set(kNVTEColumnwiseData, transposed(shape), fp8);
    out.set(kNVTEColumnwiseScaleInv, scale_shape(rows, cols, two_d, true), kNVTEFloat32);
  }
  return out;
}

struct Config {
  NVTEQuantizationConfig h = nvte_create_quantization_config();
  Config(float eps, bool pow2) {
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigAmaxEpsilon, &eps, sizeof eps);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigForcePow2Scales, &pow2,
                                           sizeof pow2);
  }
  ~Config() { nvte_destroy_quantization_config(h); }
};

void expect_exact(const std::vector<double> &x, const Shape &shape, NVTEDType in, NVTEDType fp8,
                  bool two_d, test::Copies copies, double eps, bool pow2, TestTensor &out) {
  const size_t rows = test::rows_of(shape), cols = test::cols_of(shape);
  const Ref r = reference(x, rows, cols, two_d, fp8, in, eps, pow2);
  if (test::has_rowwise(copies)) {
    EXPECT_TRUE(test::same_bytes(out.bytes(kNVTERowwiseData), r.q.data(), r.q.size())) << "row data";
    EXPECT_TRUE(test::same_bytes(out.bytes(kNVTERowwiseScaleInv),
                                 reinterpret_cast<const uint8_t *>(r.s.data()), 4 * r.s.size()))
        << "row-wise scale_inv (padding included: zeros)";
  }
  if (test::has_colwise(copies)) {
    EXPECT_TRUE(test::same_bytes(out.bytes(kNVTEColumnwiseData), r.qt.data(), r.qt.size()))
        << "column-wise (transposed) data";
    EXPECT_TRUE(test::same_bytes(out.bytes(kNVTEColumnwiseScaleInv),
                                 reinterpret_cast<const uint8_t *>(r.st.data()), 4 * r.st.size()))
        << "column-wise scale_inv";
  }
}

using Param = std::tuple<NVTEDType, NVTEDType, Shape, bool, test::Copies, bool>;
class BlockQuantize : public ::testing::TestWithParam<Param> {};

TEST_P(BlockQuantize, BytesAndScalesExact) {
  const auto [in_dtype, fp8, shape, two_d, copies, pow2] = GetParam();
  const size_t cols = test::cols_of(shape);
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, in_dtype);
  // Magnitudes drift with position so neighbouring tiles get different scales; a few tiles are
  // below eps below.
  const std::vector<double> x = test::fill_spread(in, rng, -8, 2, [&](size_t i) {
    return static_cast<int>((i / cols / 40 + 3 * (i % cols) / 100) % 12) - 6;
  });
  for (const float eps : {0.0f, 1.0f / 1024}) {
    TestTensor out = make_output(shape, fp8, two_d, copies);
    test::poison(out, 0x5A);
    Config cfg(eps, pow2);
    ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
    expect_exact(x, shape, in_dtype, fp8, two_d, copies, eps, pow2, out);
  }
}

std::string name(const ::testing::TestParamInfo<Param> &info) {
  const auto &[in, fp8, shape, two_d, copies, pow2] = info.param;
  return test::dtype_tag(in) + "_" + test::dtype_tag(fp8) + "_" + test::shape_tag(shape) +
         (two_d ? "_2d_" : "_1d_") + test::copies_tag(copies) + (pow2 ? "_pow2" : "_fp32");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BlockQuantize,
    ::testing::Combine(::testing::ValuesIn(test::kHighPrecisionTypes),
                       ::testing::Values(kNVTEFloat8E4M3, kNVTEFloat8E5M2),
                       ::testing::Values(Shape{1, 1}, Shape{3, 130}, Shape{129, 257},
                                         Shape{256, 128}, Shape{2, 3, 200}, Shape{300}),
                       ::testing::Bool(),
                       ::testing::Values(test::Copies::kRowwise, test::Copies::kColumnwise,
                                         test::Copies::kBoth),
                       ::testing::Bool()),
    name);

// Edge tiles: all zeros (scale 1), a subnormal-only tile (quotient overflows -> dtype max), Inf
// (scale 1, saturated bytes), NaN (ignored by the amax, encoded as NaN).
TEST(BlockQuantizeEdges, ZeroTinyInfNan) {
  for (const bool two_d : {false, true})
    for (const NVTEDType fp8 : {kNVTEFloat8E4M3, kNVTEFloat8E5M2})
      for (const bool pow2 : {false, true}) {
        const Shape shape{4, 512};
        TestTensor in(shape, kNVTEFloat32);
        std::vector<double> x(4 * 512, 0.0);
        for (size_t i = 0; i < 4; ++i) {
          x[i * 512 + 128 + i] = 1e-42;        // tile 1: subnormal amax
          x[i * 512 + 256] = INFINITY;         // tile 2: Inf
          x[i * 512 + 257] = 3.0;
          x[i * 512 + 384] = NAN;              // tile 3: NaN and a finite value
          x[i * 512 + 385] = -0.75;
        }
        for (size_t i = 0; i < x.size(); ++i) in.put(i, x[i]);
        TestTensor out = make_output(shape, fp8, two_d, test::Copies::kBoth);
        Config cfg(0.0f, pow2);
        ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
        expect_exact(x, shape, kNVTEFloat32, fp8, two_d, test::Copies::kBoth, 0.0, pow2, out);
      }
}

// nvte_quantize (no config) is nvte_quantize_v2 with eps 0 and fp32 scales.
TEST(BlockQuantizeEdges, DefaultConfig) {
  const Shape shape{130, 140};
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, kNVTEBFloat16);
  const std::vector<double> x = test::fill_spread(in, rng, -4, 4);
  TestTensor out = make_output(shape, kNVTEFloat8E4M3, false, test::Copies::kBoth);
  ASSERT_NVTE_OK(nvte_quantize(in, out, nullptr));
  expect_exact(x, shape, kNVTEBFloat16, kNVTEFloat8E4M3, false, test::Copies::kBoth, 0.0, false,
               out);
}

// Dequantize either copy: decode(q) * scale_inv of its tile in fp32, rounded once to the output.
TEST(BlockDequantize, EachCopyExact) {
  for (const bool two_d : {false, true})
    for (const bool colwise : {false, true})
      for (const NVTEDType od : test::kHighPrecisionTypes) {
        const Shape shape{3, 130, 260};
        const size_t rows = 390, cols = 260;
        std::mt19937 rng = test::test_rng();
        TestTensor in(shape, kNVTEFloat32);
        test::fill_spread(in, rng, -6, 6);
        TestTensor q = make_output(shape, kNVTEFloat8E5M2, two_d, test::Copies::kBoth);
        ASSERT_NVTE_OK(nvte_quantize(in, q, nullptr));
        TestTensor src(colwise ? transposed(shape) : shape, kNVTEFloat8E5M2,
                       two_d ? NVTE_BLOCK_SCALING_2D : NVTE_BLOCK_SCALING_1D);
        if (colwise) {
          src.set_null(kNVTERowwiseData, shape, kNVTEFloat8E5M2);
          src.set(kNVTEColumnwiseData, transposed(shape), kNVTEFloat8E5M2);
          src.buffer(kNVTEColumnwiseData).bytes = q.buffer(kNVTEColumnwiseData).bytes;
          src.set(kNVTEColumnwiseScaleInv, scale_shape(rows, cols, two_d, true), kNVTEFloat32);
          src.buffer(kNVTEColumnwiseScaleInv).bytes = q.buffer(kNVTEColumnwiseScaleInv).bytes;
        } else {
          src.buffer(kNVTERowwiseData).bytes = q.buffer(kNVTERowwiseData).bytes;
          src.set(kNVTERowwiseScaleInv, scale_shape(rows, cols, two_d, false), kNVTEFloat32);
          src.buffer(kNVTERowwiseScaleInv).bytes = q.buffer(kNVTERowwiseScaleInv).bytes;
        }
        TestTensor out(colwise ? transposed(shape) : shape, od);
        ASSERT_NVTE_OK(nvte_dequantize(src, out, nullptr));
        const NVTETensorParam dp = colwise ? kNVTEColumnwiseData : kNVTERowwiseData;
        const NVTETensorParam sp = colwise ? kNVTEColumnwiseScaleInv : kNVTERowwiseScaleInv;
        const Shape ss = scale_shape(rows, cols, two_d, colwise);
        std::vector<double> want(rows * cols);
        for (size_t i = 0; i < rows * cols; ++i) {
          // (r, c) in the original [rows, cols] view of stored element i.
          const size_t r = colwise ? i % rows : i / cols, c = colwise ? i / rows : i % cols;
          const size_t si = two_d ? (colwise ? (c / kN) * ss[1] + r / kN : (r / kN) * ss[1] + c / kN)
                                  : (colwise ? (r / kN) * ss[1] + c : (c / kN) * ss[1] + r);
          const float s = static_cast<float>(src.get(si, sp));
          want[i] = test::round_to(test::fp32_mul(src.get(i, dp), s), od);
        }
        EXPECT_TRUE(test::close(out.to_double(), want, test::Tol{0.0, 0.0}))
            << (two_d ? "2d " : "1d ") << (colwise ? "colwise " : "rowwise ") << test::dtype_tag(od);
      }
}

// ------------------------------------------------------------------ refusals
TEST(BlockQuantizeRejects, ShapesAndDtypes) {
  const Shape shape{7, 200};
  TestTensor in(shape, kNVTEBFloat16);
  {  // row-wise scale grid of the wrong shape (MXFP8-like, not transposed)
    TestTensor out(shape, kNVTEFloat8E4M3, NVTE_BLOCK_SCALING_1D);
    out.set(kNVTERowwiseScaleInv, {7, 2}, kNVTEFloat32);
    EXPECT_NVTE_ERROR(nvte_quantize(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                      "'output'", "row-wise scale_inv shape [2, 8]", "[7, 2]");
  }
  {  // scales must be fp32
    TestTensor out(shape, kNVTEFloat8E4M3, NVTE_BLOCK_SCALING_2D);
    out.set(kNVTERowwiseScaleInv, {1, 4}, kNVTEFloat8E8M0);
    EXPECT_NVTE_ERROR(nvte_quantize(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                      "float32");
  }
  {  // FNUZ formats are not block-scaled
    TestTensor out(shape, kNVTEFloat8E4M3FNUZ, NVTE_BLOCK_SCALING_1D);
    out.set(kNVTERowwiseScaleInv, {2, 8}, kNVTEFloat32);
    EXPECT_NVTE_ERROR(nvte_quantize(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                      "block scaling");
  }
  {  // column-wise copy must be transposed
    TestTensor out(shape, kNVTEFloat8E4M3, NVTE_BLOCK_SCALING_1D);
    out.set_null(kNVTERowwiseData, shape, kNVTEFloat8E4M3);
    out.set(kNVTEColumnwiseData, shape, kNVTEFloat8E4M3);
    out.set(kNVTEColumnwiseScaleInv, {1, 200}, kNVTEFloat32);
    EXPECT_NVTE_ERROR(nvte_quantize(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                      "column-wise (transposed) data of shape [200, 7]", "[7, 200]");
  }
  {  // dequantize: wrong grid
    TestTensor q(shape, kNVTEFloat8E4M3, NVTE_BLOCK_SCALING_2D);
    q.set(kNVTERowwiseScaleInv, {1, 2}, kNVTEFloat32);
    TestTensor out(shape, kNVTEFloat32);
    EXPECT_NVTE_ERROR(nvte_dequantize(q, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'input'",
                      "[1, 4]", "[1, 2]");
  }
}

}  // namespace
