// Vocab-parallel cross entropy on the GPU against the CPU op: row stats, forward (label smoothing,
// reduce_loss, ignored rows, 1 and 2 ranks' gathered stats) and backward, every dtype, rows over
// several blocks and vocabs over several strides of the block. The devices sum the row in
// different orders (lanes vs block reduction): values agree to fp32 accumulation error, then the
// dtype's rounding. An out-of-range target gives a NaN row on the GPU (the CPU raises).
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/cross_entropy.h"

namespace {

using test::GpuTensor;
using test::TestTensor;

constexpr int64_t kIgnore = -100;

struct Dims {
  size_t rows, vocab;  // vocab of one rank's shard
};
// 70 rows of 1 column; 3 rows over 1000 columns (4 strides of 256 threads, the last partial).
const Dims kDims[] = {{70, 1}, {3, 1000}, {33, 97}};

test::Tol ce_tolerance(NVTEDType t) {
  const test::Tol base = test::tolerance(t);
  return {std::max(base.atol, 1e-6), std::max(base.rtol, 3e-5)};
}

// (dims index, dtype, world size)
using Param = std::tuple<int, NVTEDType, int>;
class GpuCrossEntropyTest : public ::testing::TestWithParam<Param> {};

TEST_P(GpuCrossEntropyTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [di, dtype, world] = GetParam();
  const Dims d = kDims[di];
  std::mt19937 rng(static_cast<unsigned>(3 + di + 5 * world));
  TestTensor x({d.rows, d.vocab}, dtype), target({d.rows}, world == 1 ? kNVTEInt64 : kNVTEInt32);
  x.fill_uniform(rng, -5.0, 5.0);
  std::uniform_int_distribution<int64_t> pick(0, static_cast<int64_t>(d.vocab * world) - 1);
  for (size_t i = 0; i < d.rows; ++i) target.put(i, i % 4 == 3 ? kIgnore : pick(rng));
  const size_t nstat = d.rows * 4;
  for (int ls10 : {0, 1}) {
    for (int reduce : {0, 1}) {
      // Rank 0's stats from the device under test; the other ranks' are fixed values standing in
      // for a peer's (the same for both devices).
      TestTensor stats[2] = {TestTensor({d.rows, 4}, kNVTEFloat32),
                             TestTensor({d.rows, 4}, kNVTEFloat32)};
      TestTensor loss[2] = {TestTensor({d.rows}, kNVTEFloat32), TestTensor({d.rows}, kNVTEFloat32)};
      TestTensor grad[2] = {TestTensor({d.rows, d.vocab}, dtype),
                            TestTensor({d.rows, d.vocab}, dtype)};
      TestTensor dx[2] = {TestTensor({d.rows, d.vocab}, dtype),
                          TestTensor({d.rows, d.vocab}, dtype)};
      TestTensor go({d.rows}, kNVTEFloat32);
      go.fill_uniform(rng, -2.0, 2.0);
      ASSERT_NVTE_OK(nvte_cross_entropy_row_stats(x, target, 0, world, kIgnore, stats[0], nullptr));
      GpuTensor d_x(x), d_t(target), d_stats(stats[1]);
      ASSERT_NVTE_OK(
          nvte_cross_entropy_row_stats(d_x, d_t, 0, world, kIgnore, d_stats, nullptr));
      d_stats.download(stats[1], kNVTERowwiseData);
      EXPECT_TRUE(test::close(stats[1].to_double(), stats[0].to_double(),
                              ce_tolerance(kNVTEFloat32)));
      TestTensor gathered({static_cast<size_t>(world), d.rows, 4}, kNVTEFloat32);
      for (size_t k = 0; k < nstat; ++k) gathered.put(k, stats[0].get(k));
      for (size_t k = 0; k < nstat && world == 2; ++k) {
        // A peer's plausible stats: max 4.5, sum 40, target logit (if its) 2, sum of logits 3.
        const double v[4] = {4.5, 40.0, 2.0, 3.0};
        gathered.put(nstat + k, k % 4 == 2 && stats[0].get(k) != -INFINITY ? -INFINITY : v[k % 4]);
      }
      const float ls = 0.1f * static_cast<float>(ls10);
      ASSERT_NVTE_OK(nvte_cross_entropy_forward(x, target, gathered, 0, kIgnore, ls, reduce,
                                                loss[0], grad[0], nullptr));
      ASSERT_NVTE_OK(nvte_cross_entropy_backward(grad[0], go, dx[0], nullptr));
      GpuTensor d_g(gathered), d_loss(loss[1]), d_grad(grad[1]), d_go(go), d_dx(dx[1]);
      ASSERT_NVTE_OK(nvte_cross_entropy_forward(d_x, d_t, d_g, 0, kIgnore, ls, reduce, d_loss,
                                                d_grad, nullptr));
      ASSERT_NVTE_OK(nvte_cross_entropy_backward(d_grad, d_go, d_dx, nullptr));
      d_loss.download(loss[1], kNVTERowwiseData);
      d_grad.download(grad[1], kNVTERowwiseData);
      d_dx.download(dx[1], kNVTERowwiseData);
      EXPECT_TRUE(test::close(loss[1].to_double(), loss[0].to_double(), {2e-5, 2e-5}));
      EXPECT_TRUE(test::close(grad[1].to_double(), grad[0].to_double(), ce_tolerance(dtype)));
      EXPECT_TRUE(test::close(dx[1].to_double(), dx[0].to_double(), ce_tolerance(dtype)));
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<Param> &info) {
  const auto [di, dtype, world] = info.param;
  return std::to_string(kDims[di].rows) + "x" + std::to_string(kDims[di].vocab) + "_" +
         test::dtype_tag(dtype) + "_w" + std::to_string(world);
}

INSTANTIATE_TEST_SUITE_P(CrossEntropy, GpuCrossEntropyTest,
                         ::testing::Combine(::testing::Range(0, 3),
                                            ::testing::Values(kNVTEFloat32, kNVTEFloat16,
                                                              kNVTEBFloat16),
                                            ::testing::Values(1, 2)),
                         param_name);

// The device cannot raise: an out-of-range target's row gets a NaN loss and gradient, the other
// rows are unaffected.
TEST(GpuCrossEntropy, OutOfRangeTargetIsNaN) {
  SKIP_WITHOUT_GPU();
  const size_t rows = 2, vocab = 40;
  std::mt19937 rng(9);
  TestTensor x({rows, vocab}, kNVTEFloat32), target({rows}, kNVTEInt64);
  x.fill_uniform(rng, -1.0, 1.0);
  target.put(0, 5);
  target.put(1, 40);
  TestTensor stats({rows, 4}, kNVTEFloat32), gathered({1, rows, 4}, kNVTEFloat32),
      loss({rows}, kNVTEFloat32), grad({rows, vocab}, kNVTEFloat32);
  GpuTensor d_x(x), d_t(target), d_stats(stats), d_loss(loss), d_grad(grad);
  ASSERT_NVTE_OK(nvte_cross_entropy_row_stats(d_x, d_t, 0, 1, kIgnore, d_stats, nullptr));
  d_stats.download(stats, kNVTERowwiseData);
  for (size_t k = 0; k < rows * 4; ++k) gathered.put(k, stats.get(k));
  GpuTensor d_gathered(gathered);
  ASSERT_NVTE_OK(nvte_cross_entropy_forward(d_x, d_t, d_gathered, 0, kIgnore, 0.0f, 0, d_loss,
                                            d_grad, nullptr));
  d_loss.download(loss, kNVTERowwiseData);
  d_grad.download(grad, kNVTERowwiseData);
  EXPECT_TRUE(std::isfinite(loss.get(0)));
  EXPECT_TRUE(std::isnan(loss.get(1)));
  for (size_t j = 0; j < vocab; ++j) {
    EXPECT_TRUE(std::isfinite(grad.get(j)));
    EXPECT_TRUE(std::isnan(grad.get(vocab + j)));
  }
}

}  // namespace
