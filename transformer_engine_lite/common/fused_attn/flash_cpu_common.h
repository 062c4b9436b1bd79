// Shared pieces of the CPU flash-attention forward and backward (flash_fwd_cpu.cpp,
// flash_bwd_cpu.cpp): the compute element type, operand packing for platform/cpu_tile_gemm.h, tile
// sizes and the per-row key ranges.
//
// Compute types: bf16 inputs on a CPU with AVX-512 BF16 multiply bf16 operands (E = uint16_t bits,
// fp32 accumulation, probabilities rounded to bf16 before P.V as GPU flash kernels do; on AMX tiles
// at the avx512_core_amx level, AVX-512 BF16 dot products below it); every other
// case (fp16, fp32, or no BF16 dot product) computes with fp32 operands (E = float): fp16/bf16 inputs
// widen exactly, and P, dS stay fp32.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../platform/cpu_amx_tile.h"
#include "../platform/cpu_isa.h"
#include "../platform/cpu_lanes.h"
#include "../platform/cpu_tile_gemm.h"
#include "../platform/host_device.h"
#include "../util/half.h"
#include "attn_params.h"

namespace nvte {
namespace flash_cpu {

constexpr int kBlockKV = tile::kPanel;  // keys per block: one B panel
constexpr int kBlockQ = 64;             // query rows per tile (even: bf16 pairs in dK/dV GEMMs)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// The bias row of configs without bias: adding it keeps the softmax loops branch-free. (A loop with
// `if (bias) x += bias[c]` is if-converted into masked loads from a null pointer, and every such
// load takes a fault-suppression microcode assist: 3x slower than the GEMMs around it.)
alignas(64) inline constexpr float kZeroRow[kBlockKV] = {};

// The softmax on the clone's native vectors (platform/cpu_lanes.h, NVTE_CPU_DISPATCH_LANES).
using lanes::hmax_group;
using lanes::hsum_group;
using lanes::Lanes;
using lanes::mask_outside;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

// Compute element traits. K of every GEMM is padded to kKAlign (bf16 pairs) with zeros.
template <typename E>
struct Compute;

template <>
struct Compute<uint16_t> {
  static constexpr int kKAlign = 2;
  template <typename T>
  static uint16_t load(T v) {
    static_assert(std::is_same<T, bf16>::value, "the bf16 compute path takes bf16 inputs only");
    return v.x;
  }
  static uint16_t from_f32(float f) { return float_to_bf16(f).x; }
  static void gemm(int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B,
                   size_t panel_stride, float *C, int ldc, bool acc) {
    // AMX tiles at the avx512_core_amx level (their own fp32 rounding inside each 32-K step,
    // platform/cpu_amx_tile.h), AVX-512 BF16 dot products below it.
#ifdef NVTE_HAVE_AMX_TILE_KERNEL
    if (tile::has_amx_bf16()) return tile::gemm_amx_bf16(M, N, K, A, lda, B, panel_stride, C, ldc, acc);
#endif
    tile::gemm_bf16(M, N, K, A, lda, B, panel_stride, C, ldc, acc);
  }
};

// Whether the tile GEMMs of compute type E run on AMX (Compute<uint16_t>::gemm's choice).
template <typename E>
inline bool uses_amx() {
  return std::is_same<E, uint16_t>::value && tile::has_amx_bf16();
}

// Whether bf16 inputs take the bf16 dot-product path (this CPU has AVX-512 BF16); flash_fwd_cpu.cpp.
bool use_bf16_compute(NVTEDType dtype);

template <>
struct Compute<float> {
  static constexpr int kKAlign = 1;
  template <typename T>
  static float load(T v) {
    return to_float(v);
  }
  static float from_f32(float f) { return f; }
  static void gemm(int M, int N, int K, const float *A, int lda, const float *B,
                   size_t panel_stride, float *C, int ldc, bool acc) {
    tile::gemm_f32_cloned(M, N, K, A, lda, B, panel_stride, C, ldc, acc);
  }
};

// Index of element (kk, j) of a B operand (K index kk, column j) inside its 64-column panel.
template <typename E>
inline size_t b_index(int64_t kk, int64_t j) {
  if (Compute<E>::kKAlign == 2) return static_cast<size_t>(((kk >> 1) * tile::kPanel + j) * 2 + (kk & 1));
  return static_cast<size_t>(kk * tile::kPanel + j);
}

// A operand: rows [0, n) of a strided source (row r at src + row_off[r]), `cols` used columns, padded
// with zeros to `ld`; rows [n, n_alloc) zeroed.
template <typename E, typename T>
void pack_a(E *dst, int ld, const T *src, const int64_t *row_off, int n, int n_alloc, int cols) {
  for (int r = 0; r < n_alloc; ++r) {
    E *d = dst + static_cast<size_t>(r) * ld;
    if (r < n) {
      const T *s = src + row_off[r];
      for (int c = 0; c < cols; ++c) d[c] = Compute<E>::load(s[c]);
      for (int c = cols; c < ld; ++c) d[c] = E{};
    } else {
      std::memset(d, 0, sizeof(E) * ld);
    }
  }
}

// B = X^T for one 64-column panel: column j is source row j (j < n; the rest zero), K index = the
// source's features [0, kdim), padded with zeros to kpad. Used for S = Q.K^T (X = K block) and
// dP = dO.V^T (X = V block).
template <typename E, typename T>
void pack_b_rows_as_columns(E *dst, int kpad, const T *src, const int64_t *row_off, int n,
                            int kdim) {
  std::memset(dst, 0, sizeof(E) * kpad * tile::kPanel);
  if constexpr (std::is_same<E, uint16_t>::value && std::is_same<T, bf16>::value) {
    // bf16 as bf16: a K pair (kk, kk + 1) of column j is adjacent in the source row and in the
    // panel, so whole 32-bit words move (half the moves, no index arithmetic per element).
    const int pairs = kdim / 2;
    uint32_t *d32 = reinterpret_cast<uint32_t *>(dst);
    for (int j = 0; j < n; ++j) {
      const T *s = src + row_off[j];
      for (int pp = 0; pp < pairs; ++pp) {
        uint32_t w;
        std::memcpy(&w, s + 2 * pp, sizeof(w));
        d32[static_cast<size_t>(pp) * tile::kPanel + j] = w;
      }
      if (kdim % 2) dst[b_index<E>(kdim - 1, j)] = s[kdim - 1].x;
    }
    return;
  }
  for (int j = 0; j < n; ++j) {
    const T *s = src + row_off[j];
    for (int kk = 0; kk < kdim; ++kk) dst[b_index<E>(kk, j)] = Compute<E>::load(s[kk]);
  }
}

// B = Y as panels of 64 columns (features): K index = source row (rows [0, n), zero up to kpad),
// column = feature [0, cols). panel p at dst + p * kpad * 64. Used for O = P.V (Y = V block),
// dQ = dS.K (Y = K block), dK = dS^T.Q and dV = P^T.dO (Y = Q / dO tile).
template <typename E, typename T>
void pack_b_rows_as_k(E *dst, int kpad, const T *src, const int64_t *row_off, int n, int cols) {
  const int64_t panels = ceil_div(cols, tile::kPanel);
  if constexpr (std::is_same<E, float>::value) {
    // fp32 panels are row-major [kpad][64]: each source row converts into contiguous runs
    // (vectorized), and only the padding is zeroed (a full block has none).
    for (int64_t p = 0; p < panels; ++p) {
      const int c0 = static_cast<int>(p) * tile::kPanel;
      const int w = std::min(tile::kPanel, cols - c0);
      float *panel = dst + p * kpad * tile::kPanel;
      for (int kk = 0; kk < n; ++kk) {
        const T *s = src + row_off[kk] + c0;
        float *d = panel + static_cast<size_t>(kk) * tile::kPanel;
        for (int c = 0; c < w; ++c) d[c] = Compute<E>::load(s[c]);
        if (w < tile::kPanel) std::memset(d + w, 0, sizeof(float) * (tile::kPanel - w));
      }
      if (n < kpad)
        std::memset(panel + static_cast<size_t>(n) * tile::kPanel, 0,
                    sizeof(float) * (kpad - n) * tile::kPanel);
    }
    return;
  }
  if constexpr (std::is_same<E, uint16_t>::value && std::is_same<T, bf16>::value) {
    // bf16 as bf16: K rows kk and kk + 1 interleave as 32-bit words, the even row in the low half
    // (b_index), so a row pair is one vectorizable loop of word builds, not scalar index arithmetic
    // per element (that was a third of the forward's time outside the tiles and the softmax).
    alignas(64) static constexpr uint16_t kZeros[tile::kPanel] = {};
    for (int64_t p = 0; p < panels; ++p) {
      const int c0 = static_cast<int>(p) * tile::kPanel;
      const int w = std::min(tile::kPanel, cols - c0);
      uint32_t *panel = reinterpret_cast<uint32_t *>(dst + p * kpad * tile::kPanel);
      for (int kk = 0; kk < kpad; kk += 2) {
        const uint16_t *s0 = kk < n ? &src[row_off[kk] + c0].x : kZeros;
        const uint16_t *s1 = kk + 1 < n ? &src[row_off[kk + 1] + c0].x : kZeros;
        uint32_t *d = panel + static_cast<size_t>(kk / 2) * tile::kPanel;
        for (int c = 0; c < w; ++c)
          d[c] = static_cast<uint32_t>(s0[c]) | (static_cast<uint32_t>(s1[c]) << 16);
        for (int c = w; c < tile::kPanel; ++c) d[c] = 0;
      }
    }
    return;
  }
  std::memset(dst, 0, sizeof(E) * kpad * tile::kPanel * panels);
  for (int kk = 0; kk < n; ++kk) {
    const T *s = src + row_off[kk];
    for (int c = 0; c < cols; ++c) {
      const int64_t p = c / tile::kPanel;
      dst[p * kpad * tile::kPanel + b_index<E>(kk, c % tile::kPanel)] = Compute<E>::load(s[c]);
    }
  }
}

// Kept key range [lo, hi) of each query row of a tile, clamped to the sequence's keys; rows past the
// sequence's queries get an empty range. Returns the union as [*blo, *bhi).
inline void tile_key_ranges(const AttnParams &p, int64_t q0, int rows, int64_t sq, int64_t skv,
                            int64_t *lo, int64_t *hi, int64_t *ulo, int64_t *uhi) {
  *ulo = skv;
  *uhi = 0;
  for (int r = 0; r < rows; ++r) {
    const int64_t i = q0 + r;
    int64_t l = 0, h = 0;
    if (i < sq) p.key_range(i, sq, skv, &l, &h);
    l = std::max<int64_t>(l, 0);
    h = std::min<int64_t>(h, skv);
    if (l >= h) l = h = 0;
    lo[r] = l;
    hi[r] = h;
    if (l < h) {
      *ulo = std::min(*ulo, l);
      *uhi = std::max(*uhi, h);
    }
  }
  if (*ulo >= *uhi) *ulo = *uhi = 0;
}

// Bias (post_scale or ALiBi) of a tile's rows for the keys [j0, j0 + 64) as fp32 [rows][64]
// (zeros past skv). Returns false when the config has no bias.
template <typename T>
bool load_bias_tile(const AttnParams &p, int64_t bi, int64_t hi, int64_t q0, int rows,
                    int64_t j0, int64_t sq, int64_t skv, float *out) {
  if (p.bias_type == NVTE_POST_SCALE_BIAS) {
    const T *base = static_cast<const T *>(p.bias) +
                    ((p.bias_b == 1 ? 0 : bi) * p.bias_h + (p.bias_h == 1 ? 0 : hi)) * p.s_q * p.s_kv;
    for (int r = 0; r < rows; ++r) {
      const int64_t i = q0 + r;
      for (int c = 0; c < kBlockKV; ++c) {
        const int64_t j = j0 + c;
        out[r * kBlockKV + c] = (i < sq && j < skv) ? to_float(base[i * p.s_kv + j]) : 0.0f;
      }
    }
    return true;
  }
  if (p.bias_type == NVTE_ALIBI) {
    const float slope = p.alibi_slope(bi, hi);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < kBlockKV; ++c)
        out[r * kBlockKV + c] = alibi_bias(slope, q0 + r, j0 + c, sq, skv);
    return true;
  }
  return false;
}

// Dropout keep-scale of a tile ([rows][64]: 1/(1-p) kept, 0 dropped) for logits (bi, hi, q0+r, j0+c).
inline void dropout_tile(const AttnParams &p, int64_t bi, int64_t hi, int64_t q0, int rows,
                         int64_t j0, float *out) {
  const float keep_scale = 1.0f / (1.0f - p.dropout);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < kBlockKV; ++c) {
      const uint64_t pos = p.dropout_pos(bi, hi, q0 + r, j0 + c);
      out[r * kBlockKV + c] = dropout_keep(p.seed, p.offset, pos, p.dropout_thresh) ? keep_scale : 0.0f;
    }
  }
}

