// The native-width vector pieces of the CPU flash-attention softmax (platform/cpu_lanes.h), per
// clone: 16 lanes in x86-64-v4 code, 8 in v3, 4 in baseline. The max and sum of a 16-lane group
// must equal one fixed tree (lanes i and i + 8, then + 4, + 2, + 1) bit for bit at every width, so
// the clones' row sums agree; the mask keeps exactly the lanes in [lo, hi). Header-only, called
// directly, each clone on a CPU that has its instructions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "platform/cpu_lanes.h"

namespace nvte {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Per group of 16 floats: max, sum, then the masked copy for each (c0, lo, hi) of the row layout.
struct Out {
  std::vector<float> max, sum, masked;
};
constexpr int kCases = 3;
const int kRanges[kCases][2] = {{0, 64}, {5, 37}, {17, 18}};

template <int W>
__attribute__((always_inline)) inline void run_all(const std::vector<float> &in, Out *o) {
  using V = typename lanes::Lanes<W>::f;
  constexpr int kG = 16 / W;
  const size_t groups = in.size() / 16;
  o->max.resize(groups);
  o->sum.resize(groups);
  o->masked.resize(in.size() * kCases);
  for (size_t gi = 0; gi < groups; ++gi) {
    V g[kG];
    std::memcpy(g, in.data() + gi * 16, sizeof(g));
    o->max[gi] = lanes::hmax_group<W>(g);
    o->sum[gi] = lanes::hsum_group<W>(g);
    const int c16 = static_cast<int>(gi % 4) * 16;  // the group's columns in a 64-column row
    for (int cs = 0; cs < kCases; ++cs)
      for (int u = 0; u < kG; ++u) {
        V x = g[u];
        lanes::mask_outside<W>(x, c16 + u * W, kRanges[cs][0], kRanges[cs][1]);
        std::memcpy(o->masked.data() + (cs * groups + gi) * 16 + u * W, &x, sizeof(x));
      }
  }
}
#ifdef NVTE_HAVE_FMA_TILE_KERNELS
__attribute__((target("arch=x86-64-v4"))) void run_v4(const std::vector<float> &in, Out *o) {
  run_all<16>(in, o);
}
__attribute__((target("arch=x86-64-v3"))) void run_v3(const std::vector<float> &in, Out *o) {
  run_all<8>(in, o);
}
bool has_v4() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}
bool has_v3() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif
void run_baseline(const std::vector<float> &in, Out *o) { run_all<4>(in, o); }

// The contract in scalars: the tree, and -inf outside [lo, hi).
float tree(const float *x, bool is_max) {
  auto op = [&](float a, float b) { return is_max ? (b > a ? b : a) : a + b; };
  float l8[8], l4[4];
  for (int i = 0; i < 8; ++i) l8[i] = op(x[i], x[i + 8]);
  for (int i = 0; i < 4; ++i) l4[i] = op(l8[i], l8[i + 4]);
  return op(op(l4[0], l4[2]), op(l4[1], l4[3]));
}

TEST(CpuLanes, EachCloneReducesAndMasksAsTheScalarContract) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  std::vector<float> in(16 * 4096);
  for (float &x : in) x = u(gen);
  // sums that round differently in another order, -inf lanes (masked logits), +-0
  for (size_t i = 0; i < in.size(); i += 7) in[i] *= 1e7f;
  for (size_t i = 3; i < in.size(); i += 11) in[i] = -std::numeric_limits<float>::infinity();
  for (size_t i = 5; i < in.size(); i += 13) in[i] = (i % 2) ? 0.0f : -0.0f;
  const size_t groups = in.size() / 16;
  struct Clone {
    const char *name;
    void (*f)(const std::vector<float> &, Out *);
    bool available;
  };
  const Clone clones[] = {
#ifdef NVTE_HAVE_FMA_TILE_KERNELS
      {"x86-64-v4 (16 lanes)", run_v4, has_v4()},
      {"x86-64-v3 (8 lanes)", run_v3, has_v3()},
#endif
      {"baseline (4 lanes)", run_baseline, true}};
  for (const Clone &cl : clones) {
    if (!cl.available) continue;
    Out o;
    cl.f(in, &o);
    int bad = 0;
    for (size_t gi = 0; gi < groups && bad < 5; ++gi) {
      const float *x = in.data() + gi * 16;
      const float want_max = tree(x, true), want_sum = tree(x, false);
      if (bits(o.max[gi]) != bits(want_max) ||
          (bits(o.sum[gi]) != bits(want_sum) && !(std::isnan(want_sum) && std::isnan(o.sum[gi])))) {
        ++bad;
        ADD_FAILURE() << cl.name << " group " << gi << ": max " << o.max[gi] << " want " << want_max
                      << ", sum " << o.sum[gi] << " want " << want_sum;
      }
      const int c16 = static_cast<int>(gi % 4) * 16;
      for (int cs = 0; cs < kCases; ++cs)
        for (int l = 0; l < 16; ++l) {
          const int c = c16 + l;
          const float want = (c >= kRanges[cs][0] && c < kRanges[cs][1])
                                 ? x[l]
                                 : -std::numeric_limits<float>::infinity();
          const float got = o.masked[(cs * groups + gi) * 16 + l];
          if (bits(got) != bits(want) && bad < 5) {
            ++bad;
            ADD_FAILURE() << cl.name << " mask [" << kRanges[cs][0] << ", " << kRanges[cs][1]
                          << ") column " << c << ": got " << got << ", want " << want;
          }
        }
    }
  }
}

}  // namespace
}  // namespace nvte
