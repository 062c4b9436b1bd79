// nvte_ordered_batched_gemm against a scalar oracle written here: every output the chain
// c = std::fmaf(op(A)[i, p], op(B)[p, j], c) over p = 0, 1, ..., K - 1 from c = +0 (this file is
// compiled with -ffp-contract=off; std::fmaf is correctly rounded). Compared bit for bit (NaN
// matches NaN) over shapes with row / column / K tails around the tile kernel's blocking (6-row
// tiles, 16-column groups, 64-column panels, 96-row work items), every transpose combination,
// K = 0, empty batches, values over many binades (so every rounding shows), non-finite inputs and
// a case that a multiply-then-add would round differently. OpenMP thread counts 1 and 2 give the
// same bytes. ci/isa_matrix.sh runs it at every CPU level (NVTE_CPU_ISA): the AVX-512 and AVX2 tile
// clones and the baseline's exact scalar loop must all give the oracle's bits.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/gemm.h"

namespace {

using test::TestTensor;
using test::same_float_bits;
using test::with_threads;

struct Case {
  size_t batch, m, n, k;
};

// A random fp32 value over ~2^-20 .. 2^20 with either sign: products and partial sums of many
// magnitudes, so a different order or an extra rounding changes bits.
float random_value(std::mt19937 &rng) {
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  const int e = static_cast<int>(rng() % 41) - 20;
  const float v = std::ldexp(mant(rng), e);
  return (rng() & 1) ? -v : v;
}

// The operands as stored: A [batch, m, k] or [batch, k, m]; B [batch, k, n] or [batch, n, k].
struct Problem {
  Case c;
  bool ta, tb;
  std::vector<float> a, b;
  float op_a(size_t bt, size_t i, size_t p) const {
    return ta ? a[(bt * c.k + p) * c.m + i] : a[(bt * c.m + i) * c.k + p];
  }
  float op_b(size_t bt, size_t p, size_t j) const {
    return tb ? b[(bt * c.n + j) * c.k + p] : b[(bt * c.k + p) * c.n + j];
  }
};

Problem random_problem(const Case &c, bool ta, bool tb, uint32_t seed) {
  std::mt19937 rng(seed);
  Problem p{c, ta, tb, std::vector<float>(c.batch * c.m * c.k),
            std::vector<float>(c.batch * c.k * c.n)};
  for (auto &v : p.a) v = random_value(rng);
  for (auto &v : p.b) v = random_value(rng);
  return p;
}

std::vector<float> oracle(const Problem &p) {
  const Case &c = p.c;
  std::vector<float> d(c.batch * c.m * c.n);
  for (size_t bt = 0; bt < c.batch; ++bt)
    for (size_t i = 0; i < c.m; ++i)
      for (size_t j = 0; j < c.n; ++j) {
        float acc = 0.0f;
        for (size_t q = 0; q < c.k; ++q) acc = std::fmaf(p.op_a(bt, i, q), p.op_b(bt, q, j), acc);
        d[(bt * c.m + i) * c.n + j] = acc;
      }
  return d;
}

TestTensor tensor(const std::vector<size_t> &shape, const std::vector<float> &v) {
  TestTensor t(shape, kNVTEFloat32);
  if (!v.empty()) std::memcpy(t.bytes(), v.data(), v.size() * sizeof(float));
  return t;
}

std::vector<float> run(const Problem &p) {
  const Case &c = p.c;
  TestTensor a = tensor(p.ta ? std::vector<size_t>{c.batch, c.k, c.m}
                             : std::vector<size_t>{c.batch, c.m, c.k}, p.a);
  TestTensor b = tensor(p.tb ? std::vector<size_t>{c.batch, c.n, c.k}
                             : std::vector<size_t>{c.batch, c.k, c.n}, p.b);
  TestTensor d({c.batch, c.m, c.n}, kNVTEFloat32);
  for (size_t i = 0; i < d.numel(); ++i) d.f32(kNVTERowwiseData)[i] = 12345.0f;  // overwritten
  const NVTEStatus st = nvte_ordered_batched_gemm(a, b, d, p.ta, p.tb, nullptr);
  EXPECT_EQ(st, NVTE_SUCCESS) << nvte_get_last_error();
  std::vector<float> out(c.batch * c.m * c.n);
  if (!out.empty()) std::memcpy(out.data(), d.bytes(), out.size() * sizeof(float));
  return out;
}

class OrderedGemm : public ::testing::TestWithParam<Case> {};

TEST_P(OrderedGemm, EveryTransposeMatchesOracle) {
  const Case c = GetParam();
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const uint32_t seed = static_cast<uint32_t>(c.m * 7919 + c.n * 31 + c.k + t);
    const Problem p = random_problem(c, ta, tb, seed);
    EXPECT_TRUE(same_float_bits(run(p), oracle(p))) << "transa " << ta << " transb " << tb;
  }
}

