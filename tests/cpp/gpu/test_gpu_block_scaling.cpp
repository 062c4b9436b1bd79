// GPU kernels of Float8BlockScaling quantize (NVTE_BLOCK_SCALING_1D / _2D, cast/block_quantize.cu)
// against the CPU kernel, bit for bit: FP8 bytes of both copies and both fp32 scale_inv grids,
// padding included, over shape classes (tiny, ragged, aligned, 3-D, 1-D, empty), both FP8 dtypes,
// 1x128 and 128x128 tiles, power-of-2 scales and amax_epsilon, and edge tiles (zeros, subnormals,
// Inf, NaN). The CPU kernel's own bytes are checked against an fp64 reference in
// tests/cpp/test_block_scaling.cpp. Skipped without a GPU device.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "cast_reference.h"
#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/cast.h"

namespace {

using test::Copies;
using test::GpuTensor;
using test::Shape;
using test::TestTensor;

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
size_t round_up4(size_t a) { return (a + 3) / 4 * 4; }

// TE's GEMM_READY scale grids (block_scale.h).
Shape scale_shape(size_t rows, size_t cols, bool two_d, bool colwise) {
  if (two_d)
    return colwise ? Shape{ceil_div(cols, 128), round_up4(ceil_div(rows, 128))}
                   : Shape{ceil_div(rows, 128), round_up4(ceil_div(cols, 128))};
  return colwise ? Shape{ceil_div(rows, 128), round_up4(cols)}
                 : Shape{ceil_div(cols, 128), round_up4(rows)};
}

Shape transposed(const Shape &s) {
  Shape t{s.back()};
  t.insert(t.end(), s.begin(), s.end() - 1);
  return t;
}

// Output with the copies asked for, every byte poisoned: each one must be written (the scale
// padding too), and written alike on both devices.
TestTensor make_output(const Shape &shape, NVTEDType fp8, bool two_d, Copies copies) {
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
  test::poison(out, 0x5A);
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

// Quantizes `in` on both devices with (eps, pow2) and compares every output buffer.
void expect_same(const TestTensor &in, const Shape &shape, NVTEDType fp8, bool two_d,
                 Copies copies, float eps, bool pow2) {
  TestTensor out = make_output(shape, fp8, two_d, copies);
  TestTensor gout = make_output(shape, fp8, two_d, copies);
  GpuTensor d_in(in), d_out(gout);
  Config cfg(eps, pow2);
  ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
  ASSERT_NVTE_OK(nvte_quantize_v2(d_in, d_out, cfg.h, nullptr));
  d_out.download_all(gout);
  EXPECT_TRUE(test::same_buffers(gout, out)) << "eps " << eps << (pow2 ? ", pow2" : ", fp32");
}

using Param = std::tuple<NVTEDType, NVTEDType, Shape, bool, Copies>;
class BlockQuantizeGpu : public ::testing::TestWithParam<Param> {};

TEST_P(BlockQuantizeGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [in_dtype, fp8, shape, two_d, copies] = GetParam();
  const size_t cols = test::cols_of(shape);
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, in_dtype);
  // Magnitudes drift with position, so neighbouring tiles get different scales and some tiles
  // fall below the epsilon used in the second run.
  test::fill_spread(in, rng, -8, 2, [&](size_t i) {
    return static_cast<int>((i / cols / 40 + 3 * (i % cols) / 100) % 12) - 6;
  });
  expect_same(in, shape, fp8, two_d, copies, 0.0f, false);
  expect_same(in, shape, fp8, two_d, copies, 1.0f / 1024, true);
}

std::string name(const ::testing::TestParamInfo<Param> &info) {
  const auto &[in, fp8, shape, two_d, copies] = info.param;
  return test::dtype_tag(in) + "_" + test::dtype_tag(fp8) + "_" + test::shape_tag(shape) +
         (two_d ? "_2d_" : "_1d_") + test::copies_tag(copies);
}

// Tiny, ragged in both dims (scale padding), aligned, 3-D, 1-D, empty, and several 128x128 blocks
// with a partial last one.
INSTANTIATE_TEST_SUITE_P(
    Shapes, BlockQuantizeGpu,
    ::testing::Combine(::testing::ValuesIn(test::kHighPrecisionTypes),
                       ::testing::Values(kNVTEFloat8E4M3, kNVTEFloat8E5M2),
                       ::testing::Values(Shape{1, 1}, Shape{3, 130}, Shape{129, 257},
                                         Shape{256, 128}, Shape{2, 3, 200}, Shape{300},
                                         Shape{0, 5}),
                       ::testing::Bool(),
                       ::testing::Values(Copies::kRowwise, Copies::kColumnwise, Copies::kBoth)),
    name);

// Edge tiles: all zeros (scale 1), subnormal-only (fp8_max / amax overflows: the input dtype's
// max), Inf (scale 1, saturated bytes), NaN (ignored by the amax, encoded as NaN), a tile below
// epsilon.
TEST(BlockQuantizeGpuEdges, ZeroTinyInfNan) {
  SKIP_WITHOUT_GPU();
  for (const NVTEDType in_dtype : test::kHighPrecisionTypes)
    for (const bool two_d : {false, true})
      for (const NVTEDType fp8 : {kNVTEFloat8E4M3, kNVTEFloat8E5M2}) {
        const Shape shape{130, 512};
        TestTensor in(shape, in_dtype);
        std::mt19937 rng = test::test_rng();
        test::fill_spread(in, rng, -4, 4);
        for (size_t r = 0; r < 130; ++r) {
          for (size_t c = 0; c < 128; ++c) in.put(r * 512 + c, 0.0);                 // zeros
          for (size_t c = 128; c < 256; ++c) in.put(r * 512 + c, 1e-40 * (c % 3));  // subnormal
        }
        in.put(5 * 512 + 300, INFINITY);
        in.put(7 * 512 + 301, -INFINITY);
        in.put(9 * 512 + 400, NAN);
        in.put(129 * 512 + 511, NAN);
        for (const bool pow2 : {false, true}) {
          expect_same(in, shape, fp8, two_d, Copies::kBoth, 0.0f, pow2);
          expect_same(in, shape, fp8, two_d, Copies::kBoth, 1e-3f, pow2);
        }
      }
}

// nvte_quantize without a config is nvte_quantize_v2 with the defaults on the GPU too.
TEST(BlockQuantizeGpuDefaults, NoConfig) {
  SKIP_WITHOUT_GPU();
  const Shape shape{200, 300};
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, kNVTEBFloat16);
  test::fill_spread(in, rng, -10, 10);
  for (const bool two_d : {false, true}) {
    TestTensor out = make_output(shape, kNVTEFloat8E4M3, two_d, Copies::kBoth);
    TestTensor gout = make_output(shape, kNVTEFloat8E4M3, two_d, Copies::kBoth);
    GpuTensor d_in(in), d_out(gout);
    ASSERT_NVTE_OK(nvte_quantize(in, out, nullptr));
    ASSERT_NVTE_OK(nvte_quantize(d_in, d_out, nullptr));
    d_out.download_all(gout);
    EXPECT_TRUE(test::same_buffers(gout, out)) << (two_d ? "2d" : "1d");
  }
}

