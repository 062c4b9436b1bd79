// GPU kernels of NVFP4 quantize (NVTE_NVFP4_1D_SCALING, cast/nvfp4_quantize.cu) against the CPU
// kernel, bit for bit: packed E2M1 bytes of both copies, both E4M3 scale grids (padding included)
// and the amaxes, over shape classes (tiny, ragged, aligned, 3-D, past 128 rows of scale padding,
// empty), 1x16 and 16x16 blocks, the column-wise RHT, stochastic rounding, row-scaled amaxes and
// 4over6 (MAE / MSE, exact / fast-math errors, E4M3 max 448 / 256), plus inputs with NaN / Inf /
// zeros. The CPU kernel's own bytes are checked against TE's reference rules in
// tests/cpp/test_nvfp4.cpp and test_nvfp4_4over6.cpp. Skipped without a GPU device.
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

size_t up(size_t a, size_t m) { return (a + m - 1) / m * m; }
Shape scale_shape(size_t rows, size_t cols) { return {up(rows, 128), up((cols + 15) / 16, 4)}; }
Shape transposed(const Shape &s) {
  Shape t{s.back()};
  t.insert(t.end(), s.begin(), s.end() - 1);
  return t;
}
Shape packed(Shape s) {
  s.back() /= 2;
  return s;
}

// Quantization options of one case. 4over6: MAE with exact errors and E4M3 max 448; MSE with
// fast-math errors and 256; MAE, 256, row-scaled.
enum class Opt {
  kPlain, kStochastic, kRht, kRhtStochastic, kRowScaled, kFosMae, kFosMseFast256, kFosRowScaled
};
const char *opt_tag(Opt o) {
  switch (o) {
    case Opt::kPlain: return "plain";
    case Opt::kStochastic: return "sr";
    case Opt::kRht: return "rht";
    case Opt::kRhtStochastic: return "rht_sr";
    case Opt::kRowScaled: return "rowscaled";
    case Opt::kFosMae: return "4over6_mae";
    case Opt::kFosMseFast256: return "4over6_mse_fast_256";
    default: return "4over6_rowscaled";
  }
}
bool is_row_scaled(Opt o) { return o == Opt::kRowScaled || o == Opt::kFosRowScaled; }
bool is_rht(Opt o) { return o == Opt::kRht || o == Opt::kRhtStochastic; }
uint8_t fos_mode(Opt o) {
  if (o == Opt::kFosMae || o == Opt::kFosRowScaled) return kNVTENVFP44Over6MinMAE;
  return o == Opt::kFosMseFast256 ? kNVTENVFP44Over6MinMSE : kNVTENVFP44Over6Disabled;
}
int32_t e4m3_max(Opt o) { return o == Opt::kFosMseFast256 || o == Opt::kFosRowScaled ? 256 : 448; }

struct Config {
  NVTEQuantizationConfig h = nvte_create_quantization_config();
  TestTensor rng{{2}, kNVTEInt64};  // host memory, as the API requires
  NVTETensor rng_h;
  Config(bool two_d, Opt o) {
    const bool rht = is_rht(o);
    const bool sr = o == Opt::kStochastic || o == Opt::kRhtStochastic;
    const uint8_t mode = fos_mode(o);
    const bool fast = o == Opt::kFosMseFast256;
    const uint32_t mask = 0xD7E8;  // TE's wgrad sign vector
    rng.put(0, 12345.0, kNVTERowwiseData);
    rng.put(1, 7.0, kNVTERowwiseData);
    rng_h = rng;
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigNVFP42DQuantization, &two_d,
                                           1);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigNVFP4RHT, &rht, 1);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigNVFP4RHTSignMask, &mask, 4);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigStochasticRounding, &sr, 1);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigRNGState, &rng_h,
                                           sizeof rng_h);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigNVFP44Over6Mode, &mode, 1);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigNVFP44Over6ErrUseFastMath,
                                           &fast, 1);
  }
  ~Config() { nvte_destroy_quantization_config(h); }
};

// Tensor properties, not buffers: set on the host output and on its GPU copy alike.
void set_properties(NVTETensor t, Opt o) {
  const uint8_t rs = is_row_scaled(o);
  const int32_t em = e4m3_max(o);
  ASSERT_EQ(nvte_set_tensor_param_v2(t, kNVTERowScaledNVFP4, &rs, 1), NVTE_SUCCESS);
  ASSERT_EQ(nvte_set_tensor_param_v2(t, kNVTENVFP4E4M3Max, &em, 4), NVTE_SUCCESS);
}

