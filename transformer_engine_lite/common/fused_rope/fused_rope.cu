// GPU kernels of fused RoPE: one block per token (grid-stride); the token's cos/sin are computed
// once into shared memory and used by every head, and each thread rotates whole pairs with the
// CPU's pair math (fused_rope_params.h), so results differ from the CPU only through sincosf.
#include <algorithm>
#include <cmath>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "../util/dtype_dispatch.h"
#include "fused_rope_gpu.h"

namespace nvte {
namespace gpu {

namespace {

constexpr int kMaxThreads = 256;
// Grid-stride loops bound the grid; 64K blocks already fill any current GPU many times over.
constexpr size_t kMaxBlocks = 65536;
// cos and sin of one position in shared memory: 2 * 4096 * 4 B = 32 KiB, under the 48 KiB a
// kernel gets without opting in. Real models rotate at most a few hundred features.
constexpr size_t kMaxRotaryDim = 4096;

// What a token's block does.
enum class TokenMode { kRotate, kCopy, kInvalid };

// Row of freqs for `token` and what to do with it. sbhd/bshd shapes were checked against freqs on
// the host, but start_positions and the thd offsets were not (they stay on the device): thd tokens
// at or past cu[b] / cp_size are copied, and a row outside [0, freq_positions) (an offset or a
// sequence longer than freqs, or malformed offsets) marks the token invalid. Every thread of the
// block computes the same answer.
__device__ __forceinline__ TokenMode token_row(const RopeParams &p, size_t token, size_t *row) {
  size_t seq = 0;
  int64_t pos = 0, len = static_cast<int64_t>(p.s);
  if (p.format == RopeFormat::kSBHD) {
    seq = token % p.b;
    pos = static_cast<int64_t>(token / p.b);
  } else if (p.format == RopeFormat::kBSHD) {
    seq = token / p.s;
    pos = static_cast<int64_t>(token % p.s);
  } else {
    const int32_t *cu = p.cu_seqlens;
    const int64_t t = static_cast<int64_t>(token), cp = p.cp_size;
    if (p.b == 0 || t >= cu[p.b] / cp) return TokenMode::kCopy;
    // Largest i < b with cu[i] / cp_size <= token (binary search; in bounds whatever the offsets
    // hold).
    size_t lo = 0, hi = p.b;
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      if (cu[mid] / cp <= t) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    seq = lo;
    pos = t - cu[lo] / cp;
    len = cu[lo + 1] / cp - cu[lo] / cp;
    if (pos < 0) return TokenMode::kInvalid;
  }
  const int64_t r = rope_freq_row(p, pos, len, seq);
  if (r < 0 || r >= static_cast<int64_t>(p.freq_positions)) return TokenMode::kInvalid;
  *row = static_cast<size_t>(r);
  return TokenMode::kRotate;
}

template <bool kBackward, typename T>
__global__ void __launch_bounds__(kMaxThreads)
    fused_rope_kernel(const RopeParams p, const T *in, T *out) {
  extern __shared__ float trig[];  // cos[d2], then sin[d2]
  float *c = trig, *s = trig + p.d2;
  const size_t token_elems = p.h * p.d, half = p.d2 / 2, rest = p.d - p.d2;
  for (size_t token = blockIdx.x; token < p.tokens; token += gridDim.x) {
    size_t row = 0;
    const TokenMode mode = token_row(p, token, &row);
    if (mode == TokenMode::kRotate) {
      const float *f = p.freqs + row * p.d2;
      for (size_t j = threadIdx.x; j < p.d2; j += blockDim.x) sincosf(f[j], &s[j], &c[j]);
    }
    __syncthreads();
    const T *src = in + token * token_elems;
    T *dst = out + token * token_elems;
    if (mode == TokenMode::kCopy) {
      if (src != dst) {
        for (size_t i = threadIdx.x; i < token_elems; i += blockDim.x) dst[i] = src[i];
      }
    } else {
      // Each pair is read and written by one thread, so src may be dst.
      for (size_t i = threadIdx.x; i < p.h * half; i += blockDim.x) {
        const size_t head = i / half;
        size_t a, b;
        rope_pair(i - head * half, p.d2, p.interleaved, &a, &b);
        const float xa = to_float(src[head * p.d + a]), xb = to_float(src[head * p.d + b]);
        // NaN is visible, unlike garbage: the offsets ask for an angle freqs lacks.
        float ya = NAN, yb = NAN;
        if (mode == TokenMode::kRotate) {
          if constexpr (kBackward) {
            rope_pair_bwd(xa, xb, c[a], s[a], c[b], s[b], &ya, &yb);
          } else {
            rope_pair_fwd(xa, xb, c[a], s[a], c[b], s[b], &ya, &yb);
          }
        }
        dst[head * p.d + a] = from_float<T>(ya);
        dst[head * p.d + b] = from_float<T>(yb);
      }
      if (src != dst) {
        for (size_t i = threadIdx.x; i < p.h * rest; i += blockDim.x) {
          const size_t head = i / rest, j = p.d2 + (i - head * rest);
          dst[head * p.d + j] = src[head * p.d + j];
        }
      }
    }
    __syncthreads();  // the next token overwrites cos/sin
  }
}

// Whole warps, about one pair per thread: 16 heads of 64 pairs get 256 threads, one head of 16
// pairs one warp.
int block_threads(const RopeParams &p) {
  const size_t pairs = std::max<size_t>(1, p.h * (p.d2 / 2));
  const size_t warps = (pairs + kWarpSize - 1) / kWarpSize;
  return static_cast<int>(std::min<size_t>(kMaxThreads, warps * kWarpSize));
}

template <bool kBackward>
void launch(const RopeParams &p, DType dtype, const char *arg, const void *src, void *dst,
            void *stream) {
  NVTE_CHECK_SUPPORTED(p.d2 <= kMaxRotaryDim, "argument 'freqs': the GPU kernel keeps a "
                       "position's cos/sin in shared memory and takes d2 <= ", kMaxRotaryDim,
                       ", got d2 = ", p.d2);
  if (p.tokens == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min(p.tokens, kMaxBlocks));
  const size_t smem = 2 * p.d2 * sizeof(float);
  dispatch_dtype<HighPrecisionTypes>(dtype, arg, [&](auto tag) {
    using T = typename decltype(tag)::type;
    fused_rope_kernel<kBackward, T><<<blocks, block_threads(p), smem, as_stream(stream)>>>(
        p, static_cast<const T *>(src), static_cast<T *>(dst));
    NVTE_CHECK_LAUNCH();
  });
}

}  // namespace

void launch_fused_rope_fwd(const RopeParams &p, DType dtype, const void *input, void *output,
                           void *stream) {
  launch<false>(p, dtype, "input", input, output, stream);
}

void launch_fused_rope_bwd(const RopeParams &p, DType dtype, const void *output_grads,
                           void *input_grads, void *stream) {
  launch<true>(p, dtype, "output_grads", output_grads, input_grads, stream);
}

}  // namespace gpu
}  // namespace nvte
