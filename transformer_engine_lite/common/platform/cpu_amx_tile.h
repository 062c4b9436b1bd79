// The bf16 tile GEMM of platform/cpu_tile_gemm.h on AMX tiles (tdpbf16ps), for CPUs at the
// avx512_core_amx level: C[M x N] (+)= A[M x K] * B[K x N], the operand layouts of tile::gemm_bf16.
// One tdpbf16ps multiplies a 16 x 32 bf16 tile by a 32 x 16 one into 16 x 16 fp32 sums: 16 times
// the work of a vdpbf16ps at the same issue rate, so the attention tiles' GEMMs stop being the bulk
// of the time.
//
// Layouts need no repacking: a B panel [K/2][64][2] is four AMX B tiles side by side (16 columns x
// a K pair = 64 bytes per tile row, row stride 256 bytes), A is row-major, C fp32 row-major.
// Every tile is configured 16 rows x 64 bytes (one configuration per call, released at the end,
// so another library's AMX code on the thread, oneDNN's, never sees ours). Rows past M and the K
// tail past the last multiple of 32 go through zero-padded copies in the thread's scratch, so no
// load reads past an operand and every output is computed by the same sequence of instructions
// whatever its position: a row's result does not depend on M, on the row's block or the thread.
//
// Rounding: products of bf16 values are exact; the sums round in fp32 inside the instruction in an
// order Intel does not document. Measured on a Xeon (family 6, model 207) over 512,000 outputs of
// one instruction with normal inputs: about half differ in the last bits from vdpbf16ps's pairwise
// sums (and from any sequential rounding order tried), so the AMX level rounds differently from
// avx512_core_bf16 (README "CPU levels"); denormal inputs and results are flushed to zero, as by
// vdpbf16ps. K is cut into steps of 32 from k = 0, each summed into C by one instruction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_isa.h"
#include "cpu_tile_gemm.h"  // kPanel: the B panel layout shared with gemm_bf16

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && \
    !defined(__HIPCC__)
#include <immintrin.h>
#define NVTE_HAVE_AMX_TILE_KERNEL 1
#endif