// Output with the copies asked for, every byte poisoned: each one must be written (scale padding
// and amaxes too), and written alike on both devices.
TestTensor make_output(const Shape &shape, Copies copies, Opt o) {
  const bool row_scaled = is_row_scaled(o);
  const size_t rows = test::rows_of(shape), cols = test::cols_of(shape);
  TestTensor out(packed(shape), kNVTEByte, NVTE_NVFP4_1D_SCALING);
  if (test::has_rowwise(copies)) {
    out.set(kNVTERowwiseScaleInv, scale_shape(rows, cols), kNVTEFloat8E4M3);
    out.set(kNVTEAmax, {row_scaled ? rows : 1}, kNVTEFloat32);
  } else {
    out.set_null(kNVTERowwiseData, packed(shape), kNVTEByte);
  }
  if (test::has_colwise(copies)) {
    out.set(kNVTEColumnwiseData, packed(transposed(shape)), kNVTEByte);
    out.set(kNVTEColumnwiseScaleInv, scale_shape(cols, rows), kNVTEFloat8E4M3);
    out.set(kNVTEColumnwiseAmax, {row_scaled ? cols : 1}, kNVTEFloat32);
  }
  set_properties(out, o);
  test::poison(out, 0x5A);
  return out;
}

void expect_same(const TestTensor &in, const Shape &shape, Copies copies, bool two_d, Opt o) {
  TestTensor out = make_output(shape, copies, o);
  TestTensor gout = make_output(shape, copies, o);
  GpuTensor d_in(in), d_out(gout);
  set_properties(d_out, o);
  Config cfg(two_d, o);
  ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
  ASSERT_NVTE_OK(nvte_quantize_v2(d_in, d_out, cfg.h, nullptr));
  d_out.download_all(gout);
  EXPECT_TRUE(test::same_buffers(gout, out));
}

using Param = std::tuple<NVTEDType, Shape, Copies, bool, Opt>;
class Nvfp4QuantizeGpu : public ::testing::TestWithParam<Param> {};

TEST_P(Nvfp4QuantizeGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [in_dtype, shape, copies, two_d, o] = GetParam();
  const size_t cols = test::cols_of(shape);
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, in_dtype);
  // Magnitudes drift with position, so blocks get different E4M3 scales and some underflow.
  test::fill_spread(in, rng, -6, 3, [&](size_t i) {
    return static_cast<int>((i / cols / 7 + (i % cols) / 20) % 16) - 8;
  });
  expect_same(in, shape, copies, two_d, o);
}

std::string name(const ::testing::TestParamInfo<Param> &info) {
  const auto &[in, shape, copies, two_d, o] = info.param;
  return test::dtype_tag(in) + "_" + test::shape_tag(shape) + "_" + test::copies_tag(copies) +
         (two_d ? "_2d_" : "_1d_") + opt_tag(o);
}

// Every valid combination (none may skip under gpusim): the RHT only where a column-wise copy
// exists and the rows divide by 16, row scaling only with a row-wise copy and 1x16 blocks.
// (4over6 with stochastic rounding is refused by TE.)
std::vector<Param> params() {
  // Tiny, ragged (rows not a multiple of 16, last block short), aligned, 3-D, past 128 rows (a
  // second 128-row band of the padded scale grid), empty.
  const Shape shapes[] = {{2, 2}, {6, 34}, {32, 64}, {2, 8, 18}, {144, 36}, {0, 4}};
  std::vector<Param> v;
  for (const NVTEDType t : test::kHighPrecisionTypes)
    for (const Shape &s : shapes)
      for (const Copies c : {Copies::kRowwise, Copies::kColumnwise, Copies::kBoth})
        for (const bool two_d : {false, true})
          for (const Opt o : {Opt::kPlain, Opt::kStochastic, Opt::kRht, Opt::kRhtStochastic,
                              Opt::kRowScaled, Opt::kFosMae, Opt::kFosMseFast256,
                              Opt::kFosRowScaled}) {
            if (is_rht(o) && (!test::has_colwise(c) || test::rows_of(s) % 16 != 0)) continue;
            if (is_row_scaled(o) && (!test::has_rowwise(c) || two_d)) continue;
            v.emplace_back(t, s, c, two_d, o);
          }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Nvfp4QuantizeGpu, ::testing::ValuesIn(params()), name);

