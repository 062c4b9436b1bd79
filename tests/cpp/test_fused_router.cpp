// Fused MoE router on the CPU against the fp64 reference of router_reference.h: top-k with each
// score function, pre/post softmax, group-limited top-k, expert bias, scaling, every dtype, forward
// (routing maps exact: logits are distinct multiples of 1/16, exact in bf16) and backward; the
// aux-loss scores and the aux loss; tie order; argument errors that write nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "router_reference.h"
#include "test_common.h"
#include "transformer_engine_lite/fused_router.h"

namespace {

using test::TestTensor;
using Shape = std::vector<size_t>;

// tokens, experts, topk, num_groups, group_topk (0: no group limit).
struct Dims {
  size_t tokens, experts;
  int topk, groups, group_topk;
};
const Dims kDims[] = {{1, 1, 1, 0, 0},     {7, 8, 2, 0, 0},    {33, 64, 6, 8, 3},
                      {5, 128, 8, 4, 2},   {17, 37, 5, 0, 0},  {9, 32, 4, 32, 4}};

// Routing math in fp32 with expf / log1pf: a few ulps of fp32 above the storage tolerance.
test::Tol router_tolerance(NVTEDType t) {
  const test::Tol base = test::tolerance(t);
  return {std::max(base.atol, 2e-6), std::max(base.rtol, 3e-5)};
}

// Distinct logits per token: a shuffle of k/16 (exact in every dtype), k in [-n/2, n/2).
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

std::vector<double> row_of(const std::vector<double> &v, size_t t, size_t n) {
  return {v.begin() + t * n, v.begin() + (t + 1) * n};
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

class FusedRouterTest : public ::testing::TestWithParam<Param> {};

TEST_P(FusedRouterTest, TopkForwardBackward) {
  const auto [mi, di, dtype] = GetParam();
  const auto [score, pre, with_bias, mode_name] = kModes[mi];
  const Dims d = kDims[di];
  const size_t n = d.experts;
  std::mt19937 rng(static_cast<unsigned>(1000 * di + 10 * score + pre));
  TestTensor x({d.tokens, n}, dtype), probs({d.tokens, n}, dtype), map({d.tokens, n}, kNVTEByte),
      inter({d.tokens, n}, kNVTEFloat32), bias({n}, kNVTEFloat32);
  fill_logits(x, d.tokens, n, rng);
  const auto xs = x.to_double();
  const auto bs = bias.fill_uniform(rng, -0.3, 0.3);
  const float sf = di % 2 ? 2.5f : 1.0f;
  ASSERT_EQ(nvte_fused_topk_with_score_function_forward(
                x, int(d.tokens), int(n), d.topk, pre, d.groups, d.group_topk, sf, score,
                with_bias ? bias.handle() : nullptr, probs, map, inter, nullptr),
            NVTE_SUCCESS)
      << nvte_get_last_error();
  router_ref::Config c;
  c.topk = d.topk;
  c.pre_softmax = pre;
  c.num_groups = d.groups;
  c.group_topk = d.group_topk;
  c.scaling_factor = sf;
  c.score = score;
  c.bias = with_bias ? &bs : nullptr;

  TestTensor g({d.tokens, n}, dtype), dx({d.tokens, n}, dtype);
  const auto gs = g.fill_uniform(rng, -1.0, 1.0);
  ASSERT_EQ(nvte_fused_topk_with_score_function_backward(map, inter, g, int(d.tokens), int(n),
                                                         d.topk, pre, sf, score, dx, nullptr),
            NVTE_SUCCESS)
      << nvte_get_last_error();

  std::vector<double> ref_probs, ref_map, ref_dx;
  for (size_t t = 0; t < d.tokens; ++t) {
    const auto tok = router_ref::topk_fwd(c, row_of(xs, t, n));
    const auto grad = router_ref::topk_bwd(c, row_of(xs, t, n), row_of(gs, t, n));
    ref_probs.insert(ref_probs.end(), tok.probs.begin(), tok.probs.end());
    for (bool b : tok.map) ref_map.push_back(b ? 1.0 : 0.0);
    ref_dx.insert(ref_dx.end(), grad.begin(), grad.end());
  }
  EXPECT_EQ(map.to_double(), ref_map);
  EXPECT_TRUE(test::close(probs.to_double(), ref_probs, router_tolerance(dtype)));
  // The gradient sums over the routed experts: its scale is the largest |grad| of the row.
  EXPECT_TRUE(test::close(dx.to_double(), ref_dx, router_tolerance(dtype)));
}

class FusedRouterScoresTest : public ::testing::TestWithParam<Param> {};

TEST_P(FusedRouterScoresTest, ScoresForAuxLoss) {
  const auto [score, di, dtype] = GetParam();
  const Dims d = kDims[di];
  const size_t n = d.experts;
  std::mt19937 rng(static_cast<unsigned>(77 + di + 10 * score));
  TestTensor x({d.tokens, n}, dtype), scores({d.tokens, n}, kNVTEFloat32),
      map({d.tokens, n}, kNVTEByte), inter({d.tokens, n}, kNVTEFloat32);
  fill_logits(x, d.tokens, n, rng);
  const auto xs = x.to_double();
  ASSERT_EQ(nvte_fused_score_for_moe_aux_loss_forward(x, int(d.tokens), int(n), d.topk, score,
                                                      scores, map, inter, nullptr),
            NVTE_SUCCESS)
      << nvte_get_last_error();
  TestTensor g({d.tokens, n}, kNVTEFloat32), dx({d.tokens, n}, dtype);
  const auto gs = g.fill_uniform(rng, -1.0, 1.0);
  ASSERT_EQ(nvte_fused_score_for_moe_aux_loss_backward(inter, g, int(d.tokens), int(n), d.topk,
                                                       score, dx, nullptr),
            NVTE_SUCCESS)
      << nvte_get_last_error();
  std::vector<double> ref_scores, ref_map, ref_dx;
  for (size_t t = 0; t < d.tokens; ++t) {
    const auto s = router_ref::scores(score, row_of(xs, t, n));
    const auto sel = router_ref::topk(s, d.topk, std::vector<bool>(n, true));
    std::vector<double> m(n, 0.0);
    for (size_t i : sel) m[i] = 1.0;
    const auto grad = router_ref::scores_bwd(score, row_of(xs, t, n), row_of(gs, t, n));
    ref_scores.insert(ref_scores.end(), s.begin(), s.end());
    ref_map.insert(ref_map.end(), m.begin(), m.end());
    ref_dx.insert(ref_dx.end(), grad.begin(), grad.end());
  }
  EXPECT_EQ(map.to_double(), ref_map);
  EXPECT_TRUE(test::close(scores.to_double(), ref_scores, router_tolerance(kNVTEFloat32)));
  EXPECT_TRUE(test::close(dx.to_double(), ref_dx, router_tolerance(dtype)));
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

INSTANTIATE_TEST_SUITE_P(All, FusedRouterTest,
                         ::testing::Combine(::testing::Range(0, kNumModes),
                                            ::testing::Range(0, kNumDims), kDtypes),
                         topk_name);
INSTANTIATE_TEST_SUITE_P(All, FusedRouterScoresTest,
                         ::testing::Combine(::testing::Range(0, 3), ::testing::Range(0, kNumDims),
                                            kDtypes),
                         scores_name);

// Equal logits: the lowest indices win (torch.topk's order), in every score function.
TEST(FusedRouterEdge, TiesGoToLowerIndices) {
  for (int score : {0, 1, 2}) {
    TestTensor x({2, 6}, kNVTEFloat32), probs({2, 6}, kNVTEFloat32), map({2, 6}, kNVTEByte),
        inter({2, 6}, kNVTEFloat32);
    for (size_t i = 0; i < 12; ++i) x.put(i, i == 10 ? 1.0 : 0.5);
    ASSERT_EQ(nvte_fused_topk_with_score_function_forward(x, 2, 6, 3, 0, 0, 0, 1.0f, score,
                                                          nullptr, probs, map, inter, nullptr),
              NVTE_SUCCESS);
    const std::vector<double> expect = {1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 1, 0};
    EXPECT_EQ(map.to_double(), expect) << "score_function " << score;
  }
}

TEST(FusedRouterEdge, EmptyBatch) {
  TestTensor x({0, 8}, kNVTEBFloat16), probs({0, 8}, kNVTEBFloat16), map({0, 8}, kNVTEByte),
      inter({0, 8}, kNVTEFloat32);
  EXPECT_EQ(nvte_fused_topk_with_score_function_forward(x, 0, 8, 2, 0, 0, 0, 1.0f, 1, nullptr,
                                                        probs, map, inter, nullptr),
            NVTE_SUCCESS)
      << nvte_get_last_error();
}

TEST(FusedRouterAuxLoss, MatchesReference) {
  std::mt19937 rng(5);
  for (NVTEDType dtype : {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16}) {
    for (NVTEDType cdtype : {kNVTEInt32, kNVTEInt64, kNVTEFloat32, kNVTEBFloat16}) {
      const size_t rows = 37, cols = 16, experts = 8;  // cols: 2 x 8 experts (sequence-level)
      TestTensor probs({rows, cols}, dtype), counts({cols}, cdtype), loss({}, dtype),
          cbuf({1}, kNVTEFloat32);
      const auto p = probs.fill_uniform(rng, 0.0, 1.0);
      std::vector<double> cnt(cols);
      for (size_t j = 0; j < cols; ++j) counts.put(j, cnt[j] = double(j * 3 % 11));
      ASSERT_EQ(nvte_fused_moe_aux_loss_forward(probs, counts, 100, int(experts), int(rows),
                                                int(cols), 4, 0.01f, loss, cbuf, nullptr),
                NVTE_SUCCESS)
          << nvte_get_last_error();
      const double c = experts * double(0.01f) / (4.0 * 100 * 100);
      double ref = 0;
      for (size_t r = 0; r < rows; ++r)
        for (size_t j = 0; j < cols; ++j) ref += p[r * cols + j] * cnt[j];
      ref *= c;
      EXPECT_TRUE(test::close({loss.get(0)}, {ref}, router_tolerance(dtype)));
      EXPECT_TRUE(test::close({cbuf.get(0)}, {c}, router_tolerance(kNVTEFloat32)));

      TestTensor g({}, dtype), dp({rows, cols}, dtype);
      g.put(0, 1.5);
      ASSERT_NVTE_OK(
          nvte_fused_moe_aux_loss_backward(cbuf, counts, int(rows), int(cols), g, dp, nullptr));
      std::vector<double> ref_dp(rows * cols);
      for (size_t i = 0; i < ref_dp.size(); ++i) ref_dp[i] = c * cnt[i % cols] * g.get(0);
      EXPECT_TRUE(test::close(dp.to_double(), ref_dp, router_tolerance(dtype)));
    }
  }
}

// A rejected call returns NVTE_ERROR_INVALID_ARGUMENT naming the argument and writes nothing.
void expect_rejected(NVTEStatus st, const std::string &needle, TestTensor &out) {
  EXPECT_EQ(st, NVTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(nvte_get_last_error()).find(needle), std::string::npos)
      << "message: " << nvte_get_last_error() << "\nexpected to contain: " << needle;
  for (size_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.get(i), 0.0) << "written at " << i;
}

TEST(FusedRouterErrors, TopkArguments) {
  TestTensor x({4, 8}, kNVTEFloat32), probs({4, 8}, kNVTEFloat32), map({4, 8}, kNVTEByte),
      inter({4, 8}, kNVTEFloat32), bias({8}, kNVTEFloat32), bad16({4, 8}, kNVTEBFloat16),
      map_i32({4, 8}, kNVTEInt32), bias7({7}, kNVTEFloat32);
  for (size_t i = 0; i < 32; ++i) x.put(i, double(i % 8));
  auto fwd = [&](NVTETensor lg, int tokens, int experts, int topk, int groups, int gtopk, int score,
                 NVTETensor b, NVTETensor p, NVTETensor m) {
    return nvte_fused_topk_with_score_function_forward(lg, tokens, experts, topk, 0, groups, gtopk,
                                                       1.0f, score, b, p, m, inter, nullptr);
  };
  expect_rejected(fwd(nullptr, 4, 8, 2, 0, 0, 1, nullptr, probs, map), "'logits'", probs);
  expect_rejected(fwd(x, 4, 8, 0, 0, 0, 1, nullptr, probs, map), "argument 'topk'", probs);
  expect_rejected(fwd(x, 4, 8, 9, 0, 0, 1, nullptr, probs, map), "argument 'topk'", probs);
  expect_rejected(fwd(x, 4, 8, 2, 0, 0, 3, nullptr, probs, map), "'score_function'", probs);
  expect_rejected(fwd(x, 5, 8, 2, 0, 0, 1, nullptr, probs, map), "'logits': expected shape",
                  probs);
  expect_rejected(fwd(x, 4, 8, 2, 0, 0, 1, nullptr, bad16, map), "'probs'", probs);
  expect_rejected(fwd(x, 4, 8, 2, 0, 0, 1, nullptr, probs, map_i32), "'routing_map'", probs);
  expect_rejected(fwd(x, 4, 8, 2, 0, 0, 1, bias, probs, map), "'expert_bias'", probs);
  expect_rejected(fwd(x, 4, 8, 2, 0, 0, 0, bias7, probs, map), "'expert_bias'", probs);
  expect_rejected(fwd(x, 4, 8, 2, 3, 1, 0, nullptr, probs, map), "'num_groups'", probs);
  expect_rejected(fwd(x, 4, 8, 2, 4, 0, 0, nullptr, probs, map), "'group_topk'", probs);
  expect_rejected(fwd(x, 4, 8, 2, 4, 5, 0, nullptr, probs, map), "'group_topk'", probs);
  expect_rejected(fwd(x, 4, 8, 3, 4, 2, 0, nullptr, probs, map), "argument 'topk'", probs);
  expect_rejected(fwd(x, 4, 8, 2, 0, 0, 1, nullptr, probs, x), "'routing_map'", probs);
  expect_rejected(fwd(x, 4, 8, 2, 0, 0, 1, nullptr, x, map), "'probs'", probs);  // overlaps logits
  expect_rejected(nvte_fused_topk_with_score_function_forward(x, 4, 8, 2, 0, 0, 0, NAN, 1, nullptr,
                                                              probs, map, inter, nullptr),
                  "'scaling_factor'", probs);
}

TEST(FusedRouterErrors, BackwardAndAuxLoss) {
  TestTensor map({4, 8}, kNVTEByte), inter({4, 8}, kNVTEFloat32), g({4, 8}, kNVTEBFloat16),
      dx({4, 8}, kNVTEBFloat16), dx32({4, 8}, kNVTEFloat32), g16({4, 8}, kNVTEFloat16);
  expect_rejected(nvte_fused_topk_with_score_function_backward(map, inter, g, 4, 8, 2, 0, 1.0f, 1,
                                                               dx32, nullptr),
                  "'grad_logits'", dx32);
  expect_rejected(nvte_fused_score_for_moe_aux_loss_backward(inter, g16, 4, 8, 2, 1, dx, nullptr),
                  "'grad_scores'", dx);
  TestTensor probs({4, 8}, kNVTEFloat32), counts({8}, kNVTEInt32), counts7({7}, kNVTEInt32),
      loss({}, kNVTEFloat32), cbuf({1}, kNVTEFloat32), loss16({}, kNVTEFloat16),
      counts8({8}, kNVTEByte);
  auto aux = [&](NVTETensor c, int total, int experts, int topk, NVTETensor l) {
    return nvte_fused_moe_aux_loss_forward(probs, c, total, experts, 4, 8, topk, 1.0f, l, cbuf,
                                           nullptr);
  };
  expect_rejected(aux(counts, 0, 8, 2, loss), "'total_num_tokens'", loss);
  expect_rejected(aux(counts, 4, 3, 2, loss), "'num_cols'", loss);
  expect_rejected(aux(counts, 4, 8, 0, loss), "'topk'", loss);
  expect_rejected(aux(counts7, 4, 8, 2, loss), "'tokens_per_expert'", loss);
  expect_rejected(aux(counts8, 4, 8, 2, loss), "'tokens_per_expert'", loss);
  expect_rejected(aux(counts, 4, 8, 2, loss16), "'aux_loss'", loss16);
  EXPECT_EQ(cbuf.get(0), 0.0);
}

}  // namespace
