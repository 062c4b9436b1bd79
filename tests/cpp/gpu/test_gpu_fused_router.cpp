// Fused MoE router on the GPU against the CPU op: top-k forward and backward (each score function,
// pre/post softmax, group-limited top-k, expert bias, every dtype, several blocks of tokens), the
// aux-loss scores and the aux loss. Both devices run the same per-token math
// (fused_router_params.h) and differ only in expf / log1pf (an ulp): routing maps are compared
// byte for byte (distinct logits), values to the dtype's tolerance.
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/fused_router.h"

namespace {

using test::GpuTensor;
using test::TestTensor;

struct Dims {
  size_t tokens, experts;
  int topk, groups, group_topk;
};
// 300 tokens: three blocks of 128 threads, the last partly idle.
const Dims kDims[] = {{1, 1, 1, 0, 0}, {300, 8, 2, 0, 0}, {33, 64, 6, 8, 3}, {19, 37, 5, 0, 0}};

test::Tol router_tolerance(NVTEDType t) {
  const test::Tol base = test::tolerance(t);
  return {std::max(base.atol, 2e-6), std::max(base.rtol, 3e-5)};
}

// Distinct multiples of 1/16 per token (exact in every dtype, no ties).
void fill_logits(TestTensor &x, size_t tokens, size_t n, std::mt19937 &rng) {
  std::vector<double> row(n);
  for (size_t i = 0; i < n; ++i) {
    row[i] = (static_cast<double>(i) - static_cast<double>(n / 2)) / 16;
  }
  for (size_t t = 0; t < tokens; ++t) {
    std::shuffle(row.begin(), row.end(), rng);
    for (size_t i = 0; i < n; ++i) x.put(t * n + i, row[i]);
  }
}

// Score function, pre-softmax, expert bias: every meaningful combination.
struct Mode {
  int score;
  bool pre, bias;
  const char *name;
};
const Mode kModes[] = {{0, false, false, "sigmoid"},      {0, false, true, "sigmoid_bias"},
                       {1, true, false, "softmax_pre"},   {1, false, false, "softmax_post"},
                       {2, false, false, "sqrtsoftplus"}, {2, false, true, "sqrtsoftplus_bias"}};
const char *kScoreNames[] = {"sigmoid", "softmax", "sqrtsoftplus"};

// (mode index, dims index, dtype); the aux-loss scores use the mode index as score function.
using Param = std::tuple<int, int, NVTEDType>;

class GpuFusedRouterTest : public ::testing::TestWithParam<Param> {};

TEST_P(GpuFusedRouterTest, TopkMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [mi, di, dtype] = GetParam();
  const auto [score, pre, with_bias, mode_name] = kModes[mi];
  const Dims d = kDims[di];
  const size_t n = d.experts;
  std::mt19937 rng(static_cast<unsigned>(17 + di + 10 * score));
  TestTensor x({d.tokens, n}, dtype), bias({n}, kNVTEFloat32), g({d.tokens, n}, dtype);
  fill_logits(x, d.tokens, n, rng);
  bias.fill_uniform(rng, -0.3, 0.3);
  g.fill_uniform(rng, -1.0, 1.0);
  const bool use_bias = with_bias && score != 1;
  const float sf = 1.5f;
  TestTensor probs[2] = {TestTensor({d.tokens, n}, dtype), TestTensor({d.tokens, n}, dtype)};
  TestTensor map[2] = {TestTensor({d.tokens, n}, kNVTEByte), TestTensor({d.tokens, n}, kNVTEByte)};
  TestTensor inter[2] = {TestTensor({d.tokens, n}, kNVTEFloat32),
                         TestTensor({d.tokens, n}, kNVTEFloat32)};
  TestTensor dx[2] = {TestTensor({d.tokens, n}, dtype), TestTensor({d.tokens, n}, dtype)};
  ASSERT_NVTE_OK(nvte_fused_topk_with_score_function_forward(
      x, int(d.tokens), int(n), d.topk, pre, d.groups, d.group_topk, sf, score,
      use_bias ? bias.handle() : nullptr, probs[0], map[0], inter[0], nullptr));
  ASSERT_NVTE_OK(nvte_fused_topk_with_score_function_backward(
      map[0], inter[0], g, int(d.tokens), int(n), d.topk, pre, sf, score, dx[0], nullptr));

  GpuTensor d_x(x), d_bias(bias), d_g(g), d_probs(probs[1]), d_map(map[1]), d_inter(inter[1]),
      d_dx(dx[1]);
  ASSERT_NVTE_OK(nvte_fused_topk_with_score_function_forward(
      d_x, int(d.tokens), int(n), d.topk, pre, d.groups, d.group_topk, sf, score,
      use_bias ? static_cast<NVTETensor>(d_bias) : nullptr, d_probs, d_map, d_inter, nullptr));
  ASSERT_NVTE_OK(nvte_fused_topk_with_score_function_backward(
      d_map, d_inter, d_g, int(d.tokens), int(n), d.topk, pre, sf, score, d_dx, nullptr));
  d_probs.download(probs[1], kNVTERowwiseData);
  d_map.download(map[1], kNVTERowwiseData);
  d_inter.download(inter[1], kNVTERowwiseData);
  d_dx.download(dx[1], kNVTERowwiseData);
  EXPECT_EQ(map[1].to_double(), map[0].to_double());
  EXPECT_TRUE(test::close(probs[1].to_double(), probs[0].to_double(), router_tolerance(dtype)));
  EXPECT_TRUE(test::close(inter[1].to_double(), inter[0].to_double(),
                          router_tolerance(kNVTEFloat32)));
  EXPECT_TRUE(test::close(dx[1].to_double(), dx[0].to_double(), router_tolerance(dtype)));
}

class GpuFusedRouterScoresTest : public ::testing::TestWithParam<Param> {};

TEST_P(GpuFusedRouterScoresTest, ScoresMatchCpu) {
  SKIP_WITHOUT_GPU();
  const auto [score, di, dtype] = GetParam();
  const Dims d = kDims[di];
  const size_t n = d.experts;
  std::mt19937 rng(static_cast<unsigned>(5 + di + 10 * score));
  TestTensor x({d.tokens, n}, dtype), g({d.tokens, n}, kNVTEFloat32);
  fill_logits(x, d.tokens, n, rng);
  g.fill_uniform(rng, -1.0, 1.0);
  TestTensor scores[2] = {TestTensor({d.tokens, n}, kNVTEFloat32),
                          TestTensor({d.tokens, n}, kNVTEFloat32)};
  TestTensor map[2] = {TestTensor({d.tokens, n}, kNVTEByte), TestTensor({d.tokens, n}, kNVTEByte)};
  TestTensor inter[2] = {TestTensor({d.tokens, n}, kNVTEFloat32),
                         TestTensor({d.tokens, n}, kNVTEFloat32)};
  TestTensor dx[2] = {TestTensor({d.tokens, n}, dtype), TestTensor({d.tokens, n}, dtype)};
  ASSERT_NVTE_OK(nvte_fused_score_for_moe_aux_loss_forward(x, int(d.tokens), int(n), d.topk, score,
                                                           scores[0], map[0], inter[0], nullptr));
  ASSERT_NVTE_OK(nvte_fused_score_for_moe_aux_loss_backward(inter[0], g, int(d.tokens), int(n),
                                                            d.topk, score, dx[0], nullptr));
  GpuTensor d_x(x), d_g(g), d_scores(scores[1]), d_map(map[1]), d_inter(inter[1]), d_dx(dx[1]);
  ASSERT_NVTE_OK(nvte_fused_score_for_moe_aux_loss_forward(d_x, int(d.tokens), int(n), d.topk,
                                                           score, d_scores, d_map, d_inter,
                                                           nullptr));
  ASSERT_NVTE_OK(nvte_fused_score_for_moe_aux_loss_backward(d_inter, d_g, int(d.tokens), int(n),
                                                            d.topk, score, d_dx, nullptr));
  d_scores.download(scores[1], kNVTERowwiseData);
  d_map.download(map[1], kNVTERowwiseData);
  d_dx.download(dx[1], kNVTERowwiseData);
  EXPECT_EQ(map[1].to_double(), map[0].to_double());
  EXPECT_TRUE(test::close(scores[1].to_double(), scores[0].to_double(),
                          router_tolerance(kNVTEFloat32)));
  EXPECT_TRUE(test::close(dx[1].to_double(), dx[0].to_double(), router_tolerance(dtype)));
}

std::string dims_tag(int di, NVTEDType dtype) {
  const Dims d = kDims[di];
  return std::to_string(d.tokens) + "x" + std::to_string(d.experts) + "_k" +
         std::to_string(d.topk) +
         (d.groups ? "_g" + std::to_string(d.groups) + "of" + std::to_string(d.group_topk) : "") +
         "_" + test::dtype_tag(dtype);
}

std::string topk_name(const ::testing::TestParamInfo<Param> &info) {
  const auto [mi, di, dtype] = info.param;
  return std::string(kModes[mi].name) + "_" + dims_tag(di, dtype);
}

std::string scores_name(const ::testing::TestParamInfo<Param> &info) {
  const auto [score, di, dtype] = info.param;
  return std::string(kScoreNames[score]) + "_" + dims_tag(di, dtype);
}

const auto kDtypes = ::testing::Values(kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16);
constexpr int kNumModes = static_cast<int>(std::size(kModes));
constexpr int kNumDims = static_cast<int>(std::size(kDims));

INSTANTIATE_TEST_SUITE_P(All, GpuFusedRouterTest,
                         ::testing::Combine(::testing::Range(0, kNumModes),
                                            ::testing::Range(0, kNumDims), kDtypes),
                         topk_name);
INSTANTIATE_TEST_SUITE_P(All, GpuFusedRouterScoresTest,
                         ::testing::Combine(::testing::Range(0, 3), ::testing::Range(0, kNumDims),
                                            kDtypes),
                         scores_name);

// One block sums the columns; the backward is grid-stride (rows * cols over several blocks).
TEST(GpuFusedRouterAuxLoss, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  for (NVTEDType dtype : {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16}) {
    for (NVTEDType cdtype : {kNVTEInt32, kNVTEInt64, kNVTEFloat32}) {
      const size_t rows = 203, cols = 300, experts = 60;
      TestTensor probs({rows, cols}, dtype), counts({cols}, cdtype), g({}, dtype);
      probs.fill_uniform(rng, 0.0, 1.0);
      for (size_t j = 0; j < cols; ++j) counts.put(j, double(j * 7 % 13));
      g.put(0, 0.75);
      TestTensor loss[2] = {TestTensor({}, dtype), TestTensor({}, dtype)};
      TestTensor cbuf[2] = {TestTensor({1}, kNVTEFloat32), TestTensor({1}, kNVTEFloat32)};
      TestTensor dp[2] = {TestTensor({rows, cols}, dtype), TestTensor({rows, cols}, dtype)};
      ASSERT_NVTE_OK(nvte_fused_moe_aux_loss_forward(probs, counts, 4096, int(experts), int(rows),
                                                     int(cols), 6, 0.02f, loss[0], cbuf[0],
                                                     nullptr));
      ASSERT_NVTE_OK(nvte_fused_moe_aux_loss_backward(cbuf[0], counts, int(rows), int(cols), g,
                                                      dp[0], nullptr));
      GpuTensor d_probs(probs), d_counts(counts), d_g(g), d_loss(loss[1]), d_cbuf(cbuf[1]),
          d_dp(dp[1]);
      ASSERT_NVTE_OK(nvte_fused_moe_aux_loss_forward(d_probs, d_counts, 4096, int(experts),
                                                     int(rows), int(cols), 6, 0.02f, d_loss,
                                                     d_cbuf, nullptr));
      ASSERT_NVTE_OK(nvte_fused_moe_aux_loss_backward(d_cbuf, d_counts, int(rows), int(cols), d_g,
                                                      d_dp, nullptr));
      d_loss.download(loss[1], kNVTERowwiseData);
      d_cbuf.download(cbuf[1], kNVTERowwiseData);
      d_dp.download(dp[1], kNVTERowwiseData);
      EXPECT_EQ(cbuf[1].get(0), cbuf[0].get(0));
      // Sums of 203 x 300 terms in different orders: fp32 accumulation error.
      const test::Tol base = router_tolerance(dtype);
      const test::Tol sum_tol = {base.atol, std::max(base.rtol, 1e-4)};
      EXPECT_TRUE(test::close({loss[1].get(0)}, {loss[0].get(0)}, sum_tol));
      EXPECT_TRUE(test::close(dp[1].to_double(), dp[0].to_double(), base));
    }
  }
}

}  // namespace
