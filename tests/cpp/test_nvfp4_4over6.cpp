// NVFP4 4over6 (kNVTEQuantizationConfigNVFP44Over6Mode, MAE / MSE, E4M3 bound 448 or 256, exact or
// fast-math errors, 1x16 and 16x16 blocks) and row-scaled NVFP4 (kNVTERowScaledNVFP4: one amax per
// row of each copy) through the public C API against an independent oracle written from TE's
// description of the formulas: every fp32 operation of TE's order is one double operation rounded
// to float (exact for +-*/ of floats), E4M3 by the RefEncoder search, E2M1 by nearest-grid search;
// bytes, scales and amaxes compared bit for bit. Dequantize of both options; argument refusals.
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
float f32(double v) { return static_cast<float>(v); }  // one IEEE rounding

uint8_t ref_e2m1(double v) {  // nearest code, ties to the even code; NaN -> 0
  if (std::isnan(v)) return 0;
  const double a = std::min(std::fabs(v), 6.0);
  int best = 0;
  for (int k = 1; k < 8; ++k) {
    const double d = std::fabs(a - kGrid[k]), db = std::fabs(a - kGrid[best]);
    if (d < db || (d == db && k % 2 == 0)) best = k;
  }
  return static_cast<uint8_t>(v < 0 ? best | 8 : best);
}
double e2m1_val(uint8_t c) { return (c & 8 ? -1.0 : 1.0) * kGrid[c & 7]; }

struct Opts {
  uint8_t mode = kNVTENVFP44Over6Disabled;
  int e4m3_max = 448;
  bool fast = false, two_d = false, row_scaled = false;
};

struct Global {
  float amax, enc, dec;
};
Global ref_global(float amax, int m) {  // S_enc = 6 * m / amax, capped, 0 -> 1
  float s = std::isnan(amax) ? NAN : (amax == 0.0f ? FLT_MAX : f32(6.0 * m / amax));
  if (s > FLT_MAX) s = FLT_MAX;
  if (s == 0.0f) s = 1.0f;
  return {amax, s, f32(1.0 / s)};
}

struct RefCopy {
  std::vector<uint8_t> q, s;
  std::vector<float> amax;
  size_t map4 = 0, map6 = 0;  // 4over6 choices (so a test can insist both occur)
};

struct Cand {
  uint8_t sc;
  std::vector<uint8_t> codes;
  float err;
};

// One candidate over a 16-wide block of `x` (zero padded past `len`): TE's scale
// e4m3(min((amax / 6) * S_enc [* 1.5], 448)), codes of x * 1 / (sf * S_dec), and its error sum.
Cand ref_cand(const double *x, size_t len, float bmax, const Global &g, const Opts &o, bool map4,
              const test::RefEncoder &e4m3) {
  float d = f32(static_cast<double>(f32(bmax / 6.0)) * g.enc);
  if (map4) d = f32(d * 1.5);
  if (d > 448.0f) d = 448.0f;
  Cand c{e4m3(d), {}, 0.0f};
  const double sf = test::ref_fp8_decode(c.sc, kNVTEFloat8E4M3);
  float enc = f32(1.0 / static_cast<double>(f32(sf * g.dec)));
  if (enc > FLT_MAX) enc = FLT_MAX;
  const float denom = f32(6.0 * o.e4m3_max);
  for (size_t i = 0; i < 16; ++i) {
    const double xi = i < len ? x[i] : 0.0;
    const uint8_t code = ref_e2m1(f32(xi * enc));
    c.codes.push_back(code);
    float diff;
    if (!o.fast) {
      const float v = f32(static_cast<double>(f32(static_cast<double>(f32(e2m1_val(code) * sf)) *
                                                  g.amax)) / denom);
      diff = f32(v - xi);
    } else {
      diff = f32(e2m1_val(code) * sf - static_cast<double>(f32(xi * g.enc)));
    }
    const float term = o.mode == kNVTENVFP44Over6MinMSE ? f32(static_cast<double>(diff) * diff)
                                                         : std::fabs(diff);
    c.err = f32(static_cast<double>(c.err) + term);
  }
  return c;
}

