// NVFP4 (NVTE_NVFP4_1D_SCALING) through the public C API against an independent oracle: E2M1 codes
// by nearest-grid search in double (ties to the even code), the two-level scale evaluated with
// fp32 steps built from exact double operations, E4M3 by the RefEncoder search, the Hadamard
// transform as a double sum; bytes, scales (padding included) and amaxes compared bit for bit.
// Stochastic rounding: determinism, neighbour codes only, unbiasedness.
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

constexpr double kGrid[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
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
float f32(double v) { return static_cast<float>(v); }  // one IEEE rounding

// Nearest E2M1 code (ties to the even code), sign bit 8 for v < 0; NaN -> 0.
uint8_t ref_e2m1(double v) {
  if (std::isnan(v)) return 0;
  const double a = std::min(std::fabs(v), 6.0);
  int best = 0;
  for (int k = 1; k < 8; ++k) {
    const double d = std::fabs(a - kGrid[k]), db = std::fabs(a - kGrid[best]);
    if (d < db || (d == db && k % 2 == 0)) best = k;
  }
  return static_cast<uint8_t>(v < 0 ? best | 8 : best);
}

struct Global {
  float enc, dec, mult;
};
// TE's per-tensor scale: 2688 / amax capped at FLT_MAX, 0 -> 1, NaN stays; fp32 reciprocal.
Global ref_global(float amax) {
  float s = std::isnan(amax) ? NAN : (amax == 0.0f ? FLT_MAX : f32(2688.0 / amax));
  if (s > FLT_MAX) s = FLT_MAX;
  if (s == 0.0f) s = 1.0f;
  return {s, f32(1.0 / s), test::fp32_mul(s, f32(1.0 / 6.0))};
}

struct RefCopy {
  std::vector<uint8_t> q, s;
  float amax = 0.0f;
};

// Quantizes a [rows, cols] matrix (row-major doubles, already in the input dtype) with 1x16 or
// 16x16 tiles; the per-tensor scale from `given_amax` when set (a reduced amax), else from x.
RefCopy ref_quantize(const std::vector<double> &x, size_t rows, size_t cols, bool two_d,
                     const float *given_amax = nullptr) {
  const test::RefEncoder e4m3(kNVTEFloat8E4M3);
  RefCopy r;
  r.amax = given_amax != nullptr ? *given_amax : test::ref_amax(x);
  const Global g = ref_global(r.amax);
  const Shape ss = scale_shape(rows, cols);
  r.s.assign(ss[0] * ss[1], 0);
  r.q.assign(rows * cols / 2, 0);
  for (size_t i = 0; i < rows; ++i)
    for (size_t b = 0; b * 16 < cols; ++b) {
      const size_t i0 = two_d ? i / 16 * 16 : i, i1 = two_d ? std::min(rows, i0 + 16) : i + 1;
      std::vector<double> blk;
      for (size_t ii = i0; ii < i1; ++ii)
        for (size_t j = b * 16; j < std::min(cols, b * 16 + 16); ++j)
          blk.push_back(x[ii * cols + j]);
      float d = test::fp32_mul(test::ref_amax(blk), g.mult);
      if (d > 448.0f) d = 448.0f;
      const uint8_t sb = e4m3(d);
      r.s[i * ss[1] + b] = sb;
      const double sf = test::ref_fp8_decode(sb, kNVTEFloat8E4M3);
      float enc = f32(1.0 / static_cast<double>(test::fp32_mul(sf, g.dec)));
      if (enc > FLT_MAX) enc = FLT_MAX;
      for (size_t j = b * 16; j < std::min(cols, b * 16 + 16); ++j) {
        const uint8_t c = ref_e2m1(test::fp32_mul(x[i * cols + j], enc));
        r.q[(i * cols + j) / 2] |= static_cast<uint8_t>(j % 2 ? c << 4 : c);
      }
    }
  return r;
}

// x^T, Hadamard-transformed along its rows in groups of 16 (signs from `mask`), rounded to `dt`.
std::vector<double> ref_colwise_source(const std::vector<double> &x, size_t rows, size_t cols,
                                       bool rht, uint32_t mask, NVTEDType dt) {
  std::vector<double> t(rows * cols);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) t[j * rows + i] = x[i * cols + j];
  if (!rht) return t;
  std::vector<double> y(t.size());
  for (size_t j = 0; j < cols; ++j)
    for (size_t g = 0; g < rows; g += 16)
      for (int c = 0; c < 16; ++c) {
        double acc = 0.0;
        for (int i = 0; i < 16; ++i) {
          int sgn = ((mask >> i) & 1) ? -1 : 1;
          for (int bits = i & c; bits; bits &= bits - 1) sgn = -sgn;
          acc += sgn * t[j * rows + g + i] / 4.0;
        }
        y[j * rows + g + c] = test::round_to(acc, dt);
      }
  return y;
}

