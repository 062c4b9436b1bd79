// MoE permutation on the CPU against references written here: TE's row_id_map layout (exact),
// permute with and without probs (bytes exact, FP8 included; prob 0 = padding row of zeros),
// num_out_tokens dropping, unpermute with and without merging probs (fp64 reference), its
// backward with merging probs, chunk sort forward and backward; argument errors write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/permutation.h"

namespace {

using test::TestTensor;
using Shape = std::vector<size_t>;

struct Dims {
  size_t tokens, experts, hidden;
  int topk;
  int drop;  // routes dropped from the end (num_out_tokens = routes - drop)
};
const Dims kDims[] = {{1, 1, 1, 1, 0}, {7, 8, 5, 2, 0}, {33, 16, 67, 4, 5}, {20, 37, 129, 5, 11}};

// Each token picks `topk` distinct experts.
std::vector<uint8_t> make_routing(const Dims &d, std::mt19937 &rng) {
  std::vector<uint8_t> m(d.tokens * d.experts, 0);
  std::vector<size_t> ids(d.experts);
  for (size_t t = 0; t < d.tokens; ++t) {
    for (size_t e = 0; e < d.experts; ++e) ids[e] = e;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int k = 0; k < d.topk; ++k) m[t * d.experts + ids[k]] = 1;
  }
  return m;
}

// TE's row_id_map: rows grouped by expert, tokens ascending; per token destinations descending.
std::vector<int32_t> ref_row_id_map(const std::vector<uint8_t> &rm, size_t T, size_t E,
                                    int64_t out_rows) {
  std::vector<int64_t> dst(T * E, -1);
  int64_t next = 0;
  for (size_t e = 0; e < E; ++e) {
    for (size_t t = 0; t < T; ++t) {
      if (rm[t * E + e]) dst[t * E + e] = next++;
    }
  }
  const size_t w = 2 * E + 1;
  std::vector<int32_t> map(T * w, -1);
  for (size_t t = 0; t < T; ++t) {
    std::vector<std::pair<int64_t, size_t>> routes;
    for (size_t e = 0; e < E; ++e) {
      if (dst[t * E + e] >= 0 && dst[t * E + e] < out_rows) routes.push_back({dst[t * E + e], e});
    }
    std::sort(routes.rbegin(), routes.rend());
    for (size_t i = 0; i < routes.size(); ++i) {
      map[t * w + i] = int32_t(routes[i].first);
      map[t * w + E + i] = int32_t(routes[i].second);
    }
    map[t * w + 2 * E] = int32_t(routes.size());
  }
  return map;
}

std::vector<double> ints_of(const std::vector<int32_t> &v) { return {v.begin(), v.end()}; }

using Param = std::tuple<int, NVTEDType>;
class PermutationTest : public ::testing::TestWithParam<Param> {};

