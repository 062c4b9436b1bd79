// Cache-friendly transposes of row-major blocks of any element width, shared by nvte_transpose and
// the transposed FP8 copy written by the OutputEmitter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace nvte {

// Transposes an 8x8 byte tile held as 8 little-endian words (byte j of w[i] = element (i, j)) in
// three stages of swapping 1-, 2- and 4-byte sub-blocks; afterwards byte i of w[j] = element (i,
// j).
inline void transpose8x8_bytes(uint64_t w[8]) {
  constexpr uint64_t m1 = 0x00FF00FF00FF00FFull, m2 = 0x0000FFFF0000FFFFull,
                     m4 = 0x00000000FFFFFFFFull;
  for (int i = 0; i < 8; i += 2) {
    const uint64_t a = w[i], b = w[i + 1];
    w[i] = (a & m1) | ((b << 8) & ~m1);
    w[i + 1] = ((a >> 8) & m1) | (b & ~m1);
  }
  for (int i = 0; i < 8; i += 4) {
    for (int k = 0; k < 2; ++k) {
      const uint64_t a = w[i + k], b = w[i + k + 2];
      w[i + k] = (a & m2) | ((b << 16) & ~m2);
      w[i + k + 2] = ((a >> 16) & m2) | (b & ~m2);
    }
  }
  for (int k = 0; k < 4; ++k) {
    const uint64_t a = w[k], b = w[k + 4];
    w[k] = (a & m4) | (b << 32);
    w[k + 4] = (a >> 32) | (b & ~m4);
  }
}

// One full kTR x kTC tile: dst[j * ld_dst + i] = src[i * ld_src + j]. The tile is transposed into
// an L1 buffer first and leaves as kTC contiguous runs of kTR elements: scattering single elements
// (or 8-byte words) straight to rows a power of two apart measured 3-5x slower (store misses and 4
// KiB aliasing between the strided loads and stores).
template <typename T, size_t kTR, size_t kTC>
inline void transpose_tile(const T *src, size_t ld_src, T *dst, size_t ld_dst) {
  alignas(64) T buf[kTC][kTR];
  if constexpr (sizeof(T) == 1 && kTR % 8 == 0 && kTC % 8 == 0) {
    for (size_t i = 0; i < kTR; i += 8) {
      for (size_t j = 0; j < kTC; j += 8) {
        uint64_t w[8];
        for (size_t a = 0; a < 8; ++a) std::memcpy(&w[a], src + (i + a) * ld_src + j, 8);
        transpose8x8_bytes(w);
        for (size_t b = 0; b < 8; ++b) std::memcpy(&buf[j + b][i], &w[b], 8);
      }
    }
  } else {
    for (size_t i = 0; i < kTR; ++i)
      for (size_t j = 0; j < kTC; ++j) buf[j][i] = src[i * ld_src + j];
  }
  for (size_t j = 0; j < kTC; ++j) std::memcpy(dst + j * ld_dst, buf[j], kTR * sizeof(T));
}

// dst[c * ld_dst + r] = src[r * ld_src + c] for r < rows, c < cols, in kTR x kTC tiles over the
// column range [c_begin, c_end); ragged edges element by element.
template <typename T, size_t kTR, size_t kTC>
inline void transpose_rect(const T *src, size_t ld_src, size_t rows, size_t c_begin, size_t c_end,
                           T *dst, size_t ld_dst) {
  const size_t r_full = rows / kTR * kTR;
  size_t c0 = c_begin;
  for (; c0 + kTC <= c_end; c0 += kTC) {
    for (size_t r0 = 0; r0 < r_full; r0 += kTR)
      transpose_tile<T, kTR, kTC>(src + r0 * ld_src + c0, ld_src, dst + c0 * ld_dst + r0, ld_dst);
    for (size_t c = c0; c < c0 + kTC; ++c)
      for (size_t r = r_full; r < rows; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
  }
  for (size_t c = c0; c < c_end; ++c)
    for (size_t r = 0; r < rows; ++r) dst[c * ld_dst + r] = src[r * ld_src + c];
}

}  // namespace nvte