struct Opts {
  bool two_d = false, rht = false, sr = false;
  uint32_t mask = 0xD7E8;  // TE's wgrad sign vector as a bit mask
  int64_t seed = 1, offset = 0;
};

struct Config {
  NVTEQuantizationConfig h = nvte_create_quantization_config();
  TestTensor rng{{2}, kNVTEInt64};
  NVTETensor rng_h;
  explicit Config(const Opts &o) {
    rng.put(0, static_cast<double>(o.seed), kNVTERowwiseData);
    rng.put(1, static_cast<double>(o.offset), kNVTERowwiseData);
    rng_h = rng;
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigNVFP42DQuantization, &o.two_d,
                                           1);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigNVFP4RHT, &o.rht, 1);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigNVFP4RHTSignMask, &o.mask, 4);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigStochasticRounding, &o.sr, 1);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigRNGState, &rng_h,
                                           sizeof rng_h);
  }
  ~Config() { nvte_destroy_quantization_config(h); }
};

TestTensor make_output(const Shape &shape, test::Copies copies) {
  const size_t rows = test::rows_of(shape), cols = test::cols_of(shape);
  TestTensor out(packed(shape), kNVTEByte, NVTE_NVFP4_1D_SCALING);
  if (test::has_rowwise(copies)) {
    out.set(kNVTERowwiseScaleInv, scale_shape(rows, cols), kNVTEFloat8E4M3);
    out.set_amax();
  } else {
    out.set_null(kNVTERowwiseData, packed(shape), kNVTEByte);
  }
  if (test::has_colwise(copies)) {
    out.set(kNVTEColumnwiseData, packed(transposed(shape)), kNVTEByte);
    out.set(kNVTEColumnwiseScaleInv, scale_shape(cols, rows), kNVTEFloat8E4M3);
    out.set(kNVTEColumnwiseAmax, {1}, kNVTEFloat32);
  }
  return out;
}

void expect_copy(TestTensor &out, NVTETensorParam dp, NVTETensorParam sp, NVTETensorParam ap,
                 const RefCopy &r, const std::string &what) {
  EXPECT_TRUE(test::same_bytes(out.bytes(dp), r.q.data(), r.q.size())) << what << " data";
  EXPECT_TRUE(test::same_bytes(out.bytes(sp), r.s.data(), r.s.size())) << what << " scales";
  EXPECT_TRUE(test::same_bytes(out.bytes(ap), reinterpret_cast<const uint8_t *>(&r.amax), 4))
      << what << " amax " << out.get(0, ap) << " vs " << r.amax;
}

void check_exact(TestTensor &in, const std::vector<double> &x, const Shape &shape, NVTEDType dt,
                 test::Copies copies, const Opts &o) {
  const size_t rows = test::rows_of(shape), cols = test::cols_of(shape);
  TestTensor out = make_output(shape, copies);
  test::poison(out, 0x5A);
  Config cfg(o);
  ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
  if (test::has_rowwise(copies))
    expect_copy(out, kNVTERowwiseData, kNVTERowwiseScaleInv, kNVTEAmax,
                ref_quantize(x, rows, cols, o.two_d), "row-wise");
  if (test::has_colwise(copies))
    expect_copy(out, kNVTEColumnwiseData, kNVTEColumnwiseScaleInv, kNVTEColumnwiseAmax,
                ref_quantize(ref_colwise_source(x, rows, cols, o.rht, o.mask, dt), cols, rows,
                             o.two_d),
                "column-wise");
}

