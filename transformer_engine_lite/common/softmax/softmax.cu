// GPU kernels of the scaled softmax family: one block per row, fp32 math with the CPU's exp_f32 and
// masking (softmax_params.h), and the row sums in the CPU's order (lane_sum): the CPU's bits, which
// FP8 attention's emulation relies on (the same bytes on every device).
#include <algorithm>
#include <cmath>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "../util/dtype_dispatch.h"
#include "../util/math.h"
#include "softmax_gpu.h"

namespace nvte {
namespace gpu {

namespace {

// Megatron/TE: a masked logit becomes this value (unscaled), so a fully masked row is uniform.
constexpr float kMaskedLogit = -10000.0f;
// Threads per row block: at most 512 (16 warps, 8 wavefronts on CDNA), at least one warp.
constexpr int kMaxThreads = 512;
// Grid-stride loops bound the grid; 64K blocks already fill any current GPU many times over.
constexpr size_t kMaxBlocks = 65536;

// About 4 elements per thread in whole warps: sk = 128 gets one warp per row, sk = 2048 gets 512.
int row_threads(size_t cols) {
  const size_t per4 = (cols + 3) / 4;
  const size_t warps = (per4 + kWarpSize - 1) / kWarpSize;
  return static_cast<int>(std::min<size_t>(kMaxThreads, std::max<size_t>(1, warps) * kWarpSize));
}

unsigned row_blocks(size_t rows) {
  return static_cast<unsigned>(std::max<size_t>(1, std::min(rows, kMaxBlocks)));
}

// The CPU kernel's sum of term(j) over j < n (softmax_cpu.cpp, kLanes = 16): lane l adds the terms
// j = l, l + 16, ... of the whole 16-blocks in order from 0, the tail j >= 16 * (n / 16) is added
// in order from 0, then s = ((0 + lane 0) + lane 1) ... + lane 15, plus the tail. The terms (an
// exp or a product each) are computed by all threads, kChunk at a time, into shared memory; then
// threads 0-15 add their lanes' terms of the chunk and thread 16 the tail's (blocks have at least
// 32 threads): only 17 threads add, serially, but adds from shared memory are cheap, and this is
// the one order that gives the CPU's bits. Every thread of the block must call it (barriers).
constexpr int kLanes = 16;
constexpr int kChunk = 2048;  // terms per round (8 KiB); a multiple of kLanes keeps lanes aligned
static_assert(kChunk % kLanes == 0, "a chunk holds whole 16-blocks");
template <typename F>
__device__ __forceinline__ float lane_sum(size_t n, F term, float *buf, float *lanes) {
  const int t = static_cast<int>(threadIdx.x);
  const size_t full = n / kLanes * kLanes;
  float acc = 0.0f;  // lane t's sum (t < 16) or the tail's (t == 16)
  for (size_t c0 = 0; c0 < n; c0 += kChunk) {
    const size_t cn = n - c0 < static_cast<size_t>(kChunk) ? n - c0 : kChunk;
    for (size_t j = t; j < cn; j += blockDim.x) buf[j] = term(c0 + j);
    __syncthreads();
    if (t < kLanes) {
      for (size_t j = t; j < cn && c0 + j < full; j += kLanes) acc += buf[j];
    } else if (t == kLanes) {
      for (size_t j = full > c0 ? full - c0 : 0; j < cn; ++j) acc += buf[j];
    }
    __syncthreads();  // buf is refilled by the next round
  }
  if (t <= kLanes) lanes[t] = acc;
  __syncthreads();
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  s += lanes[kLanes];
  __syncthreads();  // lanes is reused by the next row
  return s;
}

template <typename T>
__device__ __forceinline__ float logit(const T *x, const uint8_t *mask, size_t j, float scale) {
  return mask != nullptr && mask[j] != 0 ? kMaskedLogit : to_float(x[j]) * scale;
}

// Three passes over the row (re-read, it sits in L1/L2): max, sum of exp(v - max), then
// y = exp(v - max) / sum over the kept prefix and exact zeros past it. Each element is read and
// written by the same thread, after both reductions' barriers, so `in` may alias `out`.
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    softmax_fwd_kernel(const SoftmaxParams p, const T *in, T *out) {
  __shared__ float scratch[kMaxThreads / kWarpSize];
  __shared__ float buf[kChunk];
  __shared__ float lanes[kLanes + 1];
  const size_t n = p.cols;
  for (size_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const size_t valid = softmax_valid_prefix(p, row);  // the same for the whole block
    const uint8_t *mask = softmax_mask_row(p, row);
    const T *x = in + row * n;
    T *y = out + row * n;
    float m = 0.0f, sum = 1.0f;
    if (valid > 0) {
      // The CPU's select form: a NaN logit is skipped here but still turns the sum into NaN.
      float tm = -INFINITY;
      for (size_t j = threadIdx.x; j < valid; j += blockDim.x) {
        const float v = logit(x, mask, j, p.scale);
        tm = v > tm ? v : tm;
      }
      m = block_reduce<true>(tm, scratch);
      sum = lane_sum(valid, [&](size_t j) { return exp_f32(logit(x, mask, j, p.scale) - m); },
                     buf, lanes);
    }
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = j < valid ? exp_f32(logit(x, mask, j, p.scale) - m) / sum : 0.0f;
      y[j] = from_float<T>(v);
    }
  }
}

// dx = scale * y * (dy - sum(dy * y)) over the kept prefix (the sum in the CPU's order), exact
// zeros past it. Same aliasing argument as the forward: element j is read and written by one
// thread, after the reduction.
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
    softmax_bwd_kernel(const SoftmaxParams p, const T *dy, const T *y, T *dx) {
  __shared__ float buf[kChunk];
  __shared__ float lanes[kLanes + 1];
  const size_t n = p.cols;
  for (size_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const size_t valid = softmax_valid_prefix(p, row);
    const T *g = dy + row * n, *yr = y + row * n;
    T *d = dx + row * n;
    const float dot =
        lane_sum(valid, [&](size_t j) { return to_float(g[j]) * to_float(yr[j]); }, buf, lanes);
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = j < valid ? p.scale * to_float(yr[j]) * (to_float(g[j]) - dot) : 0.0f;
      d[j] = from_float<T>(v);
    }
  }
}

}  // namespace

void launch_softmax_fwd(const SoftmaxParams &p, DType dtype, const void *input, void *output,
                        void *stream) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "input", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_fwd_kernel<T><<<row_blocks(p.rows), row_threads(p.cols), 0, as_stream(stream)>>>(
        p, static_cast<const T *>(input), static_cast<T *>(output));
    NVTE_CHECK_LAUNCH();
  });
}

void launch_softmax_bwd(const SoftmaxParams &p, DType dtype, const void *incoming_grads,
                        const void *softmax_results, void *output_grads, void *stream) {
  dispatch_dtype<HighPrecisionTypes>(dtype, "incoming_grads", [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_bwd_kernel<T><<<row_blocks(p.rows), row_threads(p.cols), 0, as_stream(stream)>>>(
        p, static_cast<const T *>(incoming_grads), static_cast<const T *>(softmax_results),
        static_cast<T *>(output_grads));
    NVTE_CHECK_LAUNCH();
  });
}

}  // namespace gpu
}  // namespace nvte
