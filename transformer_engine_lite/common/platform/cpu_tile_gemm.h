// Small-tile GEMMs for the CPU attention kernels: C[M x N] (+)= A[M x K] * B[K x N], fp32 results.
// Attention multiplies tiles of 64-128 rows by 64 keys with K = head dim (or 64): too small for a
// library call per tile (oneDNN's per-call overhead is comparable to the work) and too hot for plain
// loops. Two register-blocked micro-kernels:
//  - bf16: AVX-512 BF16 dot products (vdpbf16ps: pairs of bf16 products summed in fp32), about 2.7x
//    the fp32 FMA rate on the CPUs that have it. Products of bf16 values are exact in fp32; the sums
//    round in fp32 (denormal inputs and results are flushed to zero by the instruction).
//  - fp32: GCC vector extensions, one clone per level (gemm_f32_cloned). The x86-64-v4 and -v3
//    clones accumulate with fused multiply-adds (one rounding per product and sum, one instruction
//    where a multiply and an add took two) and sum every output over k in the same order, so they
//    give the same bits. The baseline clone (SSE2: no FMA hardware) multiplies and adds separately,
//    the library's default (-ffp-contract=off). An exact software FMA costs far more than the
//    rounding it saves: on a 64x64x64 tile in SSE2 code, glibc's fmaf per lane took 31-39x the
//    mul+add kernel's time and a vectorized one (exact product in double, sum rounded to odd, then
//    to float) 41-79x. So baseline results may differ from v3/v4 in the last bits (both within the
//    fp64-referenced tolerances; README "CPU levels").
// Operand layouts (all elements of the packed type E: uint16_t bf16 bits or float):
//  - A: row-major [M][lda], K used columns; bf16 K is even (callers zero-pad the odd column).
//  - B: ceil(N / 64) panels of 64 columns, panel p at B + p * panel_stride. Inside a panel, bf16 is
//    [K/2][64][2] (the two K-neighbours of a column adjacent: vdpbf16ps's pairs) and fp32 is [K][64].
//    Columns past N inside the last panel must hold zeros.
//  - C: row-major fp32 with ldc >= N rounded up to 16: the last 16-column group is written in full.
// The intrinsics live here (platform/) only; callers see plain functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_isa.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define NVTE_HAVE_BF16_DOT_KERNEL 1
#if !defined(NVTE_NO_CPU_CLONES) && !defined(__CUDACC__) && !defined(__HIPCC__)
// The fp32 kernel's FMA clones (the same condition as NVTE_CPU_DISPATCH's clones, cpu_isa.h).
#define NVTE_HAVE_FMA_TILE_KERNELS 1
#endif
#endif

namespace nvte {
namespace tile {

constexpr int kPanel = 64;  // B panel width
constexpr int kRows = 6;    // rows per micro-kernel call (6 x 4 accumulators + 4 B vectors fit 32 zmm)

// Whether the bf16 dot-product kernel runs: the CPU has AVX-512 BF16 and NVTE_CPU_ISA allows it.
inline bool has_bf16_dot() {
#ifdef NVTE_HAVE_BF16_DOT_KERNEL
  return cpu_isa_level() >= CpuIsa::kAvx512CoreBf16;
#else
  return false;
#endif
}

#ifdef NVTE_HAVE_BF16_DOT_KERNEL
// R rows x NV 16-column groups of one panel. K2 = K / 2 pairs.
template <int R, int NV>
__attribute__((target("avx512f,avx512bf16"), always_inline)) inline void mk_bf16(
    const uint16_t *A, int lda, const uint16_t *B, int K2, float *C, int ldc, bool acc) {
  __m512 c[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v)
      c[r][v] = acc ? _mm512_loadu_ps(C + r * ldc + v * 16) : _mm512_setzero_ps();
  for (int k = 0; k < K2; ++k) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v)
      b[v] = (__m512bh)_mm512_loadu_si512(B + (static_cast<size_t>(k) * kPanel + v * 16) * 2);
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, A + static_cast<size_t>(r) * lda + 2 * k, sizeof(pair));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, b[v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * ldc + v * 16, c[r][v]);
}