using Param = std::tuple<NVTEDType, Shape, bool, bool, test::Copies>;
class Nvfp4Quantize : public ::testing::TestWithParam<Param> {};

TEST_P(Nvfp4Quantize, BytesScalesAmaxExact) {
  const auto [dt, shape, two_d, rht, copies] = GetParam();
  if (rht && dt == kNVTEFloat32) GTEST_SKIP() << "fp32 RHT sums round (order-dependent)";
  if (rht && test::has_colwise(copies) && test::rows_of(shape) % 16)
    GTEST_SKIP() << "the RHT (column-wise copy) needs rows % 16 == 0";
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, dt);
  const size_t cols = test::cols_of(shape);
  const std::vector<double> x = test::fill_spread(in, rng, -6, 2, [&](size_t i) {
    return static_cast<int>((i / cols / 16 + (i % cols) / 48) % 9) - 4;
  });
  Opts o;
  o.two_d = two_d;
  o.rht = rht;
  check_exact(in, x, shape, dt, copies, o);
}

std::string name(const ::testing::TestParamInfo<Param> &info) {
  const auto &[dt, shape, two_d, rht, copies] = info.param;
  return test::dtype_tag(dt) + "_" + test::shape_tag(shape) + (two_d ? "_2d" : "_1d") +
         (rht ? "_rht_" : "_") + test::copies_tag(copies);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Nvfp4Quantize,
    ::testing::Combine(::testing::ValuesIn(test::kHighPrecisionTypes),
                       ::testing::Values(Shape{2, 2}, Shape{16, 16}, Shape{30, 50}, Shape{304, 272},
                                         Shape{2, 64, 96}, Shape{512, 1024}),
                       ::testing::Bool(), ::testing::Bool(),
                       ::testing::Values(test::Copies::kRowwise, test::Copies::kColumnwise,
                                         test::Copies::kBoth)),
    name);

// Every E2M1 bucket edge: with one block of max 2688 the global scale is 1, so a block whose max is
// 6 has E4M3 scale 1 and its values are rounded as they are: grid points, midpoints (ties) and
// their fp32 neighbours, both signs, -0, and values just above 6 in a block scaled by 6.2 / 6
// (E4M3 rounds that scale down to 1: saturation).
TEST(Nvfp4Edges, EveryBucketEdge) {
  std::vector<double> vals;
  for (int k = 0; k < 8; ++k) {
    vals.push_back(kGrid[k]);
    if (k < 7) {
      const float mid = static_cast<float>((kGrid[k] + kGrid[k + 1]) / 2);
      vals.push_back(mid);
      vals.push_back(std::nextafter(mid, 0.0f));
      vals.push_back(std::nextafter(mid, 7.0f));
    }
  }
  std::vector<double> x;
  const size_t cols = 32;
  for (double v : vals)
    for (double sgn : {1.0, -1.0}) {
      std::vector<double> row(cols, 0.0);
      row[0] = 6.0;
      row[1] = sgn * v;
      row[2] = -0.0;
      row[3] = sgn * std::nextafter(static_cast<float>(v), 0.0f);
      x.insert(x.end(), row.begin(), row.end());
    }
  std::vector<double> sat(cols, 0.0);
  sat[0] = 6.2;
  sat[1] = -6.1;
  sat[16] = 2688.0;
  x.insert(x.end(), sat.begin(), sat.end());
  const size_t rows = x.size() / cols;
  const Shape shape{rows, cols};
  TestTensor in(shape, kNVTEFloat32);
  for (size_t i = 0; i < x.size(); ++i) in.put(i, x[i]);
  check_exact(in, in.to_double(), shape, kNVTEFloat32, test::Copies::kRowwise, Opts{});
  // Spot checks of TE's table independent of the oracle: 0.25 -> 0, 0.75 -> 1.0, -0.25 -> -0.
  TestTensor out = make_output(shape, test::Copies::kRowwise);
  ASSERT_NVTE_OK(nvte_quantize(in, out, nullptr));
  EXPECT_EQ(out.bytes()[2 * cols / 2] >> 4, 0x0);  // row 2, element 1: +0.25 -> +0
  EXPECT_EQ(out.bytes()[3 * cols / 2] >> 4, 0x8);  // row 3, element 1: -0.25 -> -0
  EXPECT_EQ(out.bytes()[2 * cols / 2] & 0xF, 0x7);  // element 0: 6
}

