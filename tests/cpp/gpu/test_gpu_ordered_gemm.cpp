// nvte_ordered_batched_gemm on the GPU (gemm/ordered_gemm.cu: SIMT fmaf chains in K order) against
// the CPU kernel, bit for bit (NaN matches NaN). The CPU kernel is pinned to an independent scalar
// fmaf oracle by tests/cpp/test_ordered_gemm.cpp; equal bits here prove the GPU keeps the chain:
// K order, one rounding per term, nothing added past K. Shapes cover the 64 x 64 output tile's
// tails, K tails of the 16-K stages, K = 0, empty outputs and every transpose combination; values
// over many binades and non-finite inputs. Skipped without a GPU device.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/gemm.h"

namespace {

using test::GpuTensor;
using test::TestTensor;
using test::same_float_bits;

struct Case {
  size_t batch, m, n, k;
};

TestTensor random_tensor(std::mt19937 &rng, const std::vector<size_t> &shape, bool specials) {
  TestTensor t(shape, kNVTEFloat32);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  const float special[] = {INFINITY, -INFINITY, NAN, -0.0f, 1e-40f};
  float *v = t.f32(kNVTERowwiseData);
  for (size_t i = 0; i < t.numel(); ++i) {
    const float x = std::ldexp(mant(rng), static_cast<int>(rng() % 41) - 20);
    v[i] = (rng() & 1) ? -x : x;
    if (specials && rng() % 11 == 0) v[i] = special[rng() % 5];
  }
  return t;
}

std::vector<float> values(TestTensor &d) {
  std::vector<float> out(d.numel());
  if (!out.empty()) std::memcpy(out.data(), d.bytes(), out.size() * sizeof(float));
  return out;
}

// The GEMM on both devices; the GPU's output starts as garbage (every element must be written).
::testing::AssertionResult gpu_equals_cpu(const Case &c, bool ta, bool tb, bool specials,
                                          uint32_t seed) {
  std::mt19937 rng(seed);
  const TestTensor a = random_tensor(
      rng, ta ? std::vector<size_t>{c.batch, c.k, c.m} : std::vector<size_t>{c.batch, c.m, c.k},
      specials);
  const TestTensor b = random_tensor(
      rng, tb ? std::vector<size_t>{c.batch, c.n, c.k} : std::vector<size_t>{c.batch, c.k, c.n},
      specials);
  TestTensor d_cpu({c.batch, c.m, c.n}, kNVTEFloat32), d_gpu({c.batch, c.m, c.n}, kNVTEFloat32);
  for (size_t i = 0; i < d_gpu.numel(); ++i) d_gpu.f32(kNVTERowwiseData)[i] = 12345.0f;
  if (nvte_ordered_batched_gemm(a, b, d_cpu, ta, tb, nullptr) != NVTE_SUCCESS)
    return ::testing::AssertionFailure() << "CPU: " << nvte_get_last_error();
  GpuTensor ga(a), gb(b), gd(d_gpu);
  if (nvte_ordered_batched_gemm(ga, gb, gd, ta, tb, nullptr) != NVTE_SUCCESS)
    return ::testing::AssertionFailure() << "GPU: " << nvte_get_last_error();
  gd.download_all(d_gpu);
  return same_float_bits(values(d_gpu), values(d_cpu));
}

class OrderedGemmGpu : public ::testing::TestWithParam<Case> {};

TEST_P(OrderedGemmGpu, EqualsCpuBits) {
  SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const uint32_t seed = static_cast<uint32_t>(c.m * 1000003 + c.n * 1009 + c.k * 7 + t);
    EXPECT_TRUE(gpu_equals_cpu(c, ta, tb, false, seed)) << "transa " << ta << " transb " << tb;
  }
}

// m / n around the 64 x 64 tile; K around the 16-K stage (1, 15, 17, 64, 300).
INSTANTIATE_TEST_SUITE_P(Shapes, OrderedGemmGpu,
                         ::testing::Values(Case{1, 1, 1, 1}, Case{2, 3, 5, 15}, Case{3, 17, 9, 17},
                                           Case{2, 64, 64, 64}, Case{2, 65, 63, 40},
                                           Case{1, 33, 129, 300}, Case{2, 130, 70, 64}),
                         [](const auto &info) {
                           const Case &c = info.param;
                           return "b" + std::to_string(c.batch) + "_" + std::to_string(c.m) + "x" +
                                  std::to_string(c.n) + "x" + std::to_string(c.k);
                         });

TEST(OrderedGemmGpuEdges, NonFiniteInputs) {
  SKIP_WITHOUT_GPU();
  for (int t = 0; t < 4; ++t)
    EXPECT_TRUE(gpu_equals_cpu(Case{2, 19, 70, 33}, t & 1, t & 2, true, 40u + t)) << "t " << t;
}

TEST(OrderedGemmGpuEdges, EmptyAndZeroK) {
  SKIP_WITHOUT_GPU();
  // K = 0 writes zeros; an empty batch or output writes nothing.
  for (const Case &c : {Case{2, 3, 5, 0}, Case{0, 3, 5, 4}, Case{1, 0, 5, 4}, Case{1, 4, 0, 4}})
    EXPECT_TRUE(gpu_equals_cpu(c, false, true, false, 3u));
}

}  // namespace