template <int NV>
__attribute__((target("avx512f,avx512bf16"))) inline void panel_bf16(int M, const uint16_t *A,
                                                                     int lda, const uint16_t *B,
                                                                     int K2, float *C, int ldc,
                                                                     bool acc) {
  int r = 0;
  for (; r + kRows <= M; r += kRows)
    mk_bf16<kRows, NV>(A + static_cast<size_t>(r) * lda, lda, B, K2, C + r * ldc, ldc, acc);
  const size_t off = static_cast<size_t>(r);
  switch (M - r) {
    case 5: mk_bf16<5, NV>(A + off * lda, lda, B, K2, C + off * ldc, ldc, acc); break;
    case 4: mk_bf16<4, NV>(A + off * lda, lda, B, K2, C + off * ldc, ldc, acc); break;
    case 3: mk_bf16<3, NV>(A + off * lda, lda, B, K2, C + off * ldc, ldc, acc); break;
    case 2: mk_bf16<2, NV>(A + off * lda, lda, B, K2, C + off * ldc, ldc, acc); break;
    case 1: mk_bf16<1, NV>(A + off * lda, lda, B, K2, C + off * ldc, ldc, acc); break;
    default: break;
  }
}
#endif

// C (+)= A * B with bf16 operands (K even). Requires has_bf16_dot().
inline void gemm_bf16(int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B,
                      size_t panel_stride, float *C, int ldc, bool accumulate) {
#ifdef NVTE_HAVE_BF16_DOT_KERNEL
  for (int p = 0; p * kPanel < N; ++p) {
    const int cols = N - p * kPanel < kPanel ? N - p * kPanel : kPanel;
    const uint16_t *Bp = B + static_cast<size_t>(p) * panel_stride;
    float *Cp = C + p * kPanel;
    switch ((cols + 15) / 16) {
      case 1: panel_bf16<1>(M, A, lda, Bp, K / 2, Cp, ldc, accumulate); break;
      case 2: panel_bf16<2>(M, A, lda, Bp, K / 2, Cp, ldc, accumulate); break;
      case 3: panel_bf16<3>(M, A, lda, Bp, K / 2, Cp, ldc, accumulate); break;
      default: panel_bf16<4>(M, A, lda, Bp, K / 2, Cp, ldc, accumulate); break;
    }
  }
#else
  (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)panel_stride, (void)C, (void)ldc,
      (void)accumulate;
#endif
}

// ---- fp32 kernel (vector extensions; no intrinsics) ----
// V: the clone's native vector (v16f: 1 zmm, v8f: 1 ymm, v4f: 1 xmm). A generic 64-byte vector in
// AVX2 or SSE2 code is split by GCC through the stack, so each clone gets its own width.
typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