// NaN makes the amax and every scale NaN (E4M3 0x7F) and rounds to code 0; Inf gives a global
// scale of 1, its block the E4M3 max and the saturated code.
TEST(Nvfp4Edges, NanAndInf) {
  const Shape shape{16, 32};
  for (const double special : {double(NAN), double(INFINITY), -double(INFINITY)}) {
    std::mt19937 rng = test::test_rng();
    TestTensor in(shape, kNVTEBFloat16);
    test::fill_spread(in, rng, -3, 3);
    in.put(37, special);
    check_exact(in, in.to_double(), shape, kNVTEBFloat16, test::Copies::kBoth, Opts{});
    TestTensor out = make_output(shape, test::Copies::kRowwise);
    ASSERT_NVTE_OK(nvte_quantize(in, out, nullptr));
    if (std::isnan(special)) {
      EXPECT_TRUE(std::isnan(out.get(0, kNVTEAmax)));
      EXPECT_EQ(out.bytes(kNVTERowwiseScaleInv)[0], 0x7F);
    } else {
      EXPECT_EQ(out.bytes(kNVTERowwiseScaleInv)[1 * 4 + 0], 0x7E);  // row 1, block 0: 448
      EXPECT_EQ(out.bytes()[37 / 2] >> 4, special > 0 ? 0x7 : 0xF);
    }
  }
}

// Zero-size and all-zero tensors: amax 0, scales 0, codes 0.
TEST(Nvfp4Edges, ZerosAndEmpty) {
  for (const Shape &shape : {Shape{0, 32}, Shape{32, 32}}) {
    TestTensor in(shape, kNVTEFloat16);
    check_exact(in, in.to_double(), shape, kNVTEFloat16, test::Copies::kBoth, Opts{});
  }
}

// ------------------------------------------------------------------ given amax
// kNVTEQuantizationConfigNVFP4AmaxGiven: the second-level scale comes from the amaxes already in
// the output (TE's all-reduced amax: here a larger one, as another shard's, and a smaller one that
// saturates blocks), which stay as given; bytes and block scales as the oracle's with that amax.
TEST(Nvfp4AmaxGiven, ScalesFromTheGivenAmax) {
  const Shape shape{64, 96};
  std::mt19937 rng = test::test_rng();
  for (const NVTEDType dt : {kNVTEBFloat16, kNVTEFloat16})
    for (const bool two_d : {false, true})
      for (const bool rht : {false, true})
        for (const float factor : {5.0f, 0.25f}) {
          TestTensor in(shape, dt);
          const std::vector<double> x = test::fill_spread(in, rng, -6, 2, [&](size_t i) {
            return static_cast<int>((i / 96 / 16 + (i % 96) / 48) % 9) - 4;
          });
          const std::vector<double> t = ref_colwise_source(x, 64, 96, rht, 0xD7E8, dt);
          const float row_amax = test::ref_amax(x) * factor;
          const float col_amax = test::ref_amax(t) * factor * 1.5f;  // differs from the row one
          TestTensor out = make_output(shape, test::Copies::kBoth);
          out.f32(kNVTEAmax)[0] = row_amax;
          out.f32(kNVTEColumnwiseAmax)[0] = col_amax;
          Opts o;
          o.two_d = two_d;
          o.rht = rht;
          Config cfg(o);
          const bool given = true;
          ASSERT_NVTE_OK(nvte_set_quantization_config_attribute(
              cfg.h, kNVTEQuantizationConfigNVFP4AmaxGiven, &given, 1));
          ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
          const std::string what = test::dtype_tag(dt) + (two_d ? " 2d" : " 1d") +
                                   (rht ? " rht" : "") + " x" + std::to_string(factor);
          expect_copy(out, kNVTERowwiseData, kNVTERowwiseScaleInv, kNVTEAmax,
                      ref_quantize(x, 64, 96, two_d, &row_amax), what + " row-wise");
          expect_copy(out, kNVTEColumnwiseData, kNVTEColumnwiseScaleInv, kNVTEColumnwiseAmax,
                      ref_quantize(t, 96, 64, two_d, &col_amax), what + " column-wise");
        }
}

