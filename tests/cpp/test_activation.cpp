// Activations (element-wise, gated; fwd, bwd) vs double references from activation.h's formulas.
// Also: FP8 outputs (per-tensor and MXFP8) byte for byte, and every rejected argument.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/activation.h"

namespace {

using test::TestTensor;

// ------------------------------------------------------------------ double references
const double kPi = 3.14159265358979323846;
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}
double dgelu(double x) {
  const double k0 = std::sqrt(2.0 / kPi), t = std::tanh(k0 * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k0 * (1.0 + 3.0 * 0.044715 * x * x);
}
double qgelu(double x) { return x * sigmoid(1.702 * x); }
double dqgelu(double x) {
  const double s = sigmoid(1.702 * x);
  return s + 1.702 * x * s * (1.0 - s);
}
double relu(double x) { return x > 0 ? x : 0.0; }
double drelu(double x) { return x > 0 ? 1.0 : 0.0; }
double srelu(double x) { return x > 0 ? x * x : 0.0; }
double dsrelu(double x) { return x > 0 ? 2.0 * x : 0.0; }
double silu(double x) { return x * sigmoid(x); }
double dsigmoid(double x) {
  const double s = sigmoid(x);
  return s * (1.0 - s);
}
double dsilu(double x) {
  const double s = sigmoid(x);
  return s + x * s * (1.0 - s);
}

using FwdFn = NVTEStatus (*)(const NVTETensor, NVTETensor, NVTEStream);
using BwdFn = NVTEStatus (*)(const NVTETensor, const NVTETensor, NVTETensor, NVTEStream);

// One row per C API pair: the per-op differences live here, not in copied test bodies.
struct ActOp {
  const char *name;
  bool gated;
  FwdFn fwd;
  BwdFn bwd;
  double (*f)(double);
  double (*df)(double);
};

const ActOp kOps[] = {
    {"gelu", false, nvte_gelu, nvte_dgelu, gelu, dgelu},
    {"qgelu", false, nvte_qgelu, nvte_dqgelu, qgelu, dqgelu},
    {"relu", false, nvte_relu, nvte_drelu, relu, drelu},
    {"srelu", false, nvte_srelu, nvte_dsrelu, srelu, dsrelu},
    {"silu", false, nvte_silu, nvte_dsilu, silu, dsilu},
    {"geglu", true, nvte_geglu, nvte_dgeglu, gelu, dgelu},
    {"qgeglu", true, nvte_qgeglu, nvte_dqgeglu, qgelu, dqgelu},
    {"reglu", true, nvte_reglu, nvte_dreglu, relu, drelu},
    {"sreglu", true, nvte_sreglu, nvte_dsreglu, srelu, dsrelu},
    {"swiglu", true, nvte_swiglu, nvte_dswiglu, silu, dsilu},
    {"glu", true, nvte_glu, nvte_dglu, sigmoid, dsigmoid},
};
constexpr int kNumOps = sizeof(kOps) / sizeof(kOps[0]);

// Input range: wide enough to cover both tails of every activation.
constexpr double kLo = -4.0, kHi = 4.0;

// Shapes of the activation's result ([..., H]); a gated input is [..., 2H].
std::vector<size_t> input_shape(const ActOp &op, std::vector<size_t> shape) {
  if (op.gated) shape.back() *= 2;
  return shape;
}

// Forward reference: y[r, j] = f(x[r, j]) or f(a[r, j]) * b[r, j].
std::vector<double> ref_fwd(const ActOp &op, const std::vector<double> &x, size_t h) {
  const size_t in_cols = op.gated ? 2 * h : h, rows = h ? x.size() / in_cols : 0;
  std::vector<double> y(rows * h);
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < h; ++j) {
      const double *row = x.data() + r * in_cols;
      y[r * h + j] = op.gated ? op.f(row[j]) * row[h + j] : op.f(row[j]);
    }
  return y;
}