// Plain NVFP4 block scale (TE's default path: amax * (S_enc * (1/6))).
Cand ref_plain(const double *x, size_t len, float bmax, const Global &g,
               const test::RefEncoder &e4m3) {
  const float mult = f32(static_cast<double>(g.enc) * f32(1.0 / 6.0));
  float d = f32(static_cast<double>(bmax) * mult);
  if (d > 448.0f) d = 448.0f;
  Cand c{e4m3(d), {}, 0.0f};
  const double sf = test::ref_fp8_decode(c.sc, kNVTEFloat8E4M3);
  float enc = f32(1.0 / static_cast<double>(f32(sf * g.dec)));
  if (enc > FLT_MAX) enc = FLT_MAX;
  for (size_t i = 0; i < len; ++i) c.codes.push_back(ref_e2m1(f32(x[i] * enc)));
  return c;
}

RefCopy ref_quantize(const std::vector<double> &x, size_t rows, size_t cols, const Opts &o) {
  const test::RefEncoder e4m3(kNVTEFloat8E4M3);
  RefCopy r;
  const Shape ss = scale_shape(rows, cols);
  r.s.assign(ss[0] * ss[1], 0);
  r.q.assign(rows * cols / 2, 0);
  std::vector<Global> g;
  if (o.row_scaled) {
    for (size_t i = 0; i < rows; ++i) {
      r.amax.push_back(test::ref_amax(std::vector<double>(x.begin() + i * cols,
                                                          x.begin() + (i + 1) * cols)));
      g.push_back(ref_global(r.amax.back(), o.e4m3_max));
    }
  } else {
    r.amax.push_back(test::ref_amax(x));
    g.assign(rows, ref_global(r.amax[0], o.e4m3_max));
  }
  auto put = [&](size_t i, size_t j, uint8_t c) {
    r.q[(i * cols + j) / 2] |= static_cast<uint8_t>(j % 2 ? c << 4 : c);
  };
  const bool fos = o.mode != kNVTENVFP44Over6Disabled;
  for (size_t b = 0; b * 16 < cols; ++b) {
    const size_t j0 = b * 16, len = std::min<size_t>(16, cols - j0);
    for (size_t i0 = 0; i0 < rows; i0 += o.two_d ? 16 : 1) {
      const size_t i1 = o.two_d ? std::min(rows, i0 + 16) : i0 + 1;
      std::vector<double> blk;
      for (size_t i = i0; i < i1; ++i)
        for (size_t j = j0; j < j0 + len; ++j) blk.push_back(x[i * cols + j]);
      const float bmax = test::ref_amax(blk);
      int pick = 0;
      if (fos) {  // per-row errors; in 2D summed over the 16 rows in TE's warp tree order
        double zeros[16] = {};
        float e[2][16];
        for (size_t k = 0; k < (o.two_d ? 16u : 1u); ++k)
          for (int m = 0; m < 2; ++m) {
            const bool real = i0 + k < i1;
            e[m][k] = ref_cand(real ? &x[(i0 + k) * cols + j0] : zeros, real ? len : 16, bmax,
                               g[i0], o, m == 1, e4m3).err;
          }
        if (o.two_d)
          for (int m = 0; m < 2; ++m)
            for (int w = 8; w >= 1; w /= 2)
              for (int k = 0; k < w; ++k) e[m][k] = f32(static_cast<double>(e[m][k]) + e[m][k + w]);
        pick = e[1][0] < e[0][0] ? 1 : 0;
        (pick ? r.map4 : r.map6)++;
      }
      for (size_t i = i0; i < i1; ++i) {
        const double *xi = &x[i * cols + j0];
        const Cand c = fos ? ref_cand(xi, len, bmax, g[i], o, pick == 1, e4m3)
                           : ref_plain(xi, len, bmax, g[i], e4m3);
        r.s[i * ss[1] + b] = c.sc;
        for (size_t j = 0; j < len; ++j) put(i, j0 + j, c.codes[j]);
      }
    }
  }
  return r;
}

std::vector<double> transpose(const std::vector<double> &x, size_t rows, size_t cols) {
  std::vector<double> t(rows * cols);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) t[j * rows + i] = x[i * cols + j];
  return t;
}

struct Config {
  NVTEQuantizationConfig h = nvte_create_quantization_config();
  explicit Config(const Opts &o) {
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigNVFP42DQuantization, &o.two_d,
                                           1);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigNVFP44Over6Mode, &o.mode, 1);
    nvte_set_quantization_config_attribute(h, kNVTEQuantizationConfigNVFP44Over6ErrUseFastMath,
                                           &o.fast, 1);
  }
  ~Config() { nvte_destroy_quantization_config(h); }
};

