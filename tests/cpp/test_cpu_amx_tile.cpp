// The AMX bf16 tile GEMM of the CPU flash attention (platform/cpu_amx_tile.h), called directly. AMX
// sums each 32-K step inside one instruction in an undocumented order, so no oracle gives its bits;
// what is pinned here is everything around that instruction: the error against fp64 stays within the
// fp32 summation bound, K is cut into steps of 32 from 0 (two accumulating halves give the same bits
// as one call), a row's result depends neither on M nor on the row's position (the zero-padded edge
// copies), the K tail equals explicit zero padding, and accumulate = false never reads C.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "platform/cpu_amx_tile.h"

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace nvte {
namespace {

#ifdef NVTE_HAVE_AMX_TILE_KERNEL

// The CPU has AMX bf16 and the OS grants the tile state (the library asks the same way, cpu_isa.cpp).
bool amx_usable() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) return false;
#if defined(__linux__)
  return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
  return false;
#endif
}

uint16_t to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// A [M][lda] bf16 row-major (lda >= K), B as 64-column panels [K/2][64][2] (zero past N), C [M][ldc].
struct Problem {
  int M, N, K, lda, ldc;
  size_t panel_stride;
  std::vector<uint16_t> A, B;
  std::vector<float> C0;
  Problem(int m, int n, int k, uint32_t seed, int lda_extra = 6)
      : M(m), N(n), K(k), lda(k + lda_extra), ldc((n + 15) / 16 * 16) {
    panel_stride = static_cast<size_t>(K) * tile::kPanel;
    const int panels = (N + tile::kPanel - 1) / tile::kPanel;
    std::mt19937 g(seed);
    std::normal_distribution<float> u(0.0f, 1.0f);
    A.assign(static_cast<size_t>(M) * lda, 0);
    for (int r = 0; r < M; ++r)
      for (int kk = 0; kk < K; ++kk) A[r * lda + kk] = to_bf16(u(g));
    B.assign(panel_stride * panels, 0);
    for (int kk = 0; kk < K; ++kk)
      for (int j = 0; j < N; ++j) B[b_at(kk, j)] = to_bf16(u(g));
    C0.assign(static_cast<size_t>(M) * ldc, 0.0f);
    for (float &c : C0) c = u(g);
  }
  size_t b_at(int kk, int j) const {
    return (j / tile::kPanel) * panel_stride + ((kk / 2) * tile::kPanel + j % tile::kPanel) * 2 + kk % 2;
  }
  std::vector<float> run(bool acc) const {
    std::vector<float> C = C0;
    tile::gemm_amx_bf16(M, N, K, A.data(), lda, B.data(), panel_stride, C.data(), ldc, acc);
    return C;
  }
};

TEST(CpuAmxTile, WithinTheFp32SummationBoundOfFp64) {
  if (!amx_usable()) GTEST_SKIP() << "no AMX bf16 (or the OS refuses the tile state)";
  const int shapes[][3] = {{64, 64, 64}, {13, 50, 38}, {7, 130, 40}, {1, 17, 2},
                           {33, 64, 48}, {64, 64, 16}, {70, 128, 96}, {128, 64, 64}};
  uint32_t seed = 1;
  for (const auto &s : shapes) {
    const Problem p(s[0], s[1], s[2], seed++);
    for (bool acc : {false, true}) {
      const std::vector<float> C = p.run(acc);
      int bad = 0;
      for (int r = 0; r < p.M; ++r)
        for (int j = 0; j < p.N; ++j) {
          double ref = acc ? p.C0[r * p.ldc + j] : 0.0, mag = std::fabs(ref);
          for (int kk = 0; kk < p.K; ++kk) {
            const double prod = static_cast<double>(from_bf16(p.A[r * p.lda + kk])) *
                                from_bf16(p.B[p.b_at(kk, j)]);
            ref += prod;
            mag += std::fabs(prod);
          }
          // Any order of K + 1 fp32 additions: |error| <= (K + 1) u sum|terms|, u = 2^-24.
          const double bound = (p.K + 1) * std::ldexp(1.0, -24) * mag;
          if (std::fabs(C[r * p.ldc + j] - ref) > bound && bad++ < 5)
            ADD_FAILURE() << "M=" << p.M << " N=" << p.N << " K=" << p.K << " acc=" << acc << " ("
                          << r << ", " << j << "): got " << C[r * p.ldc + j] << ", fp64 " << ref;
        }
    }
  }
}

