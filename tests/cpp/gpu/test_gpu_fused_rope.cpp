// Fused RoPE on the GPU against the CPU op: forward and backward, sbhd / bshd / thd (with empty
// sequences and padding tokens), interleaved or not, partial rotary dims, every dtype, in place,
// with start_positions and context-parallel shards.
// The devices share the pair math and differ only in cos/sin (sincosf vs std::cos/std::sin, an ulp
// or two), so values agree to the dtype's tolerance and copied features bit for bit. Also: a thd
// sequence longer than freqs gets NaN in its rotated features (the GPU does not read the offsets
// on the host).
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/fused_rope.h"

namespace {

using test::GpuTensor;
using test::TestTensor;
using Shape = std::vector<size_t>;

// s positions (thd: the longest sequence), b batch (thd: sequences), h heads of d features, d2
// rotated, s_max positions in freqs; up to 16 heads x 64 pairs (256 threads per block, the most a
// block gets) and 257 positions.
struct Dims {
  size_t s, b, h, d, d2, s_max;
};
const Dims kDims[] = {{1, 1, 1, 2, 2, 1},    {7, 3, 2, 16, 16, 7},   {5, 2, 3, 10, 6, 9},
                      {33, 1, 4, 64, 32, 40}, {13, 4, 16, 128, 128, 13}, {257, 2, 1, 96, 64, 300}};

// The C API without start_positions, on a single rank (cp_size 1), default stream: the calls of
// most tests.
NVTEStatus rope_fwd(NVTETensor in, NVTETensor cu, NVTETensor freqs, NVTETensor out,
                    NVTE_QKV_Format f, bool interleaved) {
  return nvte_fused_rope_forward(in, cu, freqs, nullptr, out, f, interleaved, 1, 0, nullptr);
}
NVTEStatus rope_bwd(NVTETensor in, NVTETensor cu, NVTETensor freqs, NVTETensor out,
                    NVTE_QKV_Format f, bool interleaved) {
  return nvte_fused_rope_backward(in, cu, freqs, nullptr, out, f, interleaved, 1, 0, nullptr);
}

const char *format_name(NVTE_QKV_Format f) {
  return f == NVTE_SBHD ? "sbhd" : (f == NVTE_BSHD ? "bshd" : "thd");
}

// thd lengths cycle through s, 0, (s + 1) / 2, 1, then 3 padding tokens.
std::vector<int32_t> thd_offsets(const Dims &d) {
  const size_t cycle[] = {d.s, 0, (d.s + 1) / 2, 1};
  std::vector<int32_t> cu = {0};
  for (size_t i = 0; i < d.b; ++i) cu.push_back(cu.back() + static_cast<int32_t>(cycle[i % 4]));
  return cu;
}

Shape input_shape(NVTE_QKV_Format f, const Dims &d, const std::vector<int32_t> &cu) {
  if (f == NVTE_SBHD) return {d.s, d.b, d.h, d.d};
  if (f == NVTE_BSHD) return {d.b, d.s, d.h, d.d};
  return {static_cast<size_t>(cu.back()) + 3, d.h, d.d};
}

NVTEStatus run(bool backward, NVTETensor in, NVTETensor cu, NVTETensor freqs, NVTETensor out,
               NVTE_QKV_Format f, bool interleaved) {
  return backward ? rope_bwd(in, cu, freqs, out, f, interleaved)
                  : rope_fwd(in, cu, freqs, out, f, interleaved);
}

// Within the dtype's tolerance, and the input's bytes wherever the op copies: features past d2 and
// thd tokens from `first_padding` on.
::testing::AssertionResult matches_cpu(const TestTensor &gpu, const TestTensor &cpu,
                                       const TestTensor &in, const Dims &d, size_t first_padding) {
  ::testing::AssertionResult r =
      test::close(gpu.to_double(), cpu.to_double(), test::tolerance(cpu.buffer().dtype));
  if (!r) return r;
  const size_t es = nvte_dtype_size(cpu.buffer().dtype);
  const uint8_t *g = gpu.buffer().bytes.data(), *x = in.buffer().bytes.data();
  for (size_t i = 0; i < cpu.numel(); ++i) {
    const bool copied = i % d.d >= d.d2 || i / (d.h * d.d) >= first_padding;
    if (copied && std::memcmp(g + i * es, x + i * es, es) != 0) {
      return ::testing::AssertionFailure() << "[" << i << "] expected the input's " << in.get(i)
                                           << " (copied), got " << gpu.get(i);
    }
  }
  return ::testing::AssertionSuccess();
}

// (format, interleaved, dtype, dims index, in place)
using Param = std::tuple<NVTE_QKV_Format, bool, NVTEDType, int, bool>;

class GpuFusedRopeTest : public ::testing::TestWithParam<Param> {};

TEST_P(GpuFusedRopeTest, ForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  const auto [f, interleaved, t, di, in_place] = GetParam();
  const Dims d = kDims[di];
  const std::vector<int32_t> offsets = thd_offsets(d);
  const Shape shape = input_shape(f, d, offsets);
  std::mt19937 rng(41u + static_cast<unsigned>(di));
  TestTensor freqs({d.s_max, 1, 1, d.d2}, kNVTEFloat32), cu({offsets.size()}, kNVTEInt32);
  freqs.fill_uniform(rng, -300.0, 300.0);
  for (size_t i = 0; i < offsets.size(); ++i) cu.put(i, offsets[i]);
  GpuTensor d_freqs(freqs), d_cu(cu);
  NVTETensor h_cu = f == NVTE_THD ? cu.handle() : nullptr;
  NVTETensor g_cu = f == NVTE_THD ? static_cast<NVTETensor>(d_cu) : nullptr;

  for (bool backward : {false, true}) {
    TestTensor x(shape, t), y(shape, t), gy(shape, t);
    x.fill_uniform(rng, -2.0, 2.0);
    ASSERT_NVTE_OK(run(backward, x, h_cu, freqs, y, f, interleaved));
    GpuTensor d_x(x), d_y(gy);
    NVTETensor d_out = in_place ? static_cast<NVTETensor>(d_x) : static_cast<NVTETensor>(d_y);
    ASSERT_NVTE_OK(run(backward, d_x, g_cu, d_freqs, d_out, f, interleaved));
    (in_place ? d_x : d_y).download(gy, kNVTERowwiseData);
    const size_t first_padding = f == NVTE_THD ? static_cast<size_t>(offsets.back()) : x.numel();
    EXPECT_TRUE(matches_cpu(gy, y, x, d, first_padding)) << (backward ? "backward" : "forward");
  }
}

std::string param_name(const ::testing::TestParamInfo<Param> &info) {
  const auto &[f, interleaved, t, di, in_place] = info.param;
  const Dims &d = kDims[di];
  return std::string(format_name(f)) + (interleaved ? "_interleaved_" : "_") +
         test::dtype_tag(t) + "_s" + std::to_string(d.s) + "b" + std::to_string(d.b) + "h" +
         std::to_string(d.h) + "d" + std::to_string(d.d) + "r" + std::to_string(d.d2) +
         (in_place ? "_inplace" : "");
}

INSTANTIATE_TEST_SUITE_P(
    All, GpuFusedRopeTest,
    ::testing::Combine(::testing::Values(NVTE_SBHD, NVTE_BSHD, NVTE_THD), ::testing::Bool(),
                       ::testing::Values(kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16),
                       ::testing::Range(0, static_cast<int>(std::size(kDims))), ::testing::Bool()),
    param_name);

// start_positions and context parallelism (cp_size, cp_rank): the GPU computes each token's row of
// freqs itself (thd: a binary search over cu_seqlens / cp_size) and must pick the CPU's rows.
struct PosVariant {
  bool start;
  int cp_size, cp_rank;
};
const PosVariant kPosVariants[] = {{true, 1, 0}, {false, 2, 1}, {true, 2, 0}, {true, 3, 2}};

// (format, interleaved, dtype, variant index)
using PosParam = std::tuple<NVTE_QKV_Format, bool, NVTEDType, int>;
class GpuFusedRopePositions : public ::testing::TestWithParam<PosParam> {};

TEST_P(GpuFusedRopePositions, MatchCpu) {
  SKIP_WITHOUT_GPU();
  const auto [f, interleaved, t, vi] = GetParam();
  const PosVariant v = kPosVariants[vi];
  // 4 sequences of 6, 0, 4 and 2 local tokens (thd: cu_seqlens of the whole sequences, then 3
  // padding tokens); sbhd / bshd: s = 6. h = 3 heads of 20 features, 12 rotated.
  const size_t b = 4, s = 6, h = 3, d = 20, d2 = 12;
  const int32_t local[] = {6, 0, 4, 2};
  std::vector<int32_t> offsets = {0};
  for (int32_t n : local) offsets.push_back(offsets.back() + n * v.cp_size);
  const size_t tokens = static_cast<size_t>(offsets.back() / v.cp_size) + 3;
  const Shape shape = f == NVTE_THD ? Shape{tokens, h, d}
                                    : (f == NVTE_SBHD ? Shape{s, b, h, d} : Shape{b, s, h, d});
  std::mt19937 rng(7u + static_cast<unsigned>(vi));
  const size_t rows = s * static_cast<size_t>(v.cp_size) + 9;  // starts are at most 9
  TestTensor freqs({rows, 1, 1, d2}, kNVTEFloat32), cu({b + 1}, kNVTEInt32), sp({b}, kNVTEInt32);
  freqs.fill_uniform(rng, -50.0, 50.0);
  for (size_t i = 0; i <= b; ++i) cu.put(i, offsets[i]);
  const int32_t starts[] = {9, 2, 0, 5};
  for (size_t i = 0; i < b; ++i) sp.put(i, starts[i]);
  GpuTensor d_freqs(freqs), d_cu(cu), d_sp(sp);
  const bool thd = f == NVTE_THD;
  for (bool backward : {false, true}) {
    TestTensor x(shape, t), y(shape, t), gy(shape, t);
    x.fill_uniform(rng, -2.0, 2.0);
    const auto call = [&](NVTETensor in, NVTETensor c, NVTETensor fr, NVTETensor st,
                          NVTETensor out) {
      return backward ? nvte_fused_rope_backward(in, c, fr, st, out, f, interleaved, v.cp_size,
                                                 v.cp_rank, nullptr)
                      : nvte_fused_rope_forward(in, c, fr, st, out, f, interleaved, v.cp_size,
                                                v.cp_rank, nullptr);
    };
    ASSERT_NVTE_OK(call(x, thd ? cu.handle() : nullptr, freqs, v.start ? sp.handle() : nullptr,
                        y));
    GpuTensor d_x(x), d_y(gy);
    ASSERT_NVTE_OK(call(d_x, thd ? static_cast<NVTETensor>(d_cu) : nullptr, d_freqs,
                        v.start ? static_cast<NVTETensor>(d_sp) : nullptr, d_y));
    d_y.download(gy, kNVTERowwiseData);
    const size_t first_padding = thd ? tokens - 3 : x.numel();
    EXPECT_TRUE(matches_cpu(gy, y, x, Dims{s, b, h, d, d2, rows}, first_padding))
        << (backward ? "backward" : "forward");
  }
}

std::string pos_param_name(const ::testing::TestParamInfo<PosParam> &info) {
  const auto &[f, interleaved, t, vi] = info.param;
  const PosVariant &v = kPosVariants[vi];
  return std::string(format_name(f)) + (interleaved ? "_interleaved_" : "_") + test::dtype_tag(t) +
         (v.start ? "_start" : "") + "_cp" + std::to_string(v.cp_size) + "r" +
         std::to_string(v.cp_rank);
}

INSTANTIATE_TEST_SUITE_P(
    All, GpuFusedRopePositions,
    ::testing::Combine(::testing::Values(NVTE_SBHD, NVTE_BSHD, NVTE_THD), ::testing::Bool(),
                       ::testing::Values(kNVTEFloat32, kNVTEBFloat16),
                       ::testing::Range(0, static_cast<int>(std::size(kPosVariants)))),
    pos_param_name);

// start_positions are not read on the host either: a row past freqs gives NaN, not garbage.
TEST(GpuFusedRopeEdge, StartPositionPastFreqsIsNaN) {
  SKIP_WITHOUT_GPU();
  const size_t s = 3, b = 2, h = 1, d = 4;
  TestTensor freqs({5, 1, 1, d}, kNVTEFloat32), sp({b}, kNVTEInt32), x({s, b, h, d}, kNVTEFloat32),
      y({s, b, h, d}, kNVTEFloat32);
  sp.put(0, 1);  // rows 1 .. 3: inside
  sp.put(1, 3);  // rows 3 .. 5: row 5 is past freqs' 5
  std::mt19937 rng(4);
  freqs.fill_uniform(rng, -3.0, 3.0);
  x.fill_uniform(rng, -1.0, 1.0);
  GpuTensor d_freqs(freqs), d_sp(sp), d_x(x), d_y(y);
  ASSERT_NVTE_OK(nvte_fused_rope_forward(d_x, nullptr, d_freqs, d_sp, d_y, NVTE_SBHD, false, 1, 0,
                                         nullptr));
  d_y.download(y, kNVTERowwiseData);
  for (size_t i = 0; i < s * b * d; ++i) {
    const bool past = i / d == 2 * b + 1;  // sbhd: (position 2) * b + (batch entry 1)
    EXPECT_EQ(std::isnan(y.get(i)), past) << "element " << i;
  }
}

// thd offsets are not read on the host: a sequence longer than freqs is not an error on the GPU;
// its tokens past freqs' positions get NaN in the rotated features, the rest is exact.
TEST(GpuFusedRopeEdge, ThdSequenceLongerThanFreqsIsNaN) {
  SKIP_WITHOUT_GPU();
  const size_t h = 2, d = 8, d2 = 4;
  TestTensor freqs({3, 1, 1, d2}, kNVTEFloat32), cu({3}, kNVTEInt32), x({7, h, d}, kNVTEFloat32),
      y({7, h, d}, kNVTEFloat32);
  const int32_t offsets[] = {0, 2, 7};  // the second sequence has 5 tokens, freqs 3 positions
  for (size_t i = 0; i < 3; ++i) cu.put(i, offsets[i]);
  std::mt19937 rng(3);
  freqs.fill_uniform(rng, -3.0, 3.0);
  x.fill_uniform(rng, -1.0, 1.0);
  GpuTensor d_freqs(freqs), d_cu(cu), d_x(x), d_y(y);
  ASSERT_NVTE_OK(rope_fwd(d_x, d_cu, d_freqs, d_y, NVTE_THD, false));
  d_y.download(y, kNVTERowwiseData);
  for (size_t tok = 0; tok < 7; ++tok) {
    const bool beyond = tok >= 5;  // positions 3 and 4 of the second sequence
    for (size_t e = 0; e < h * d; ++e) {
      const size_t i = tok * h * d + e;
      if (e % d >= d2) {
        EXPECT_EQ(y.get(i), x.get(i)) << "token " << tok << ", pass-through feature " << e;
      } else if (beyond) {
        EXPECT_TRUE(std::isnan(y.get(i))) << "token " << tok << ", feature " << e;
      } else {
        EXPECT_FALSE(std::isnan(y.get(i))) << "token " << tok << ", feature " << e;
      }
    }
  }
}

}  // namespace
