// nvte_cublas_gemm against double-precision references: every operand and output dtype, all four
// transposes, odd and empty shapes, each epilogue (bias, GELU, accumulate, dGELU, bias gradients),
// bit-exact rounding of exactly representable results, cache reuse, threads, and every rejection.
#include <thread>

#include "gemm_check.h"

namespace {

// ------------------------------------------------------------------ dtypes, transposes, shapes
struct DtypePair {
  NVTEDType a, b;
};
const DtypePair kPairs[] = {{kF32, kF32},   {kF16, kF16},   {kBF16, kBF16},   {kE4M3, kE4M3},
                            {kE5M2, kE5M2}, {kE4M3, kE5M2}, {kE5M2, kE4M3},   {kE4M3Z, kE4M3Z},
                            {kE5M2Z, kE5M2Z}, {kE4M3, kE5M2Z}};
const NVTEDType kOutTypes[] = {kF32, kF16, kBF16, kE4M3, kE5M2, kE4M3Z, kE5M2Z};
std::string pair_tag(DtypePair p) { return test::dtype_tag(p.a) + "_x_" + test::dtype_tag(p.b); }

// Every operand pair x every output dtype, in two layouts (TE's forward TN and an NT).
struct Layout {
  bool transa, transb;
  Dims dims;
};
const Layout kLayouts[] = {{true, false, {129, 257, 65}}, {false, true, {7, 33, 5}}};
using DtypeParam = std::tuple<DtypePair, NVTEDType, Layout>;
class GemmDtypeTest : public ::testing::TestWithParam<DtypeParam> {};
TEST_P(GemmDtypeTest, MatchesDoubleReference) {
  const auto [pair, out, lay] = GetParam();
  run_case({lay.dims, lay.transa, lay.transb, pair.a, pair.b, out, kPlain, kBF16}, 1234);
}
// (Functions, not lambdas: structured bindings' commas would split the macro's arguments.)
std::string dtype_param_name(const ::testing::TestParamInfo<DtypeParam> &info) {
  const auto [pair, out, lay] = info.param;
  return pair_tag(pair) + "_to_" + test::dtype_tag(out) + "_" + trans_tag(lay.transa, lay.transb) +
         "_" + dims_tag(lay.dims);
}
INSTANTIATE_TEST_SUITE_P(AllDtypes, GemmDtypeTest,
                         ::testing::Combine(::testing::ValuesIn(kPairs),
                                            ::testing::ValuesIn(kOutTypes),
                                            ::testing::ValuesIn(kLayouts)),
                         dtype_param_name);

// Every operand pair x all four transposes x odd shapes (bf16 output).
const Dims kShapes[] = {{1, 1, 1}, {7, 33, 5}, {129, 257, 65}};
using TransParam = std::tuple<DtypePair, int, Dims>;  // pair, transa * 2 + transb, shape
class GemmTransposeTest : public ::testing::TestWithParam<TransParam> {};
TEST_P(GemmTransposeTest, MatchesDoubleReference) {
  const auto [pair, trans, dims] = GetParam();
  run_case({dims, (trans & 2) != 0, (trans & 1) != 0, pair.a, pair.b, kBF16, kPlain, kBF16}, 77);
}
std::string trans_param_name(const ::testing::TestParamInfo<TransParam> &info) {
  const auto [pair, trans, dims] = info.param;
  return pair_tag(pair) + "_" + trans_tag(trans & 2, trans & 1) + "_" + dims_tag(dims);
}
INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmTransposeTest,
                         ::testing::Combine(::testing::ValuesIn(kPairs), ::testing::Range(0, 4),
                                            ::testing::ValuesIn(kShapes)),
                         trans_param_name);

// ------------------------------------------------------------------ epilogues
// Every mode x operand dtype x output dtype in TE's forward layout; every mode x transpose in bf16.
std::vector<Config> epilogue_configs() {
  std::vector<Config> cs;
  const NVTEDType types[] = {kF32, kBF16, kE4M3};
  for (int mode = 1; mode < static_cast<int>(std::size(kModes)); ++mode) {
    for (NVTEDType in : types)
      for (NVTEDType out : types) {
        if (kModes[mode].accumulate && test::is_fp8(out)) continue;  // rejected (see errors)
        cs.push_back({{129, 257, 65}, true, false, in, in, out, mode, aux_for(in)});
      }
    for (int trans = 0; trans < 4; ++trans)
      cs.push_back({{7, 33, 5}, (trans & 2) != 0, (trans & 1) != 0, kBF16, kBF16, kBF16, mode, kBF16});
  }
  return cs;
}
std::string config_name(const Config &c) {
  return std::string(kModes[c.mode].name) + "_" + test::dtype_tag(c.a) + "_to_" +
         test::dtype_tag(c.d) + "_aux_" + test::dtype_tag(c.aux) + "_" +
         trans_tag(c.transa, c.transb) + "_" + dims_tag(c.dims);
}