// One copy alone reads only its own amax; an empty tensor keeps the given one; without the flag
// the kernel overwrites the amax with x's (the default is unchanged).
TEST(Nvfp4AmaxGiven, OneCopyEmptyAndDefault) {
  const bool given = true;
  for (const Shape &shape : {Shape{0, 32}, Shape{32, 32}}) {
    TestTensor in(shape, kNVTEFloat16);
    std::mt19937 rng = test::test_rng();
    const std::vector<double> x = test::fill_spread(in, rng, -3, 3, [](size_t) { return 0; });
    TestTensor out = make_output(shape, test::Copies::kColumnwise);
    const float amax = 1000.0f;
    out.f32(kNVTEColumnwiseAmax)[0] = amax;
    Config cfg(Opts{});
    ASSERT_NVTE_OK(nvte_set_quantization_config_attribute(
        cfg.h, kNVTEQuantizationConfigNVFP4AmaxGiven, &given, 1));
    ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
    const size_t rows = test::rows_of(shape), cols = test::cols_of(shape);
    const std::vector<double> t = ref_colwise_source(x, rows, cols, false, 0, kNVTEFloat16);
    expect_copy(out, kNVTEColumnwiseData, kNVTEColumnwiseScaleInv, kNVTEColumnwiseAmax,
                ref_quantize(t, cols, rows, false, &amax), "column-wise " + test::shape_tag(shape));
  }
  TestTensor in({32, 32}, kNVTEFloat16);
  std::mt19937 rng = test::test_rng();
  const std::vector<double> x = test::fill_spread(in, rng, -3, 3, [](size_t) { return 0; });
  TestTensor out = make_output({32, 32}, test::Copies::kRowwise);
  out.f32(kNVTEAmax)[0] = 1000.0f;
  Config cfg(Opts{});
  ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
  expect_copy(out, kNVTERowwiseData, kNVTERowwiseScaleInv, kNVTEAmax,
              ref_quantize(x, 32, 32, false), "default");
}

