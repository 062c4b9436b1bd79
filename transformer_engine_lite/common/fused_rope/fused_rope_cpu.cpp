// CPU kernels of fused RoPE: parallel over positions; a row of freqs' cos/sin is computed once and
// reused by every head of a token and by the following tokens at that position that use the same
// row (all b of them without start_positions), so the trig costs d2 calls per position (per token
// with start_positions) instead of per element.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../cast/emit_cpu.h"
#include "../platform/host_device.h"
#include "../util/dtype_dispatch.h"
#include "../util/parallel.h"
#include "fused_rope_cpu.h"

namespace nvte {

namespace {

// One pair of rotated features, forward or backward.
template <bool kBackward>
NVTE_HOST_DEVICE void rotate_pair(const float *x, float *y, const float *c, const float *s,
                                  size_t a, size_t b) {
  if constexpr (kBackward) {
    rope_pair_bwd(x[a], x[b], c[a], s[a], c[b], s[b], &y[a], &y[b]);
  } else {
    rope_pair_fwd(x[a], x[b], c[a], s[a], c[b], s[b], &y[a], &y[b]);
  }
}

// Rotated features of one head in fp32 (x -> y, distinct buffers). Split by layout so each loop has
// unit stride (halves) or a fixed stride of 2 (pairs) and vectorizes.
template <bool kBackward>
NVTE_CPU_KERNEL void rotate_head(const float *x, float *y, const float *c, const float *s,
                                 size_t d2, bool interleaved) {
  const size_t half = d2 / 2;
  if (interleaved) {
    for (size_t q = 0; q < half; ++q) rotate_pair<kBackward>(x, y, c, s, 2 * q, 2 * q + 1);
  } else {
    for (size_t q = 0; q < half; ++q) rotate_pair<kBackward>(x, y, c, s, q, q + half);
  }
}

// Scratch of one worker: the position's cos/sin and one head's fp32 input and output.
struct Scratch {
  explicit Scratch(size_t d2) : c(d2), s(d2), x(d2), y(d2) {}
  std::vector<float> c, s, x, y;
};

// One token: h heads of d features at `in` / `out` (which may be the same buffer: each head is
// loaded whole before it is stored, and the pass-through copy is skipped in place).
template <bool kBackward, typename T>
void rotate_token(const RopeParams &p, const T *in, T *out, Scratch &w) {
  for (size_t head = 0; head < p.h; ++head) {
    const T *src = in + head * p.d;
    T *dst = out + head * p.d;
    load_row(src, w.x.data(), p.d2);
    NVTE_CPU_DISPATCH(
        rotate_head<kBackward>(w.x.data(), w.y.data(), w.c.data(), w.s.data(), p.d2,
                               p.interleaved));
    store_row(w.y.data(), dst, p.d2);
    if (src != dst && p.d > p.d2) std::memcpy(dst + p.d2, src + p.d2, (p.d - p.d2) * sizeof(T));
  }
}

// The token at local index `pos` of sequence `seq` and that sequence's local length, or false
// when the sequence is shorter (thd; its local tokens are cu[i] / cp_size .. cu[i + 1] / cp_size).
bool token_at(const RopeParams &p, size_t pos, size_t seq, size_t *token, size_t *len) {
  switch (p.format) {
    case RopeFormat::kSBHD:
      *token = pos * p.b + seq;
      *len = p.s;
      return true;
    case RopeFormat::kBSHD:
      *token = seq * p.s + pos;
      *len = p.s;
      return true;
    case RopeFormat::kTHD:
    default: {
      const size_t begin = static_cast<size_t>(p.cu_seqlens[seq] / p.cp_size);
      const size_t end = static_cast<size_t>(p.cu_seqlens[seq + 1] / p.cp_size);
      *token = begin + pos;
      *len = end - begin;
      return pos < end - begin;
    }
  }
}

template <bool kBackward, typename T>
void fused_rope_kernel(const RopeParams &p, const T *in, T *out) {
  const size_t token_elems = p.h * p.d;
  const size_t positions = p.format == RopeFormat::kTHD ? p.max_seqlen : p.s;
  // Positions per chunk: at least ~16K elements of work (b tokens each) so threads pay off.
  const size_t grain = std::max<size_t>(1, 16384 / std::max<size_t>(1, p.b * token_elems));
  parallel_for(positions, grain, [&](size_t p0, size_t p1) {
    Scratch w(p.d2);
    for (size_t pos = p0; pos < p1; ++pos) {
      // cos/sin of the last row used: without start_positions (and with equal thd lengths under
      // context parallelism) every sequence at this position shares one row, computed once.
      int64_t cached = -1;
      for (size_t seq = 0; seq < p.b; ++seq) {
        size_t token, len;
        if (!token_at(p, pos, seq, &token, &len)) continue;
        // In [0, freq_positions): the entry checked every sequence's rows.
        const int64_t row = rope_freq_row(p, static_cast<int64_t>(pos),
                                          static_cast<int64_t>(len), seq);
        if (row != cached) {
          const float *f = p.freqs + static_cast<size_t>(row) * p.d2;
          for (size_t j = 0; j < p.d2; ++j) {
            w.c[j] = std::cos(f[j]);
            w.s[j] = std::sin(f[j]);
          }
          cached = row;
        }
        rotate_token<kBackward>(p, in + token * token_elems, out + token * token_elems, w);
      }
    }
  });
  // thd tokens past the last sequence belong to none: copied unchanged (the identity is its own
  // transpose, so forward and backward agree).
  if (p.format == RopeFormat::kTHD && in != out) {
    const size_t used = static_cast<size_t>(p.cu_seqlens[p.b] / p.cp_size);
    std::memcpy(out + used * token_elems, in + used * token_elems,
                (p.tokens - used) * token_elems * sizeof(T));
  }
}

template <bool kBackward>
void launch(const RopeParams &p, DType dtype, const char *arg, const void *src, void *dst) {
  dispatch_dtype<HighPrecisionTypes>(dtype, arg, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fused_rope_kernel<kBackward>(p, static_cast<const T *>(src), static_cast<T *>(dst));
  });
}

}  // namespace

void launch_fused_rope_fwd(const RopeParams &p, DType dtype, const void *input, void *output) {
  launch<false>(p, dtype, "input", input, output);
}

void launch_fused_rope_bwd(const RopeParams &p, DType dtype, const void *output_grads,
                           void *input_grads) {
  launch<true>(p, dtype, "output_grads", output_grads, input_grads);
}

}  // namespace nvte