class GemmEpilogueTest : public ::testing::TestWithParam<Config> {};
TEST_P(GemmEpilogueTest, MatchesDoubleReference) { run_case(GetParam(), 42); }
INSTANTIATE_TEST_SUITE_P(AllModes, GemmEpilogueTest, ::testing::ValuesIn(epilogue_configs()),
                         [](const ::testing::TestParamInfo<Config> &info) {
                           return config_name(info.param);
                         });

// oneDNN 3.2 workaround (gemm_cpu.cpp, make_plan): on AVX-512 FP16 CPUs without AMX, its brgemm
// matmul with bf16 operands and an f16 bias (binary-add post-op) returned wrong values for every
// output, silently. The bias now always enters oneDNN as fp32; these are the configurations that
// failed, kept by name (they also run in AllModes).
TEST(GemmOneDnnWorkarounds, Fp16BiasOnBf16Operands) {
  for (NVTEDType in : {kE4M3, kBF16})
    for (NVTEDType out : {kF32, kBF16}) {
      SCOPED_TRACE(test::dtype_tag(in) + "_to_" + test::dtype_tag(out));
      run_case({{129, 257, 65}, true, false, in, in, out, /*mode=bias*/ 1, kF16}, 42);
    }
}

// Concurrent executions of one cached oneDNN primitive (the JAX front end runs one GEMM per host
// device at once, from XLA's threads). Regression: with oneDNN's library-managed scratchpad a cached
// primitive is tied to the thread that created it, and brgemm kernels run from several threads at
// once returned wrong values; each execution now brings its own scratchpad.
TEST(GemmConcurrency, OneCachedPrimitiveFromManyThreads) {
  if (!have_gemm()) GTEST_SKIP() << "built without the CPU GEMM";
  for (NVTEDType in : {kBF16, kE4M3, kF32}) {
    SCOPED_TRACE(test::dtype_tag(in));
    const Config c{{256, 192, 512}, true, false, in, in, kF32, kPlain, kF32};
    run_case(c, 1);  // creates and caches the primitive on this thread
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&c, t] {
        for (int r = 0; r < 4; ++r) run_case(c, 100 + 10 * t + r);
      });
    }
    for (std::thread &t : threads) t.join();
  }
}

// Empty products: k = 0 (D = epilogue of zeros), and empty outputs (n = 0, m = 0).
std::vector<Config> empty_configs() {
  std::vector<Config> cs;
  for (Dims s : {Dims{5, 3, 0}, Dims{4, 0, 7}, Dims{0, 3, 7}})
    for (int mode : {0, 3, 5, 9, 13})
      for (NVTEDType out : {kF32, kE4M3}) {
        if (kModes[mode].accumulate && test::is_fp8(out)) continue;
        cs.push_back({s, true, false, kBF16, kBF16, out, mode, kF32});
      }
  return cs;
}
class GemmEmptyTest : public ::testing::TestWithParam<Config> {};
TEST_P(GemmEmptyTest, MatchesDoubleReference) { run_case(GetParam(), 7); }
INSTANTIATE_TEST_SUITE_P(EmptyDims, GemmEmptyTest, ::testing::ValuesIn(empty_configs()),
                         [](const ::testing::TestParamInfo<Config> &info) {
                           return config_name(info.param);
                         });

// Large K and M (one dtype each path: bf16 direct, FP8 widened, fp16).
std::vector<Config> large_configs() {
  return {{{1023, 65, 4097}, true, false, kBF16, kBF16, kBF16, kPlain, kBF16},
          {{1023, 65, 4097}, false, false, kBF16, kBF16, kF32, kBiasAcc, kBF16},
          {{4097, 33, 1023}, true, true, kE4M3, kE4M3, kBF16, kPlain, kBF16},
          {{1023, 33, 4097}, false, true, kF16, kF16, kF16, kBgradB, kF16}};
}
class GemmLargeTest : public ::testing::TestWithParam<Config> {};
TEST_P(GemmLargeTest, MatchesDoubleReference) { run_case(GetParam(), 99); }
INSTANTIATE_TEST_SUITE_P(Large, GemmLargeTest, ::testing::ValuesIn(large_configs()),
                         [](const ::testing::TestParamInfo<Config> &info) {
                           return config_name(info.param);
                         });

// ------------------------------------------------------------------ bit-exact rounding
// Inputs on a 1/4 grid make op(B)op(A) + bias + prev exact in fp32, so every output byte must equal
// the independent rounding of the exact result (for FP8 D: encode(result * scale), saturating).
struct ExactParam {
  DtypePair pair;
  NVTEDType out;
  int mode;
  bool transa, transb;
};
class GemmExactTest : public ::testing::TestWithParam<ExactParam> {};