// Backward reference: dx = g * f'(x), or [g * b * f'(a) | g * f(a)] for gated.
std::vector<double> ref_bwd(const ActOp &op, const std::vector<double> &g,
                            const std::vector<double> &x, size_t h) {
  std::vector<double> dx(x.size());
  if (!op.gated) {
    for (size_t i = 0; i < x.size(); ++i) dx[i] = g[i] * op.df(x[i]);
    return dx;
  }
  const size_t rows = h ? g.size() / h : 0;
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < h; ++j) {
      const double a = x[r * 2 * h + j], b = x[r * 2 * h + h + j], gv = g[r * h + j];
      dx[r * 2 * h + j] = gv * b * op.df(a);
      dx[r * 2 * h + h + j] = gv * op.f(a);
    }
  return dx;
}

// The references' derivatives are checked against central differences, so a wrong formula in the
// test cannot hide a wrong kernel.
TEST(ActivationReference, DerivativesMatchFiniteDifferences) {
  for (const ActOp &op : kOps) {
    for (double x = -3.9; x < 4.0; x += 0.1) {
      if (std::fabs(x) < 1e-3) continue;  // relu kink
      const double eps = 1e-6, fd = (op.f(x + eps) - op.f(x - eps)) / (2 * eps);
      EXPECT_NEAR(op.df(x), fd, 1e-6) << op.name << " at x = " << x;
    }
  }
}

// ------------------------------------------------------------------ high-precision outputs
struct DTypes {
  NVTEDType in, out;
};
const DTypes kDTypes[] = {{kNVTEFloat32, kNVTEFloat32}, {kNVTEFloat16, kNVTEFloat16},
                          {kNVTEBFloat16, kNVTEBFloat16}, {kNVTEBFloat16, kNVTEFloat32},
                          {kNVTEFloat32, kNVTEBFloat16}, {kNVTEFloat16, kNVTEFloat32}};
const std::vector<std::vector<size_t>> kShapes = {{1, 1}, {7, 33}, {129, 257}, {2, 3, 17}};

using HpParam = std::tuple<int, DTypes, std::vector<size_t>>;

std::string hp_name(const ::testing::TestParamInfo<HpParam> &info) {
  const auto &[op, dt, shape] = info.param;
  return std::string(kOps[op].name) + "_" + test::dtype_tag(dt.in) + "_to_" +
         test::dtype_tag(dt.out) + "_" + test::shape_tag(shape);
}

// Runs forward and backward of one op on `shape` and compares with the references.
void check_fwd(const ActOp &op, DTypes dt, const std::vector<size_t> &shape, unsigned seed) {
  std::mt19937 rng(seed);
  TestTensor in(input_shape(op, shape), dt.in);
  const std::vector<double> x = in.fill_uniform(rng, kLo, kHi);
  TestTensor out(shape, dt.out);
  ASSERT_NVTE_OK(op.fwd(in, out, nullptr));
  EXPECT_TRUE(test::close(out.to_double(), ref_fwd(op, x, shape.back()),
                          test::activation_tolerance(dt.out)))
      << op.name << " forward";
}

void check_bwd(const ActOp &op, DTypes dt, const std::vector<size_t> &shape, unsigned seed) {
  std::mt19937 rng(seed);
  TestTensor in(input_shape(op, shape), dt.in), grad(shape, dt.in);
  const std::vector<double> x = in.fill_uniform(rng, kLo, kHi);
  const std::vector<double> g = grad.fill_uniform(rng, -2.0, 2.0);
  TestTensor out(input_shape(op, shape), dt.out);
  ASSERT_NVTE_OK(op.bwd(grad, in, out, nullptr));
  EXPECT_TRUE(test::close(out.to_double(), ref_bwd(op, g, x, shape.back()),
                          test::activation_tolerance(dt.out)))
      << op.name << " backward";
}

class ActivationTest : public ::testing::TestWithParam<HpParam> {};

TEST_P(ActivationTest, Forward) {
  const auto &[op, dt, shape] = GetParam();
  check_fwd(kOps[op], dt, shape, 1234u + op);
}

TEST_P(ActivationTest, Backward) {
  const auto &[op, dt, shape] = GetParam();
  check_bwd(kOps[op], dt, shape, 4321u + op);
}

