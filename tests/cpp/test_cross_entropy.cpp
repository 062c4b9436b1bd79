// Vocab-parallel cross entropy on the CPU against the fp64 reference of cross_entropy_reference.h:
// every dtype, int32 / int64 targets, label smoothing, reduce_loss, ignored rows, the vocab split
// over 1, 2 and 3 "ranks" (stats gathered by the test as a process group would), the backward with
// per-row and scalar grad_output; argument errors (out-of-range targets among them).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cross_entropy_reference.h"
#include "test_common.h"
#include "transformer_engine_lite/cross_entropy.h"

namespace {

using test::TestTensor;
using Shape = std::vector<size_t>;

constexpr int64_t kIgnore = -100;

struct Dims {
  size_t rows, vocab;  // vocab: the whole vocab, split evenly over the ranks
};
// 4098 = 2 x 3 x 683: splits over 1, 2, 3 ranks with a tail after the 16-lane loop.
const Dims kDims[] = {{1, 6}, {7, 66}, {19, 1002}, {4, 4098}};

// Loss: fp32 sums of `vocab` exps (relative error ~sqrt(vocab) 2^-24) under a log, plus the fp32
// lse - x_t subtraction of O(10) values. Grad: exp_f32 (1 ulp) times 1/D (the same sum error),
// then the storage rounding of the dtype.
test::Tol loss_tolerance() { return {2e-5, 2e-5}; }
test::Tol grad_tolerance(NVTEDType t) {
  const test::Tol base = test::tolerance(t);
  return {std::max(base.atol, 1e-6), std::max(base.rtol, 3e-5)};
}

struct RankRun {
  std::vector<double> loss;  // rank 0's (every rank's must agree)
  std::vector<double> grad;  // [rows, vocab], the ranks' shards side by side
};

// The C API run as `world` ranks would: stats per shard, gathered in rank order, forward per rank.
RankRun run_ranks(const std::vector<double> &x, const TestTensor &target, size_t rows, size_t vocab,
              int world, NVTEDType dtype, float ls, bool reduce) {
  const size_t v = vocab / static_cast<size_t>(world);
  std::vector<TestTensor> shards;
  TestTensor gathered({static_cast<size_t>(world), rows, 4}, kNVTEFloat32);
  for (int r = 0; r < world; ++r) {
    shards.emplace_back(Shape{rows, v}, dtype);
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < v; ++j) shards[r].put(i * v + j, x[i * vocab + r * v + j]);
    TestTensor stats({rows, 4}, kNVTEFloat32);
    EXPECT_EQ(nvte_cross_entropy_row_stats(shards[r], target, r, world, kIgnore, stats, nullptr),
              NVTE_SUCCESS)
        << nvte_get_last_error();
    for (size_t k = 0; k < rows * 4; ++k) gathered.put(r * rows * 4 + k, stats.get(k));
  }
  RankRun out{{}, std::vector<double>(rows * vocab)};
  for (int r = 0; r < world; ++r) {
    TestTensor loss({rows}, kNVTEFloat32), grad({rows, v}, dtype);
    EXPECT_EQ(nvte_cross_entropy_forward(shards[r], target, gathered, r, kIgnore, ls, reduce, loss,
                                         grad, nullptr),
              NVTE_SUCCESS)
        << nvte_get_last_error();
    if (r == 0) out.loss = loss.to_double();
    EXPECT_EQ(loss.to_double(), out.loss) << "rank " << r << "'s loss differs from rank 0's";
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < v; ++j) out.grad[i * vocab + r * v + j] = grad.get(i * v + j);
  }
  return out;
}

// (dims index, dtype, world size, label smoothing x 10, reduce_loss)
using Param = std::tuple<int, NVTEDType, int, int, bool>;
class CrossEntropyTest : public ::testing::TestWithParam<Param> {};