TEST_P(GemmExactTest, BytesEqualRoundedExactResult) {
  if (!have_gemm()) GTEST_SKIP() << "built without oneDNN";
  const auto [pair, out, mode, ta, tb] = GetParam();
  const Mode &md = kModes[mode];
  const Dims d{33, 17, 65};
  const NVTEDType aux = kBF16;
  std::mt19937 rng(5);
  Operand A = quarter_operand(shape_a(d, ta), pair.a, rng);
  Operand B = quarter_operand(shape_b(d, tb), pair.b, rng);
  const Product P = ref_product(A.v, B.v, d, ta, tb);
  TestTensor D({d.n, d.m}, out), expect({d.n, d.m}, out);
  std::vector<double> prev(d.n * d.m, 0.0), bias_v;
  if (md.accumulate) prev = fill_eighths(D, rng);
  TestTensor bias({md.grad ? d.n : d.m}, aux), bias_expect({md.grad ? d.n : d.m}, aux);
  if (md.bias && !md.grad) bias_v = fill_eighths(bias, rng);
  const float scale = 8.0f;  // E4M3FNUZ (max 240) saturates some values: satfinite is pinned too
  if (test::is_fp8(out)) {
    D.set_scale(scale);
    D.set_amax();
    D.set_scale_inv();
  }
  ASSERT_NVTE_OK(nvte_cublas_gemm(A.t, B.t, D, md.bias ? bias.handle() : nullptr, nullptr, ta, tb,
                                  md.grad, nullptr, md.accumulate, false, 0, nullptr));
  double amax = 0;
  for (size_t i = 0; i < d.n * d.m; ++i) {
    const double v = P.x[i] + (bias_v.empty() ? 0.0 : bias_v[i % d.m]) + prev[i];
    amax = std::max(amax, std::fabs(v));
    expect.put(i, test::is_fp8(out) ? v * scale : v);
  }
  EXPECT_TRUE(test::same_bytes(D.bytes(), expect.bytes(), expect.buffer().bytes.size()));
  if (test::is_fp8(out)) {
    EXPECT_EQ(D.get(0, kNVTEAmax), amax);
    EXPECT_EQ(D.get(0, kNVTERowwiseScaleInv), 1.0 / 8.0);
  }
  if (md.grad && md.bias) {
    const std::vector<double> bo = op_b_rows(B.v, d, tb);
    for (size_t i = 0; i < d.n; ++i) {
      double s = 0;
      for (size_t kk = 0; kk < d.k; ++kk) s += bo[i * d.k + kk];
      bias_expect.put(i, s);
    }
    EXPECT_TRUE(test::same_bytes(bias.bytes(), bias_expect.bytes(), bias.buffer().bytes.size()));
  }
}

const DtypePair kExactPairs[] = {{kF32, kF32},   {kF16, kF16},     {kBF16, kBF16},
                                 {kE4M3, kE4M3}, {kE5M2, kE5M2},   {kE4M3Z, kE4M3Z},
                                 {kE5M2Z, kE5M2Z}, {kE4M3, kE5M2}};
// Each pair x output dtype x {plain, bias + accumulate, bias gradient of B}, each mode with its own
// transposes.
std::vector<ExactParam> exact_params() {
  std::vector<ExactParam> ps;
  for (DtypePair pair : kExactPairs)
    for (NVTEDType out : kOutTypes) {
      ps.push_back({pair, out, kPlain, false, true});
      if (!test::is_fp8(out)) ps.push_back({pair, out, kBiasAcc, true, false});
      ps.push_back({pair, out, kBgradB, true, true});
    }
  return ps;
}
std::string exact_param_name(const ::testing::TestParamInfo<ExactParam> &info) {
  const ExactParam &p = info.param;
  return pair_tag(p.pair) + "_to_" + test::dtype_tag(p.out) + "_" + kModes[p.mode].name + "_" +
         trans_tag(p.transa, p.transb);
}
INSTANTIATE_TEST_SUITE_P(Rounding, GemmExactTest, ::testing::ValuesIn(exact_params()),
                         exact_param_name);

