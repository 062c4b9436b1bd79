// The GEMM suite's harness (test_gemm.cpp): operand and output dtypes, epilogue modes, the
// double-precision reference and run_case(), which builds one configuration, runs
// nvte_cublas_gemm and compares with the reference. Included by test_gemm.cpp only (its
// helpers live in an unnamed namespace, one copy per test executable).
#pragma once

#include <algorithm>
#include <string>

#include "test_common.h"
#include "transformer_engine_lite/gemm.h"

namespace {

using test::TestTensor;

constexpr NVTEDType kF32 = kNVTEFloat32, kF16 = kNVTEFloat16, kBF16 = kNVTEBFloat16,
                    kE4M3 = kNVTEFloat8E4M3, kE5M2 = kNVTEFloat8E5M2,
                    kE4M3Z = kNVTEFloat8E4M3FNUZ, kE5M2Z = kNVTEFloat8E5M2FNUZ;

bool have_gemm() {
  return std::string(nvte_get_build_info()).find("\"gemm_cpu\": null") == std::string::npos;
}

struct Dims {
  size_t m, n, k;
};
std::string dims_tag(Dims d) {
  return std::to_string(d.m) + "x" + std::to_string(d.n) + "x" + std::to_string(d.k);
}
std::vector<size_t> shape_a(Dims d, bool transa) {
  return transa ? std::vector<size_t>{d.m, d.k} : std::vector<size_t>{d.k, d.m};
}
std::vector<size_t> shape_b(Dims d, bool transb) {
  return transb ? std::vector<size_t>{d.k, d.n} : std::vector<size_t>{d.n, d.k};
}
std::string trans_tag(bool ta, bool tb) { return std::string(ta ? "T" : "N") + (tb ? "T" : "N"); }

// Which epilogue a case runs (see gemm.h): forward bias/GELU/accumulate, or grad mode.
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
constexpr int kPlain = 0, kBiasAcc = 5, kBgradB = 9;

struct Config {
  Dims dims;
  bool transa, transb;
  NVTEDType a, b, d;
  int mode;
  NVTEDType aux;  // dtype of bias and pre_gelu_out
  // nvte_cublas_gemm_scaled with these factors (the mode's accumulate flag is then unused);
  // otherwise nvte_cublas_gemm, i.e. alpha = 1, beta = accumulate.
  bool scaled = false;
  float alpha = 1.0f, beta = 0.0f;
};
double alpha_of(const Config &c) { return c.scaled ? c.alpha : 1.0; }
double beta_of(const Config &c) {
  return c.scaled ? c.beta : kModes[c.mode].accumulate ? 1.0 : 0.0;
}

NVTEDType aux_for(NVTEDType in) { return in == kF32 ? kF32 : in == kBF16 ? kBF16 : kF16; }

// ------------------------------------------------------------------ double-precision reference
double gelu_ref(double x) {
  const double k0 = std::sqrt(2.0 / M_PI), k1 = 0.044715;
  return 0.5 * x * (1.0 + std::tanh(k0 * (x + k1 * x * x * x)));
}
double dgelu_ref(double x) {  // d/dx of gelu_ref, derived by hand
  const double k0 = std::sqrt(2.0 / M_PI), k1 = 0.044715;
  const double t = std::tanh(k0 * (x + k1 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k0 * (1.0 + 3.0 * k1 * x * x);
}

// op(A) as [m][k] and op(B) as [n][k] (contiguous k), from the row-major operand values.
std::vector<double> op_a_rows(const std::vector<double> &a, Dims d, bool ta) {
  std::vector<double> o(d.m * d.k);
  for (size_t j = 0; j < d.m; ++j)
    for (size_t kk = 0; kk < d.k; ++kk) o[j * d.k + kk] = ta ? a[j * d.k + kk] : a[kk * d.m + j];
  return o;
}
std::vector<double> op_b_rows(const std::vector<double> &b, Dims d, bool tb) {
  std::vector<double> o(d.n * d.k);
  for (size_t i = 0; i < d.n; ++i)
    for (size_t kk = 0; kk < d.k; ++kk) o[i * d.k + kk] = tb ? b[kk * d.n + i] : b[i * d.k + kk];
  return o;
}

struct Product {
  std::vector<double> x;  // [n, m] = op(B) op(A)
  double max_l1 = 0;      // max over outputs of sum_k |op(B)[i,k] op(A)[k,j]|
};
Product ref_product(const std::vector<double> &a, const std::vector<double> &b, Dims d, bool ta,
                    bool tb) {
  const std::vector<double> ao = op_a_rows(a, d, ta), bo = op_b_rows(b, d, tb);
  Product p;
  p.x.assign(d.n * d.m, 0.0);
  for (size_t i = 0; i < d.n; ++i) {
    const double *br = bo.data() + i * d.k;
    for (size_t j = 0; j < d.m; ++j) {
      const double *ar = ao.data() + j * d.k;
      double s = 0, l1 = 0;
      for (size_t kk = 0; kk < d.k; ++kk) {
        s += br[kk] * ar[kk];
        l1 += std::fabs(br[kk] * ar[kk]);
      }
      p.x[i * d.m + j] = s;
      p.max_l1 = std::max(p.max_l1, l1);
    }
  }
  return p;
}

// ------------------------------------------------------------------ operands
// FP8 codes decoded once per format with the independent test::ref_fp8_decode; encode is the same
// nearest-code rule as test::ref_fp8_encode (ties to even code, satfinite, -0 only in OCP), on the
// cached table, because the exhaustive reference is too slow for the 10^5-element checks here.
struct Fp8Table {
  NVTEDType t;
  double val[256];
  std::vector<uint8_t> small_codes;  // finite codes with |value| <= 2
  explicit Fp8Table(NVTEDType type) : t(type) {
    for (int c = 0; c < 256; ++c) {
      val[c] = test::ref_fp8_decode(static_cast<uint8_t>(c), t);
      if (std::isfinite(val[c]) && std::fabs(val[c]) <= 2.0) small_codes.push_back(c);
    }
  }
  uint8_t encode(double x) const {
    const test::Fp8Spec s = test::fp8_spec(t);
    const double a = std::min(std::fabs(x), s.max);
    int best = 0;
    double best_d = std::numeric_limits<double>::infinity();
    for (int c = 0; c < 128; ++c) {
      if (!std::isfinite(val[c])) continue;
      const double dd = std::fabs(val[c] - a);
      if (dd < best_d || (dd == best_d && (c & 1) == 0)) {
        best_d = dd;
        best = c;
      }
    }
    if (s.fnuz && best == 0) return 0;
    return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
  }
};
const Fp8Table &fp8_table(NVTEDType t) {
  static const Fp8Table e4m3(kE4M3), e5m2(kE5M2), e4m3z(kE4M3Z), e5m2z(kE5M2Z);
  return t == kE4M3 ? e4m3 : t == kE5M2 ? e5m2 : t == kE4M3Z ? e4m3z : e5m2z;
}

struct Operand {
  TestTensor t;
  std::vector<double> v;  // real values (FP8: decoded * scale_inv)
};

// High precision: uniform in [lo, hi). FP8: uniformly drawn codes of magnitude <= 2 (subnormals and
// every exponent included) with scale_inv = 0.5, so real values lie in [-1, 1].
Operand random_operand(const std::vector<size_t> &shape, NVTEDType dt, std::mt19937 &rng,
                       double lo = -1.0, double hi = 1.0) {
  Operand op{TestTensor(shape, dt), {}};
  if (!test::is_fp8(dt)) {
    op.v = op.t.fill_uniform(rng, lo, hi);
    return op;
  }
  op.t.set_scale_inv(0.5f);
  const Fp8Table &tab = fp8_table(dt);
  op.v.resize(op.t.numel());
  for (size_t i = 0; i < op.v.size(); ++i) {
    const uint8_t c = tab.small_codes[rng() % tab.small_codes.size()];
    op.t.bytes()[i] = c;
    op.v[i] = 0.5 * tab.val[c];
  }
  return op;
}

// Multiples of 1/4 in [-3/4, 3/4] (FP8: integers -3..3 with scale_inv 1/4): every product, sum and
// epilogue add of the exact tests is exactly representable in fp32.
Operand quarter_operand(const std::vector<size_t> &shape, NVTEDType dt, std::mt19937 &rng) {
  Operand op{TestTensor(shape, dt), {}};
  const bool fp8 = test::is_fp8(dt);
  if (fp8) op.t.set_scale_inv(0.25f);
  op.v.resize(op.t.numel());
  for (size_t i = 0; i < op.v.size(); ++i) {
    const int q = static_cast<int>(rng() % 7) - 3;
    op.t.put(i, fp8 ? q : q * 0.25);
    op.v[i] = q * 0.25;
  }
  return op;
}
// Multiples of 1/8 in [-4, 4] (exact in every high-precision dtype).
std::vector<double> fill_eighths(TestTensor &t, std::mt19937 &rng) {
  for (size_t i = 0; i < t.numel(); ++i) t.put(i, (static_cast<int>(rng() % 65) - 32) / 8.0);
  return t.to_double();
}

// FP8 output check: the library rounds its fp32 value, which may differ from the double reference by
// `slack`; each byte must be the encoding of some value within ref +- slack (encode is monotonic, so
// the decoded byte lies between the encodings of the two ends).
::testing::AssertionResult fp8_close(const TestTensor &D, const std::vector<double> &ref,
                                     double scale, double slack) {
  const Fp8Table &tab = fp8_table(D.buffer().dtype);
  size_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double s = slack + std::ldexp(std::fabs(ref[i]), -22);
    const double lo = tab.val[tab.encode((ref[i] - s) * scale)];
    const double hi = tab.val[tab.encode((ref[i] + s) * scale)];
    const double got = tab.val[D.buffer().bytes[i]];
    if (!(got >= lo && got <= hi)) {
      if (bad < 5) first << "\n  [" << i << "] got " << got << ", expected in [" << lo << ", " << hi
                         << "] (ref " << ref[i] * scale << ")";
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << ref.size() << " FP8 values off:"
                                       << first.str();
}

double max_abs(const std::vector<double> &v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

NVTEStatus call_gemm(const TestTensor &A, const TestTensor &B, TestTensor &D, NVTETensor bias,
                     NVTETensor pre, const Config &c) {
  const Mode &md = kModes[c.mode];
  if (c.scaled) {
    return nvte_cublas_gemm_scaled(A, B, D, bias, pre, c.transa, c.transb, md.grad, nullptr,
                                   c.alpha, c.beta, false, 0, nullptr);
  }
  return nvte_cublas_gemm(A, B, D, bias, pre, c.transa, c.transb, md.grad, nullptr, md.accumulate,
                          false, 0, nullptr);
}

// ------------------------------------------------------------------ the general check
void run_case(const Config &c, uint32_t seed) {
  if (!have_gemm()) GTEST_SKIP() << "built without oneDNN";
  const Mode &md = kModes[c.mode];
  const Dims d = c.dims;
  std::mt19937 rng(seed);
  Operand A = random_operand(shape_a(d, c.transa), c.a, rng);
  Operand B = random_operand(shape_b(d, c.transb), c.b, rng);
  const Product P = ref_product(A.v, B.v, d, c.transa, c.transb);

  const double alpha = alpha_of(c), beta = beta_of(c);
  TestTensor D({d.n, d.m}, c.d);
  std::vector<double> prev(d.n * d.m, 0.0);
  if (beta != 0.0) {
    prev = D.fill_uniform(rng, -1, 1);
  } else if (c.scaled && !test::is_fp8(c.d)) {
    for (size_t i = 0; i < D.numel(); ++i) D.put(i, NAN);  // beta = 0 must not read D
  }
  TestTensor bias, pre;
  std::vector<double> bias_v, pre_v;
  const size_t bias_len = md.grad && !md.gelu ? d.n : d.m;
  if (md.bias) {
    bias = TestTensor({bias_len}, c.aux);
    if (!md.grad) bias_v = bias.fill_uniform(rng, -1, 1);
  }
  if (md.gelu) {
    pre = TestTensor({d.n, d.m}, c.aux);
    if (md.grad) pre_v = pre.fill_uniform(rng, -3, 3);
  }

  // Reference epilogue in double.
  std::vector<double> out(d.n * d.m), pre_ref(md.gelu ? d.n * d.m : 0), bias_ref(bias_len, 0.0);
  std::vector<double> term(d.n * d.m);  // the epilogue's value before beta * prev is added
  double bias_l1 = 0;  // largest sum of |terms| behind one bias-gradient value
  for (size_t i = 0; i < d.n; ++i) {
    for (size_t j = 0; j < d.m; ++j) {
      const size_t idx = i * d.m + j;
      double v = alpha * P.x[idx];
      if (!md.grad) {
        if (md.bias) v += bias_v[j];
        if (md.gelu) {
          pre_ref[idx] = v;
          v = gelu_ref(v);
        }
      } else if (md.gelu) {
        v *= dgelu_ref(pre_v[idx]);
        bias_ref[j] += v;
      }
      term[idx] = v;
      out[idx] = v + beta * prev[idx];
    }
  }
  if (md.grad && md.gelu) {
    std::vector<double> col_l1(d.m, 0.0);
    for (size_t idx = 0; idx < out.size(); ++idx) col_l1[idx % d.m] += std::fabs(term[idx]);
    bias_l1 = max_abs(col_l1);
  }
  if (md.grad && !md.gelu) {
    const std::vector<double> bo = op_b_rows(B.v, d, c.transb);
    for (size_t i = 0; i < d.n; ++i) {
      double l1 = 0;
      for (size_t kk = 0; kk < d.k; ++kk) {
        bias_ref[i] += bo[i * d.k + kk];
        l1 += std::fabs(bo[i * d.k + kk]);
      }
      bias_l1 = std::max(bias_l1, l1);
    }
  }

  // FP8 output: a scale that uses about half the format's range.
  float d_scale = 1.0f;
  if (test::is_fp8(c.d)) {
    const double mx = max_abs(out);
    d_scale = mx > 0 ? static_cast<float>(0.5 * test::fp8_spec(c.d).max / mx) : 1.0f;
    D.set_scale(d_scale);
    D.set_amax(-1.0f);
    D.set_scale_inv(-1.0f);
  }
  ASSERT_NVTE_OK(call_gemm(A.t, B.t, D, md.bias ? bias.handle() : nullptr,
                           md.gelu ? pre.handle() : nullptr, c));

  // Error of the fp32 product and epilogue (|gelu'| <= 1.13, bias adds |.| <= 1, beta * prev
  // |beta|; alpha scales the product's error with it).
  const double atol_c = test::fp32_accumulation_atol(
      d.k, std::fabs(alpha) * 1.2 * P.max_l1 + 1.0 + std::max(1.0, std::fabs(beta)));
  if (test::is_fp8(c.d)) {
    EXPECT_TRUE(fp8_close(D, out, d_scale, atol_c));
    const double amax = D.get(0, kNVTEAmax);
    EXPECT_NEAR(amax, max_abs(out), atol_c + std::ldexp(max_abs(out), -22)) << "amax of D";
    EXPECT_EQ(D.get(0, kNVTERowwiseScaleInv), static_cast<double>(1.0f / d_scale)) << "scale_inv";
  } else {
    const test::Tol t = test::tolerance(c.d);
    EXPECT_TRUE(test::close(D.to_double(), out, {t.atol + atol_c, t.rtol})) << "D";
  }
  const test::Tol ta = test::tolerance(c.aux);
  if (md.gelu && !md.grad) {
    EXPECT_TRUE(test::close(pre.to_double(), pre_ref, {ta.atol + atol_c, ta.rtol})) << "pre_gelu_out";
  }
  if (md.grad && md.bias) {
    const size_t terms = md.gelu ? d.n : d.k;
    const double per_term = md.gelu ? atol_c : 0.0;  // each dGELU term carries the product's error
    const double atol = ta.atol + terms * per_term + test::fp32_accumulation_atol(terms, bias_l1);
    EXPECT_TRUE(test::close(bias.to_double(), bias_ref, {atol, ta.rtol})) << "bias gradient";
  }
}

}  // namespace
