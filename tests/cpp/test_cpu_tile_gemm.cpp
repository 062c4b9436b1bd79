// The fp32 tile kernel of the CPU flash attention (platform/cpu_tile_gemm.h), per clone: the
// x86-64-v4 and -v3 clones accumulate with fused multiply-adds in one k order (each output equals
// the chain c = fma(a_k, b_k, c), k = 0, 1, ..., so the two agree bit for bit), the baseline clone
// with a separate multiply and add. The clones are header-only and called directly here, each on a
// CPU that has its instructions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "platform/cpu_tile_gemm.h"

namespace nvte {
namespace {

#ifdef NVTE_HAVE_FMA_TILE_KERNELS

using GemmFn = void (*)(int, int, int, const float *, int, const float *, size_t, float *, int, bool);

bool has_v4() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"); }
bool has_v3() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// A [M][lda] row-major, B as 64-column panels of [K][64] (zero past N), C [M][ldc].
struct Problem {
  int M, N, K, lda, ldc;
  size_t panel_stride;
  std::vector<float> A, B, C0;
  Problem(int m, int n, int k, uint32_t seed) : M(m), N(n), K(k), lda(k + 3), ldc((n + 15) / 16 * 16) {
    panel_stride = static_cast<size_t>(K) * tile::kPanel;
    const int panels = (N + tile::kPanel - 1) / tile::kPanel;
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    A.assign(static_cast<size_t>(M) * lda, 0.0f);
    for (int r = 0; r < M; ++r)
      for (int k2 = 0; k2 < K; ++k2) A[r * lda + k2] = u(g);
    B.assign(panel_stride * panels, 0.0f);
    for (int k2 = 0; k2 < K; ++k2)
      for (int j = 0; j < N; ++j) B[(j / tile::kPanel) * panel_stride + k2 * tile::kPanel + j % tile::kPanel] = u(g);
    C0.assign(static_cast<size_t>(M) * ldc, 0.0f);
    for (float &c : C0) c = u(g);
  }
  float b(int k2, int j) const { return B[(j / tile::kPanel) * panel_stride + k2 * tile::kPanel + j % tile::kPanel]; }
  std::vector<float> run(GemmFn f, bool acc) const {
    std::vector<float> C = C0;
    f(M, N, K, A.data(), lda, B.data(), panel_stride, C.data(), ldc, acc);
    return C;
  }
  // The contract, element by element: from C (or 0), k = 0, 1, ... in order.
  float expect(int r, int j, bool acc, bool fused) const {
    volatile float c = acc ? C0[r * ldc + j] : 0.0f;  // volatile: no contraction of the mul+add
    for (int k2 = 0; k2 < K; ++k2) {
      if (fused) {
        c = std::fma(A[r * lda + k2], b(k2, j), c);
      } else {
        volatile float p = A[r * lda + k2] * b(k2, j);
        c = c + p;
      }
    }
    return c;
  }
};

// a * b = 1 + 2^-11 + 2^-24 exactly: rounded alone it is 1 + 2^-11 (a tie, to even), so
// a * b + c is 0 with a multiply and an add and 2^-24 with one fused multiply-add.
TEST(CpuTileGemmF32, FmaClonesFuseAndBaselineDoesNot) {
  const float a = 1.0f + std::ldexp(1.0f, -12), c = -(1.0f + std::ldexp(1.0f, -11));
  std::vector<float> A(1, a), B(tile::kPanel, 0.0f);
  B[0] = a;
  auto one = [&](GemmFn f) {
    std::vector<float> C(16, 0.0f);
    C[0] = c;
    f(1, 1, 1, A.data(), 1, B.data(), tile::kPanel, C.data(), 16, true);
    return C[0];
  };
  EXPECT_EQ(one(tile::gemm_f32_baseline), 0.0f);
  if (has_v3()) {
    EXPECT_EQ(one(tile::gemm_f32_v3), std::ldexp(1.0f, -24));
  }
  if (has_v4()) {
    EXPECT_EQ(one(tile::gemm_f32_v4), std::ldexp(1.0f, -24));
  }
}

// Every blocking's remainders (rows past 6 / 4, partial 16-column groups and panels), accumulating
// and not: v4 and v3 equal the fma chain bit for bit, baseline the mul+add chain.
TEST(CpuTileGemmF32, EachCloneFollowsItsChain) {
  const int shapes[][3] = {{64, 64, 64}, {13, 50, 37}, {7, 130, 40}, {1, 17, 1}, {5, 64, 2}};
  uint32_t seed = 1;
  for (const auto &s : shapes) {
    const Problem p(s[0], s[1], s[2], seed++);
    for (bool acc : {false, true}) {
      struct Clone { const char *name; GemmFn f; bool fused, available; };
      const Clone clones[] = {{"x86-64-v4", tile::gemm_f32_v4, true, has_v4()},
                              {"x86-64-v3", tile::gemm_f32_v3, true, has_v3()},
                              {"baseline", tile::gemm_f32_baseline, false, true}};
      for (const Clone &cl : clones) {
        if (!cl.available) continue;
        const std::vector<float> C = p.run(cl.f, acc);
        int bad = 0;
        for (int r = 0; r < p.M && bad < 5; ++r)
          for (int j = 0; j < p.N && bad < 5; ++j) {
            const float want = p.expect(r, j, acc, cl.fused);
            if (bits(C[r * p.ldc + j]) != bits(want)) {
              ++bad;
              ADD_FAILURE() << cl.name << " M=" << p.M << " N=" << p.N << " K=" << p.K
                            << " acc=" << acc << " (" << r << ", " << j << "): got " << C[r * p.ldc + j]
                            << ", want " << want;
            }
          }
      }
    }
  }
}

#else
TEST(CpuTileGemmF32, FmaClonesFuseAndBaselineDoesNot) { GTEST_SKIP() << "no per-level clones in this build"; }
#endif

}  // namespace
}  // namespace nvte
