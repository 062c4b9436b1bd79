// The softmax exp on native-width vectors (platform/cpu_lanes.h), per clone: exp_softmax_lanes<W>
// must give exp_softmax_f32's bits (util/math.h) lane by lane, so that the CPU flash attention's
// probabilities are the same whether a vector or a scalar loop computed them and in every clone
// (16 lanes in x86-64-v4 code, 8 in v3, 4 in baseline). Header-only, called directly, each clone on
// a CPU that has its instructions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "platform/cpu_lanes.h"
#include "util/math.h"

namespace nvte {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

template <int W>
__attribute__((always_inline)) inline void exp_all(const float *in, float *out, size_t n) {
  using V = typename lanes::Lanes<W>::f;
  for (size_t i = 0; i < n; i += W) {
    V x;
    std::memcpy(&x, in + i, sizeof(x));
    lanes::exp_softmax_lanes<W>(x);
    std::memcpy(out + i, &x, sizeof(x));
  }
}
#ifdef NVTE_HAVE_FMA_TILE_KERNELS
__attribute__((target("arch=x86-64-v4"))) void exp_v4(const float *in, float *out, size_t n) {
  exp_all<16>(in, out, n);
}
__attribute__((target("arch=x86-64-v3"))) void exp_v3(const float *in, float *out, size_t n) {
  exp_all<8>(in, out, n);
}
bool has_v4() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}
bool has_v3() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif
void exp_baseline(const float *in, float *out, size_t n) { exp_all<4>(in, out, n); }

// Inputs: every 61st float of [-104, 0] (-0 and +0 included), the valid positive range up to 88 in
// steps, the underflow edge (-86.5 and its neighbours), infinities and NaN; padded to 16 lanes.
std::vector<float> inputs() {
  std::vector<float> v;
  for (uint32_t b = 0x80000000u; b <= bits(-104.0f); b += 61) {
    float f;
    std::memcpy(&f, &b, sizeof(f));
    v.push_back(f);
  }
  for (float f = 0.0f; f <= 88.0f; f += 0.013f) v.push_back(f);
  const float inf = std::numeric_limits<float>::infinity();
  for (float f : {0.0f, -0.0f, -86.5f, std::nextafter(-86.5f, 0.0f), std::nextafter(-86.5f, -inf),
                  -inf, inf, std::numeric_limits<float>::quiet_NaN(), -1e-45f, -1e30f, 88.0f})
    v.push_back(f);
  while (v.size() % 16) v.push_back(-1.0f);
  return v;
}

void check(const char *clone, void (*f)(const float *, float *, size_t)) {
  const std::vector<float> in = inputs();
  std::vector<float> out(in.size());
  f(in.data(), out.data(), in.size());
  int bad = 0;
  for (size_t i = 0; i < in.size() && bad < 5; ++i) {
    const float want = exp_softmax_f32(in[i]);
    const bool same = std::isnan(want) ? std::isnan(out[i]) : bits(out[i]) == bits(want);
    if (!same) {
      ++bad;
      ADD_FAILURE() << clone << ": exp(" << std::hexfloat << in[i] << ") = " << out[i] << ", want "
                    << want;
    }
  }
  EXPECT_GT(in.size(), 1000000u);
}

TEST(CpuLanesExp, EachCloneMatchesTheScalarExpBitForBit) {
#ifdef NVTE_HAVE_FMA_TILE_KERNELS
  if (has_v4()) check("x86-64-v4 (16 lanes)", exp_v4);
  if (has_v3()) check("x86-64-v3 (8 lanes)", exp_v3);
#endif
  check("baseline (4 lanes)", exp_baseline);
}

}  // namespace
}  // namespace nvte