TEST(Nvfp4AmaxGiven, Rejects) {
  TestTensor in({32, 32}, kNVTEFloat32);
  TestTensor out = make_output({32, 32}, test::Copies::kRowwise);
  out.set(kNVTEAmax, {32}, kNVTEFloat32);
  const uint8_t rs = 1;
  ASSERT_NVTE_OK(nvte_set_tensor_param_v2(out, kNVTERowScaledNVFP4, &rs, 1));
  NVTEQuantizationConfig c = nvte_create_quantization_config();
  const bool t = true;
  ASSERT_NVTE_OK(
      nvte_set_quantization_config_attribute(c, kNVTEQuantizationConfigNVFP4AmaxGiven, &t, 1));
  EXPECT_NVTE_ERROR(nvte_quantize_v2(in, out, c, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "kNVTEQuantizationConfigNVFP4AmaxGiven", "row-scaled");
  EXPECT_NVTE_ERROR(
      nvte_set_quantization_config_attribute(c, kNVTEQuantizationConfigNVFP4AmaxGiven, &t, 4),
      NVTE_ERROR_INVALID_ARGUMENT, "size_in_bytes");
  nvte_destroy_quantization_config(c);
}

// ------------------------------------------------------------------ stochastic rounding
std::vector<uint8_t> sr_run(TestTensor &in, const Shape &shape, const Opts &o, test::Copies c,
                            NVTETensorParam p) {
  TestTensor out = make_output(shape, c);
  Config cfg(o);
  EXPECT_EQ(nvte_quantize_v2(in, out, cfg.h, nullptr), NVTE_SUCCESS) << nvte_get_last_error();
  return std::vector<uint8_t>(out.bytes(p), out.bytes(p) + out.numel(p));
}

TEST(Nvfp4Stochastic, DeterministicNeighboursUnbiased) {
  const size_t rows = 4096, cols = 32;
  const Shape shape{rows, cols};
  TestTensor in(shape, kNVTEFloat32);
  // Every row holds the same 32 values (global scale 1, block scale 1: values rounded as they are).
  std::mt19937 rng = test::test_rng();
  std::uniform_real_distribution<double> u(-6.0, 6.0);
  std::vector<double> base(cols);
  for (double &v : base) v = static_cast<float>(u(rng));
  base[0] = 6.0;
  base[16] = 2688.0;
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) in.put(i * cols + j, base[j]);
  Opts o;
  o.sr = true;
  o.seed = 1234;
  const auto a = sr_run(in, shape, o, test::Copies::kRowwise, kNVTERowwiseData);
  EXPECT_EQ(a, sr_run(in, shape, o, test::Copies::kRowwise, kNVTERowwiseData)) << "same seed";
  Opts o2 = o;
  o2.offset = 1;
  EXPECT_NE(a, sr_run(in, shape, o2, test::Copies::kRowwise, kNVTERowwiseData)) << "new offset";
  Opts o3 = o;
  o3.seed = 99;
  EXPECT_NE(a, sr_run(in, shape, o3, test::Copies::kRowwise, kNVTERowwiseData)) << "new seed";
  // Each code is a neighbour of the exact value; the mean over rows approaches it (5 sigma of a
  // Bernoulli step: |mean - v| <= 5 * step / (2 sqrt(rows))).
  for (size_t j = 1; j < 16; ++j) {
    const double v = base[j], m = std::fabs(v);
    double sum = 0.0;
    for (size_t i = 0; i < rows; ++i) {
      const uint8_t byte = a[(i * cols + j) / 2];
      const uint8_t code = j % 2 ? byte >> 4 : byte & 0xF;
      const double q = (code & 8 ? -1.0 : 1.0) * kGrid[code & 7];
      int k = 0;
      while (k < 7 && kGrid[k + 1] <= m) ++k;
      const double lo = kGrid[k], hi = kGrid[std::min(k + 1, 7)];
      ASSERT_TRUE(std::fabs(q) == lo || std::fabs(q) == hi) << v << " -> " << q;
      sum += q;
    }
    int k = 0;
    while (k < 7 && kGrid[k + 1] <= m) ++k;
    const double step = kGrid[std::min(k + 1, 7)] - kGrid[k];
    EXPECT_NEAR(sum / rows, v, 5.0 * step / (2.0 * std::sqrt(double(rows))) + 1e-12) << "col " << j;
  }
  // The column-wise copy draws from its own stream (copy bit), also neighbour-only.
  const auto t = sr_run(in, shape, o, test::Copies::kBoth, kNVTEColumnwiseData);
  EXPECT_EQ(t.size(), rows * cols / 2);
}

// ------------------------------------------------------------------ dequantize
TEST(Nvfp4Dequantize, EachCopyExact) {
  for (const bool colwise : {false, true})
    for (const NVTEDType od : test::kHighPrecisionTypes) {
      const Shape shape{2, 48, 64};
      const size_t rows = 96, cols = 64;
      std::mt19937 rng = test::test_rng();
      TestTensor in(shape, kNVTEFloat32);
      test::fill_spread(in, rng, -6, 6);
      TestTensor q = make_output(shape, test::Copies::kBoth);
      ASSERT_NVTE_OK(nvte_quantize(in, q, nullptr));
      const Shape lshape = colwise ? transposed(shape) : shape;
      const size_t R = colwise ? cols : rows, C = colwise ? rows : cols;
      TestTensor src(packed(lshape), kNVTEByte, NVTE_NVFP4_1D_SCALING);
      const NVTETensorParam dp = colwise ? kNVTEColumnwiseData : kNVTERowwiseData;
      const NVTETensorParam sp = colwise ? kNVTEColumnwiseScaleInv : kNVTERowwiseScaleInv;
      const NVTETensorParam ap = colwise ? kNVTEColumnwiseAmax : kNVTEAmax;
      if (colwise) src.set_null(kNVTERowwiseData, packed(lshape), kNVTEByte);
      src.set(dp, packed(lshape), kNVTEByte);
      src.buffer(dp).bytes = q.buffer(dp).bytes;
      src.set(sp, scale_shape(R, C), kNVTEFloat8E4M3);
      src.buffer(sp).bytes = q.buffer(sp).bytes;
      src.set(ap, {1}, kNVTEFloat32);
      src.buffer(ap).bytes = q.buffer(ap).bytes;
      TestTensor out(lshape, od);
      ASSERT_NVTE_OK(nvte_dequantize(src, out, nullptr));
      const float amax = static_cast<float>(src.get(0, ap));
      const Shape ss = scale_shape(R, C);
      std::vector<double> want(R * C);
      for (size_t i = 0; i < R * C; ++i) {
        const size_t r = i / C, c = i % C;
        const uint8_t byte = src.bytes(dp)[i / 2];
        const uint8_t code = i % 2 ? byte >> 4 : byte & 0xF;
        const double sf = test::ref_fp8_decode(src.bytes(sp)[r * ss[1] + c / 16], kNVTEFloat8E4M3);
        const float factor = test::fp32_mul(test::fp32_mul(sf, amax), f32(1.0 / 2688.0));
        const double v = (code & 8 ? -1.0 : 1.0) * kGrid[code & 7];
        want[i] = test::round_to(test::fp32_mul(v, factor), od);
      }
      EXPECT_TRUE(test::close(out.to_double(), want, test::Tol{0.0, 0.0}))
          << (colwise ? "colwise " : "rowwise ") << test::dtype_tag(od);
    }
}