// ------------------------------------------------------------------ behaviours beyond the tables
TEST(GemmMisc, NewScaleInvValuesReuseCachedPrimitive) {
  // Scales are runtime arguments of the cached primitive: changing them must change the result.
  if (!have_gemm()) GTEST_SKIP() << "built without oneDNN";
  const Dims d{17, 9, 31};
  std::mt19937 rng(3);
  Operand A = random_operand(shape_a(d, true), kE4M3, rng);
  Operand B = random_operand(shape_b(d, false), kE5M2, rng);
  TestTensor D1({d.n, d.m}, kF32), D2({d.n, d.m}, kF32);
  ASSERT_NVTE_OK(nvte_cublas_gemm(A.t, B.t, D1, nullptr, nullptr, true, false, false, nullptr,
                                  false, false, 0, nullptr));
  A.t.f32(kNVTERowwiseScaleInv)[0] *= 4.0f;  // powers of two: the results scale exactly
  B.t.f32(kNVTERowwiseScaleInv)[0] *= 0.125f;
  ASSERT_NVTE_OK(nvte_cublas_gemm(A.t, B.t, D2, nullptr, nullptr, true, false, false, nullptr,
                                  false, false, 0, nullptr));
  std::vector<double> expect = D1.to_double();
  for (double &v : expect) v *= 0.5;
  EXPECT_TRUE(test::close(D2.to_double(), expect, {0.0, 0.0}));
}

TEST(GemmMisc, ConcurrentCallsFromThreads) {
  // The primitive cache is shared: threads creating and reusing primitives at once must all get
  // correct results.
  if (!have_gemm()) GTEST_SKIP() << "built without oneDNN";
  constexpr int kThreads = 4, kIters = 6;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      std::mt19937 rng(100 + t);
      for (int it = 0; it < kIters; ++it) {
        const Dims d{static_cast<size_t>(8 + (it % 3)), static_cast<size_t>(5 + t), 24};
        Operand A = random_operand(shape_a(d, it % 2), kBF16, rng);
        Operand B = random_operand(shape_b(d, false), kBF16, rng);
        TestTensor D({d.n, d.m}, kF32);
        if (nvte_cublas_gemm(A.t, B.t, D, nullptr, nullptr, it % 2, false, false, nullptr, false,
                             false, 0, nullptr) != NVTE_SUCCESS) {
          ++failures[t];
          continue;
        }
        const Product P = ref_product(A.v, B.v, d, it % 2, false);
        const double atol = test::fp32_accumulation_atol(d.k, P.max_l1);
        if (!test::close(D.to_double(), P.x, {atol, test::tolerance(kF32).rtol})) ++failures[t];
      }
    });
  }
  for (std::thread &th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

TEST(GemmMisc, Fp8OutputWithTransposedCopy) {
  if (!have_gemm()) GTEST_SKIP() << "built without oneDNN";
  const Dims d{19, 37, 11};
  std::mt19937 rng(8);
  Operand A = random_operand(shape_a(d, false), kBF16, rng);
  Operand B = random_operand(shape_b(d, true), kBF16, rng);
  TestTensor D({d.n, d.m}, kE4M3);
  D.set(kNVTEColumnwiseData, {d.m, d.n}, kE4M3);
  D.set_scale(16.0f);
  D.set_amax();
  ASSERT_NVTE_OK(nvte_cublas_gemm(A.t, B.t, D, nullptr, nullptr, false, true, false, nullptr, false,
                                  false, 0, nullptr));
  const Product P = ref_product(A.v, B.v, d, false, true);
  EXPECT_TRUE(fp8_close(D, P.x, 16.0, test::fp32_accumulation_atol(d.k, P.max_l1)));
  for (size_t i = 0; i < d.n; ++i)
    for (size_t j = 0; j < d.m; ++j)
      ASSERT_EQ(D.bytes()[i * d.m + j], D.bytes(kNVTEColumnwiseData)[j * d.n + i]) << i << "," << j;
}

TEST(GemmMisc, LeadingDimsFlattenAndEmptyOptionalHandles) {
  // B [2, 3, k] is op(B) with n = 6 rows; D may keep the split [2, 3, m]. A bias handle without data
  // counts as no bias (as TE), and the workspace is accepted and ignored.
  if (!have_gemm()) GTEST_SKIP() << "built without oneDNN";
  const size_t m = 10, k = 7;
  std::mt19937 rng(11);
  Operand A = random_operand({k, m}, kF32, rng);
  Operand B = random_operand({2, 3, k}, kF32, rng);
  TestTensor D({2, 3, m}, kBF16), workspace({1024}, kNVTEByte), no_bias({m}, kBF16);
  D.set_amax(-1.0f);
  no_bias.set_null(kNVTERowwiseData, {m}, kBF16);
  ASSERT_NVTE_OK(nvte_cublas_gemm(A.t, B.t, D, no_bias, nullptr, false, false, false, workspace,
                                  false, true, 8, nullptr));
  const Product P = ref_product(A.v, B.v, {m, 6, k}, false, false);
  const test::Tol t = test::tolerance(kBF16);
  EXPECT_TRUE(test::close(D.to_double(), P.x, t));
  // amax of a non-FP8 output, when it has an amax buffer: max |D| before rounding.
  EXPECT_NEAR(D.get(0, kNVTEAmax), max_abs(P.x), 1e-5 * max_abs(P.x));
}

}  // namespace
