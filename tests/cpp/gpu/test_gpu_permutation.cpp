// MoE permutation on the GPU against the CPU op: row_id_map (several blocks of experts and
// tokens, num_out_tokens dropping), permute with and without probs (FP8 bytes included),
// unpermute with and without merging probs, its backward with merging probs, and the chunk sort;
// the index map: the one-block radix sort (negative and repeated indices, large expert ids that
// need every digit pass, a slice per thread of several routes) and its data kernels.
// Both devices run the same per-element math (permutation_params.h) in the same order: every
// output is compared byte for byte.
#include <algorithm>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/permutation.h"

namespace {

using test::GpuTensor;
using test::TestTensor;

struct Dims {
  size_t tokens, experts, hidden;
  int topk, drop;
};
// 300 tokens / 160 experts: several blocks of 128 threads, the last partly idle.
const Dims kDims[] = {{1, 1, 1, 1, 0}, {300, 8, 33, 2, 7}, {21, 160, 130, 6, 0}};

void fill_routing(TestTensor &rm, const Dims &d, std::mt19937 &rng) {
  std::vector<size_t> ids(d.experts);
  for (size_t t = 0; t < d.tokens; ++t) {
    for (size_t e = 0; e < d.experts; ++e) ids[e] = e;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (size_t e = 0; e < d.experts; ++e) rm.put(t * d.experts + e, 0);
    for (int k = 0; k < d.topk; ++k) rm.put(t * d.experts + ids[k], 1);
  }
}

::testing::AssertionResult same(const TestTensor &gpu, const TestTensor &cpu) {
  TestTensor &g = const_cast<TestTensor &>(gpu), &c = const_cast<TestTensor &>(cpu);
  return test::same_bytes(g.bytes(), c.bytes(), c.buffer().bytes.size());
}

using Param = std::tuple<int, NVTEDType>;
class GpuPermutationTest : public ::testing::TestWithParam<Param> {};

TEST_P(GpuPermutationTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [di, dtype] = GetParam();
  const Dims d = kDims[di];
  const size_t T = d.tokens, E = d.experts, H = d.hidden, w = 2 * E + 1;
  const int out = int(T) * d.topk - d.drop;
  const size_t O = size_t(out);
  const bool fp8 = test::is_fp8(dtype);
  const NVTEDType pdt = fp8 ? kNVTEFloat32 : dtype;
  std::mt19937 rng(11 + di);
  TestTensor rm({T, E}, kNVTEByte), x({T, H}, dtype), probs({T, E}, pdt), g({T, H}, dtype);
  fill_routing(rm, d, rng);
  x.fill_uniform(rng, -2.0, 2.0);
  probs.fill_uniform(rng, 0.1, 1.0);
  probs.put(0, 0.0);  // a padding slot where expert 0 is routed
  g.fill_uniform(rng, -1.0, 1.0);
  GpuTensor d_rm(rm), d_x(x), d_probs(probs), d_g(g);

  TestTensor map[2] = {TestTensor({T, w}, kNVTEInt32), TestTensor({T, w}, kNVTEInt32)};
  TestTensor y[2] = {TestTensor({O, H}, dtype), TestTensor({O, H}, dtype)};
  TestTensor pp[2] = {TestTensor({O}, pdt), TestTensor({O}, pdt)};
  ASSERT_NVTE_OK(nvte_permute_make_row_id_map(rm, int(T), int(E), out, map[0], nullptr));
  ASSERT_NVTE_OK(nvte_permute_with_mask_map(x, map[0], probs, int(T), int(E), out, int(H), y[0],
                                            pp[0], nullptr));
  GpuTensor d_map(map[1]), d_y(y[1]), d_pp(pp[1]);
  ASSERT_NVTE_OK(nvte_permute_make_row_id_map(d_rm, int(T), int(E), out, d_map, nullptr));
  ASSERT_NVTE_OK(nvte_permute_with_mask_map(d_x, d_map, d_probs, int(T), int(E), out, int(H),
                                            d_y, d_pp, nullptr));
  d_map.download(map[1], kNVTERowwiseData);
  d_y.download(y[1], kNVTERowwiseData);
  d_pp.download(pp[1], kNVTERowwiseData);
  EXPECT_TRUE(same(map[1], map[0]));
  EXPECT_TRUE(same(y[1], y[0]));
  EXPECT_TRUE(same(pp[1], pp[0]));
  if (fp8) return;

  TestTensor z[2] = {TestTensor({T, H}, dtype), TestTensor({T, H}, dtype)};
  TestTensor z_np[2] = {TestTensor({T, H}, dtype), TestTensor({T, H}, dtype)};
  TestTensor up[2] = {TestTensor({T, E}, pdt), TestTensor({T, E}, pdt)};
  TestTensor dx[2] = {TestTensor({O, H}, dtype), TestTensor({O, H}, dtype)};
  TestTensor dp[2] = {TestTensor({T, E}, pdt), TestTensor({T, E}, pdt)};
  ASSERT_NVTE_OK(nvte_unpermute_with_mask_map(y[0], map[0], probs, pp[0], int(T), int(E), int(H),
                                              z[0], up[0], nullptr));
  ASSERT_NVTE_OK(nvte_unpermute_with_mask_map(y[0], map[0], nullptr, nullptr, int(T), int(E),
                                              int(H), z_np[0], nullptr, nullptr));
  ASSERT_NVTE_OK(nvte_unpermute_with_mask_map_bwd_with_merging_probs(
      g, map[0], y[0], probs, int(T), int(E), int(H), dx[0], dp[0], nullptr));
  GpuTensor d_z(z[1]), d_znp(z_np[1]), d_up(up[1]), d_dx(dx[1]), d_dp(dp[1]);
  ASSERT_NVTE_OK(nvte_unpermute_with_mask_map(d_y, d_map, d_probs, d_pp, int(T), int(E), int(H),
                                              d_z, d_up, nullptr));
  ASSERT_NVTE_OK(nvte_unpermute_with_mask_map(d_y, d_map, nullptr, nullptr, int(T), int(E),
                                              int(H), d_znp, nullptr, nullptr));
  ASSERT_NVTE_OK(nvte_unpermute_with_mask_map_bwd_with_merging_probs(
      d_g, d_map, d_y, d_probs, int(T), int(E), int(H), d_dx, d_dp, nullptr));
  d_z.download(z[1], kNVTERowwiseData);
  d_znp.download(z_np[1], kNVTERowwiseData);
  d_up.download(up[1], kNVTERowwiseData);
  d_dx.download(dx[1], kNVTERowwiseData);
  d_dp.download(dp[1], kNVTERowwiseData);
  EXPECT_TRUE(same(z[1], z[0]));
  EXPECT_TRUE(same(z_np[1], z_np[0]));
  EXPECT_TRUE(same(up[1], up[0]));
  EXPECT_TRUE(same(dx[1], dx[0]));
  EXPECT_TRUE(same(dp[1], dp[0]));
}

std::string param_name(const ::testing::TestParamInfo<Param> &info) {
  const auto [di, dtype] = info.param;
  const Dims d = kDims[di];
  return std::to_string(d.tokens) + "x" + std::to_string(d.experts) + "x" +
         std::to_string(d.hidden) + "_k" + std::to_string(d.topk) + "_drop" +
         std::to_string(d.drop) + "_" + test::dtype_tag(dtype);
}

INSTANTIATE_TEST_SUITE_P(All, GpuPermutationTest,
                         ::testing::Combine(::testing::Range(0, int(std::size(kDims))),
                                            ::testing::Values(kNVTEFloat32, kNVTEFloat16,
                                                              kNVTEBFloat16, kNVTEFloat8E4M3)),
                         param_name);

// 300 rows in 7 chunks (one empty), forward then backward, with probs.
TEST(GpuPermutationChunkSort, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<double> sizes = {40, 0, 77, 3, 100, 50, 30}, order = {4, 0, 6, 2, 1, 5, 3};
  const size_t T = 300, H = 37, S = sizes.size();
  std::mt19937 rng(2);
  TestTensor ss({S}, kNVTEInt64), si({S}, kNVTEInt64), x({T, H}, kNVTEBFloat16),
      p({T}, kNVTEFloat32);
  for (size_t i = 0; i < S; ++i) {
    ss.put(i, sizes[i]);
    si.put(i, order[i]);
  }
  x.fill_uniform(rng, -1, 1);
  p.fill_uniform(rng, 0, 1);
  TestTensor map[2] = {TestTensor({T}, kNVTEInt32), TestTensor({T}, kNVTEInt32)};
  TestTensor y[2] = {TestTensor({T, H}, kNVTEBFloat16), TestTensor({T, H}, kNVTEBFloat16)};
  TestTensor py[2] = {TestTensor({T}, kNVTEFloat32), TestTensor({T}, kNVTEFloat32)};
  TestTensor b[2] = {TestTensor({T, H}, kNVTEBFloat16), TestTensor({T, H}, kNVTEBFloat16)};
  ASSERT_NVTE_OK(nvte_make_chunk_sort_map(ss, si, int(T), int(S), map[0], nullptr));
  ASSERT_NVTE_OK(nvte_sort_chunks_by_map(x, map[0], p, int(T), int(H), 1, y[0], py[0], nullptr));
  ASSERT_NVTE_OK(nvte_sort_chunks_by_map(y[0], map[0], nullptr, int(T), int(H), 0, b[0], nullptr,
                                         nullptr));
  GpuTensor d_ss(ss), d_si(si), d_x(x), d_p(p), d_map(map[1]), d_y(y[1]), d_py(py[1]), d_b(b[1]);
  ASSERT_NVTE_OK(nvte_make_chunk_sort_map(d_ss, d_si, int(T), int(S), d_map, nullptr));
  ASSERT_NVTE_OK(
      nvte_sort_chunks_by_map(d_x, d_map, d_p, int(T), int(H), 1, d_y, d_py, nullptr));
  ASSERT_NVTE_OK(nvte_sort_chunks_by_map(d_y, d_map, nullptr, int(T), int(H), 0, d_b, nullptr,
                                         nullptr));
  d_map.download(map[1], kNVTERowwiseData);
  d_y.download(y[1], kNVTERowwiseData);
  d_py.download(py[1], kNVTERowwiseData);
  d_b.download(b[1], kNVTERowwiseData);
  EXPECT_TRUE(same(map[1], map[0]));
  EXPECT_TRUE(same(y[1], y[0]));
  EXPECT_TRUE(same(py[1], py[0]));
  EXPECT_TRUE(same(b[1], x));
}

// Index map: 700 tokens x 3 routes (2100 routes: several per sort thread), then expert ids over
// 2^28 (every 4-bit pass moves keys), then a few tokens (most sort threads idle).
struct IndexDims {
  size_t tokens, topk, hidden;
  int lo, span, drop;
};
const IndexDims kIndexDims[] = {{700, 3, 19, -2, 9, 101}, {64, 4, 7, 1 << 28, 1 << 30, 0},
                                {3, 2, 130, 0, 2, 1}};

class GpuIndexPermutationTest : public ::testing::TestWithParam<Param> {};

TEST_P(GpuIndexPermutationTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto [di, dtype] = GetParam();
  const IndexDims d = kIndexDims[di];
  const size_t T = d.tokens, K = d.topk, H = d.hidden, R = T * K;
  const int out = int(R) - d.drop;
  const size_t O = size_t(out);
  std::mt19937 rng(5 + di);
  std::uniform_int_distribution<int> pick(d.lo, d.lo + d.span - 1);
  TestTensor idx({T, K}, kNVTEInt32), x({T, H}, dtype), probs({T, K}, kNVTEFloat32),
      g({T, H}, dtype), ws({R}, kNVTEInt32);
  for (size_t i = 0; i < R; ++i) idx.put(i, pick(rng));
  x.fill_uniform(rng, -2.0, 2.0);
  probs.fill_uniform(rng, 0.0, 1.0);
  g.fill_uniform(rng, -1.0, 1.0);
  GpuTensor d_idx(idx), d_x(x), d_probs(probs), d_g(g), d_ws(ws);
  TestTensor map[2] = {TestTensor({R}, kNVTEInt32), TestTensor({R}, kNVTEInt32)};
  TestTensor y[2] = {TestTensor({O, H}, dtype), TestTensor({O, H}, dtype)};
  ASSERT_NVTE_OK(nvte_permute_index_make_row_id_map(idx, int(T), int(K), out, ws, map[0], nullptr));
  ASSERT_NVTE_OK(
      nvte_permute_with_index_map(x, map[0], int(T), int(K), out, int(H), y[0], nullptr));
  GpuTensor d_map(map[1]), d_y(y[1]);
  ASSERT_NVTE_OK(
      nvte_permute_index_make_row_id_map(d_idx, int(T), int(K), out, d_ws, d_map, nullptr));
  ASSERT_NVTE_OK(
      nvte_permute_with_index_map(d_x, d_map, int(T), int(K), out, int(H), d_y, nullptr));
  d_map.download(map[1], kNVTERowwiseData);
  d_y.download(y[1], kNVTERowwiseData);
  EXPECT_TRUE(same(map[1], map[0]));
  EXPECT_TRUE(same(y[1], y[0]));
  if (test::is_fp8(dtype)) return;

  TestTensor z[2] = {TestTensor({T, H}, dtype), TestTensor({T, H}, dtype)};
  TestTensor z_np[2] = {TestTensor({T, H}, dtype), TestTensor({T, H}, dtype)};
  TestTensor dx[2] = {TestTensor({O, H}, dtype), TestTensor({O, H}, dtype)};
  TestTensor dp[2] = {TestTensor({T, K}, kNVTEFloat32), TestTensor({T, K}, kNVTEFloat32)};
  ASSERT_NVTE_OK(
      nvte_unpermute_with_index_map(y[0], map[0], probs, int(T), int(K), int(H), z[0], nullptr));
  ASSERT_NVTE_OK(nvte_unpermute_with_index_map(y[0], map[0], nullptr, int(T), int(K), int(H),
                                               z_np[0], nullptr));
  ASSERT_NVTE_OK(nvte_unpermute_with_index_map_bwd(g, map[0], y[0], probs, int(T), int(K), int(H),
                                                   dx[0], dp[0], nullptr));
  GpuTensor d_z(z[1]), d_znp(z_np[1]), d_dx(dx[1]), d_dp(dp[1]);
  ASSERT_NVTE_OK(
      nvte_unpermute_with_index_map(d_y, d_map, d_probs, int(T), int(K), int(H), d_z, nullptr));
  ASSERT_NVTE_OK(nvte_unpermute_with_index_map(d_y, d_map, nullptr, int(T), int(K), int(H), d_znp,
                                               nullptr));
  ASSERT_NVTE_OK(nvte_unpermute_with_index_map_bwd(d_g, d_map, d_y, d_probs, int(T), int(K),
                                                   int(H), d_dx, d_dp, nullptr));
  d_z.download(z[1], kNVTERowwiseData);
  d_znp.download(z_np[1], kNVTERowwiseData);
  d_dx.download(dx[1], kNVTERowwiseData);
  d_dp.download(dp[1], kNVTERowwiseData);
  EXPECT_TRUE(same(z[1], z[0]));
  EXPECT_TRUE(same(z_np[1], z_np[0]));
  EXPECT_TRUE(same(dx[1], dx[0]));
  EXPECT_TRUE(same(dp[1], dp[0]));
}

std::string index_param_name(const ::testing::TestParamInfo<Param> &info) {
  const auto [di, dtype] = info.param;
  const IndexDims d = kIndexDims[di];
  return std::to_string(d.tokens) + "x" + std::to_string(d.topk) + "x" +
         std::to_string(d.hidden) + "_drop" + std::to_string(d.drop) + "_" +
         test::dtype_tag(dtype);
}

INSTANTIATE_TEST_SUITE_P(All, GpuIndexPermutationTest,
                         ::testing::Combine(::testing::Range(0, int(std::size(kIndexDims))),
                                            ::testing::Values(kNVTEFloat32, kNVTEBFloat16,
                                                              kNVTEFloat8E4M3)),
                         index_param_name);

}  // namespace
