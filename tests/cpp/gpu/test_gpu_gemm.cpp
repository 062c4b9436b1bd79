// nvte_cublas_gemm on GPU tensors against the CPU op: every operand pair and output dtype, all four
// transposes, each epilogue, odd / multi-tile / empty shapes, a caller's workspace, and
// nvte_cublas_gemm_scaled's alpha / beta with each epilogue. The GPU runs
// cuBLASLt or the tiled kernel, both summing in another order than oneDNN, so values are compared
// within twice the FP32-accumulation allowance (both devices lie within it of the exact result, a
// double reference computed here), plus the vendor-GELU allowance where an epilogue has GELU.
// Exact results (scale_inv, the transposed FP8 copy, outputs of empty products) byte for byte.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/gemm.h"

namespace {

using test::GpuTensor;
using test::TestTensor;

constexpr NVTEDType kF32 = kNVTEFloat32, kF16 = kNVTEFloat16, kBF16 = kNVTEBFloat16,
                    kE4M3 = kNVTEFloat8E4M3, kE5M2 = kNVTEFloat8E5M2,
                    kE4M3Z = kNVTEFloat8E4M3FNUZ, kE5M2Z = kNVTEFloat8E5M2FNUZ;

bool have_cpu_gemm() {
  return std::string(nvte_get_build_info()).find("\"gemm_cpu\": null") == std::string::npos;
}
#define SKIP_WITHOUT_GPU_AND_CPU_GEMM()                                   \
  SKIP_WITHOUT_GPU();                                                     \
  if (!have_cpu_gemm()) GTEST_SKIP() << "no CPU GEMM (built without oneDNN) to compare with"

struct Dims {
  size_t m, n, k;
};

// Which epilogue a case runs (gemm.h): forward bias / GELU / accumulate, or grad mode.
struct Mode {
  const char *name;
  bool grad, bias, gelu, accumulate;
};
const Mode kModes[] = {
    {"plain", false, false, false, false},  {"bias", false, true, false, false},
    {"gelu", false, false, true, false},    {"bias_gelu", false, true, true, false},
    {"acc", false, false, false, true},     {"bias_acc", false, true, false, true},
    {"bias_gelu_acc", false, true, true, true},
    {"grad", true, false, false, false},    {"grad_acc", true, false, false, true},
    {"bgradB", true, true, false, false},   {"bgradB_acc", true, true, false, true},
    {"dgelu", true, false, true, false},    {"dgelu_bgrad", true, true, true, false},
    {"dgelu_bgrad_acc", true, true, true, true},
};
constexpr int kPlain = 0, kBiasGelu = 3, kBgradB = 9, kDgeluBgrad = 12;

struct Config {
  Dims dims;
  bool transa, transb;
  NVTEDType a, b, d;
  int mode;
  NVTEDType aux;              // dtype of bias and pre_gelu_out
  bool d_transposed = false;  // FP8 D also gets its transposed copy [m, n]
  bool workspace = false;     // pass a 32 MiB device workspace
  // nvte_cublas_gemm_scaled with these factors (the mode's accumulate flag is then unused).
  bool scaled = false;
  float alpha = 1.0f, beta = 0.0f;
};
double alpha_of(const Config &c) { return c.scaled ? c.alpha : 1.0; }
double beta_of(const Config &c) {
  return c.scaled ? c.beta : kModes[c.mode].accumulate ? 1.0 : 0.0;
}

NVTEStatus call_gemm(const Config &c, NVTETensor A, NVTETensor B, NVTETensor D, NVTETensor bias,
                     NVTETensor pre, NVTETensor ws) {
  const Mode &md = kModes[c.mode];
  if (c.scaled) {
    return nvte_cublas_gemm_scaled(A, B, D, bias, pre, c.transa, c.transb, md.grad, ws, c.alpha,
                                   c.beta, false, 0, nullptr);
  }
  return nvte_cublas_gemm(A, B, D, bias, pre, c.transa, c.transb, md.grad, ws, md.accumulate,
                          false, 0, nullptr);
}

NVTEDType aux_for(NVTEDType in) { return in == kF32 ? kF32 : in == kF16 ? kF16 : kBF16; }

std::string scale_tag(float v) {  // 2.5 -> "2p5", -0.75 -> "m0p75"
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  for (char &ch : s) ch = ch == '-' ? 'm' : ch == '.' ? 'p' : ch;
  return s;
}
std::string trans_tag(bool ta, bool tb) { return std::string(ta ? "T" : "N") + (tb ? "T" : "N"); }
std::string config_name(const Config &c) {
  return std::string(kModes[c.mode].name) + "_" + test::dtype_tag(c.a) + "_x_" +
         test::dtype_tag(c.b) + "_to_" + test::dtype_tag(c.d) + "_aux_" + test::dtype_tag(c.aux) +
         "_" + trans_tag(c.transa, c.transb) + "_" + std::to_string(c.dims.m) + "x" +
         std::to_string(c.dims.n) + "x" + std::to_string(c.dims.k) +
         (c.d_transposed ? "_transposed" : "") + (c.workspace ? "_workspace" : "") +
         (c.scaled ? "_a" + scale_tag(c.alpha) + "_b" + scale_tag(c.beta) : "");
}

// A host tensor with the same buffers (shapes, dtypes, bytes) as `t`: holds the GPU's results.
TestTensor clone(const TestTensor &t) {
  TestTensor c(t.buffer().shape, t.buffer().dtype, nvte_tensor_scaling_mode(t.handle()));
  for (int i = 0; i < kNVTENumTensorParams; ++i) {
    const auto p = static_cast<NVTETensorParam>(i);
    const test::Buffer &b = t.buffer(p);
    if (b.bytes.empty()) continue;
    c.set(p, b.shape, b.dtype);
    std::copy(b.bytes.begin(), b.bytes.end(), c.bytes(p));
  }
  return c;
}

// High precision: uniform in [-1, 1). FP8: uniformly drawn codes of magnitude <= 2 (subnormals
// included) with scale_inv 0.5, so real values lie in [-1, 1] too. Returns the real values.
std::vector<double> fill_operand(TestTensor &t, std::mt19937 &rng) {
  const NVTEDType dt = t.buffer().dtype;
  if (!test::is_fp8(dt)) return t.fill_uniform(rng, -1.0, 1.0);
  t.set_scale_inv(0.5f);
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c) {
    const double v = test::ref_fp8_decode(static_cast<uint8_t>(c), dt);
    if (std::isfinite(v) && std::fabs(v) <= 2.0) codes.push_back(static_cast<uint8_t>(c));
  }
  std::vector<double> v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) {
    t.bytes()[i] = codes[rng() % codes.size()];
    v[i] = 0.5 * t.get(i);
  }
  return v;
}