TestTensor make_output(size_t rows, size_t cols, bool colwise, const Opts &o) {
  TestTensor out({rows, cols / 2}, kNVTEByte, NVTE_NVFP4_1D_SCALING);
  out.set(kNVTERowwiseScaleInv, scale_shape(rows, cols), kNVTEFloat8E4M3);
  out.set(kNVTEAmax, {o.row_scaled ? rows : 1}, kNVTEFloat32);
  if (colwise) {
    out.set(kNVTEColumnwiseData, {cols, rows / 2}, kNVTEByte);
    out.set(kNVTEColumnwiseScaleInv, scale_shape(cols, rows), kNVTEFloat8E4M3);
    out.set(kNVTEColumnwiseAmax, {o.row_scaled ? cols : 1}, kNVTEFloat32);
  }
  const uint8_t rs = o.row_scaled;
  const int32_t em = o.e4m3_max;
  EXPECT_EQ(nvte_set_tensor_param_v2(out, kNVTERowScaledNVFP4, &rs, 1), NVTE_SUCCESS);
  EXPECT_EQ(nvte_set_tensor_param_v2(out, kNVTENVFP4E4M3Max, &em, 4), NVTE_SUCCESS);
  return out;
}

void expect_copy(TestTensor &out, NVTETensorParam dp, NVTETensorParam sp, NVTETensorParam ap,
                 const RefCopy &r, const std::string &what) {
  EXPECT_TRUE(test::same_bytes(out.bytes(dp), r.q.data(), r.q.size())) << what << " data";
  EXPECT_TRUE(test::same_bytes(out.bytes(sp), r.s.data(), r.s.size())) << what << " scales";
  ASSERT_EQ(out.numel(ap), r.amax.size()) << what;
  EXPECT_TRUE(test::same_bytes(out.bytes(ap), reinterpret_cast<const uint8_t *>(r.amax.data()),
                               4 * r.amax.size()))
      << what << " amax";
}

// mode, e4m3 max, fast errors, 2D, row-scaled, dtype, shape
using Param = std::tuple<int, int, bool, bool, bool, NVTEDType, Shape>;
class Nvfp4Options : public ::testing::TestWithParam<Param> {};

TEST_P(Nvfp4Options, BytesScalesAmaxExact) {
  const auto [mode, em, fast, two_d, row_scaled, dt, shape] = GetParam();
  Opts o;
  o.mode = static_cast<uint8_t>(mode);
  o.e4m3_max = em;
  o.fast = fast;
  o.two_d = two_d;
  o.row_scaled = row_scaled;
  if (o.mode == kNVTENVFP44Over6Disabled && (em != 448 || fast)) GTEST_SKIP() << "4over6 only";
  if (row_scaled && two_d) GTEST_SKIP() << "row-scaled NVFP4 is 1x16 only";
  const size_t rows = shape[0], cols = shape[1];
  std::mt19937 rng = test::test_rng();
  TestTensor in(shape, dt);
  // Magnitudes spread over 2^-6 .. 2^2, blocks scaled apart, so both candidates win somewhere.
  const std::vector<double> x = test::fill_spread(in, rng, -6, 2, [&](size_t i) {
    return static_cast<int>((i / cols / 16 + (i % cols) / 48) % 9) - 4;
  });
  TestTensor out = make_output(rows, cols, true, o);
  test::poison(out, 0x5A);
  Config cfg(o);
  ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
  const RefCopy rr = ref_quantize(x, rows, cols, o);
  expect_copy(out, kNVTERowwiseData, kNVTERowwiseScaleInv, kNVTEAmax, rr, "row-wise");
  const RefCopy rc = ref_quantize(transpose(x, rows, cols), cols, rows, o);
  expect_copy(out, kNVTEColumnwiseData, kNVTEColumnwiseScaleInv, kNVTEColumnwiseAmax, rc,
              "column-wise");
  if (o.mode != kNVTENVFP44Over6Disabled && !two_d && rows * cols >= 2048) {
    EXPECT_GT(rr.map4, 0u) << "no block chose map-to-4: the data does not test the choice";
    EXPECT_GT(rr.map6, 0u) << "no block chose map-to-6: the data does not test the choice";
  }
}