// Row offsets (elements) of `n` consecutive tokens starting at token t0 of sequence bi, head hd.
inline void token_offsets_q(const AttnParams &p, const AttnStrides &st, int64_t bi, int64_t hd,
                            int64_t t0, int n, int64_t *off) {
  for (int r = 0; r < n; ++r) off[r] = p.token_q(st, bi, t0 + r) + hd * st.head;
}
inline void token_offsets_kv(const AttnParams &p, const AttnStrides &st, int64_t bi, int64_t hd,
                             int64_t t0, int n, int64_t *off) {
  for (int r = 0; r < n; ++r) off[r] = p.token_kv(st, bi, t0 + r) + hd * st.head;
}

// Starts loading `n` rows of `bytes` bytes each (row r at base + off[r] elements of T) into the
// cache, for a packing or store that comes a tile's compute later. One head's rows lie a token
// stride apart (2 KiB for bshd H=16 D=64 bf16), beyond what the hardware prefetchers follow, so
// without it every row of Q, K, V and O is a cache miss at the point of use.
template <typename T>
inline void prefetch_rows(const T *base, const int64_t *off, int n, int64_t bytes, bool write) {
  for (int r = 0; r < n; ++r) {
    const char *row = reinterpret_cast<const char *>(base + off[r]);
    for (int64_t b = 0; b < bytes; b += 64) {
      if (write)
        __builtin_prefetch(row + b, 1);
      else
        __builtin_prefetch(row + b, 0);
    }
  }
}

}  // namespace flash_cpu
}  // namespace nvte