INSTANTIATE_TEST_SUITE_P(AllOps, ActivationTest,
                         ::testing::Combine(::testing::Range(0, kNumOps),
                                            ::testing::ValuesIn(kDTypes),
                                            ::testing::ValuesIn(kShapes)),
                         hp_name);

// One large odd shape per family (element-wise and gated): many row blocks over both threads.
INSTANTIATE_TEST_SUITE_P(Large, ActivationTest,
                         ::testing::Combine(::testing::Values(0, 9),  // gelu, swiglu
                                            ::testing::Values(DTypes{kNVTEBFloat16, kNVTEBFloat16}),
                                            ::testing::Values(std::vector<size_t>{1023, 4097})),
                         hp_name);

// A zero-row tensor is valid and writes nothing but the (zero) amax.
TEST(ActivationEdge, EmptyTensor) {
  for (const ActOp &op : kOps) {
    TestTensor in(input_shape(op, {0, 8}), kNVTEFloat32), out({0, 8}, kNVTEFloat32);
    out.set_amax(-1.0f);
    ASSERT_NVTE_OK(op.fwd(in, out, nullptr));
    EXPECT_EQ(out.f32(kNVTEAmax)[0], 0.0f) << op.name;
  }
}

// ------------------------------------------------------------------ FP8 outputs
enum class Fp8Mode { kPerTensor, kPerTensorTransposed, kMxfp8 };
const char *mode_name(Fp8Mode m) {
  switch (m) {
    case Fp8Mode::kPerTensor: return "per_tensor";
    case Fp8Mode::kPerTensorTransposed: return "per_tensor_t";
    default: return "mxfp8";
  }
}

using Fp8Param = std::tuple<int, NVTEDType, Fp8Mode, bool /*backward*/>;

std::string fp8_name(const ::testing::TestParamInfo<Fp8Param> &info) {
  const auto &[op, t, mode, bwd] = info.param;
  return std::string(bwd ? "d" : "") + kOps[op].name + "_" + test::dtype_tag(t) + "_" +
         mode_name(mode);
}

// Expected E8M0 byte of a block with amax `amax`: 2^ceil(log2(amax / fp8_max)) (TE's round-up
// rule), from the exact exponent of the double quotient (frexp: q = f * 2^k, f in [0.5, 1)).
uint8_t ref_mx_scale(float amax, double fp8_max) {
  if (amax == 0.0f) return 0;
  int k;
  const double f = std::frexp(static_cast<double>(amax) / fp8_max, &k);
  const int e = f == 0.5 ? k - 1 : k;
  return static_cast<uint8_t>(std::clamp(e + 127, 0, 254));
}

class ActivationFp8Test : public ::testing::TestWithParam<Fp8Param> {};