std::string name(const ::testing::TestParamInfo<Param> &info) {
  const auto &[mode, em, fast, two_d, row_scaled, dt, shape] = info.param;
  const char *m[] = {"plain", "mae", "mse"};
  return std::string(m[mode]) + "_" + std::to_string(em) + (fast ? "_fast" : "_exact") +
         (two_d ? "_2d" : "_1d") + (row_scaled ? "_rowscaled_" : "_") + test::dtype_tag(dt) + "_" +
         test::shape_tag(shape);
}

INSTANTIATE_TEST_SUITE_P(
    All, Nvfp4Options,
    ::testing::Combine(::testing::Values(0, 1, 2), ::testing::Values(448, 256), ::testing::Bool(),
                       ::testing::Bool(), ::testing::Bool(),
                       ::testing::ValuesIn(test::kHighPrecisionTypes),
                       ::testing::Values(Shape{64, 128}, Shape{30, 50}, Shape{144, 96})),
    name);

// Special values: zeros (amax 0), a NaN (NaN scales), +-Inf and the dtype's largest values through
// every mode, both copies.
TEST(Nvfp4Options, SpecialValues) {
  for (const int mode : {1, 2})
    for (const bool fast : {false, true})
      for (const bool row_scaled : {false, true})
        for (const double special : {0.0, double(NAN), double(INFINITY), 3.0e38}) {
          Opts o;
          o.mode = static_cast<uint8_t>(mode);
          o.fast = fast;
          o.row_scaled = row_scaled;
          const size_t rows = 32, cols = 64;
          std::mt19937 rng = test::test_rng();
          TestTensor in({rows, cols}, kNVTEFloat32);
          test::fill_spread(in, rng, -3, 3);
          if (special == 0.0) {
            for (size_t i = 0; i < rows * cols; ++i) in.put(i, 0.0);
          } else {
            in.put(37, special);
            in.put(100, -special);
          }
          const std::vector<double> x = in.to_double();
          TestTensor out = make_output(rows, cols, true, o);
          Config cfg(o);
          ASSERT_NVTE_OK(nvte_quantize_v2(in, out, cfg.h, nullptr));
          const std::string what = "mode " + std::to_string(mode) + (fast ? " fast" : "") +
                                   (row_scaled ? " row-scaled " : " ") + std::to_string(special);
          expect_copy(out, kNVTERowwiseData, kNVTERowwiseScaleInv, kNVTEAmax,
                      ref_quantize(x, rows, cols, o), what + " row-wise");
          expect_copy(out, kNVTEColumnwiseData, kNVTEColumnwiseScaleInv, kNVTEColumnwiseAmax,
                      ref_quantize(transpose(x, rows, cols), cols, rows, o), what + " col-wise");
        }
}

// Dequantize: e2m1 * ((e4m3 * amax[row]) * (1 / (6 * e4m3_max))) with the row's amax when
// row-scaled and the tensor's E4M3 bound.
TEST(Nvfp4Options, DequantizeRowScaledAnd256) {
  for (const bool row_scaled : {false, true})
    for (const int em : {448, 256}) {
      Opts o;
      o.mode = kNVTENVFP44Over6MinMAE;
      o.e4m3_max = em;
      o.row_scaled = row_scaled;
      const size_t rows = 48, cols = 64;
      std::mt19937 rng = test::test_rng();
      TestTensor in({rows, cols}, kNVTEBFloat16);
      test::fill_spread(in, rng, -6, 6, [&](size_t i) { return static_cast<int>(i / cols % 5); });
      TestTensor q = make_output(rows, cols, false, o);
      Config cfg(o);
      ASSERT_NVTE_OK(nvte_quantize_v2(in, q, cfg.h, nullptr));
      TestTensor out({rows, cols}, kNVTEFloat32);
      ASSERT_NVTE_OK(nvte_dequantize(q, out, nullptr));
      const Shape ss = scale_shape(rows, cols);
      std::vector<double> want(rows * cols), x = in.to_double();
      double max_rel = 0.0;
      for (size_t i = 0; i < rows * cols; ++i) {
        const size_t r = i / cols, c = i % cols;
        const uint8_t byte = q.bytes()[i / 2];
        const uint8_t code = i % 2 ? byte >> 4 : byte & 0xF;
        const double sf = test::ref_fp8_decode(q.bytes(kNVTERowwiseScaleInv)[r * ss[1] + c / 16],
                                               kNVTEFloat8E4M3);
        const float amax = static_cast<float>(q.get(row_scaled ? r : 0, kNVTEAmax));
        const float factor = test::fp32_mul(test::fp32_mul(sf, amax), f32(1.0 / (6.0 * em)));
        want[i] = test::fp32_mul(e2m1_val(code), factor);
        max_rel = std::max(max_rel, std::fabs(want[i] - x[i]) / amax);
      }
      EXPECT_TRUE(test::close(out.to_double(), want, test::Tol{0.0, 0.0}))
          << (row_scaled ? "row-scaled " : "") << em;
      // and the values are x within half an E2M1 step of the row's (or tensor's) amax / 6 * 2
      EXPECT_LT(max_rel, 0.5) << "dequantized values far from the input";
    }
}

