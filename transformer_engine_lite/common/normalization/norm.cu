// GPU kernels of LayerNorm / RMSNorm: the CPU kernels' fp32 formulas (norm_cpu.cpp), one block per
// row, and the CPU's chunked dgamma/dbeta reduction so those match the CPU bit for bit.
#include <algorithm>

#include "../cast/staged_output_gpu.cuh"
#include "../util/hp_access.h"
#include "norm_gpu.h"

namespace nvte {
namespace gpu {

namespace {

// Threads per row block: at most 512 (16 warps, 8 wavefronts on CDNA), at least one warp.
constexpr int kMaxThreads = 512;
// Grid-stride loops bound the grid; 64K blocks already fill any current GPU many times over.
constexpr size_t kMaxBlocks = 65536;
// Column threads of the dgamma/dbeta kernels.
constexpr int kColThreads = 256;

// About 4 elements per thread, rounded up to whole warps: a hidden size of 64 gets one warp (a
// warp per row), 4096 gets 512 threads.
int row_threads(size_t hidden) {
  const size_t per4 = (hidden + 3) / 4;
  const size_t warps = (per4 + kWarpSize - 1) / kWarpSize;
  return static_cast<int>(std::min<size_t>(kMaxThreads, std::max<size_t>(1, warps) * kWarpSize));
}

unsigned grid_for(size_t work, size_t per_block) {
  const size_t blocks = (work + per_block - 1) / per_block;
  // At least one block: forward kernels also write scale_inv, which an empty output still gets.
  return static_cast<unsigned>(std::max<size_t>(1, std::min(blocks, kMaxBlocks)));
}

// The weight applied, in fp32: gamma, or 1 + gamma rounded once in fp32 (as the CPU).
__device__ __forceinline__ float weight(const void *gamma, DType t, size_t j, bool zero_centered) {
  const float g = load_hp(gamma, t, j);
  return zero_centered ? g + 1.0f : g;
}

// ---------------------------------------------------------------- forward
// Three passes over the row (re-read from L1/L2, not staged): the mean, the centered sum of squares
// (accurate when |mean| >> stddev, as the CPU's two-pass form), then z. Every thread of the block
// runs every pass: the reductions contain barriers.
template <typename IType, typename OType>
__global__ void __launch_bounds__(kMaxThreads)
    norm_fwd_kernel(const NormFwdParams p, const OutputParams out) {
  __shared__ float scratch[kMaxThreads / kWarpSize];
  const bool centered = p.kind == NormKind::kLayerNorm;
  const size_t n = p.hidden;
  const float nf = static_cast<float>(n);
  const float scale = output_scale(out);
  float thread_amax = 0.0f;
  for (size_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const IType *x = static_cast<const IType *>(p.x) + row * n;
    float mean = 0.0f;
    if (centered) {
      float s = 0.0f;
      for (size_t j = threadIdx.x; j < n; j += blockDim.x) s += to_float(x[j]);
      mean = block_reduce<false>(s, scratch) / nf;
    }
    float sq = 0.0f;
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float d = to_float(x[j]) - mean;
      sq += d * d;
    }
    const float rs = 1.0f / sqrtf(block_reduce<false>(sq, scratch) / nf + p.epsilon);
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float v = to_float(x[j]);
      const float w = weight(p.gamma, p.w_dtype, j, p.zero_centered_gamma);
      const float z = centered ? (v - mean) * rs * w + load_hp(p.beta, p.w_dtype, j) : v * rs * w;
      store_output<OType>(out, row, j, z, scale);
      thread_amax = abs_max_update(thread_amax, z);
    }
    if (threadIdx.x == 0) {
      if (centered) p.mu[row] = mean;
      p.rsigma[row] = rs;
    }
  }
  record_amax(out, thread_amax, scratch);
  write_scale_inv(out);
}

// ---------------------------------------------------------------- backward
// dx = rsigma * (dy - mean(dy) - xhat * mean(dy * xhat)), dy = dz * w: the two row means in one
// pass, dx in a second (RMSNorm: no mean(dy) term, mu = 0).
__global__ void __launch_bounds__(kMaxThreads) norm_bwd_kernel(const NormBwdParams p) {
  __shared__ float scratch[kMaxThreads / kWarpSize];
  const bool centered = p.kind == NormKind::kLayerNorm;
  const size_t n = p.hidden;
  const float nf = static_cast<float>(n);
  for (size_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const size_t base = row * n;
    const float mu = centered ? p.mu[row] : 0.0f;
    const float rs = p.rsigma[row];
    float s_dy = 0.0f, s_dyx = 0.0f;
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float xh = (load_hp(p.x, p.x_dtype, base + j) - mu) * rs;
      const float dy = load_hp(p.dz, p.dz_dtype, base + j) *
                       weight(p.gamma, p.w_dtype, j, p.zero_centered_gamma);
      s_dy += dy;
      s_dyx += dy * xh;
    }
    const float m_dy = centered ? block_reduce<false>(s_dy, scratch) / nf : 0.0f;
    const float m_dyx = block_reduce<false>(s_dyx, scratch) / nf;
    for (size_t j = threadIdx.x; j < n; j += blockDim.x) {
      const float xh = (load_hp(p.x, p.x_dtype, base + j) - mu) * rs;
      const float dy = load_hp(p.dz, p.dz_dtype, base + j) *
                       weight(p.gamma, p.w_dtype, j, p.zero_centered_gamma);
      float dx = rs * (dy - m_dy - xh * m_dyx);
      if (p.add != nullptr) dx += load_hp(p.add, p.add_dtype, base + j);  // fused residual grad
      store_hp(p.dx, p.dx_dtype, base + j, dx);
    }
  }
}