TEST_P(PermutationTest, MatchesReference) {
  const auto [di, dtype] = GetParam();
  const Dims d = kDims[di];
  const size_t T = d.tokens, E = d.experts, H = d.hidden, w = 2 * E + 1;
  std::mt19937 rng(3 + di);
  const std::vector<uint8_t> rm_bytes = make_routing(d, rng);
  const int routes = int(T) * d.topk, out = routes - d.drop;
  const bool fp8 = test::is_fp8(dtype);
  const NVTEDType pdt = fp8 ? kNVTEFloat32 : dtype;
  for (NVTEDType mdt : {kNVTEByte, kNVTEInt32}) {
    TestTensor rm({T, E}, mdt), map({T, w}, kNVTEInt32);
    for (size_t i = 0; i < T * E; ++i) rm.put(i, rm_bytes[i]);
    ASSERT_NVTE_OK(nvte_permute_make_row_id_map(rm, int(T), int(E), out, map, nullptr));
    EXPECT_EQ(map.to_double(), ints_of(ref_row_id_map(rm_bytes, T, E, out)))
        << test::dtype_tag(mdt);
  }
  TestTensor rm({T, E}, kNVTEByte), map({T, w}, kNVTEInt32);
  std::memcpy(rm.bytes(), rm_bytes.data(), rm_bytes.size());
  ASSERT_NVTE_OK(nvte_permute_make_row_id_map(rm, int(T), int(E), out, map, nullptr));
  const std::vector<double> m = map.to_double();

  // Permute: with probs, one routed prob per token set to 0 (a padding slot).
  TestTensor x({T, H}, dtype), probs({T, E}, pdt), y({size_t(out), H}, dtype),
      pp({size_t(out)}, pdt), y_np({size_t(out), H}, dtype);
  x.fill_uniform(rng, -2.0, 2.0);
  probs.fill_uniform(rng, 0.1, 1.0);
  for (size_t t = 0; t < T; t += 3) {
    if (m[t * w + 2 * E] > 0) probs.put(t * E + size_t(m[t * w + E]), 0.0);
  }
  ASSERT_NVTE_OK(nvte_permute_with_mask_map(x, map, probs, int(T), int(E), out, int(H), y, pp,
                                            nullptr));
  ASSERT_NVTE_OK(nvte_permute_with_mask_map(x, map, nullptr, int(T), int(E), out, int(H), y_np,
                                            nullptr, nullptr));
  const size_t es = test::dtype_bytes(dtype);
  std::vector<uint8_t> ref(y.numel() * es, 0), ref_np(y.numel() * es, 0);
  std::vector<double> ref_pp(size_t(out), 0.0);
  for (size_t t = 0; t < T; ++t) {
    for (int i = 0; i < int(m[t * w + 2 * E]); ++i) {
      const size_t dst = size_t(m[t * w + i]), e = size_t(m[t * w + E + i]);
      const bool pad = probs.get(t * E + e) == 0.0;
      std::memcpy(&ref_np[dst * H * es], x.bytes() + t * H * es, H * es);
      if (!pad) std::memcpy(&ref[dst * H * es], x.bytes() + t * H * es, H * es);
      ref_pp[dst] = probs.get(t * E + e);
    }
  }
  EXPECT_TRUE(test::same_bytes(y.bytes(), ref.data(), ref.size()));
  EXPECT_TRUE(test::same_bytes(y_np.bytes(), ref_np.data(), ref_np.size()));
  EXPECT_EQ(pp.to_double(), ref_pp);
  if (fp8) return;  // unpermute takes high precision only (TE's)

  // Unpermute y_np with merging probs (and the permuted probs back), then without.
  TestTensor z({T, H}, dtype), up({T, E}, pdt), z_np({T, H}, dtype);
  ASSERT_NVTE_OK(nvte_unpermute_with_mask_map(y_np, map, probs, pp, int(T), int(E), int(H), z, up,
                                              nullptr));
  ASSERT_NVTE_OK(nvte_unpermute_with_mask_map(y_np, map, nullptr, nullptr, int(T), int(E), int(H),
                                              z_np, nullptr, nullptr));
  std::vector<double> rz(T * H, 0.0), rz_np(T * H, 0.0), rup(T * E, 0.0);
  for (size_t t = 0; t < T; ++t) {
    for (int i = 0; i < int(m[t * w + 2 * E]); ++i) {
      const size_t src = size_t(m[t * w + i]), e = size_t(m[t * w + E + i]);
      for (size_t h = 0; h < H; ++h) {
        rz[t * H + h] += y_np.get(src * H + h) * probs.get(t * E + e);
        rz_np[t * H + h] += y_np.get(src * H + h);
      }
      rup[t * E + e] = pp.get(src);
    }
  }
  const test::Tol tol = test::tolerance(dtype);
  EXPECT_TRUE(test::close(z.to_double(), rz, tol));
  EXPECT_TRUE(test::close(z_np.to_double(), rz_np, tol));
  EXPECT_EQ(up.to_double(), rup);

  // Backward with merging probs.
  TestTensor g({T, H}, dtype), dx({size_t(out), H}, dtype), dp({T, E}, pdt);
  g.fill_uniform(rng, -1.0, 1.0);
  ASSERT_NVTE_OK(nvte_unpermute_with_mask_map_bwd_with_merging_probs(
      g, map, y_np, probs, int(T), int(E), int(H), dx, dp, nullptr));
  std::vector<double> rdx(size_t(out) * H, 0.0), rdp(T * E, 0.0);
  for (size_t t = 0; t < T; ++t) {
    for (int i = 0; i < int(m[t * w + 2 * E]); ++i) {
      const size_t dst = size_t(m[t * w + i]), e = size_t(m[t * w + E + i]);
      for (size_t h = 0; h < H; ++h) {
        rdx[dst * H + h] = g.get(t * H + h) * probs.get(t * E + e);
        rdp[t * E + e] += y_np.get(dst * H + h) * g.get(t * H + h);
      }
    }
  }
  EXPECT_TRUE(test::close(dx.to_double(), rdx, tol));
  const test::Tol sum_tol = {std::max(tol.atol, test::fp32_accumulation_atol(H, 2.0 * H)),
                             tol.rtol};
  EXPECT_TRUE(test::close(dp.to_double(), rdp, sum_tol));
}

