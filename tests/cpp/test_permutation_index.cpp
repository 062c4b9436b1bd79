// MoE permutation with an index map (TE's map_type="index") on the CPU against references written
// here: row_id_map = TE's layout from a stable sort by expert (exact, negative and repeated
// indices included), dropping past num_out_tokens, permute (bytes exact, FP8 included), unpermute
// with and without probs (fp64 reference), its backward with probs; argument errors write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/permutation.h"

namespace {

using test::TestTensor;

struct Dims {
  size_t tokens, topk, hidden;
  int experts;  // indices drawn from [lo, lo + experts)
  int lo;
  int drop;     // routes dropped from the end
};
const Dims kDims[] = {
    {1, 1, 1, 1, 0, 0}, {9, 2, 5, 4, 0, 3}, {37, 3, 67, 8, 0, 0}, {50, 5, 33, 70, -3, 17}};

// row_id_map[k * T + t]: position of route t * K + k in a stable sort by index (independent of
// the library: std::stable_sort on the flat route ids).
std::vector<double> ref_map(const std::vector<int32_t> &idx, size_t T, size_t K, int64_t out) {
  std::vector<size_t> order(T * K);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return idx[a] < idx[b]; });
  std::vector<double> m(T * K, -1.0);
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t t = order[i] / K, k = order[i] % K;
    m[k * T + t] = int64_t(i) < out ? double(i) : -1.0;
  }
  return m;
}

using Param = std::tuple<int, NVTEDType>;
class IndexPermutationTest : public ::testing::TestWithParam<Param> {};

TEST_P(IndexPermutationTest, MatchesReference) {
  const auto [di, dtype] = GetParam();
  const Dims d = kDims[di];
  const size_t T = d.tokens, K = d.topk, H = d.hidden, R = T * K;
  std::mt19937 rng(11 + di);
  std::uniform_int_distribution<int> pick(d.lo, d.lo + d.experts - 1);
  std::vector<int32_t> idx(R);
  for (auto &v : idx) v = pick(rng);  // repeats within a token are allowed (ties by route id)
  const int out = int(R) - d.drop;
  TestTensor ti({T, K}, kNVTEInt32), ws({R}, kNVTEInt32), map({R}, kNVTEInt32);
  for (size_t i = 0; i < R; ++i) ti.put(i, idx[i]);
  ASSERT_NVTE_OK(nvte_permute_index_make_row_id_map(ti, int(T), int(K), out, ws, map, nullptr));
  const std::vector<double> m = ref_map(idx, T, K, out);
  ASSERT_EQ(map.to_double(), m);
  TestTensor map_all({R}, kNVTEInt32);
  ASSERT_NVTE_OK(nvte_permute_index_make_row_id_map(ti, int(T), int(K), -1, ws, map_all, nullptr));
  EXPECT_EQ(map_all.to_double(), ref_map(idx, T, K, int64_t(R)));

  // Permute: bytes of token t at each kept route's row; the rows past the routes untouched (0).
  const size_t es = test::dtype_bytes(dtype);
  TestTensor x({T, H}, dtype), y({size_t(out), H}, dtype);
  x.fill_uniform(rng, -2.0, 2.0);
  ASSERT_NVTE_OK(nvte_permute_with_index_map(x, map, int(T), int(K), out, int(H), y, nullptr));
  std::vector<uint8_t> ref(size_t(out) * H * es, 0);
  for (size_t t = 0; t < T; ++t) {
    for (size_t k = 0; k < K; ++k) {
      const double r = m[k * T + t];
      if (r >= 0) std::copy_n(x.bytes() + t * H * es, H * es, &ref[size_t(r) * H * es]);
    }
  }
  EXPECT_TRUE(test::same_bytes(y.bytes(), ref.data(), ref.size()));
  // unpermute takes high precision only (TE's)
  if (test::is_fp8(dtype) || dtype == kNVTEByte) return;

  // Unpermute with and without probs.
  TestTensor probs({T, K}, kNVTEFloat32), z({T, H}, dtype), z_np({T, H}, dtype);
  probs.fill_uniform(rng, 0.0, 1.0);
  ASSERT_NVTE_OK(nvte_unpermute_with_index_map(y, map, probs, int(T), int(K), int(H), z, nullptr));
  ASSERT_NVTE_OK(
      nvte_unpermute_with_index_map(y, map, nullptr, int(T), int(K), int(H), z_np, nullptr));
  std::vector<double> rz(T * H, 0.0), rz_np(T * H, 0.0);
  for (size_t t = 0; t < T; ++t) {
    for (size_t k = 0; k < K; ++k) {
      const double r = m[k * T + t];
      if (r < 0) continue;
      for (size_t h = 0; h < H; ++h) {
        rz[t * H + h] += y.get(size_t(r) * H + h) * probs.get(t * K + k);
        rz_np[t * H + h] += y.get(size_t(r) * H + h);
      }
    }
  }
  // Sum of K terms in fp32, rounded once to the dtype.
  const test::Tol tol = test::tolerance(dtype);
  EXPECT_TRUE(test::close(z.to_double(), rz, tol));
  EXPECT_TRUE(test::close(z_np.to_double(), rz_np, tol));

  // Backward with probs: act grad per kept route, probs grad = dot products (0 when dropped).
  TestTensor g({T, H}, dtype), dx({size_t(out), H}, dtype), dp({T, K}, kNVTEFloat32);
  g.fill_uniform(rng, -1.0, 1.0);
  ASSERT_NVTE_OK(nvte_unpermute_with_index_map_bwd(g, map, y, probs, int(T), int(K), int(H), dx,
                                                   dp, nullptr));
  std::vector<double> rdx(size_t(out) * H, 0.0), rdp(T * K, 0.0);
  for (size_t t = 0; t < T; ++t) {
    for (size_t k = 0; k < K; ++k) {
      const double r = m[k * T + t];
      if (r < 0) continue;
      for (size_t h = 0; h < H; ++h) {
        rdx[size_t(r) * H + h] = g.get(t * H + h) * probs.get(t * K + k);
        rdp[t * K + k] += y.get(size_t(r) * H + h) * g.get(t * H + h);
      }
    }
  }
  EXPECT_TRUE(test::close(dx.to_double(), rdx, tol));
  // fp64 accumulation of exact products, rounded once to fp32.
  EXPECT_TRUE(test::close(dp.to_double(), rdp, {1e-30, 1.2e-7}));
}