// C = A[:, :32] B[:32] then C += A[:, 32:] B[32:] equals one call with K = 64: K steps of 32 from 0.
TEST(CpuAmxTile, KStepsOf32FromZero) {
  if (!amx_usable()) GTEST_SKIP() << "no AMX bf16";
  const Problem p(40, 64, 64, 7);
  const std::vector<float> whole = p.run(false);
  std::vector<float> C(p.C0.size(), std::numeric_limits<float>::quiet_NaN());
  tile::gemm_amx_bf16(p.M, p.N, 32, p.A.data(), p.lda, p.B.data(), p.panel_stride, C.data(), p.ldc,
                      false);
  tile::gemm_amx_bf16(p.M, p.N, 32, p.A.data() + 32, p.lda, p.B.data() + 16 * tile::kPanel * 2,
                      p.panel_stride, C.data(), p.ldc, true);
  for (int r = 0; r < p.M; ++r)
    for (int j = 0; j < p.N; ++j)
      ASSERT_EQ(bits(C[r * p.ldc + j]), bits(whole[r * p.ldc + j])) << r << ", " << j;
}

// Each row alone (M = 1: the zero-padded edge copy) and the rows of a sub-range starting at an odd
// row give the bits of the full product; so does the K tail (K = 48) against K = 64 with zeros.
TEST(CpuAmxTile, RowsAndKTailIndependentOfTheEdges) {
  if (!amx_usable()) GTEST_SKIP() << "no AMX bf16";
  const Problem p(70, 100, 48, 11);
  for (bool acc : {false, true}) {
    const std::vector<float> full = p.run(acc);
    for (int r0 : {0, 5, 17, 69}) {
      const int m = std::min(p.M - r0, r0 == 5 ? 37 : 1);
      std::vector<float> C(p.C0.begin() + static_cast<size_t>(r0) * p.ldc, p.C0.end());
      tile::gemm_amx_bf16(m, p.N, p.K, p.A.data() + static_cast<size_t>(r0) * p.lda, p.lda, p.B.data(),
                          p.panel_stride, C.data(), p.ldc, acc);
      for (int r = 0; r < m; ++r)
        for (int j = 0; j < p.N; ++j)
          ASSERT_EQ(bits(C[r * p.ldc + j]), bits(full[(r0 + r) * p.ldc + j]))
              << "acc=" << acc << " row " << r0 + r << ", " << j;
    }
    // K = 64 with A's columns 48..63 and B's rows 48..63 zero.
    Problem z(p.M, p.N, 64, 11);
    for (int r = 0; r < p.M; ++r)
      for (int kk = 0; kk < 64; ++kk) z.A[r * z.lda + kk] = kk < p.K ? p.A[r * p.lda + kk] : 0;
    for (int kk = 0; kk < 64; ++kk)
      for (int j = 0; j < p.N; ++j) z.B[z.b_at(kk, j)] = kk < p.K ? p.B[p.b_at(kk, j)] : 0;
    z.C0 = p.C0;
    const std::vector<float> padded = z.run(acc);
    for (int r = 0; r < p.M; ++r)
      for (int j = 0; j < p.N; ++j)
        ASSERT_EQ(bits(padded[r * p.ldc + j]), bits(full[r * p.ldc + j])) << r << ", " << j;
  }
}

// accumulate = false: C's old contents (NaN here) never reach the result, in whole tiles and edges.
TEST(CpuAmxTile, NoAccumulateIgnoresC) {
  if (!amx_usable()) GTEST_SKIP() << "no AMX bf16";
  const Problem p(21, 40, 34, 3);
  const std::vector<float> want = p.run(false);
  std::vector<float> C(p.C0.size(), std::numeric_limits<float>::quiet_NaN());
  tile::gemm_amx_bf16(p.M, p.N, p.K, p.A.data(), p.lda, p.B.data(), p.panel_stride, C.data(), p.ldc,
                      false);
  for (int r = 0; r < p.M; ++r)
    for (int j = 0; j < p.N; ++j) ASSERT_EQ(bits(C[r * p.ldc + j]), bits(want[r * p.ldc + j]));
}

#else
TEST(CpuAmxTile, Kernel) { GTEST_SKIP() << "no AMX kernel in this build"; }
#endif

}  // namespace
}  // namespace nvte