std::string param_name(const ::testing::TestParamInfo<Param> &info) {
  const auto [di, dtype] = info.param;
  const Dims d = kDims[di];
  return std::to_string(d.tokens) + "x" + std::to_string(d.experts) + "x" +
         std::to_string(d.hidden) + "_k" + std::to_string(d.topk) + "_drop" +
         std::to_string(d.drop) + "_" + test::dtype_tag(dtype);
}

INSTANTIATE_TEST_SUITE_P(All, PermutationTest,
                         ::testing::Combine(::testing::Range(0, int(std::size(kDims))),
                                            ::testing::Values(kNVTEFloat32, kNVTEFloat16,
                                                              kNVTEBFloat16, kNVTEFloat8E4M3,
                                                              kNVTEFloat8E5M2FNUZ)),
                         param_name);

TEST(ChunkSort, ForwardAndBackward) {
  const std::vector<int64_t> sizes = {3, 0, 5, 2, 4}, order = {2, 4, 0, 3, 1};
  const size_t T = 14, H = 9, S = sizes.size();
  TestTensor ss({S}, kNVTEInt64), si({S}, kNVTEInt64), map({T}, kNVTEInt32);
  for (size_t i = 0; i < S; ++i) {
    ss.put(i, double(sizes[i]));
    si.put(i, double(order[i]));
  }
  ASSERT_NVTE_OK(nvte_make_chunk_sort_map(ss, si, int(T), int(S), map, nullptr));
  std::vector<int64_t> start(S, 0);
  for (size_t c = 1; c < S; ++c) start[c] = start[c - 1] + sizes[c - 1];
  std::vector<double> ref_map(T);
  int64_t pos = 0;
  for (int64_t c : order) {
    for (int64_t r = 0; r < sizes[size_t(c)]; ++r) {
      ref_map[size_t(start[size_t(c)] + r)] = double(pos++);
    }
  }
  EXPECT_EQ(map.to_double(), ref_map);
  std::mt19937 rng(1);
  TestTensor x({T, H}, kNVTEBFloat16), p({T}, kNVTEFloat32), y({T, H}, kNVTEBFloat16),
      py({T}, kNVTEFloat32), back({T, H}, kNVTEBFloat16), pback({T}, kNVTEFloat32);
  x.fill_uniform(rng, -1, 1);
  p.fill_uniform(rng, 0, 1);
  ASSERT_NVTE_OK(nvte_sort_chunks_by_map(x, map, p, int(T), int(H), 1, y, py, nullptr));
  for (size_t t = 0; t < T; ++t) {
    const size_t d = size_t(ref_map[t]);
    EXPECT_EQ(py.get(d), p.get(t));
    for (size_t h = 0; h < H; ++h) ASSERT_EQ(y.get(d * H + h), x.get(t * H + h));
  }
  ASSERT_NVTE_OK(nvte_sort_chunks_by_map(y, map, py, int(T), int(H), 0, back, pback, nullptr));
  EXPECT_TRUE(test::same_bytes(back.bytes(), x.bytes(), T * H * 2));
  EXPECT_EQ(pback.to_double(), p.to_double());
}