std::string param_name(const ::testing::TestParamInfo<Param> &info) {
  const auto [di, dtype] = info.param;
  const Dims d = kDims[di];
  return std::to_string(d.tokens) + "x" + std::to_string(d.topk) + "x" + std::to_string(d.hidden) +
         "_e" + std::to_string(d.experts) + "_drop" + std::to_string(d.drop) + "_" +
         test::dtype_tag(dtype);
}

INSTANTIATE_TEST_SUITE_P(All, IndexPermutationTest,
                         ::testing::Combine(::testing::Range(0, int(std::size(kDims))),
                                            ::testing::Values(kNVTEFloat32, kNVTEFloat16,
                                                              kNVTEBFloat16, kNVTEFloat8E4M3,
                                                              kNVTEByte)),
                         param_name);

TEST(IndexPermutationEdge, EmptyBatch) {
  TestTensor ti({0, 2}, kNVTEInt32), ws({0}, kNVTEInt32), map({0}, kNVTEInt32),
      x({0, 3}, kNVTEFloat32), y({0, 3}, kNVTEFloat32);
  ASSERT_NVTE_OK(nvte_permute_index_make_row_id_map(ti, 0, 2, -1, ws, map, nullptr));
  ASSERT_NVTE_OK(nvte_permute_with_index_map(x, map, 0, 2, 0, 3, y, nullptr));
  ASSERT_NVTE_OK(nvte_unpermute_with_index_map(y, map, nullptr, 0, 2, 3, x, nullptr));
}

void expect_rejected(NVTEStatus st, const std::string &needle, TestTensor &out) {
  EXPECT_EQ(st, NVTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(nvte_get_last_error()).find(needle), std::string::npos)
      << "message: " << nvte_get_last_error() << "\nexpected to contain: " << needle;
  for (size_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.get(i), 0.0) << "written at " << i;
}

TEST(IndexPermutationErrors, Arguments) {
  TestTensor ti({4, 2}, kNVTEInt32), ti64({4, 2}, kNVTEInt64), ws({8}, kNVTEInt32),
      ws_bad({7}, kNVTEInt32), map({8}, kNVTEInt32), map_bad({4, 2}, kNVTEInt32),
      x({4, 5}, kNVTEFloat32), y({8, 5}, kNVTEFloat32), y16({8, 5}, kNVTEBFloat16),
      x8({8, 5}, kNVTEFloat8E4M3), z({4, 5}, kNVTEFloat32), p16({4, 2}, kNVTEBFloat16),
      p({4, 2}, kNVTEFloat32), dp({4, 2}, kNVTEFloat32), dx({8, 5}, kNVTEFloat32);
  expect_rejected(nvte_permute_index_make_row_id_map(ti64, 4, 2, -1, ws, map, nullptr),
                  "'indices'", map);
  expect_rejected(nvte_permute_index_make_row_id_map(ti, 4, 0, -1, ws, map, nullptr), "'topK'",
                  map);
  expect_rejected(nvte_permute_index_make_row_id_map(ti, 4, 2, -1, ws_bad, map, nullptr),
                  "'workspace'", map);
  expect_rejected(nvte_permute_index_make_row_id_map(ti, 4, 2, -1, ws, map_bad, nullptr),
                  "'row_id_map'", map_bad);
  expect_rejected(nvte_permute_with_index_map(x, map, 4, 2, 8, 5, y16, nullptr), "'output'", y16);
  expect_rejected(nvte_permute_with_index_map(x, map, 4, 2, -1, 5, y, nullptr),
                  "'num_out_tokens'", y);
  expect_rejected(nvte_unpermute_with_index_map(x8, map, nullptr, 4, 2, 5, z, nullptr), "'input'",
                  z);
  expect_rejected(nvte_unpermute_with_index_map(y, map, p16, 4, 2, 5, z, nullptr), "'probs'", z);
  expect_rejected(nvte_unpermute_with_index_map_bwd(z, map, y, p16, 4, 2, 5, dx, dp, nullptr),
                  "'probs'", dx);
  expect_rejected(nvte_unpermute_with_index_map_bwd(z, map, y, p, 4, 2, 5, dx, p16, nullptr),
                  "'probs_grad'", dx);
}

}  // namespace