// Runs the op twice: with an fp32 output (the kernel's own values, themselves checked above) and
// with the FP8 output. The FP8 bytes must equal the independent encoder applied to those values
// (q = encode(v * scale), or v / block scale for MXFP8), amax and scale_inv must be exact, and the
// decoded FP8 values must be within FP8 rounding of the double reference.
TEST_P(ActivationFp8Test, MatchesEncodedFp32Result) {
  // Plain variables, not a structured binding: the lambda below captures `bwd` (C++17).
  const int op_idx = std::get<0>(GetParam());
  const NVTEDType t = std::get<1>(GetParam());
  const Fp8Mode mode = std::get<2>(GetParam());
  const bool bwd = std::get<3>(GetParam());
  const ActOp &op = kOps[op_idx];
  const std::vector<size_t> act_shape = {41, 71};  // odd in both dims: partial MX blocks each way
  const std::vector<size_t> out_shape = bwd ? input_shape(op, act_shape) : act_shape;
  const size_t rows = out_shape[0], cols = out_shape[1];
  const double fp8_max = test::fp8_spec(t).max;

  std::mt19937 rng(99u + op_idx);
  TestTensor in(input_shape(op, act_shape), kNVTEBFloat16), grad(act_shape, kNVTEBFloat16);
  const std::vector<double> x = in.fill_uniform(rng, kLo, kHi);
  const std::vector<double> g = grad.fill_uniform(rng, -2.0, 2.0);
  const std::vector<double> ref = bwd ? ref_bwd(op, g, x, act_shape.back())
                                      : ref_fwd(op, x, act_shape.back());
  auto run = [&](TestTensor &out) {
    return bwd ? op.bwd(grad, in, out, nullptr) : op.fwd(in, out, nullptr);
  };

  TestTensor f32(out_shape, kNVTEFloat32);
  ASSERT_NVTE_OK(run(f32));
  std::vector<float> v(rows * cols);
  std::memcpy(v.data(), f32.bytes(), v.size() * sizeof(float));
  float amax = 0.0f;
  for (float e : v) amax = std::max(amax, std::fabs(e));

  const test::Tol qtol = test::fp8_quantization_tolerance(t);
  std::vector<uint8_t> expect(v.size());
  std::vector<double> decoded(v.size()), ref_q(v.size());

  if (mode == Fp8Mode::kMxfp8) {
    const size_t sc = (cols + 31) / 32, sr = (rows + 31) / 32;
    TestTensor q(out_shape, t, NVTE_MXFP8_1D_SCALING);
    q.set(kNVTERowwiseScaleInv, {rows, sc}, kNVTEFloat8E8M0);
    q.set(kNVTEColumnwiseData, out_shape, t);
    q.set(kNVTEColumnwiseScaleInv, {sr, cols}, kNVTEFloat8E8M0);
    ASSERT_NVTE_OK(run(q));
    // Row-wise: blocks of 32 along a row; column-wise: blocks of 32 along a column.
    for (int colwise = 0; colwise < 2; ++colwise) {
      const NVTETensorParam data = colwise ? kNVTEColumnwiseData : kNVTERowwiseData;
      const NVTETensorParam scales = colwise ? kNVTEColumnwiseScaleInv : kNVTERowwiseScaleInv;
      std::vector<uint8_t> expect_scales(colwise ? sr * cols : rows * sc);
      for (size_t s = 0; s < expect_scales.size(); ++s) {
        const size_t r0 = colwise ? (s / cols) * 32 : s / sc;
        const size_t c0 = colwise ? s % cols : (s % sc) * 32;
        std::vector<size_t> idx;
        for (size_t k = 0; k < 32; ++k) {
          const size_t r = colwise ? r0 + k : r0, c = colwise ? c0 : c0 + k;
          if (r < rows && c < cols) idx.push_back(r * cols + c);
        }
        float bmax = 0.0f;
        for (size_t i : idx) bmax = std::max(bmax, std::fabs(v[i]));
        expect_scales[s] = ref_mx_scale(bmax, fp8_max);
        const double mult = std::ldexp(1.0, 127 - expect_scales[s]);
        for (size_t i : idx) {
          expect[i] = test::ref_fp8_encode(v[i] * mult, t);
          decoded[i] = test::ref_fp8_decode(q.bytes(data)[i], t);
          ref_q[i] = ref[i] * mult;
        }
      }
      ASSERT_TRUE(test::same_bytes(q.bytes(scales), expect_scales.data(), expect_scales.size()))
          << (colwise ? "column-wise" : "row-wise") << " E8M0 scales";
      EXPECT_TRUE(test::same_bytes(q.bytes(data), expect.data(), expect.size()))
          << (colwise ? "column-wise" : "row-wise") << " data";
      EXPECT_TRUE(test::close(decoded, ref_q, qtol)) << "decoded vs reference / block scale";
    }
    return;
  }

  // Per-tensor: a scale that saturates the largest values, so satfinite is exercised too.
  const float scale = static_cast<float>(1.5 * fp8_max / amax);
  TestTensor q(out_shape, t);
  q.set_scale(scale);
  q.set_amax(-1.0f);
  q.set_scale_inv(-1.0f);
  const bool transposed = mode == Fp8Mode::kPerTensorTransposed;
  if (transposed) q.set(kNVTEColumnwiseData, {cols, rows}, t);
  ASSERT_NVTE_OK(run(q));
  EXPECT_EQ(q.f32(kNVTEAmax)[0], amax) << "amax = max|v| before scaling";
  EXPECT_EQ(q.f32(kNVTERowwiseScaleInv)[0], 1.0f / scale) << "scale_inv = 1 / scale";
  for (size_t i = 0; i < v.size(); ++i) {
    expect[i] = test::ref_fp8_encode(v[i] * scale, t);  // fp32 product, as the spec says
    decoded[i] = test::ref_fp8_decode(q.bytes()[i], t);
    ref_q[i] = std::clamp(ref[i] * scale, -fp8_max, fp8_max);
  }
  EXPECT_TRUE(test::same_bytes(q.bytes(), expect.data(), expect.size())) << "row-wise data";
  EXPECT_TRUE(test::close(decoded, ref_q, qtol)) << "decoded vs reference * scale (saturated)";
  if (transposed) {
    std::vector<uint8_t> expect_t(v.size());
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) expect_t[c * rows + r] = expect[r * cols + c];
    EXPECT_TRUE(test::same_bytes(q.bytes(kNVTEColumnwiseData), expect_t.data(), expect_t.size()))
        << "transposed copy";
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllOps, ActivationFp8Test,
    ::testing::Combine(::testing::Range(0, kNumOps),
                       ::testing::Values(kNVTEFloat8E4M3, kNVTEFloat8E5M2, kNVTEFloat8E4M3FNUZ,
                                         kNVTEFloat8E5M2FNUZ),
                       ::testing::Values(Fp8Mode::kPerTensor, Fp8Mode::kPerTensorTransposed,
                                         Fp8Mode::kMxfp8),
                       ::testing::Bool()),
    fp8_name);