TEST(PermutationEdge, EmptyBatch) {
  TestTensor rm({0, 4}, kNVTEByte), map({0, 9}, kNVTEInt32), x({0, 3}, kNVTEFloat32),
      y({0, 3}, kNVTEFloat32);
  ASSERT_NVTE_OK(nvte_permute_make_row_id_map(rm, 0, 4, -1, map, nullptr));
  ASSERT_NVTE_OK(nvte_permute_with_mask_map(x, map, nullptr, 0, 4, 0, 3, y, nullptr, nullptr));
  ASSERT_NVTE_OK(nvte_unpermute_with_mask_map(y, map, nullptr, nullptr, 0, 4, 3, x, nullptr,
                                              nullptr));
}

// A rejected call returns NVTE_ERROR_INVALID_ARGUMENT naming the argument and writes nothing.
void expect_rejected(NVTEStatus st, const std::string &needle, TestTensor &out) {
  EXPECT_EQ(st, NVTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(nvte_get_last_error()).find(needle), std::string::npos)
      << "message: " << nvte_get_last_error() << "\nexpected to contain: " << needle;
  for (size_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.get(i), 0.0) << "written at " << i;
}

TEST(PermutationErrors, Arguments) {
  TestTensor rm({4, 3}, kNVTEByte), rm16({4, 3}, kNVTEFloat16), map({4, 7}, kNVTEInt32),
      map64({4, 7}, kNVTEInt64), map_bad({4, 6}, kNVTEInt32), x({4, 5}, kNVTEFloat32),
      y({6, 5}, kNVTEFloat32), y16({6, 5}, kNVTEBFloat16), probs({4, 3}, kNVTEFloat32),
      pp({5}, kNVTEFloat32), x8({4, 5}, kNVTEFloat8E4M3), z({4, 5}, kNVTEFloat32),
      z8({4, 5}, kNVTEFloat8E4M3);
  for (size_t i = 0; i < 4; ++i) rm.put(i * 3 + i % 3, 1);
  expect_rejected(nvte_permute_make_row_id_map(rm16, 4, 3, -1, map, nullptr), "'routing_map'",
                  map);
  expect_rejected(nvte_permute_make_row_id_map(rm, 4, 0, -1, map, nullptr), "'num_experts'",
                  map);
  expect_rejected(nvte_permute_make_row_id_map(rm, 4, 3, -1, map_bad, nullptr),
                  "'row_id_map': expected shape", map_bad);
  expect_rejected(nvte_permute_make_row_id_map(rm, 4, 3, -1, map64, nullptr), "'row_id_map'",
                  map64);
  expect_rejected(nvte_permute_with_mask_map(x, map, nullptr, 4, 3, 6, 5, y16, nullptr, nullptr),
                  "'output'", y16);
  expect_rejected(nvte_permute_with_mask_map(x, map, nullptr, 4, 3, -1, 5, y, nullptr, nullptr),
                  "'num_out_tokens'", y);
  expect_rejected(nvte_permute_with_mask_map(x, map, probs, 4, 3, 6, 5, y, pp, nullptr),
                  "'permuted_probs'", y);
  expect_rejected(nvte_permute_with_mask_map(x, map, nullptr, 4, 3, 6, 4, y, nullptr, nullptr),
                  "'input': expected shape", y);
  expect_rejected(nvte_unpermute_with_mask_map(x8, map, nullptr, nullptr, 4, 3, 5, z8, nullptr,
                                               nullptr),
                  "'input'", z8);
  expect_rejected(nvte_unpermute_with_mask_map(y, map, rm, nullptr, 4, 3, 5, z, nullptr, nullptr),
                  "'merging_probs'", z);
  TestTensor ss({2}, kNVTEInt64), si({2}, kNVTEInt64), cmap({4}, kNVTEInt32),
      si32({2}, kNVTEInt32);
  ss.put(0, 1);
  ss.put(1, 2);
  si.put(0, 1);
  expect_rejected(nvte_make_chunk_sort_map(ss, si, 4, 2, cmap, nullptr), "'split_sizes'", cmap);
  ss.put(1, 3);
  si.put(1, 1);
  expect_rejected(nvte_make_chunk_sort_map(ss, si, 4, 2, cmap, nullptr), "'sorted_index'", cmap);
  expect_rejected(nvte_make_chunk_sort_map(ss, si32, 4, 2, cmap, nullptr), "'sorted_index'",
                  cmap);
}

}  // namespace