// c += a * b for one native vector. v16f and v8f: one fused multiply-add (vfmadd231ps; AVX-512F and
// FMA3 round alike, so v4 and v3 agree bit for bit), as inline assembly: the intrinsic carries a
// target and cannot be inlined into these target-less templates, and as a plain call GCC kept the
// accumulators in memory (4x slower). The assembly is only ever compiled inside gemm_f32_v4 / _v3
// (the only users of the kAvx512 / kAvx2 blockings), which are compiled for those levels.
// v4f (the SSE2 blocking): multiply, then add.
#ifdef NVTE_HAVE_FMA_TILE_KERNELS
__attribute__((always_inline)) inline void madd(v16f &c, const v16f &a, const v16f &b) {
  asm("vfmadd231ps %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
}
__attribute__((always_inline)) inline void madd(v8f &c, const v8f &a, const v8f &b) {
  asm("vfmadd231ps %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
}
#else  // one generic build (other compilers/architectures): no clones, no FMA
__attribute__((always_inline)) inline void madd(v16f &c, const v16f &a, const v16f &b) { c += a * b; }
__attribute__((always_inline)) inline void madd(v8f &c, const v8f &a, const v8f &b) { c += a * b; }
#endif
__attribute__((always_inline)) inline void madd(v4f &c, const v4f &a, const v4f &b) { c += a * b; }

// The loops over rows and vectors are unrolled by pragma: the accumulators must become registers,
// and GCC's own cost model (which sees the assembly as opaque) left some of them in a stack array.
template <typename V, int R, int NV>
__attribute__((always_inline)) inline void mk_f32(const float *A, int lda, const float *B, int K,
                                                  float *C, int ldc, bool acc) {
  constexpr int W = sizeof(V) / sizeof(float);
  V c[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (acc)
        std::memcpy(&c[r][v], C + r * ldc + v * W, sizeof(V));
      else
        c[r][v] = V{};
    }
  for (int k = 0; k < K; ++k) {
    V b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      std::memcpy(&b[v], B + static_cast<size_t>(k) * kPanel + v * W, sizeof(V));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const V a = A[static_cast<size_t>(r) * lda + k] - V{};  // broadcast
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) madd(c[r][v], a, b[v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(C + r * ldc + v * W, &c[r][v], sizeof(V));
}

// M rows in blocks of R (the remainder with R - 1, R - 2, ...).
template <typename V, int R, int NV>
__attribute__((always_inline)) inline void rows_f32(int M, const float *A, int lda, const float *B,
                                                    int K, float *C, int ldc, bool acc) {
  int r = 0;
  for (; r + R <= M; r += R)
    mk_f32<V, R, NV>(A + static_cast<size_t>(r) * lda, lda, B, K,
                     C + static_cast<size_t>(r) * ldc, ldc, acc);
  if constexpr (R > 1) {
    if (r < M)
      rows_f32<V, R - 1, NV>(M - r, A + static_cast<size_t>(r) * lda, lda, B, K,
                             C + static_cast<size_t>(r) * ldc, ldc, acc);
  }
}

// Register blocking of the fp32 kernel per clone, R rows x NV native vectors of accumulators with
// room for the B vectors: AVX-512 6 x 4 zmm (24 of 32 registers, + 4 B), AVX2 6 x 2 ymm (12 of 16,
// + 2), SSE2 4 x 2 xmm (8 of 16, + 2). AVX-512's blocking compiled for AVX2 spilled every
// accumulator (16x slower). Every blocking sums each output over k in the same order (from C or 0,
// k = 0, 1, ...), so the two FMA clones give the same bits.
enum class F32Blocking { kAvx512, kAvx2, kSse2 };

// C (+)= A * B with fp32 operands with blocking kB; called through gemm_f32_cloned, which compiles
// each blocking for its level.
template <F32Blocking kB>
__attribute__((always_inline)) inline void gemm_f32(int M, int N, int K, const float *A, int lda,
                                                    const float *B, size_t panel_stride, float *C,
                                                    int ldc, bool accumulate) {
  for (int p = 0; p * kPanel < N; ++p) {
    const int cols = N - p * kPanel < kPanel ? N - p * kPanel : kPanel;
    const float *Bp = B + static_cast<size_t>(p) * panel_stride;
    float *Cp = C + p * kPanel;
    const int groups = (cols + 15) / 16;  // 16-column groups, each written in full
    if constexpr (kB == F32Blocking::kAvx512) {
      switch (groups) {
        case 1: rows_f32<v16f, kRows, 1>(M, A, lda, Bp, K, Cp, ldc, accumulate); break;
        case 2: rows_f32<v16f, kRows, 2>(M, A, lda, Bp, K, Cp, ldc, accumulate); break;
        case 3: rows_f32<v16f, kRows, 3>(M, A, lda, Bp, K, Cp, ldc, accumulate); break;
        default: rows_f32<v16f, kRows, 4>(M, A, lda, Bp, K, Cp, ldc, accumulate); break;
      }
    } else if constexpr (kB == F32Blocking::kAvx2) {
      for (int g = 0; g < groups; ++g)
        rows_f32<v8f, kRows, 2>(M, A, lda, Bp + g * 16, K, Cp + g * 16, ldc, accumulate);
    } else {
      for (int g = 0; g < 2 * groups; ++g)
        rows_f32<v4f, 4, 2>(M, A, lda, Bp + g * 8, K, Cp + g * 8, ldc, accumulate);
    }
  }
}

// The per-level clones, each compiled for its level (NVTE_CPU_DISPATCH would also compile the AVX-512
// blocking's assembly into the SSE2 clone).
#ifdef NVTE_HAVE_FMA_TILE_KERNELS
__attribute__((target("arch=x86-64-v4"))) inline void gemm_f32_v4(
    int M, int N, int K, const float *A, int lda, const float *B, size_t panel_stride, float *C,
    int ldc, bool accumulate) {
  gemm_f32<F32Blocking::kAvx512>(M, N, K, A, lda, B, panel_stride, C, ldc, accumulate);
}
__attribute__((target("arch=x86-64-v3"))) inline void gemm_f32_v3(
    int M, int N, int K, const float *A, int lda, const float *B, size_t panel_stride, float *C,
    int ldc, bool accumulate) {
  gemm_f32<F32Blocking::kAvx2>(M, N, K, A, lda, B, panel_stride, C, ldc, accumulate);
}
#endif
inline void gemm_f32_baseline(int M, int N, int K, const float *A, int lda, const float *B,
                              size_t panel_stride, float *C, int ldc, bool accumulate) {
  gemm_f32<F32Blocking::kSse2>(M, N, K, A, lda, B, panel_stride, C, ldc, accumulate);
}

// sum_k a[k] * b[k] (k = 0, 1, ...) rounded as the same clone's fp32 kernel rounds one output of C
// with accumulate = false: fused multiply-adds at v4/v3 (scalar fmaf compiles to vfmadd there),
// mul+add at baseline. The attention backward's delta = rowsum(dO * O) uses it so that, where P is
// one-hot (O = V), delta equals the tile GEMM's dP = dO.V^T exactly and dS = P (dP - delta) is 0.
#ifdef NVTE_HAVE_FMA_TILE_KERNELS
__attribute__((target("arch=x86-64-v4"))) inline float dot_f32_v4(const float *a, const float *b, int n) {
  float c = 0.0f;
  for (int k = 0; k < n; ++k) c = __builtin_fmaf(a[k], b[k], c);
  return c;
}
__attribute__((target("arch=x86-64-v3"))) inline float dot_f32_v3(const float *a, const float *b, int n) {
  float c = 0.0f;
  for (int k = 0; k < n; ++k) c = __builtin_fmaf(a[k], b[k], c);
  return c;
}
#endif
inline float dot_f32_baseline(const float *a, const float *b, int n) {
  float c = 0.0f;
  for (int k = 0; k < n; ++k) c = c + a[k] * b[k];
  return c;
}
inline float dot_f32_cloned(const float *a, const float *b, int n) {
#ifdef NVTE_HAVE_FMA_TILE_KERNELS
  const CpuIsa isa = cpu_isa_level();
  if (isa >= CpuIsa::kAvx512Core) return dot_f32_v4(a, b, n);
  if (isa >= CpuIsa::kAvx2) return dot_f32_v3(a, b, n);
#endif
  return dot_f32_baseline(a, b, n);
}

// C (+)= A * B with fp32 operands, the clone of cpu_isa_level() (x86-64-v4 and -v3: FMA, the same
// bits; baseline: mul+add).
inline void gemm_f32_cloned(int M, int N, int K, const float *A, int lda, const float *B,
                            size_t panel_stride, float *C, int ldc, bool accumulate) {
#ifdef NVTE_HAVE_FMA_TILE_KERNELS
  const CpuIsa isa = cpu_isa_level();
  if (isa >= CpuIsa::kAvx512Core)
    return gemm_f32_v4(M, N, K, A, lda, B, panel_stride, C, ldc, accumulate);
  if (isa >= CpuIsa::kAvx2) return gemm_f32_v3(M, N, K, A, lda, B, panel_stride, C, ldc, accumulate);
#endif
  gemm_f32_baseline(M, N, K, A, lda, B, panel_stride, C, ldc, accumulate);
}

}  // namespace tile
}  // namespace nvte