double dgelu_ref(double x) {
  const double k0 = std::sqrt(2.0 / M_PI), k1 = 0.044715;
  const double t = std::tanh(k0 * (x + k1 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k0 * (1.0 + 3.0 * k1 * x * x);
}

// What the double reference says about the magnitudes, for the tolerances.
struct Bounds {
  double max_l1 = 0;     // max over outputs of sum_k |op(B)[i,k] op(A)[k,j]|
  double max_x = 0;      // max |alpha op(B) op(A)|
  double max_arg = 0;    // max |GELU argument|: x + bias (forward) or pre_gelu_out (grad)
  double dbias_l1 = 0;   // max over columns of sum_i |x * gelu'(pre)| (dGELU bias gradient)
  double bgrad_l1 = 0;   // max over rows of sum_k |op(B)[i, k]| (bias gradient of op(B))
};

Bounds reference_bounds(const Config &c, const std::vector<double> &a, const std::vector<double> &b,
                        const std::vector<double> &bias, const std::vector<double> &pre) {
  const Dims d = c.dims;
  const Mode &md = kModes[c.mode];
  auto op_a = [&](size_t kk, size_t j) { return c.transa ? a[j * d.k + kk] : a[kk * d.m + j]; };
  auto op_b = [&](size_t i, size_t kk) { return c.transb ? b[kk * d.n + i] : b[i * d.k + kk]; };
  const double alpha = alpha_of(c);
  Bounds r;
  std::vector<double> col_l1(d.m, 0.0);
  for (size_t i = 0; i < d.n; ++i) {
    double row_l1 = 0;
    for (size_t kk = 0; kk < d.k; ++kk) row_l1 += std::fabs(op_b(i, kk));
    r.bgrad_l1 = std::max(r.bgrad_l1, row_l1);
    for (size_t j = 0; j < d.m; ++j) {
      double x = 0, l1 = 0;
      for (size_t kk = 0; kk < d.k; ++kk) {
        x += op_b(i, kk) * op_a(kk, j);
        l1 += std::fabs(op_b(i, kk) * op_a(kk, j));
      }
      x *= alpha;  // alpha scales the product (not the bias gradient of op(B) above)
      l1 *= std::fabs(alpha);
      r.max_l1 = std::max(r.max_l1, l1);
      r.max_x = std::max(r.max_x, std::fabs(x));
      if (md.gelu && !md.grad) {
        r.max_arg = std::max(r.max_arg, std::fabs(x + (md.bias ? bias[j] : 0)));
      }
      if (md.gelu && md.grad) {
        r.max_arg = std::max(r.max_arg, std::fabs(pre[i * d.m + j]));
        col_l1[j] += std::fabs(x * dgelu_ref(pre[i * d.m + j]));
      }
    }
  }
  for (double v : col_l1) r.dbias_l1 = std::max(r.dbias_l1, v);
  return r;
}

// Byte-exact: the transposed FP8 copy is the row-wise bytes transposed.
::testing::AssertionResult is_transpose(const TestTensor &t, size_t rows, size_t cols) {
  const uint8_t *row = t.buffer(kNVTERowwiseData).bytes.data();
  const uint8_t *col = t.buffer(kNVTEColumnwiseData).bytes.data();
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j)
      if (row[i * cols + j] != col[j * rows + i])
        return ::testing::AssertionFailure()
               << "transposed copy differs at [" << j << ", " << i << "]";
  return ::testing::AssertionSuccess();
}

// ------------------------------------------------------------------ the general check
void run_case(const Config &c, uint32_t seed) {
  SKIP_WITHOUT_GPU_AND_CPU_GEMM();
  const Mode &md = kModes[c.mode];
  const Dims d = c.dims;
  std::mt19937 rng(seed);
  TestTensor A(c.transa ? std::vector<size_t>{d.m, d.k} : std::vector<size_t>{d.k, d.m}, c.a);
  TestTensor B(c.transb ? std::vector<size_t>{d.k, d.n} : std::vector<size_t>{d.n, d.k}, c.b);
  const std::vector<double> av = fill_operand(A, rng), bv = fill_operand(B, rng);

  TestTensor D({d.n, d.m}, c.d);
  const double beta = beta_of(c);
  if (beta != 0.0) {
    D.fill_uniform(rng, -1, 1);
  } else if (c.scaled && !test::is_fp8(c.d)) {
    for (size_t i = 0; i < D.numel(); ++i) D.put(i, NAN);  // beta = 0 reads no D on either device
  }
  const size_t bias_len = md.grad && !md.gelu ? d.n : d.m;
  TestTensor bias({bias_len}, c.aux), pre({d.n, d.m}, c.aux);
  std::vector<double> bias_v(bias_len, 0.0), pre_v;
  if (md.bias && !md.grad) bias_v = bias.fill_uniform(rng, -1, 1);
  if (md.gelu && md.grad) pre_v = pre.fill_uniform(rng, -3, 3);
  const Bounds bd = reference_bounds(c, av, bv, bias_v, pre_v);

  float d_scale = 1.0f;
  if (test::is_fp8(c.d)) {  // a scale that uses about half the range: a few values saturate
    const double typical = std::sqrt(static_cast<double>(d.k)) + 1.0;
    d_scale = static_cast<float>(0.5 * test::fp8_spec(c.d).max / typical);
    D.set_scale(d_scale);
    D.set_amax(-1.0f);
    D.set_scale_inv(-1.0f);
    if (c.d_transposed) D.set(kNVTEColumnwiseData, {d.m, d.n}, c.d);
  }

  // GPU copies of the inputs and of the untouched outputs, then the CPU op on the host tensors.
  TestTensor gD = clone(D), gbias = clone(bias), gpre = clone(pre);
  GpuTensor dA(A), dB(B), dD(gD), dbias(gbias), dpre(gpre);
  GpuTensor ws({size_t{32} << 20}, kNVTEByte);
  ASSERT_NVTE_OK(call_gemm(c, A, B, D, md.bias ? bias.handle() : nullptr,
                           md.gelu ? pre.handle() : nullptr, nullptr));
  const NVTETensor d_bias = md.bias ? static_cast<NVTETensor>(dbias) : nullptr;
  const NVTETensor d_pre = md.gelu ? static_cast<NVTETensor>(dpre) : nullptr;
  const NVTETensor d_ws = c.workspace ? static_cast<NVTETensor>(ws) : nullptr;
  ASSERT_NVTE_OK(call_gemm(c, dA, dB, dD, d_bias, d_pre, d_ws));
  dD.download_all(gD);
  dbias.download_all(gbias);
  dpre.download_all(gpre);

  // Each device is within acc of the exact value (test_gemm.cpp's bound: |gelu'| <= 1.13, bias and
  // D's previous value add <= 1 each, beta times D's value |beta|; max_l1 carries alpha), so the
  // two within 2 acc; GELU may differ by the vendor's tanh.
  const double acc =
      test::fp32_accumulation_atol(d.k, 1.2 * bd.max_l1 + 1.0 + std::max(1.0, std::fabs(beta)));
  const double gelu = md.gelu ? test::vendor_gelu_atol(bd.max_arg, md.grad ? bd.max_x : 1.0) : 0;
  // cuBLASLt's bias epilogues into a 16-bit D round alpha AB + beta C to D's type before adding
  // the bias (seen on an H200: where the bias cancels the product, the result sits on the
  // product's bf16 grid), so D and pre_gelu_out may be off by half an ulp of that sum; the CPU and
  // the tiled kernel add the bias in fp32. TE's GPU GEMM has the same epilogue.
  const bool half_d = c.d == kNVTEBFloat16 || c.d == kNVTEFloat16;
  const double pre_bias = md.bias && !md.grad && half_d
                              ? std::ldexp(bd.max_x + std::fabs(beta), c.d == kNVTEBFloat16 ? -8 : -11)
                              : 0.0;
  const double slack = 2 * acc + gelu + 1.13 * pre_bias;
  if (test::is_fp8(c.d)) {
    // Rounding an fp32 value that differs by `slack` may land one code away: one FP8 ulp.
    const test::Tol q = test::fp8_quantization_tolerance(c.d);
    const test::Tol tol{2 * q.atol + d_scale * slack, 2 * q.rtol};
    EXPECT_TRUE(test::close(gD.to_double(), D.to_double(), tol)) << "D";
    const double amax = D.get(0, kNVTEAmax);
    EXPECT_NEAR(gD.get(0, kNVTEAmax), amax, slack + std::ldexp(amax, -22)) << "amax of D";
    EXPECT_EQ(gD.f32(kNVTERowwiseScaleInv)[0], D.f32(kNVTERowwiseScaleInv)[0]) << "scale_inv";
    if (c.d_transposed) {
      EXPECT_TRUE(is_transpose(gD, d.n, d.m)) << "D transposed copy";
    }
  } else {
    const test::Tol t = test::tolerance(c.d);
    EXPECT_TRUE(test::close(gD.to_double(), D.to_double(), {t.atol + slack, t.rtol})) << "D";
  }
  const test::Tol ta = test::tolerance(c.aux);
  if (md.gelu && !md.grad) {
    EXPECT_TRUE(
        test::close(gpre.to_double(), pre.to_double(), {ta.atol + 2 * acc + pre_bias, ta.rtol}))
        << "pre_gelu_out";
  }
  if (md.grad && md.bias) {
    // dGELU: n terms, each carrying its product's difference; op(B): k exact terms.
    const size_t terms = md.gelu ? d.n : d.k;
    const double l1 = md.gelu ? bd.dbias_l1 : bd.bgrad_l1;
    const double per_term = md.gelu ? 2 * acc + gelu : 0.0;
    const double atol = ta.atol + terms * per_term + 2 * test::fp32_accumulation_atol(terms, l1);
    EXPECT_TRUE(test::close(gbias.to_double(), bias.to_double(), {atol, ta.rtol}))
        << "bias gradient";
  }
}

// ------------------------------------------------------------------ dtypes and transposes
struct DtypePair {
  NVTEDType a, b;
};
const DtypePair kPairs[] = {{kF32, kF32},     {kF16, kF16},   {kBF16, kBF16}, {kE4M3, kE4M3},
                            {kE5M2, kE5M2},   {kE4M3, kE5M2}, {kE5M2, kE4M3}, {kE4M3Z, kE4M3Z},
                            {kE5M2Z, kE5M2Z}, {kE4M3, kE5M2Z}};
const NVTEDType kOutTypes[] = {kF32, kF16, kBF16, kE4M3, kE5M2, kE4M3Z, kE5M2Z};

std::vector<Config> dtype_configs() {
  std::vector<Config> cs;
  for (const DtypePair &p : kPairs) {
    for (NVTEDType out : kOutTypes) {
      // TE's forward layout (TN; cuBLASLt's FP8 layout) and an NT one, both with partial tiles.
      cs.push_back({{129, 257, 65}, true, false, p.a, p.b, out, kPlain, kBF16});
      cs.push_back({{7, 33, 5}, false, true, p.a, p.b, out, kPlain, kBF16});
    }
    for (int trans : {0, 1, 3}) {  // TN with a bf16 D is in the list above
      cs.push_back({{129, 257, 65}, (trans & 2) != 0, (trans & 1) != 0, p.a, p.b, kBF16, kPlain,
                    kBF16});
    }
  }
  return cs;
}

// Every mode x operand dtype x output dtype in TE's forward layout; every mode x transpose in bf16.
std::vector<Config> epilogue_configs() {
  std::vector<Config> cs;
  const NVTEDType types[] = {kF32, kBF16, kE4M3};
  for (int mode = 1; mode < static_cast<int>(std::size(kModes)); ++mode) {
    for (NVTEDType in : types) {
      for (NVTEDType out : types) {
        if (kModes[mode].accumulate && test::is_fp8(out)) continue;  // rejected by gemm.h
        cs.push_back({{129, 257, 65}, true, false, in, in, out, mode, aux_for(in)});
      }
    }
    for (int trans = 0; trans < 4; ++trans) {
      cs.push_back({{7, 33, 5}, (trans & 2) != 0, (trans & 1) != 0, kBF16, kBF16, kBF16, mode,
                    kBF16});
    }
    // bf16 output with fp32 bias / pre-GELU: cuBLASLt ties them to D's type, the tiled kernel runs.
    cs.push_back({{129, 257, 65}, true, false, kBF16, kBF16, kBF16, mode, kF32});
  }
  return cs;
}

// Shapes the generic lists miss: many tiles in both directions with every epilogue stage, the
// column-partials path of the op(B) bias gradient (k beyond one 128-row chunk), FP8 D with its
// transposed copy, FNUZ operands in the epilogues, a caller's workspace.
std::vector<Config> special_configs() {
  return {
      {{300, 520, 700}, true, false, kBF16, kBF16, kBF16, kBiasGelu, kBF16},
      {{300, 520, 700}, false, false, kF16, kF16, kF32, kDgeluBgrad, kF16},
      {{65, 300, 700}, false, true, kBF16, kBF16, kBF16, kBgradB, kBF16},
      {{65, 300, 700}, false, true, kE4M3, kE5M2, kF32, kBgradB, kBF16},
      {{65, 300, 257}, false, false, kE5M2Z, kE4M3Z, kBF16, kBgradB, kBF16},
      {{129, 257, 65}, true, false, kE4M3, kE4M3, kE4M3, kBiasGelu, kBF16, true},
      {{129, 257, 65}, false, true, kE4M3Z, kE4M3Z, kE4M3Z, kPlain, kBF16, true},
      {{129, 257, 65}, true, false, kE4M3Z, kE4M3Z, kBF16, kDgeluBgrad, kBF16},
      {{129, 257, 65}, true, false, kBF16, kBF16, kBF16, kBiasGelu, kBF16, false, true},
      {{129, 257, 65}, true, false, kE4M3, kE4M3, kE4M3, kPlain, kBF16, true, true},
  };
}

class GpuGemmTest : public ::testing::TestWithParam<Config> {};
TEST_P(GpuGemmTest, MatchesCpu) { run_case(GetParam(), 4321); }
std::string param_name(const ::testing::TestParamInfo<Config> &info) {
  return config_name(info.param);
}
INSTANTIATE_TEST_SUITE_P(Dtypes, GpuGemmTest, ::testing::ValuesIn(dtype_configs()), param_name);
INSTANTIATE_TEST_SUITE_P(Epilogues, GpuGemmTest, ::testing::ValuesIn(epilogue_configs()),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Special, GpuGemmTest, ::testing::ValuesIn(special_configs()), param_name);

// nvte_cublas_gemm_scaled: every epilogue x (alpha, beta) with alpha positive, negative and 0 and
// beta 0, 1 and other, for fp32, bf16 and FP8 operands (FP8 D only with beta = 0: gemm.h), TN with
// two tiles of n, and bf16 NT on an odd shape. cuBLASLt takes the forward ones without GELU +
// beta; the tiled kernel the rest (and all of them under gpusim).
std::vector<Config> scaled_configs() {
  struct Scales {
    float alpha, beta;
  };
  const Scales scales[] = {{2.5f, 0.0f}, {-0.75f, 0.5f}, {0.0f, 1.0f}};
  std::vector<Config> cs;
  for (int mode = 0; mode < static_cast<int>(std::size(kModes)); ++mode) {
    if (kModes[mode].accumulate) continue;  // beta replaces the flag
    for (const Scales &s : scales) {
      auto add = [&](Config c) {
        c.scaled = true;
        c.alpha = s.alpha;
        c.beta = s.beta;
        cs.push_back(c);
      };
      add({{65, 130, 33}, true, false, kF32, kF32, kF32, mode, kF32});
      add({{65, 130, 33}, true, false, kBF16, kBF16, kBF16, mode, kBF16});
      add({{65, 130, 33}, true, false, kE4M3, kE4M3, kBF16, mode, kBF16});
      if (s.beta == 0.0f) add({{65, 130, 33}, true, false, kE4M3, kE5M2, kE4M3, mode, kBF16});
      add({{7, 33, 5}, false, true, kBF16, kBF16, kBF16, mode, kBF16});
    }
  }
  return cs;
}
INSTANTIATE_TEST_SUITE_P(Scaled, GpuGemmTest, ::testing::ValuesIn(scaled_configs()), param_name);

// ------------------------------------------------------------------ empty products
// m, n or k = 0: nothing to multiply, but amax (0), scale_inv and bias gradients (zeros) are still
// written, exactly as on the CPU.
class GpuGemmEmptyTest : public ::testing::TestWithParam<std::tuple<int, int>> {};
TEST_P(GpuGemmEmptyTest, MatchesCpuBytes) {
  SKIP_WITHOUT_GPU_AND_CPU_GEMM();
  const Dims shapes[] = {{0, 9, 5}, {9, 0, 5}, {9, 7, 0}};
  const Dims d = shapes[std::get<0>(GetParam())];
  const Mode &md = kModes[std::get<1>(GetParam())];
  TestTensor A({d.m, d.k}, kE4M3), B({d.n, d.k}, kE4M3);  // TN: A [m, k], B [n, k]
  std::mt19937 rng(5);
  fill_operand(A, rng);
  fill_operand(B, rng);
  TestTensor D({d.n, d.m}, kE4M3);
  D.set_scale(4.0f);
  D.set_amax(-1.0f);
  D.set_scale_inv(-1.0f);
  // An empty buffer is "no data" for bias/pre: pass them only where they have elements. The bias
  // length follows what is passed: a gradient without pre_gelu_out is the bias gradient of op(B),
  // [n]; otherwise one value per column of D, [m] (so dgelu_bgrad with n = 0 passes no bias).
  const bool use_pre = md.gelu && d.n * d.m > 0;
  const size_t bias_len = md.grad && !use_pre ? d.n : d.m;
  const bool use_bias = md.bias && bias_len > 0;
  TestTensor bias({bias_len}, kBF16), pre({d.n, d.m}, kBF16);
  bias.fill_uniform(rng, -1, 1);  // gradients overwrite it with zeros
  pre.fill_uniform(rng, -1, 1);
  TestTensor gD = clone(D), gbias = clone(bias), gpre = clone(pre);
  GpuTensor dA(A), dB(B), dD(gD), dbias(gbias), dpre(gpre);
  ASSERT_NVTE_OK(nvte_cublas_gemm(A, B, D, use_bias ? bias.handle() : nullptr,
                                  use_pre ? pre.handle() : nullptr, true, false, md.grad, nullptr,
                                  false, false, 0, nullptr));
  ASSERT_NVTE_OK(nvte_cublas_gemm(dA, dB, dD, use_bias ? static_cast<NVTETensor>(dbias) : nullptr,
                                  use_pre ? static_cast<NVTETensor>(dpre) : nullptr, true, false,
                                  md.grad, nullptr, false, false, 0, nullptr));
  dD.download_all(gD);
  dbias.download_all(gbias);
  dpre.download_all(gpre);
  EXPECT_TRUE(test::same_buffers(gD, D)) << "D";
  EXPECT_TRUE(test::same_buffers(gbias, bias)) << "bias";
  EXPECT_TRUE(test::same_buffers(gpre, pre)) << "pre_gelu_out";
}
// (A function, not a lambda: a braced list's commas would split the macro's arguments.)
std::string empty_param_name(const ::testing::TestParamInfo<std::tuple<int, int>> &info) {
  static const char *kDimTags[] = {"m0", "n0", "k0"};
  return std::string(kDimTags[std::get<0>(info.param)]) + "_" +
         kModes[std::get<1>(info.param)].name;
}
INSTANTIATE_TEST_SUITE_P(Empty, GpuGemmEmptyTest,
                         ::testing::Combine(::testing::Range(0, 3),
                                            ::testing::Values(kPlain, kBiasGelu, kBgradB,
                                                              kDgeluBgrad)),
                         empty_param_name);

// ------------------------------------------------------------------ determinism and errors
// The tiled kernel's bias gradients are fixed-order reductions: two runs give the same bytes. (A
// bf16 bias with an fp32 D keeps cuBLASLt out: it ties the bias to D's type.)
TEST(GpuGemm, BiasGradientsRepeatBitForBit) {
  SKIP_WITHOUT_GPU();
  for (int mode : {kBgradB, kDgeluBgrad}) {
    const Mode &md = kModes[mode];
    const Dims d{96, 300, 200};
    std::mt19937 rng(11);
    TestTensor A({d.m, d.k}, kBF16), B({d.k, d.n}, kBF16), pre({d.n, d.m}, kBF16);
    fill_operand(A, rng);
    fill_operand(B, rng);
    pre.fill_uniform(rng, -3, 3);
    TestTensor D({d.n, d.m}, kF32), bias({md.gelu ? d.m : d.n}, kBF16);
    TestTensor D2 = clone(D), bias2 = clone(bias);
    GpuTensor dA(A), dB(B), dpre(pre), dD(D), dbias(bias), dD2(D2), dbias2(bias2);
    for (auto [dd, db] : {std::make_pair(&dD, &dbias), std::make_pair(&dD2, &dbias2)}) {
      const NVTETensor d_pre = md.gelu ? static_cast<NVTETensor>(dpre) : nullptr;
      ASSERT_NVTE_OK(nvte_cublas_gemm(dA, dB, *dd, *db, d_pre, true, true, true, nullptr, false,
                                      false, 0, nullptr));
    }
    dbias.download_all(bias);
    dbias2.download_all(bias2);
    EXPECT_TRUE(test::same_buffers(bias2, bias)) << md.name;
  }
}

// GPU tensors with a CPU tensor among them are an error naming the op and the argument.
TEST(GpuGemm, MixedDevicesRejected) {
  SKIP_WITHOUT_GPU();
  TestTensor A({8, 4}, kF32), B({8, 4}, kF32), D({8, 8}, kF32);
  GpuTensor dA(A), dB(B);
  EXPECT_NVTE_ERROR(nvte_cublas_gemm(dA, dB, D, nullptr, nullptr, true, false, false, nullptr,
                                     false, false, 0, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "nvte_cublas_gemm", "argument 'D'");
}

}  // namespace