// NaN, +-Inf, zeros and a zero block: NaN-sticky amaxes (global and per row), E4M3 NaN scales,
// code 0 for NaN elements, saturation.
TEST(Nvfp4QuantizeGpuEdges, NanInfZeros) {
  SKIP_WITHOUT_GPU();
  const Shape shape{48, 64};
  for (const NVTEDType t : test::kHighPrecisionTypes)
    for (const bool two_d : {false, true})
      for (const Opt o : {Opt::kPlain, Opt::kRht, Opt::kRowScaled, Opt::kFosMae,
                          Opt::kFosMseFast256}) {
        if (is_row_scaled(o) && two_d) continue;
        for (const int special : {0, 1, 2}) {  // zeros only, + Inf, + NaN
          std::mt19937 rng = test::test_rng();
          TestTensor in(shape, t);
          test::fill_spread(in, rng, -4, 4);
          for (size_t c = 0; c < 16; ++c)
            for (size_t r = 0; r < 16; ++r) in.put(r * 64 + c, 0.0);  // one zero 16x16 block
          if (special >= 1) {
            in.put(20 * 64 + 3, INFINITY);
            in.put(33 * 64 + 40, -INFINITY);
          }
          if (special == 2) in.put(40 * 64 + 17, NAN);
          SCOPED_TRACE(std::string(test::dtype_tag(t)) + (two_d ? " 2d " : " 1d ") + opt_tag(o) +
                       " special " + std::to_string(special));
          expect_same(in, shape, Copies::kBoth, two_d, o);
        }
      }
}

// TE keeps the stochastic-rounding state (seed, offset) in a CUDA tensor: a GPU-resident rng_state
// is read by the kernel and draws the same stream as the host one the CPU reads. A cpu output
// cannot take a device-memory state.
TEST(Nvfp4QuantizeGpuRng, StateInDeviceMemory) {
  SKIP_WITHOUT_GPU();
  const Shape shape{32, 48};
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, kNVTEBFloat16);
  test::fill_spread(in, rng, -6, 6);
  for (const bool two_d : {false, true})
    for (const Opt o : {Opt::kStochastic, Opt::kRhtStochastic}) {
      SCOPED_TRACE(std::string(two_d ? "2d " : "1d ") + opt_tag(o));
      TestTensor out = make_output(shape, Copies::kBoth, o);
      TestTensor gout = make_output(shape, Copies::kBoth, o);
      GpuTensor d_in(in), d_out(gout);
      set_properties(d_out, o);
      Config cfg(two_d, o);  // host state, for the CPU run
      ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
      Config dcfg(two_d, o);
      GpuTensor d_rng(dcfg.rng);
      NVTETensor d_rng_h = d_rng;
      nvte_set_quantization_config_attribute(dcfg.h, kNVTEQuantizationConfigRNGState, &d_rng_h,
                                             sizeof d_rng_h);
      ASSERT_NVTE_OK(nvte_quantize_v2(d_in, d_out, dcfg.h, nullptr));
      d_out.download_all(gout);
      EXPECT_TRUE(test::same_buffers(gout, out));
      TestTensor cpu_out = make_output(shape, Copies::kBoth, o);
      EXPECT_NVTE_ERROR(nvte_quantize_v2(in, cpu_out, dcfg.h, nullptr),
                        NVTE_ERROR_INVALID_ARGUMENT, "'config'", "host memory", "gpu");
    }
}

// kNVTEQuantizationConfigNVFP4AmaxGiven: both kernels read the amaxes already in the output (a
// reduced amax: here larger and smaller than the tensor's own, the column-wise one apart) and
// leave them; bytes, scales and amaxes as the CPU's (whose bytes test_nvfp4.cpp checks against
// its oracle).
TEST(Nvfp4QuantizeGpuAmaxGiven, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const Shape shape{64, 96};
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, kNVTEBFloat16);
  test::fill_spread(in, rng, -6, 6);
  const bool given = true;
  for (const bool two_d : {false, true})
    for (const Opt o : {Opt::kPlain, Opt::kRht, Opt::kStochastic})
      for (const float row_amax : {1.0e4f, 2.0f}) {
        SCOPED_TRACE(std::string(two_d ? "2d " : "1d ") + opt_tag(o) + " amax " +
                     std::to_string(row_amax));
        TestTensor out = make_output(shape, Copies::kBoth, o);
        TestTensor gout = make_output(shape, Copies::kBoth, o);
        for (TestTensor *t : {&out, &gout}) {
          t->f32(kNVTEAmax)[0] = row_amax;
          t->f32(kNVTEColumnwiseAmax)[0] = 3.0f * row_amax;
        }
        GpuTensor d_in(in), d_out(gout);
        set_properties(d_out, o);
        Config cfg(two_d, o);
        ASSERT_NVTE_OK(nvte_set_quantization_config_attribute(
            cfg.h, kNVTEQuantizationConfigNVFP4AmaxGiven, &given, 1));
        ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
        ASSERT_NVTE_OK(nvte_quantize_v2(d_in, d_out, cfg.h, nullptr));
        d_out.download_all(gout);
        EXPECT_TRUE(test::same_buffers(gout, out));
        EXPECT_EQ(gout.f32(kNVTEAmax)[0], row_amax);
        EXPECT_EQ(gout.f32(kNVTEColumnwiseAmax)[0], 3.0f * row_amax);
      }
}