// More 1x128 row tiles (33,000) than the capped grid covers in one step (4096 blocks x 8 tile
// groups), so the row-wise kernel's block-uniform grid-stride loop runs a second iteration.
TEST(BlockQuantizeGpuLarge, RowTilesPastOneGridStep) {
  SKIP_WITHOUT_GPU();
  const Shape shape{33000, 4};
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, kNVTEBFloat16);
  test::fill_spread(in, rng, -12, 12);
  expect_same(in, shape, kNVTEFloat8E4M3, false, Copies::kBoth, 0.0f, false);
}

// ---------------------------------------------------------------- dequantize
// Quantizes `in` on the CPU into the one copy asked for, then dequantizes that copy (as stored:
// the column-wise copy transposed) on both devices into `odt`, byte for byte.
void expect_same_dequantize(const TestTensor &in, const Shape &shape, NVTEDType fp8, bool two_d,
                            Copies copy, bool pow2, NVTEDType odt) {
  TestTensor q = make_output(shape, fp8, two_d, copy);
  Config cfg(0.0f, pow2);
  ASSERT_NVTE_OK(nvte_quantize_v2(in, q, cfg.h, nullptr));
  const Shape oshape = copy == Copies::kRowwise ? shape : transposed(shape);
  TestTensor out(oshape, odt), gout(oshape, odt);
  // Poisoned differently, so an unwritten element cannot match by accident (an empty output's
  // one placeholder byte is never written: alike there).
  test::poison(out, 0x5A);
  test::poison(gout, test::numel_of(oshape) ? 0xA5 : 0x5A);
  GpuTensor d_q(q), d_out(gout);
  ASSERT_NVTE_OK(nvte_dequantize(q, out, nullptr));
  ASSERT_NVTE_OK(nvte_dequantize(d_q, d_out, nullptr));
  d_out.download_all(gout);
  EXPECT_TRUE(test::same_buffers(gout, out))
      << test::dtype_tag(odt) << (pow2 ? " pow2" : " fp32") << " " << test::copies_tag(copy);
}