TEST_P(CrossEntropyTest, MatchesReference) {
  const auto [di, dtype, world, ls10, reduce] = GetParam();
  const Dims d = kDims[di];
  const float ls = static_cast<float>(ls10) / 10.0f;
  std::mt19937 rng(static_cast<unsigned>(11 + di * 7 + world));
  TestTensor x({d.rows, d.vocab}, dtype);
  const std::vector<double> xd = x.fill_uniform(rng, -6.0, 6.0);
  // int64 targets on even dims, int32 on odd; every third row ignored (none in a single row).
  TestTensor target({d.rows}, di % 2 == 0 ? kNVTEInt64 : kNVTEInt32);
  std::vector<int64_t> t(d.rows);
  std::uniform_int_distribution<int64_t> pick(0, static_cast<int64_t>(d.vocab) - 1);
  for (size_t i = 0; i < d.rows; ++i) {
    t[i] = (i % 3 == 2) ? kIgnore : pick(rng);
    target.put(i, static_cast<double>(t[i]));
  }
  const test::CrossEntropyRef ref =
      test::cross_entropy_reference(xd, t, d.vocab, ls, reduce, kIgnore);
  const RankRun got = run_ranks(xd, target, d.rows, d.vocab, world, dtype, ls, reduce);
  EXPECT_TRUE(test::close(got.loss, ref.loss, loss_tolerance()));
  EXPECT_TRUE(test::close(got.grad, ref.grad, grad_tolerance(dtype)));

  // Backward: per-row grad_output, then a scalar one, on rank 0's shard layout (world 1).
  TestTensor g({d.rows, d.vocab}, dtype), dx({d.rows, d.vocab}, dtype);
  for (size_t k = 0; k < d.rows * d.vocab; ++k) g.put(k, got.grad[k]);
  const std::vector<double> stored = g.to_double();
  TestTensor go({d.rows}, kNVTEFloat32), go1({1}, kNVTEFloat32);
  const std::vector<double> god = go.fill_uniform(rng, -2.0, 2.0);
  go1.put(0, 0.75);
  ASSERT_NVTE_OK(nvte_cross_entropy_backward(g, go, dx, nullptr));
  std::vector<double> want(stored.size());
  for (size_t k = 0; k < want.size(); ++k) want[k] = stored[k] * god[k / d.vocab];
  EXPECT_TRUE(test::close(dx.to_double(), want, test::tolerance(dtype)));
  ASSERT_NVTE_OK(nvte_cross_entropy_backward(g, go1, dx, nullptr));
  for (size_t k = 0; k < want.size(); ++k) want[k] = stored[k] * 0.75;
  EXPECT_TRUE(test::close(dx.to_double(), want, test::tolerance(dtype)));
  // In place: dx = grad.
  ASSERT_NVTE_OK(nvte_cross_entropy_backward(g, go1, g, nullptr));
  EXPECT_TRUE(test::close(g.to_double(), want, test::tolerance(dtype)));
}

std::string param_name(const ::testing::TestParamInfo<Param> &info) {
  const auto [di, dtype, world, ls10, reduce] = info.param;
  return std::to_string(kDims[di].rows) + "x" + std::to_string(kDims[di].vocab) + "_" +
         test::dtype_tag(dtype) + "_w" + std::to_string(world) + "_ls" + std::to_string(ls10) +
         (reduce ? "_mean" : "_none");
}

INSTANTIATE_TEST_SUITE_P(CrossEntropy, CrossEntropyTest,
                         ::testing::Combine(::testing::Range(0, 4),
                                            ::testing::Values(kNVTEFloat32, kNVTEFloat16,
                                                              kNVTEBFloat16),
                                            ::testing::Values(1, 2, 3), ::testing::Values(0, 1),
                                            ::testing::Bool()),
                         param_name);

// Extreme logits: a row of -inf but one entry, a shard of all -inf (rank 1 of 2), large values
// (exp would overflow without the max shift).
TEST(CrossEntropyEdge, InfiniteAndLargeLogits) {
  const size_t rows = 3, vocab = 8;
  std::vector<double> x(rows * vocab, -INFINITY);
  x[0 * vocab + 2] = 1.0;                                        // row 0: one finite logit
  for (size_t j = 0; j < 4; ++j) x[1 * vocab + j] = 0.5 * j;     // row 1: rank 1's half all -inf
  for (size_t j = 0; j < vocab; ++j) x[2 * vocab + j] = 1e4 + j;  // row 2: huge
  TestTensor target({rows}, kNVTEInt64);
  const std::vector<int64_t> t = {2, 3, 7};
  for (size_t i = 0; i < rows; ++i) target.put(i, static_cast<double>(t[i]));
  const test::CrossEntropyRef ref = test::cross_entropy_reference(x, t, vocab, 0.0, false, kIgnore);
  for (int world : {1, 2}) {
    const RankRun got = run_ranks(x, target, rows, vocab, world, kNVTEFloat32, 0.0f, false);
    EXPECT_TRUE(test::close(got.loss, ref.loss, loss_tolerance())) << "world " << world;
    EXPECT_TRUE(test::close(got.grad, ref.grad, grad_tolerance(kNVTEFloat32))) << "world " << world;
  }
}