// ------------------------------------------------------------------ rejected arguments
// Fills every buffer of `t` with a sentinel; unchanged() then tells whether a failing call wrote.
struct Sentinel {
  explicit Sentinel(TestTensor &t) : t_(t) {
    for (int p = 0; p < kNVTENumTensorParams; ++p) {
      auto &b = t.buffer(static_cast<NVTETensorParam>(p)).bytes;
      std::fill(b.begin(), b.end(), uint8_t{0xA5});
      saved_.push_back(b);
    }
  }
  bool unchanged() const {
    for (int p = 0; p < kNVTENumTensorParams; ++p)
      if (t_.buffer(static_cast<NVTETensorParam>(p)).bytes != saved_[p]) return false;
    return true;
  }
  TestTensor &t_;
  std::vector<std::vector<uint8_t>> saved_;
};

constexpr NVTEStatus kInvalid = NVTE_ERROR_INVALID_ARGUMENT;

TEST(ActivationErrors, NullHandlesAndData) {
  TestTensor in({7, 34}, kNVTEBFloat16), grad({7, 34}, kNVTEBFloat16), out({7, 34}, kNVTEFloat32);
  Sentinel s(out);
  EXPECT_NVTE_ERROR(nvte_gelu(nullptr, out, nullptr), kInvalid, "nvte_gelu", "'input'", "NULL");
  EXPECT_NVTE_ERROR(nvte_gelu(in, nullptr, nullptr), kInvalid, "'output'", "NULL");
  EXPECT_NVTE_ERROR(nvte_dgelu(nullptr, in, out, nullptr), kInvalid, "nvte_dgelu", "'grad'",
                    "NULL");
  EXPECT_NVTE_ERROR(nvte_dswiglu(grad, nullptr, out, nullptr), kInvalid, "'input'", "NULL");
  TestTensor no_data({7, 34}, kNVTEBFloat16);
  no_data.set_null(kNVTERowwiseData, {7, 34}, kNVTEBFloat16);
  EXPECT_NVTE_ERROR(nvte_silu(no_data, out, nullptr), kInvalid, "'input'", "null pointer");
  EXPECT_NVTE_ERROR(nvte_dsilu(no_data, in, out, nullptr), kInvalid, "'grad'", "null pointer");
  EXPECT_NVTE_ERROR(nvte_relu(in, no_data, nullptr), kInvalid, "'output'", "null pointer");
  EXPECT_TRUE(s.unchanged());
}

