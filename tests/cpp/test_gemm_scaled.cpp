// nvte_cublas_gemm_scaled (alpha, beta) against the double-precision reference of gemm_check.h:
// alpha positive, negative and 0, beta 0 (D not read), 1 and others, every epilogue, every operand
// and output dtype; bytes equal to nvte_cublas_gemm for alpha = 1, beta in {0, 1}; exact rounding
// of alpha / beta on representable data; the rejections specific to the scaled entry.
#include <cmath>

#include "gemm_check.h"

namespace {

struct Scales {
  float alpha, beta;
};
const Scales kScales[] = {{2.5f, 0.0f}, {-0.75f, 0.5f}, {0.0f, 1.0f}, {1.0f, -1.5f}, {-3.0f, 1.0f}};
std::string num_tag(float v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  for (char &ch : s) ch = ch == '-' ? 'm' : ch == '.' ? 'p' : ch;
  return s;
}
std::string scaled_name(const ::testing::TestParamInfo<Config> &info) {
  const Config &c = info.param;
  return std::string(kModes[c.mode].name) + "_" + test::dtype_tag(c.a) + "_x_" +
         test::dtype_tag(c.b) + "_to_" + test::dtype_tag(c.d) + "_" +
         trans_tag(c.transa, c.transb) + "_" + dims_tag(c.dims) + "_a" + num_tag(c.alpha) + "_b" +
         num_tag(c.beta);
}

// Modes without the accumulate flag (beta replaces it): plain, bias, gelu, bias_gelu, grad,
// bgradB, dgelu, dgelu_bgrad.
std::vector<int> base_modes() {
  std::vector<int> ms;
  for (int i = 0; i < static_cast<int>(std::size(kModes)); ++i)
    if (!kModes[i].accumulate) ms.push_back(i);
  return ms;
}

// Every operand pair kind x every output dtype x every (alpha, beta), forward bias epilogue.
std::vector<Config> dtype_configs() {
  const std::pair<NVTEDType, NVTEDType> pairs[] = {
      {kF32, kF32}, {kF16, kF16}, {kBF16, kBF16}, {kE4M3, kE4M3}, {kE5M2, kE4M3}, {kE4M3Z, kE5M2Z}};
  const NVTEDType outs[] = {kF32, kF16, kBF16, kE4M3, kE5M2, kE4M3Z, kE5M2Z};
  std::vector<Config> cs;
  for (auto [a, b] : pairs)
    for (NVTEDType out : outs)
      for (Scales s : kScales) {
        if (test::is_fp8(out) && s.beta != 0.0f) continue;  // rejected (see below)
        const NVTEDType aux = aux_for(test::is_fp8(a) ? kBF16 : a);
        Config c{{65, 33, 17}, true, false, a, b, out, /*bias*/ 1, aux};
        c.scaled = true;
        c.alpha = s.alpha;
        c.beta = s.beta;
        cs.push_back(c);
      }
  return cs;
}
class GemmScaledDtypeTest : public ::testing::TestWithParam<Config> {};
TEST_P(GemmScaledDtypeTest, MatchesDoubleReference) { run_case(GetParam(), 21); }
INSTANTIATE_TEST_SUITE_P(AllDtypes, GemmScaledDtypeTest, ::testing::ValuesIn(dtype_configs()),
                         scaled_name);

// Every epilogue x every (alpha, beta) for fp32 and FP8 operands (fp32 out), and in bf16 with all
// four transposes on an odd shape.
std::vector<Config> epilogue_configs() {
  std::vector<Config> cs;
  for (int mode : base_modes())
    for (Scales s : kScales) {
      auto add = [&](Config c) {
        c.scaled = true;
        c.alpha = s.alpha;
        c.beta = s.beta;
        cs.push_back(c);
      };
      add({{129, 257, 65}, true, false, kF32, kF32, kF32, mode, kF32});
      add({{129, 257, 65}, true, false, kE4M3, kE4M3, kF32, mode, kBF16});
      for (int t = 0; t < 4; ++t)
        add({{7, 33, 5}, (t & 2) != 0, (t & 1) != 0, kBF16, kBF16, kBF16, mode, kBF16});
    }
  return cs;
}
class GemmScaledEpilogueTest : public ::testing::TestWithParam<Config> {};
TEST_P(GemmScaledEpilogueTest, MatchesDoubleReference) { run_case(GetParam(), 43); }
INSTANTIATE_TEST_SUITE_P(AllModes, GemmScaledEpilogueTest, ::testing::ValuesIn(epilogue_configs()),
                         scaled_name);

// ------------------------------------------------------------------ same bytes as nvte_cublas_gemm
// nvte_cublas_gemm is the scaled GEMM with alpha = 1, beta = accumulate: every mode, D and bias
// bytes identical (both run the same plan; this pins that alpha = 1 / beta = 1 change nothing).
TEST(GemmScaled, AlphaOneBetaAccumulateIsNvteCublasGemm) {
  if (!have_gemm()) GTEST_SKIP() << "built without oneDNN";
  const Dims d{65, 33, 17};
  for (int mode = 0; mode < static_cast<int>(std::size(kModes)); ++mode)
    for (NVTEDType in : {kF32, kBF16, kE4M3})
      for (NVTEDType out : {kF32, kBF16, kE4M3}) {
        const Mode &md = kModes[mode];
        if (md.accumulate && test::is_fp8(out)) continue;
        SCOPED_TRACE(std::string(md.name) + "_" + test::dtype_tag(in) + "_to_" +
                     test::dtype_tag(out));
        std::mt19937 rng(mode * 31 + 5);
        Operand A = random_operand(shape_a(d, true), in, rng);
        Operand B = random_operand(shape_b(d, false), in, rng);
        TestTensor D1({d.n, d.m}, out), D2({d.n, d.m}, out);
        const size_t blen = md.grad && !md.gelu ? d.n : d.m;
        TestTensor b1({blen}, kBF16), b2({blen}, kBF16), pre({d.n, d.m}, kBF16);
        TestTensor pre2({d.n, d.m}, kBF16);
        if (!test::is_fp8(out)) {  // an FP8 D is never read
          D1.fill_uniform(rng, -1, 1);
          for (size_t i = 0; i < D1.numel(); ++i) D2.put(i, D1.get(i));
        }
        b1.fill_uniform(rng, -1, 1);
        for (size_t i = 0; i < blen; ++i) b2.put(i, b1.get(i));
        pre.fill_uniform(rng, -3, 3);
        for (size_t i = 0; i < pre.numel(); ++i) pre2.put(i, pre.get(i));
        if (test::is_fp8(out)) {
          for (TestTensor *t : {&D1, &D2}) {
            t->set_scale(4.0f);
            t->set_amax();
            t->set_scale_inv();
          }
        }
        ASSERT_NVTE_OK(nvte_cublas_gemm(A.t, B.t, D1, md.bias ? b1.handle() : nullptr,
                                        md.gelu ? pre.handle() : nullptr, true, false, md.grad,
                                        nullptr, md.accumulate, false, 0, nullptr));
        ASSERT_NVTE_OK(nvte_cublas_gemm_scaled(
            A.t, B.t, D2, md.bias ? b2.handle() : nullptr, md.gelu ? pre2.handle() : nullptr, true,
            false, md.grad, nullptr, 1.0f, md.accumulate ? 1.0f : 0.0f, false, 0, nullptr));
        EXPECT_EQ(D1.buffer().bytes, D2.buffer().bytes) << "D";
        EXPECT_EQ(b1.buffer().bytes, b2.buffer().bytes) << "bias";
        EXPECT_EQ(pre.buffer().bytes, pre2.buffer().bytes) << "pre_gelu_out";
        if (test::is_fp8(out)) {
          EXPECT_EQ(D1.get(0, kNVTEAmax), D2.get(0, kNVTEAmax)) << "amax";
        }
      }
}

// ------------------------------------------------------------------ exact rounding
// Quarter-grid operands and eighth-grid bias / prev with power-of-two alpha and beta:
// alpha X + bias + beta prev is exact in fp32, so D's bytes must be the independent rounding of
// the exact value.
TEST(GemmScaled, PowerOfTwoScalesRoundOnce) {
  if (!have_gemm()) GTEST_SKIP() << "built without oneDNN";
  const Dims d{33, 17, 65};
  for (NVTEDType in : {kF32, kBF16, kF16, kE4M3})
    for (NVTEDType out : {kF32, kBF16, kF16})
      for (Scales s : {Scales{0.5f, 2.0f}, Scales{-4.0f, 0.25f}, Scales{0.0f, -1.0f}}) {
        SCOPED_TRACE(test::dtype_tag(in) + "_to_" + test::dtype_tag(out) + "_a" +
                     num_tag(s.alpha) + "_b" + num_tag(s.beta));
        std::mt19937 rng(9);
        Operand A = quarter_operand(shape_a(d, true), in, rng);
        Operand B = quarter_operand(shape_b(d, false), in, rng);
        const Product P = ref_product(A.v, B.v, d, true, false);
        TestTensor D({d.n, d.m}, out), expect({d.n, d.m}, out), bias({d.m}, kBF16);
        const std::vector<double> prev = fill_eighths(D, rng), bias_v = fill_eighths(bias, rng);
        ASSERT_NVTE_OK(nvte_cublas_gemm_scaled(A.t, B.t, D, bias, nullptr, true, false, false,
                                               nullptr, s.alpha, s.beta, false, 0, nullptr));
        for (size_t i = 0; i < d.n * d.m; ++i)
          expect.put(i, s.alpha * P.x[i] + bias_v[i % d.m] + s.beta * prev[i]);
        EXPECT_TRUE(test::same_bytes(D.bytes(), expect.bytes(), expect.buffer().bytes.size()));
      }
}

// ------------------------------------------------------------------ rejections
TEST(GemmScaled, Rejections) {
  TestTensor A({3, 5}, kBF16), B({4, 3}, kBF16), D({4, 5}, kF32), D8({4, 5}, kE4M3);
  D8.set_scale(1.0f);
  for (TestTensor *t : {&A, &B, &D})
    for (size_t i = 0; i < t->numel(); ++i) t->put(i, 0.25 * static_cast<double>(i % 5));
  const std::vector<uint8_t> d0 = D.buffer().bytes, d80 = D8.buffer().bytes;
  auto call = [&](NVTETensor d, float alpha, float beta) {
    return nvte_cublas_gemm_scaled(A, B, d, nullptr, nullptr, false, false, false, nullptr, alpha,
                                   beta, false, 0, nullptr);
  };
  EXPECT_NVTE_ERROR(call(D8, 1.0f, 0.5f), NVTE_ERROR_UNSUPPORTED, "'beta'", "FP8",
                    "float8_e4m3");
  EXPECT_NVTE_ERROR(call(D, INFINITY, 0.0f), NVTE_ERROR_INVALID_ARGUMENT,
                    "nvte_cublas_gemm_scaled", "'alpha'", "finite", "inf");
  EXPECT_NVTE_ERROR(call(D, 1.0f, NAN), NVTE_ERROR_INVALID_ARGUMENT, "'beta'", "finite", "nan");
  EXPECT_NVTE_ERROR(call(D, -INFINITY, 1.0f), NVTE_ERROR_INVALID_ARGUMENT, "'alpha'");
  EXPECT_EQ(D.buffer().bytes, d0);
  EXPECT_EQ(D8.buffer().bytes, d80);
  if (have_gemm()) {
    D8.set_amax();
    EXPECT_EQ(call(D8, -2.0f, 0.0f), NVTE_SUCCESS) << nvte_get_last_error();  // beta = 0: fine
  }
}

}  // namespace