// ------------------------------------------------------------------ refusals
TEST(Nvfp4Rejects, ShapesDtypesOptions) {
  const Shape shape{32, 64};
  TestTensor in(shape, kNVTEBFloat16);
  {  // data not packed
    TestTensor out(shape, kNVTEByte, NVTE_NVFP4_1D_SCALING);
    out.set(kNVTERowwiseScaleInv, scale_shape(32, 64), kNVTEFloat8E4M3);
    out.set_amax();
    EXPECT_NVTE_ERROR(nvte_quantize(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'output'",
                      "[32, 32]", "[32, 64]");
  }
  {  // scale grid not padded
    TestTensor out(packed(shape), kNVTEByte, NVTE_NVFP4_1D_SCALING);
    out.set(kNVTERowwiseScaleInv, {32, 4}, kNVTEFloat8E4M3);
    out.set_amax();
    EXPECT_NVTE_ERROR(nvte_quantize(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                      "row-wise scale_inv shape [128, 4]", "[32, 4]");
  }
  {  // amax missing
    TestTensor out(packed(shape), kNVTEByte, NVTE_NVFP4_1D_SCALING);
    out.set(kNVTERowwiseScaleInv, scale_shape(32, 64), kNVTEFloat8E4M3);
    EXPECT_NVTE_ERROR(nvte_quantize(in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "amax");
  }
  {  // odd last dim
    TestTensor in3({4, 3}, kNVTEFloat32);
    TestTensor out({4, 1}, kNVTEByte, NVTE_NVFP4_1D_SCALING);
    out.set(kNVTERowwiseScaleInv, scale_shape(4, 3), kNVTEFloat8E4M3);
    out.set_amax();
    EXPECT_NVTE_ERROR(nvte_quantize(in3, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "even last");
  }
  {  // RHT over rows not divisible by 16; SR without RNG state
    TestTensor in2({24, 64}, kNVTEFloat32);
    TestTensor out = make_output({24, 64}, test::Copies::kBoth);
    Opts o;
    o.rht = true;
    Config cfg(o);
    EXPECT_NVTE_ERROR(nvte_quantize_v2(in2, out, cfg.h, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                      "divisible by 16", "24");
    NVTEQuantizationConfig c = nvte_create_quantization_config();
    const bool t = true;
    nvte_set_quantization_config_attribute(c, kNVTEQuantizationConfigStochasticRounding, &t, 1);
    EXPECT_NVTE_ERROR(nvte_quantize_v2(in2, out, c, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                      "kNVTEQuantizationConfigRNGState");
    const uint32_t bad = 0x10000;
    EXPECT_NVTE_ERROR(nvte_set_quantization_config_attribute(
                          c, kNVTEQuantizationConfigNVFP4RHTSignMask, &bad, 4),
                      NVTE_ERROR_INVALID_ARGUMENT, "16-bit");
    nvte_destroy_quantization_config(c);
  }
}

}  // namespace