TEST(ActivationErrors, Dtypes) {
  TestTensor out({7, 33}, kNVTEFloat32);
  Sentinel s(out);
  TestTensor i32({7, 33}, kNVTEInt32), fp8({7, 33}, kNVTEFloat8E4M3);
  EXPECT_NVTE_ERROR(nvte_gelu(i32, out, nullptr), kInvalid, "'input'", "expected dtype", "int32");
  EXPECT_NVTE_ERROR(nvte_qgelu(fp8, out, nullptr), kInvalid, "'input'", "float8_e4m3");
  // grad and input must share a dtype.
  TestTensor x({7, 33}, kNVTEBFloat16), g16({7, 33}, kNVTEFloat16);
  EXPECT_NVTE_ERROR(nvte_dgelu(g16, x, out, nullptr), kInvalid, "'grad'", "bfloat16", "float16");
  // Output: not an activation result dtype.
  TestTensor bad_out({7, 33}, kNVTEInt32);
  Sentinel s2(bad_out);
  EXPECT_NVTE_ERROR(nvte_srelu(x, bad_out, nullptr), kInvalid, "'output'", "int32");
  // MXFP8 scaling needs an FP8 dtype.
  TestTensor mx_bf16({7, 33}, kNVTEBFloat16, NVTE_MXFP8_1D_SCALING);
  mx_bf16.set(kNVTERowwiseScaleInv, {7, 2}, kNVTEFloat8E8M0);
  Sentinel s3(mx_bf16);
  EXPECT_NVTE_ERROR(nvte_relu(x, mx_bf16, nullptr), kInvalid, "'output'", "MXFP8");
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(s2.unchanged());
  EXPECT_TRUE(s3.unchanged());
}

TEST(ActivationErrors, Shapes) {
  TestTensor x({7, 33}, kNVTEFloat32), out34({7, 34}, kNVTEFloat32);
  Sentinel s(out34);
  EXPECT_NVTE_ERROR(nvte_gelu(x, out34, nullptr), kInvalid, "'output'", "[7, 33]", "[7, 34]");
  // Gated: the last dim must be even, the output half of it.
  TestTensor out17({7, 17}, kNVTEFloat32);
  Sentinel s17(out17);
  EXPECT_NVTE_ERROR(nvte_geglu(x, out17, nullptr), kInvalid, "'input'", "even", "[7, 33]");
  TestTensor x34({7, 34}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_swiglu(x34, out34, nullptr), kInvalid, "'output'", "[7, 17]", "[7, 34]");
  TestTensor scalar(std::vector<size_t>{}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_reglu(scalar, out17, nullptr), kInvalid, "'input'", "at least 1");
  // Backward: grad must match input (element-wise) or be its half (gated).
  TestTensor g32({7, 32}, kNVTEFloat32), out33({7, 33}, kNVTEFloat32);
  Sentinel s33(out33);
  EXPECT_NVTE_ERROR(nvte_dgelu(g32, x, out33, nullptr), kInvalid, "'grad'", "[7, 33]", "[7, 32]");
  TestTensor g34({7, 34}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_dgeglu(g34, x34, out34, nullptr), kInvalid, "'grad'", "[7, 17]");
  TestTensor g17({7, 17}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_dswiglu(g17, x34, out17, nullptr), kInvalid, "'output'", "[7, 34]");
  EXPECT_NVTE_ERROR(nvte_dsreglu(g17, x, out34, nullptr), kInvalid, "'input'", "even");
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(s17.unchanged());
  EXPECT_TRUE(s33.unchanged());
}