// Workspace row c = the partial sums of chunk c (rows [rows*c/chunks, rows*(c+1)/chunks)):
// dgamma in columns [0, n), dbeta in [n, 2n). One thread per (column, chunk) adds its chunk's rows
// in row order from 0, exactly as the CPU does, so each partial is the CPU's value.
__global__ void __launch_bounds__(kColThreads) norm_bwd_partials_kernel(const NormBwdParams p) {
  const bool centered = p.kind == NormKind::kLayerNorm;
  const size_t n = p.hidden, c = blockIdx.y;
  const size_t per_chunk = centered ? 2 * n : n;
  const size_t r0 = p.rows * c / p.chunks, r1 = p.rows * (c + 1) / p.chunks;
  float *ws = p.workspace + c * per_chunk;
  for (size_t j = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float dgamma = 0.0f, dbeta = 0.0f;
    for (size_t row = r0; row < r1; ++row) {
      const float mu = centered ? p.mu[row] : 0.0f;
      const float xh = (load_hp(p.x, p.x_dtype, row * n + j) - mu) * p.rsigma[row];
      const float d = load_hp(p.dz, p.dz_dtype, row * n + j);
      dgamma += d * xh;
      dbeta += d;
    }
    ws[j] = dgamma;
    if (centered) ws[n + j] = dbeta;
  }
}

// dgamma / dbeta = the chunks' partials summed in chunk order from 0 (the CPU's add_row order).
__global__ void __launch_bounds__(kColThreads) norm_bwd_reduce_kernel(const NormBwdParams p) {
  const bool centered = p.kind == NormKind::kLayerNorm;
  const size_t n = p.hidden;
  const size_t per_chunk = centered ? 2 * n : n;
  for (size_t j = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; j < per_chunk;
       j += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (size_t c = 0; c < p.chunks; ++c) acc += p.workspace[c * per_chunk + j];
    if (j < n) {
      store_hp(p.dgamma, p.w_dtype, j, acc);
    } else {
      store_hp(p.dbeta, p.w_dtype, j - n, acc);
    }
  }
}

}  // namespace

void launch_norm_fwd(const NormFwdParams &p, const Tensor &z, const OutputSpec &spec,
                     void *stream) {
  const cudaStream_t s = as_stream(stream);
  StagedOutput out(z, spec, s);
  const int threads = row_threads(p.hidden);
  const unsigned blocks = grid_for(p.rows, 1);
  dispatch_dtype<HighPrecisionTypes>(p.x_dtype, "x", [&](auto itag) {
    using IType = typename decltype(itag)::type;
    dispatch_dtype<GpuOutputTypes>(out.store_dtype(), "z", [&](auto otag) {
      using OType = typename decltype(otag)::type;
      norm_fwd_kernel<IType, OType><<<blocks, threads, 0, s>>>(p, out.params());
      NVTE_CHECK_LAUNCH();
    });
  });
  out.finish();
}

void launch_norm_bwd(const NormBwdParams &p, void *stream) {
  const cudaStream_t s = as_stream(stream);
  if (p.rows > 0) {
    norm_bwd_kernel<<<grid_for(p.rows, 1), row_threads(p.hidden), 0, s>>>(p);
    NVTE_CHECK_LAUNCH();
  }
  // chunks <= 64 (norm_bwd_chunks), within gridDim.y's limit of 65535.
  const dim3 partial_grid(grid_for(p.hidden, kColThreads), static_cast<unsigned>(p.chunks));
  norm_bwd_partials_kernel<<<partial_grid, kColThreads, 0, s>>>(p);
  NVTE_CHECK_LAUNCH();
  const size_t per_chunk = norm_bwd_partials_per_chunk(p.kind, p.hidden);
  norm_bwd_reduce_kernel<<<grid_for(per_chunk, kColThreads), kColThreads, 0, s>>>(p);
  NVTE_CHECK_LAUNCH();
}

}  // namespace gpu
}  // namespace nvte