// ---------------------------------------------------------------- dequantize
// Quantizes `in` on the CPU into the one copy asked for with options `o`, then dequantizes that
// copy (as stored: the column-wise copy transposed) on both devices into `odt`, byte for byte.
void expect_same_dequantize(const TestTensor &in, const Shape &shape, Copies copy, bool two_d,
                            Opt o, NVTEDType odt) {
  TestTensor q = make_output(shape, copy, o);
  Config cfg(two_d, o);
  ASSERT_NVTE_OK(nvte_quantize_v2(in, q, cfg.h, nullptr));
  const Shape oshape = copy == Copies::kRowwise ? shape : transposed(shape);
  TestTensor out(oshape, odt), gout(oshape, odt);
  // Poisoned differently, so an unwritten element cannot match by accident (an empty output's
  // one placeholder byte is never written: alike there).
  test::poison(out, 0x5A);
  test::poison(gout, test::numel_of(oshape) ? 0xA5 : 0x5A);
  GpuTensor d_q(q), d_out(gout);
  set_properties(d_q, o);
  ASSERT_NVTE_OK(nvte_dequantize(q, out, nullptr));
  ASSERT_NVTE_OK(nvte_dequantize(d_q, d_out, nullptr));
  d_out.download_all(gout);
  EXPECT_TRUE(test::same_buffers(gout, out));
}

using DqParam = std::tuple<NVTEDType, Shape, Copies, bool, Opt>;
class Nvfp4DequantizeGpu : public ::testing::TestWithParam<DqParam> {};

// 1x16 and 16x16 blocks, both copies (the column-wise one RHT'd where the rows allow), row-scaled
// amaxes and 4over6's E4M3 bound of 256, into each output dtype.
TEST_P(Nvfp4DequantizeGpu, MatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [odt, shape, copy, two_d, o] = GetParam();
  const size_t cols = test::cols_of(shape);
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, kNVTEFloat32);
  test::fill_spread(in, rng, -6, 3, [&](size_t i) {
    return static_cast<int>((i / cols / 7 + (i % cols) / 20) % 16) - 8;
  });
  SCOPED_TRACE(opt_tag(o));
  expect_same_dequantize(in, shape, copy, two_d, o, odt);
}

std::vector<DqParam> dq_params() {
  const Shape shapes[] = {{2, 2}, {6, 34}, {32, 64}, {2, 8, 18}, {144, 36}, {0, 4}};
  std::vector<DqParam> v;
  for (const NVTEDType t : test::kHighPrecisionTypes)
    for (const Shape &s : shapes)
      for (const Copies c : {Copies::kRowwise, Copies::kColumnwise})
        for (const bool two_d : {false, true})
          for (const Opt o : {Opt::kPlain, Opt::kRht, Opt::kRowScaled, Opt::kFosMseFast256,
                              Opt::kFosRowScaled}) {
            if (is_rht(o) && (c != Copies::kColumnwise || test::rows_of(s) % 16 != 0)) continue;
            if (is_row_scaled(o) && (c != Copies::kRowwise || two_d)) continue;
            v.emplace_back(t, s, c, two_d, o);
          }
  return v;
}

std::string dq_name(const ::testing::TestParamInfo<DqParam> &info) {
  const auto &[odt, shape, copy, two_d, o] = info.param;
  return "to_" + test::dtype_tag(odt) + "_" + test::shape_tag(shape) + "_" +
         test::copies_tag(copy) + (two_d ? "_2d_" : "_1d_") + opt_tag(o);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Nvfp4DequantizeGpu, ::testing::ValuesIn(dq_params()), dq_name);

// NaN / Inf / zero blocks: a NaN amax or E4M3 NaN scale dequantizes to the CPU's quiet NaN.
TEST(Nvfp4DequantizeGpuEdges, NanInfZeros) {
  SKIP_WITHOUT_GPU();
  const Shape shape{48, 64};
  for (const int special : {0, 1, 2}) {  // zeros only, + Inf, + NaN
    std::mt19937 rng = test::test_rng();
    TestTensor in(shape, kNVTEFloat32);
    test::fill_spread(in, rng, -4, 4);
    for (size_t c = 0; c < 16; ++c)
      for (size_t r = 0; r < 16; ++r) in.put(r * 64 + c, 0.0);
    if (special >= 1) {
      in.put(20 * 64 + 3, INFINITY);
      in.put(33 * 64 + 40, -INFINITY);
    }
    if (special == 2) in.put(40 * 64 + 17, NAN);
    for (const Opt o : {Opt::kPlain, Opt::kRowScaled})
      for (const NVTEDType odt : test::kHighPrecisionTypes) {
        SCOPED_TRACE(std::string(opt_tag(o)) + " special " + std::to_string(special));
        expect_same_dequantize(in, shape, Copies::kRowwise, false, o, odt);
        if (o == Opt::kPlain) expect_same_dequantize(in, shape, Copies::kColumnwise, true, o, odt);
      }
  }
}

}  // namespace