TEST(ActivationErrors, Fp8OutputBuffers) {
  TestTensor x({7, 33}, kNVTEBFloat16);
  TestTensor no_scale({7, 33}, kNVTEFloat8E4M3);
  no_scale.set_amax();
  Sentinel s(no_scale);
  EXPECT_NVTE_ERROR(nvte_gelu(x, no_scale, nullptr), kInvalid, "'output'", "scale");
  TestTensor mx({7, 33}, kNVTEFloat8E4M3, NVTE_MXFP8_1D_SCALING);
  mx.set(kNVTERowwiseScaleInv, {7, 1}, kNVTEFloat8E8M0);  // needs [7, 2]
  Sentinel smx(mx);
  EXPECT_NVTE_ERROR(nvte_silu(x, mx, nullptr), kInvalid, "'output'", "scale_inv", "[7, 2]");
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(smx.unchanged());
}

// A second handle onto (part of) another tensor's memory, to build overlapping arguments.
struct View {
  View(TestTensor &base, size_t byte_offset, const std::vector<size_t> &shape, NVTEDType dtype)
      : h(nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING)) {
    NVTEBasicTensor bt{};
    bt.data_ptr = base.bytes() + byte_offset;
    bt.dtype = dtype;
    bt.shape.ndim = shape.size();
    for (size_t i = 0; i < shape.size(); ++i) bt.shape.data[i] = shape[i];
    EXPECT_EQ(nvte_set_tensor_param(&h, kNVTERowwiseData, &bt), NVTE_SUCCESS);
  }
  ~View() { nvte_destroy_tensor(h); }
  NVTETensor h;
};

TEST(ActivationErrors, OverlappingBuffers) {
  TestTensor x({8, 32}, kNVTEFloat32), g({8, 32}, kNVTEFloat32), gh({8, 16}, kNVTEFloat32);
  Sentinel sx(x), sg(g);
  View same(x, 0, {8, 32}, kNVTEFloat32), half(x, 64, {8, 16}, kNVTEFloat32);
  View on_g(g, 0, {8, 32}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_gelu(x, same.h, nullptr), kInvalid, "'output (row-wise data)'", "'input'",
                    "overlapping");
  EXPECT_NVTE_ERROR(nvte_swiglu(x, half.h, nullptr), kInvalid, "'output (row-wise data)'",
                    "overlapping");
  EXPECT_NVTE_ERROR(nvte_dswiglu(gh, x, same.h, nullptr), kInvalid, "'input'", "overlapping");
  EXPECT_NVTE_ERROR(nvte_dgelu(g, x, on_g.h, nullptr), kInvalid, "'grad'", "overlapping");
  // An FP8 output whose amax lies inside the input.
  TestTensor q({8, 32}, kNVTEFloat8E4M3);
  q.set_scale(1.0f);
  NVTEBasicTensor amax_in_x{};
  amax_in_x.data_ptr = x.bytes() + 4;
  amax_in_x.dtype = kNVTEFloat32;
  amax_in_x.shape.ndim = 1;
  amax_in_x.shape.data[0] = 1;
  NVTETensor qh = q.handle();
  ASSERT_NVTE_OK(nvte_set_tensor_param(&qh, kNVTEAmax, &amax_in_x));
  EXPECT_NVTE_ERROR(nvte_relu(x, q, nullptr), kInvalid, "'output (amax)'", "overlapping");
  EXPECT_TRUE(sx.unchanged());
  EXPECT_TRUE(sg.unchanged());
}

TEST(ActivationErrors, Devices) {
  TestTensor x({7, 34}, kNVTEFloat32), g({7, 17}, kNVTEFloat32), out({7, 17}, kNVTEFloat32);
  TestTensor dx({7, 34}, kNVTEFloat32);
  Sentinel s(out), sdx(dx);
  out.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_swiglu(x, out, nullptr), kInvalid, "'output'", "device", "gpu");
  g.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_dswiglu(g, x, dx, nullptr), kInvalid, "device", "gpu");
  // All on the GPU: a valid request this CPU-only build cannot serve.
  x.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_swiglu(x, out, nullptr), NVTE_ERROR_UNSUPPORTED, "nvte_swiglu", "GPU");
  dx.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_dswiglu(g, x, dx, nullptr), NVTE_ERROR_UNSUPPORTED, "nvte_dswiglu");
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(sdx.unchanged());
}

}  // namespace