// Errors name the argument; nothing is written.
TEST(CrossEntropyErrors, RejectsBadArguments) {
  TestTensor x({4, 10}, kNVTEFloat32), stats({4, 4}, kNVTEFloat32), gathered({1, 4, 4},
                                                                             kNVTEFloat32);
  TestTensor loss({4}, kNVTEFloat32), grad({4, 10}, kNVTEFloat32);
  TestTensor t({4}, kNVTEInt64), t_short({3}, kNVTEInt64), t_float({4}, kNVTEFloat32);
  TestTensor t_bad({4}, kNVTEInt32);
  t_bad.put(2, 10);  // vocab is 10: out of range
  TestTensor x1({4}, kNVTEFloat32), xi({4, 10}, kNVTEInt32), grad16({4, 10}, kNVTEFloat16);
  const NVTEStatus kInv = NVTE_ERROR_INVALID_ARGUMENT;
  EXPECT_NVTE_ERROR(nvte_cross_entropy_row_stats(x, t_short, 0, 1, kIgnore, stats, nullptr), kInv,
                    "'target'", "4 elements");
  EXPECT_NVTE_ERROR(nvte_cross_entropy_row_stats(x, t_float, 0, 1, kIgnore, stats, nullptr), kInv,
                    "'target'", "float32");
  EXPECT_NVTE_ERROR(nvte_cross_entropy_row_stats(x1, t, 0, 1, kIgnore, stats, nullptr), kInv,
                    "'logits'");
  EXPECT_NVTE_ERROR(nvte_cross_entropy_row_stats(xi, t, 0, 1, kIgnore, stats, nullptr), kInv,
                    "'logits'", "int32");
  EXPECT_NVTE_ERROR(nvte_cross_entropy_row_stats(x, t, 2, 2, kIgnore, stats, nullptr), kInv,
                    "'rank'");
  EXPECT_NVTE_ERROR(nvte_cross_entropy_row_stats(x, t_bad, 0, 1, kIgnore, stats, nullptr), kInv,
                    "'target'", "[0, 10)", "got 10 at row 2");
  // With 2 ranks the vocab is 20: 10 is valid (rank 1 holds it).
  ASSERT_NVTE_OK(nvte_cross_entropy_row_stats(x, t_bad, 0, 2, kIgnore, stats, nullptr));
  EXPECT_NVTE_ERROR(nvte_cross_entropy_forward(x, t_bad, gathered, 0, kIgnore, 0.0f, 0, loss, grad,
                                               nullptr),
                    kInv, "'target'", "got 10");
  EXPECT_NVTE_ERROR(nvte_cross_entropy_forward(x, t, gathered, 0, kIgnore, 1.5f, 0, loss, grad,
                                               nullptr),
                    kInv, "'label_smoothing'");
  EXPECT_NVTE_ERROR(nvte_cross_entropy_forward(x, t, stats, 0, kIgnore, 0.0f, 0, loss, grad,
                                               nullptr),
                    kInv, "'stats'");
  EXPECT_NVTE_ERROR(nvte_cross_entropy_forward(x, t, gathered, 0, kIgnore, 0.0f, 0, loss, grad16,
                                               nullptr),
                    kInv, "'grad'", "float16");
  EXPECT_NVTE_ERROR(nvte_cross_entropy_forward(x, t, gathered, 0, kIgnore, 0.0f, 0, loss, x,
                                               nullptr),
                    kInv, "'grad'");
  TestTensor go({3}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_cross_entropy_backward(grad, go, grad, nullptr), kInv, "'grad_output'");
  for (double v : loss.to_double()) EXPECT_EQ(v, 0.0);
}

// Zero rows: valid, nothing written.
TEST(CrossEntropyEdge, ZeroRows) {
  TestTensor x({0, 5}, kNVTEBFloat16), t({0}, kNVTEInt64), stats({0, 4}, kNVTEFloat32);
  TestTensor gathered({2, 0, 4}, kNVTEFloat32), loss({0}, kNVTEFloat32);
  TestTensor grad({0, 5}, kNVTEBFloat16);
  ASSERT_NVTE_OK(nvte_cross_entropy_row_stats(x, t, 1, 2, kIgnore, stats, nullptr));
  ASSERT_NVTE_OK(nvte_cross_entropy_forward(x, t, gathered, 1, kIgnore, 0.1f, 1, loss, grad,
                                            nullptr));
}

}  // namespace