TEST(Nvfp4Options, Refusals) {
  const size_t rows = 32, cols = 64;
  TestTensor in({rows, cols}, kNVTEBFloat16);
  {  // E4M3 bound 256 without 4over6
    Opts o;
    o.e4m3_max = 256;
    TestTensor out = make_output(rows, cols, false, o);
    Config cfg(o);
    EXPECT_NVTE_ERROR(nvte_quantize_v2(in, out, cfg.h, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                      "E4M3 max of 256", "4over6");
  }
  {  // row-scaled with a scalar amax
    Opts o;
    o.row_scaled = true;
    TestTensor out = make_output(rows, cols, false, o);
    out.set(kNVTEAmax, {1}, kNVTEFloat32);
    Config cfg(o);
    EXPECT_NVTE_ERROR(nvte_quantize_v2(in, out, cfg.h, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                      "amax (row-wise)", "32 fp32 values");
  }
  {  // row-scaled with 2D blocks; 4over6 with stochastic rounding
    Opts o;
    o.row_scaled = true;
    o.two_d = true;
    TestTensor out = make_output(rows, cols, false, o);
    Config cfg(o);
    EXPECT_NVTE_ERROR(nvte_quantize_v2(in, out, cfg.h, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                      "row-scaled", "2D");
    Opts p;
    p.mode = kNVTENVFP44Over6MinMSE;
    TestTensor out2 = make_output(rows, cols, false, p);
    Config cfg2(p);
    const bool sr = true;
    nvte_set_quantization_config_attribute(cfg2.h, kNVTEQuantizationConfigStochasticRounding, &sr,
                                           1);
    EXPECT_NVTE_ERROR(nvte_quantize_v2(in, out2, cfg2.h, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                      "4over6", "stochastic rounding");
  }
  {  // setters
    TestTensor t({2, 2}, kNVTEByte, NVTE_NVFP4_1D_SCALING);
    const int32_t bad = 300;
    const uint8_t two = 2, mode = 3;
    EXPECT_NVTE_ERROR(nvte_set_tensor_param_v2(t, kNVTENVFP4E4M3Max, &bad, 4),
                      NVTE_ERROR_INVALID_ARGUMENT, "448 or 256", "300");
    EXPECT_NVTE_ERROR(nvte_set_tensor_param_v2(t, kNVTERowScaledNVFP4, &two, 1),
                      NVTE_ERROR_INVALID_ARGUMENT, "0 or 1");
    EXPECT_NVTE_ERROR(nvte_set_tensor_param_v2(t, kNVTEAmax, &two, 1),
                      NVTE_ERROR_INVALID_ARGUMENT, "param");
    NVTEQuantizationConfig c = nvte_create_quantization_config();
    EXPECT_NVTE_ERROR(
        nvte_set_quantization_config_attribute(c, kNVTEQuantizationConfigNVFP44Over6Mode, &mode, 1),
        NVTE_ERROR_INVALID_ARGUMENT, "NVTENVFP44Over6Mode", "3");
    nvte_destroy_quantization_config(c);
    int32_t got = 0;
    size_t n = 0;
    nvte_get_tensor_param_v2(t, kNVTENVFP4E4M3Max, &got, 4, &n);
    EXPECT_EQ(got, 448);
    EXPECT_EQ(n, 4u);
  }
}

}  // namespace
