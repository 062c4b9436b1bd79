// Fused RoPE: the kernel parameters and the per-pair rotation, shared by the CPU and GPU kernels so
// both round identically (up to the cos/sin they are given).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../platform/host_device.h"

namespace nvte {

// Token layout of input/output (the values of NVTE_QKV_Format).
enum class RopeFormat { kSBHD = 0, kBSHD = 1, kTHD = 2 };

struct RopeParams {
  RopeFormat format = RopeFormat::kSBHD;
  bool interleaved = false;   // pairs (2i, 2i+1) instead of (j, j + d2/2)
  size_t tokens = 0;          // s * b (sbhd/bshd) or t (thd)
  size_t s = 0;               // sbhd/bshd: sequence length (positions 0 .. s-1)
  size_t b = 0;               // sbhd/bshd: batch; thd: number of sequences
  size_t h = 0;               // heads
  size_t d = 0;               // features per head (elements between heads)
  size_t d2 = 0;              // rotated features per head, even, <= d
  size_t freq_positions = 0;  // s_max: positions freqs holds
  const float *freqs = nullptr;         // [freq_positions, d2] angles
  const int32_t *cu_seqlens = nullptr;  // thd: [b + 1] token offsets
  // thd, CPU only (the entry computes it from the validated offsets): the longest sequence.
  size_t max_seqlen = 0;
};

// The two features of pair q (0 <= q < d2/2): (q, q + d2/2) when not interleaved (TE's halves),
// (2q, 2q + 1) when interleaved.
NVTE_HOST_DEVICE void rope_pair(size_t q, size_t d2, bool interleaved, size_t *a, size_t *b) {
  *a = interleaved ? 2 * q : q;
  *b = interleaved ? 2 * q + 1 : q + d2 / 2;
}

// Forward rotation of one pair, TE's x * cos + rotate_half(x) * sin with each feature's own angle:
// rotate_half maps (x[a], x[b]) to (-x[b], x[a]).
NVTE_HOST_DEVICE void rope_pair_fwd(float xa, float xb, float ca, float sa, float cb, float sb,
                                    float *ya, float *yb) {
  *ya = xa * ca - xb * sa;
  *yb = xb * cb + xa * sb;
}

// Backward: the transpose of the forward's 2x2 map [[ca, -sa], [sb, cb]].
NVTE_HOST_DEVICE void rope_pair_bwd(float ga, float gb, float ca, float sa, float cb, float sb,
                                    float *da, float *db) {
  *da = ga * ca + gb * sb;
  *db = gb * cb - ga * sa;
}

}  // namespace nvte