// m around the 6-row tiles and 96-row work items; n around 16-column groups and 64-column panels;
// K = 0, 1, odd, and long chains (1000 terms).
INSTANTIATE_TEST_SUITE_P(
    Shapes, OrderedGemm,
    ::testing::Values(Case{1, 1, 1, 1}, Case{1, 1, 1, 0}, Case{2, 3, 5, 0}, Case{0, 4, 4, 4},
                      Case{1, 0, 5, 3}, Case{1, 4, 0, 3}, Case{3, 7, 13, 5}, Case{2, 6, 16, 64},
                      Case{2, 97, 65, 33}, Case{1, 193, 130, 17}, Case{4, 17, 64, 1000},
                      Case{2, 64, 200, 64}),
    [](const auto &info) {
      const Case &c = info.param;
      return "b" + std::to_string(c.batch) + "_" + std::to_string(c.m) + "x" +
             std::to_string(c.n) + "x" + std::to_string(c.k);
    });

// The chain rounds once per term: [1, a] . [-(1 + 2^-11), a] with a = 1 + 2^-12 is
// fmaf(a, a, -(1 + 2^-11)) = 2^-24 exactly (a * a = 1 + 2^-11 + 2^-24); a multiply then an add
// would round a * a to 1 + 2^-11 first and give 0.
TEST(OrderedGemmEdges, FusedMultiplyAddNotMulAdd) {
  const float a = 1.0f + std::ldexp(1.0f, -12), s = -(1.0f + std::ldexp(1.0f, -11));
  Problem p{Case{1, 1, 1, 2}, false, false, {1.0f, a}, {s, a}};
  const std::vector<float> got = run(p);
  EXPECT_EQ(got[0], std::ldexp(1.0f, -24));
  EXPECT_TRUE(same_float_bits(got, oracle(p)));
}

// Inf, NaN, -0 and subnormal inputs: IEEE's fmaf on both sides (Inf * 0 is NaN, Inf - Inf is NaN,
// sums of -0 products are +0 from the +0 start).
TEST(OrderedGemmEdges, NonFiniteAndSignedZeros) {
  const Case c{2, 9, 21, 7};
  for (int t = 0; t < 4; ++t) {
    Problem p = random_problem(c, t & 1, t & 2, 99u + t);
    const float specials[] = {INFINITY, -INFINITY, NAN, -0.0f, 0.0f, 1e-40f, -1e-39f};
    for (size_t i = 0; i < p.a.size(); i += 5) p.a[i] = specials[i % 7];
    for (size_t i = 0; i < p.b.size(); i += 3) p.b[i] = specials[(i / 3) % 7];
    EXPECT_TRUE(same_float_bits(run(p), oracle(p))) << "t " << t;
  }
  // All products -0: the chain stays +0 (the first fmaf adds -0 to +0).
  Problem z{Case{1, 1, 1, 3}, false, false, {-0.0f, 1.0f, -2.0f}, {1.0f, -0.0f, 0.0f}};
  const std::vector<float> got = run(z);
  EXPECT_FALSE(std::signbit(got[0]));
}

TEST(OrderedGemmEdges, SameBytesAcrossThreadCounts) {
  const Case c{3, 150, 90, 77};
  for (int t = 0; t < 4; ++t) {
    const Problem p = random_problem(c, t & 1, t & 2, 5u + t);
    const std::vector<float> one = with_threads(1, [&] { return run(p); });
    const std::vector<float> two = with_threads(2, [&] { return run(p); });
    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * sizeof(float)), 0) << "t " << t;
    EXPECT_TRUE(same_float_bits(one, oracle(p)));
  }
}

TEST(OrderedGemmErrors, ArgumentsAreNamed) {
  auto expect = [](NVTEStatus st, const char *needle) {
    EXPECT_EQ(st, NVTE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(nvte_get_last_error()).find(needle), std::string::npos)
        << nvte_get_last_error();
  };
  TestTensor a({2, 3, 4}, kNVTEFloat32), b({2, 4, 5}, kNVTEFloat32), d({2, 3, 5}, kNVTEFloat32);
  TestTensor a2d({3, 4}, kNVTEFloat32), a_bf16({2, 3, 4}, kNVTEBFloat16);
  TestTensor b_k5({2, 5, 5}, kNVTEFloat32), b_b3({3, 4, 5}, kNVTEFloat32);
  TestTensor d_bad({2, 5, 3}, kNVTEFloat32), d_bf16({2, 3, 5}, kNVTEBFloat16);
  EXPECT_EQ(nvte_ordered_batched_gemm(a, b, d, false, false, nullptr), NVTE_SUCCESS)
      << nvte_get_last_error();
  expect(nvte_ordered_batched_gemm(a2d, b, d, false, false, nullptr), "'A': expected a 3-D");
  expect(nvte_ordered_batched_gemm(a_bf16, b, d, false, false, nullptr), "'A'");
  expect(nvte_ordered_batched_gemm(a, b_k5, d, false, false, nullptr), "same K");
  expect(nvte_ordered_batched_gemm(a, b_b3, d, false, false, nullptr), "same batch");
  expect(nvte_ordered_batched_gemm(a, b, d, true, false, nullptr), "same K");  // A^T: K = 3
  expect(nvte_ordered_batched_gemm(a, b, d_bad, false, false, nullptr), "'D'");
  expect(nvte_ordered_batched_gemm(a, b, d_bf16, false, false, nullptr), "'D'");
  EXPECT_EQ(nvte_ordered_batched_gemm(nullptr, b, d, false, false, nullptr),
            NVTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(nvte_get_last_error()).find("'A'"), std::string::npos);
}

}  // namespace