namespace nvte {
namespace tile {

// Whether the AMX kernel runs: the level in use is avx512_core_amx, which cpu_isa.cpp only reports
// once the OS granted the process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM).
inline bool has_amx_bf16() {
#ifdef NVTE_HAVE_AMX_TILE_KERNEL
  return cpu_isa_level() >= CpuIsa::kAvx512CoreAmx;
#else
  return false;
#endif
}

#ifdef NVTE_HAVE_AMX_TILE_KERNEL
namespace amx {

constexpr int kTileRows = 16;  // rows of every tile
constexpr int kTileK = 32;     // bf16 K values per A tile row (64 bytes)
constexpr int kPanelCols = 64;

// The 64-byte operand of ldtilecfg (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// ldtilecfg as inline assembly reading the whole 64-byte object: GCC 12's _tile_loadconfig tells
// the compiler it reads only a pointer's 8 bytes, so the stores that fill the configuration can be
// dropped as dead (seen: a #GP fault on an all-garbage configuration at -O2).
__attribute__((always_inline)) inline void load_config(const TileConfig &cfg) {
  asm volatile("ldtilecfg %0" : : "m"(cfg));
}

// Zero-padded copies for the edges (rows past M, the K tail) of up to 2 x 2 C tiles.
struct Scratch {
  alignas(64) uint16_t a[2][kTileRows * kTileK];
  alignas(64) uint16_t b[2][kTileRows * 32];  // 16 K pairs x 16 columns x 2
  alignas(64) float c[2][2][kTileRows * 16];
};

// A's 16 x 32 tile at rows [r0, r0 + rows) (rows <= 16), K [k0, k0 + kk) (kk <= 32), zero-padded
// into s when it is not a whole tile of A. Returns the address and row stride in bytes.
inline const void *a_tile(const uint16_t *A, int lda, int r0, int rows, int k0, int kk,
                          uint16_t *s, int *stride) {
  const uint16_t *src = A + static_cast<size_t>(r0) * lda + k0;
  if (rows == kTileRows && kk == kTileK) {
    *stride = lda * 2;
    return src;
  }
  std::memset(s, 0, sizeof(uint16_t) * kTileRows * kTileK);
  for (int r = 0; r < rows; ++r)
    std::memcpy(s + r * kTileK, src + static_cast<size_t>(r) * lda, sizeof(uint16_t) * kk);
  *stride = kTileK * 2;
  return s;
}

// B's tile of K [k0, k0 + kk) x 16 columns starting at column g * 16 of the panel; the K tail is
// zero-padded into s.
inline const void *b_tile(const uint16_t *Bp, int g, int k0, int kk, uint16_t *s, int *stride) {
  const uint16_t *src = Bp + (static_cast<size_t>(k0 / 2) * kPanelCols + g * 16) * 2;
  if (kk == kTileK) {
    *stride = kPanelCols * 2 * 2;
    return src;
  }
  std::memset(s, 0, sizeof(uint16_t) * kTileRows * 32);
  for (int pr = 0; pr < kk / 2; ++pr)
    std::memcpy(s + pr * 32, src + static_cast<size_t>(pr) * kPanelCols * 2, 64);
  *stride = 64;
  return s;
}

// C tile (row block rb, column group cb of the step) in memory: C itself for a whole tile, else a
// copy in s (rows past M zero) that store_c writes back.
inline float *c_tile(float *C, int ldc, int rows, float *s, bool acc, int *stride) {
  if (rows == kTileRows) {
    *stride = ldc * 4;
    return C;
  }
  if (acc) {
    std::memset(s, 0, sizeof(float) * kTileRows * 16);
    for (int r = 0; r < rows; ++r) std::memcpy(s + r * 16, C + static_cast<size_t>(r) * ldc, 64);
  }
  *stride = 64;
  return s;
}

// RB row blocks x CB column groups of C tiles: rows [0, rows) of A / C (rows <= 16 RB, each block
// but the last whole), column groups g0 .. g0 + CB - 1 of the panel. Tiles: C 0-3, A 4-5, B 6-7.
// The tile numbers of the intrinsics are immediates, hence the explicit cases.
template <int RB, int CB>
__attribute__((target("amx-tile,amx-bf16"), always_inline)) inline void block(
    int rows, int K, const uint16_t *A, int lda, const uint16_t *Bp, int g0, float *C, int ldc,
    bool acc, Scratch &s) {
  float *cp[2][2];
  int cs[2][2];
  for (int rb = 0; rb < RB; ++rb)
    for (int cb = 0; cb < CB; ++cb) {
      const int rr = rows - rb * kTileRows < kTileRows ? rows - rb * kTileRows : kTileRows;
      cp[rb][cb] = c_tile(C + static_cast<size_t>(rb) * kTileRows * ldc + (g0 + cb) * 16, ldc, rr,
                          s.c[rb][cb], acc, &cs[rb][cb]);
    }
  // Without accumulation a tile starts at zero (a copy's rows past M are never stored back).
#define NVTE_AMX_C(rb, cb, t)                  \
  if (RB > rb && CB > cb) {                    \
    if (acc)                                   \
      _tile_loadd(t, cp[rb][cb], cs[rb][cb]);  \
    else                                       \
      _tile_zero(t);                           \
  }
  NVTE_AMX_C(0, 0, 0)
  NVTE_AMX_C(0, 1, 1)
  NVTE_AMX_C(1, 0, 2)
  NVTE_AMX_C(1, 1, 3)
#undef NVTE_AMX_C
  for (int k0 = 0; k0 < K; k0 += kTileK) {
    const int kk = K - k0 < kTileK ? K - k0 : kTileK;
    int as, bs;
    const void *a0 = a_tile(A, lda, 0, rows < kTileRows ? rows : kTileRows, k0, kk, s.a[0], &as);
    _tile_loadd(4, a0, as);
    if (RB > 1) {
      const void *a1 = a_tile(A, lda, kTileRows, rows - kTileRows, k0, kk, s.a[1], &as);
      _tile_loadd(5, a1, as);
    }
    const void *b0 = b_tile(Bp, g0, k0, kk, s.b[0], &bs);
    _tile_loadd(6, b0, bs);
    if (CB > 1) {
      const void *b1 = b_tile(Bp, g0 + 1, k0, kk, s.b[1], &bs);
      _tile_loadd(7, b1, bs);
    }
    _tile_dpbf16ps(0, 4, 6);
    if (CB > 1) _tile_dpbf16ps(1, 4, 7);
    if (RB > 1) _tile_dpbf16ps(2, 5, 6);
    if (RB > 1 && CB > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, cp[0][0], cs[0][0]);
  if (CB > 1) _tile_stored(1, cp[0][1], cs[0][1]);
  if (RB > 1) _tile_stored(2, cp[1][0], cs[1][0]);
  if (RB > 1 && CB > 1) _tile_stored(3, cp[1][1], cs[1][1]);
  // Copies back: the rows that exist.
  for (int rb = 0; rb < RB; ++rb) {
    const int rr = rows - rb * kTileRows < kTileRows ? rows - rb * kTileRows : kTileRows;
    if (rr == kTileRows) continue;
    for (int cb = 0; cb < CB; ++cb) {
      float *dst = C + static_cast<size_t>(rb) * kTileRows * ldc + (g0 + cb) * 16;
      for (int r = 0; r < rr; ++r) std::memcpy(dst + static_cast<size_t>(r) * ldc, s.c[rb][cb] + r * 16, 64);
    }
  }
}

}  // namespace amx

// Tiles configured by an AmxScope on this thread (0: none; each gemm_amx_bf16 configures its own).
inline thread_local int amx_scope_depth = 0;

__attribute__((target("amx-tile"))) inline void amx_configure() {
  amx::TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = amx::kTileRows;
    cfg.colsb[t] = 64;
  }
  amx::load_config(cfg);
}
__attribute__((target("amx-tile"))) inline void amx_release() { _tile_release(); }

// C (+)= A * B with bf16 operands on AMX tiles; tile::gemm_bf16's contract (K even, B panels of 64
// columns zero past N, C's last 16-column group written in full). Requires has_amx_bf16().
__attribute__((target("amx-tile,amx-bf16"))) inline void gemm_amx_bf16(
    int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B, size_t panel_stride,
    float *C, int ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  const bool own = amx_scope_depth == 0;
  if (own) amx_configure();
  amx::Scratch s;
  for (int p = 0; p * kPanel < N; ++p) {
    const int cols = N - p * kPanel < kPanel ? N - p * kPanel : kPanel;
    const int groups = (cols + 15) / 16;
    const uint16_t *Bp = B + static_cast<size_t>(p) * panel_stride;
    float *Cp = C + p * kPanel;
    for (int r0 = 0; r0 < M; r0 += 2 * amx::kTileRows) {
      const int rows = M - r0 < 2 * amx::kTileRows ? M - r0 : 2 * amx::kTileRows;
      const uint16_t *Ar = A + static_cast<size_t>(r0) * lda;
      float *Cr = Cp + static_cast<size_t>(r0) * ldc;
      int g = 0;
      if (rows > amx::kTileRows) {
        for (; g + 2 <= groups; g += 2) amx::block<2, 2>(rows, K, Ar, lda, Bp, g, Cr, ldc, accumulate, s);
        if (g < groups) amx::block<2, 1>(rows, K, Ar, lda, Bp, g, Cr, ldc, accumulate, s);
      } else {
        for (; g + 2 <= groups; g += 2) amx::block<1, 2>(rows, K, Ar, lda, Bp, g, Cr, ldc, accumulate, s);
        if (g < groups) amx::block<1, 1>(rows, K, Ar, lda, Bp, g, Cr, ldc, accumulate, s);
      }
    }
  }
  if (own) amx_release();
}

// Configures the tiles once for every gemm_amx_bf16 call on this thread while it lives (ldtilecfg
// + tilerelease cost about 85 ns, 5-15% of an attention tile's 64 x 64 x 64 product), and releases
// them at the end. Only for code that runs no other AMX user (oneDNN) on the thread meanwhile: the
// attention kernels' parallel regions. Inactive when `on` is false.
class AmxScope {
 public:
  explicit AmxScope(bool on) : on_(on) {
    if (on_ && amx_scope_depth++ == 0) amx_configure();
  }
  ~AmxScope() {
    if (on_ && --amx_scope_depth == 0) amx_release();
  }
  AmxScope(const AmxScope &) = delete;
  AmxScope &operator=(const AmxScope &) = delete;

 private:
  bool on_;
};
#else
class AmxScope {
 public:
  explicit AmxScope(bool) {}
};
#endif

}  // namespace tile
}  // namespace nvte