using DqParam = std::tuple<NVTEDType, Shape, bool, Copies, NVTEDType>;
class BlockDequantizeGpu : public ::testing::TestWithParam<DqParam> {};

// Both scale layouts of both copies (GEMM_READY grids, padding read past), fp32 and power-of-2
// scales, into each output dtype.
TEST_P(BlockDequantizeGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [fp8, shape, two_d, copy, odt] = GetParam();
  const size_t cols = test::cols_of(shape);
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, kNVTEFloat32);
  test::fill_spread(in, rng, -8, 2, [&](size_t i) {
    return static_cast<int>((i / cols / 40 + 3 * (i % cols) / 100) % 12) - 6;
  });
  for (const bool pow2 : {false, true})
    expect_same_dequantize(in, shape, fp8, two_d, copy, pow2, odt);
}

std::string dq_name(const ::testing::TestParamInfo<DqParam> &info) {
  const auto &[fp8, shape, two_d, copy, odt] = info.param;
  return test::dtype_tag(fp8) + "_" + test::shape_tag(shape) + (two_d ? "_2d_" : "_1d_") +
         test::copies_tag(copy) + "_to_" + test::dtype_tag(odt);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BlockDequantizeGpu,
    ::testing::Combine(::testing::Values(kNVTEFloat8E4M3, kNVTEFloat8E5M2),
                       ::testing::Values(Shape{1, 1}, Shape{3, 130}, Shape{129, 257},
                                         Shape{256, 128}, Shape{2, 3, 200}, Shape{0, 5}),
                       ::testing::Bool(),
                       ::testing::Values(Copies::kRowwise, Copies::kColumnwise),
                       ::testing::ValuesIn(test::kHighPrecisionTypes)),
    dq_name);

// Edge tiles: zeros, subnormal-only tiles (scale_inv itself subnormal: 1 / FLT_MAX), Inf
// (saturated codes) and NaN codes (the CPU's quiet NaN in every output dtype).
TEST(BlockDequantizeGpuEdges, ZeroTinyInfNan) {
  SKIP_WITHOUT_GPU();
  const Shape shape{130, 512};
  TestTensor in(shape, kNVTEFloat32);
  std::mt19937 rng = test::test_rng();
  test::fill_spread(in, rng, -4, 4);
  for (size_t r = 0; r < 130; ++r) {
    for (size_t c = 0; c < 128; ++c) in.put(r * 512 + c, 0.0);
    for (size_t c = 128; c < 256; ++c) in.put(r * 512 + c, 1e-40 * (c % 3));
  }
  in.put(5 * 512 + 300, INFINITY);
  in.put(7 * 512 + 301, -INFINITY);
  in.put(9 * 512 + 400, NAN);
  in.put(129 * 512 + 511, -NAN);
  for (const NVTEDType fp8 : {kNVTEFloat8E4M3, kNVTEFloat8E5M2})
    for (const bool two_d : {false, true})
      for (const Copies copy : {Copies::kRowwise, Copies::kColumnwise})
        for (const NVTEDType odt : test::kHighPrecisionTypes)
          expect_same_dequantize(in, shape, fp8, two_d, copy, false, odt);
}

}  // namespace
