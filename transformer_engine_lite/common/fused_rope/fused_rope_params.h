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
  const int32_t *cu_seqlens = nullptr;  // thd: [b + 1] token offsets (of the whole sequences)
  // [b] per-sequence offsets into freqs (KV-cache decoding: a sequence's first token sits at
  // start_positions[i]), or null for none.
  const int32_t *start_positions = nullptr;
  // Context parallelism (TE's dual-chunk split): this rank holds chunks cp_rank and
  // 2 * cp_size - 1 - cp_rank of each sequence cut into 2 * cp_size; thd offsets are divided by
  // cp_size to give the local ones. cp_size = 1: the whole sequence.
  int cp_size = 1;
  int cp_rank = 0;
  // thd, CPU only (the entry computes it from the validated offsets): the longest local sequence.
  size_t max_seqlen = 0;
};

// Row of freqs for the token at local index `pos` of sequence `seq`, whose local length is `len`
// (s for sbhd/bshd): pos + start_positions[seq], and with context parallelism the first half of
// the local tokens continue chunk cp_rank of the full sequence (cp_size * len tokens), the second
// half chunk 2 * cp_size - 1 - cp_rank. May lie outside freqs: callers check the range.
NVTE_HOST_DEVICE int64_t rope_freq_row(const RopeParams &p, int64_t pos, int64_t len, size_t seq) {
  int64_t row = pos + (p.start_positions != nullptr ? p.start_positions[seq] : 0);
  if (p.cp_size > 1) {
    const int64_t half = len / 2, cp = p.cp_size, rank = p.cp_rank;
    row += pos < half ? rank * half : cp * len - (rank + 1) * half - half;
  }
  return row;
}

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
