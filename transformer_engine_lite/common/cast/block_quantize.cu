// GPU kernels of Float8BlockScaling quantize and dequantize (NVTE_BLOCK_SCALING_1D / _2D): 1x128
// tiles along the rows, 128x1 tiles down the columns (the column-wise copy of 1D), and 128x128
// blocks shared by both copies (2D). Layouts, padding and the scale rule are block_quantize.cpp's:
// the tile scale comes from block_scale.h and the bytes from util/fp8.h, so the output equals the
// CPU kernel's bit for bit (tests/cpp/gpu/test_gpu_block_scaling.cpp).
#include <algorithm>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "../util/dtype_dispatch.h"
#include "../util/fp8.h"
#include "block_quantize.h"
#include "block_scale.h"
#include "quantize_gpu.h"
#include "x86_nan.cuh"

namespace nvte {
namespace gpu {

namespace {

// Threads per block: a multiple of 64, so the 32-lane tile groups of the row-wise kernel never
// straddle a CDNA wavefront's halves unevenly and every block reduction sees whole warps.
constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;  // grid-stride loops bound the grid
constexpr size_t kN = kBlockScaleLen;
// Row-wise 1x128 tiles: one group of 32 lanes per tile, each lane 4 elements 32 apart (every load
// of the group is one contiguous 128-byte run of fp32 input).
constexpr int kGroup = 32;
constexpr int kPerLane = static_cast<int>(kN) / kGroup;
static_assert(kThreads % 64 == 0 && kPerLane * kGroup == static_cast<int>(kN),
              "tile groups must cover a tile and tile blocks and wavefronts");

__host__ __device__ __forceinline__ size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

unsigned grid_for(size_t work, size_t per_block) {
  const size_t blocks = std::min(ceil_div(work, per_block), kMaxBlocks);
  return static_cast<unsigned>(std::max<size_t>(1, blocks));
}

// |v| as magnitude bits, NaN as 0: the CPU's running max (a > amax ? a : amax from 0) never lets a
// NaN win, and on non-negative floats an integer max of the bits is the float max.
__device__ __forceinline__ uint32_t tile_amax_bits(float v) {
  const uint32_t m = float_bits(v) & 0x7FFFFFFFu;
  return m > 0x7F800000u ? 0u : m;
}
__device__ __forceinline__ uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

struct BlockParams {
  const void *src = nullptr;      // input [rows, cols] of IType
  uint8_t *q = nullptr;           // row-wise FP8 [rows, cols], or null
  uint8_t *qt = nullptr;          // column-wise FP8 [cols, rows] (transposed), or null
  float *sinv = nullptr;          // row-wise scale_inv grid (GEMM_READY), or null
  float *sinv_t = nullptr;        // column-wise scale_inv grid, or null
  size_t rows = 0, cols = 0;
  size_t sld = 0, sld_t = 0;      // inner (padded) dims of the two grids
  float eps = 0.0f;               // amax floor
  float vinf = 0.0f;              // scale of a tile whose fp8_max / amax overflows
  bool pow2 = false;              // scales rounded down to powers of two
};

template <typename F>
__device__ __forceinline__ float tile_scale(uint32_t amax_bits, const BlockParams &p) {
  return block_scale_from_amax(bits_float(amax_bits), fp8_max_value<F>(), p.eps, p.pow2, p.vinf);
}

// 1D row-wise: a group of 32 lanes per 1x128 tile, the tile amax a width-32 integer max. The trip
// count is block-uniform (as the MXFP8 row-wise kernel): with per-group counts a 64-lane
// wavefront's shuffles would run with one of its two groups gone from the loop.
template <typename IType, typename F>
__global__ void __launch_bounds__(kThreads) block_rowwise_1d_kernel(const BlockParams p) {
  const IType *src = static_cast<const IType *>(p.src);
  const int lane = threadIdx.x % kGroup;
  const size_t tiles_c = ceil_div(p.cols, kN), ntiles = p.rows * tiles_c;
  const size_t groups = blockDim.x / kGroup, stride = static_cast<size_t>(gridDim.x) * groups;
  for (size_t first = blockIdx.x * groups; first < ntiles; first += stride) {
    const size_t t = first + threadIdx.x / kGroup;
    const bool active = t < ntiles;
    const size_t r = active ? t / tiles_c : 0, tc = active ? t - r * tiles_c : 0;
    float v[kPerLane];
    uint32_t amax = 0;
    for (int k = 0; k < kPerLane; ++k) {
      const size_t c = tc * kN + lane + k * kGroup;
      v[k] = active && c < p.cols ? to_float(src[r * p.cols + c]) : 0.0f;
      amax = max_u32(amax, tile_amax_bits(v[k]));
    }
    amax = warp_reduce_max_u32(amax, kGroup);
    const float scale = tile_scale<F>(amax, p);
    for (int k = 0; k < kPerLane; ++k) {
      const size_t c = tc * kN + lane + k * kGroup;
      if (active && c < p.cols) p.q[r * p.cols + c] = fp8_encode<F>(v[k] * scale);
    }
    if (active && lane == 0) p.sinv[tc * p.sld + r] = 1.0f / scale;  // grid [col tiles, rows]
  }
}

// 1D column-wise: a thread block per (128-row block, chunk of kThreads columns), a thread per
// column: neighbouring threads read neighbouring columns (coalesced), each reducing its 128x1
// tile's amax and encoding it into shared memory (the 128 values are read twice; the second read
// hits the cache). The chunk then leaves as contiguous per-column runs of the transposed copy,
// consecutive threads writing consecutive bytes, so the stores coalesce too. The grid-stride loop
// is block-uniform: it holds barriers.
template <typename IType, typename F>
__global__ void __launch_bounds__(kThreads) block_colwise_1d_kernel(const BlockParams p) {
  // +4 bytes per column: a 33-word stride puts the 32 columns of a warp's stores in 32 banks.
  __shared__ uint8_t tile[kThreads][kN + 4];
  const IType *src = static_cast<const IType *>(p.src);
  const size_t chunks = ceil_div(p.cols, kThreads), items = ceil_div(p.rows, kN) * chunks;
  for (size_t w = blockIdx.x; w < items; w += gridDim.x) {
    const size_t rb = w / chunks, c0 = (w - rb * chunks) * kThreads;
    const size_t r0 = rb * kN, nr = r0 + kN < p.rows ? kN : p.rows - r0;
    const size_t nc = c0 + kThreads < p.cols ? kThreads : p.cols - c0;
    const size_t c = c0 + threadIdx.x;
    if (threadIdx.x < nc) {
      uint32_t amax = 0;
      for (size_t k = 0; k < nr; ++k)
        amax = max_u32(amax, tile_amax_bits(to_float(src[(r0 + k) * p.cols + c])));
      const float scale = tile_scale<F>(amax, p);
      p.sinv_t[rb * p.sld_t + c] = 1.0f / scale;  // grid [row blocks, cols]
      for (size_t k = 0; k < nr; ++k)
        tile[threadIdx.x][k] = fp8_encode<F>(to_float(src[(r0 + k) * p.cols + c]) * scale);
    }
    __syncthreads();
    for (size_t i = threadIdx.x; i < nc * nr; i += blockDim.x) {
      const size_t j = i / nr, k = i - j * nr;  // column c0 + j, row r0 + k
      p.qt[(c0 + j) * p.rows + r0 + k] = tile[j][k];
    }
    __syncthreads();  // the tile is rewritten by the next item
  }
}

// 2D: one thread block per 128x128 block (grid-stride over blocks; every thread runs every
// iteration, the loop holds barriers). Pass 1 reduces the amax, pass 2 writes the row-wise copy
// row-major and pass 3 the transposed copy in its own row-major order, so both stores coalesce.
template <typename IType, typename F>
__global__ void __launch_bounds__(kThreads) block_2d_kernel(const BlockParams p) {
  __shared__ uint32_t scratch[kThreads / kWarpSize];
  const IType *src = static_cast<const IType *>(p.src);
  const size_t bc = ceil_div(p.cols, kN), nblocks = ceil_div(p.rows, kN) * bc;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int nwarps = static_cast<int>(blockDim.x) / kWarpSize;
  for (size_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const size_t rb = b / bc, cb = b - rb * bc, r0 = rb * kN, c0 = cb * kN;
    const size_t nr = r0 + kN < p.rows ? kN : p.rows - r0;
    const size_t nc = c0 + kN < p.cols ? kN : p.cols - c0;
    uint32_t amax = 0;
    for (size_t i = threadIdx.x; i < nr * nc; i += blockDim.x) {
      const size_t r = r0 + i / nc, c = c0 + i % nc;
      amax = max_u32(amax, tile_amax_bits(to_float(src[r * p.cols + c])));
    }
    amax = warp_reduce_max_u32(amax);
    if (lane == 0) scratch[warp] = amax;
    __syncthreads();
    amax = 0;
    for (int w = 0; w < nwarps; ++w) amax = max_u32(amax, scratch[w]);
    __syncthreads();  // scratch is rewritten by the next block
    const float scale = tile_scale<F>(amax, p);
    if (threadIdx.x == 0) {
      if (p.sinv) p.sinv[rb * p.sld + cb] = 1.0f / scale;
      if (p.sinv_t) p.sinv_t[cb * p.sld_t + rb] = 1.0f / scale;
    }
    if (p.q) {
      for (size_t i = threadIdx.x; i < nr * nc; i += blockDim.x) {
        const size_t r = r0 + i / nc, c = c0 + i % nc;
        p.q[r * p.cols + c] = fp8_encode<F>(to_float(src[r * p.cols + c]) * scale);
      }
    }
    if (p.qt) {
      for (size_t i = threadIdx.x; i < nr * nc; i += blockDim.x) {
        const size_t c = c0 + i / nr, r = r0 + i % nr;
        p.qt[c * p.rows + r] = fp8_encode<F>(to_float(src[r * p.cols + c]) * scale);
      }
    }
  }
}

template <typename IType, typename F>
void launch_typed(const BlockParams &p, const BlockSpec &s, cudaStream_t stream) {
  if (s.two_d) {
    const size_t blocks = ceil_div(s.rows, kN) * ceil_div(s.cols, kN);
    block_2d_kernel<IType, F><<<grid_for(blocks, 1), kThreads, 0, stream>>>(p);
    NVTE_CHECK_LAUNCH();
    return;
  }
  if (s.rowwise) {
    const size_t tiles = s.rows * ceil_div(s.cols, kN);
    block_rowwise_1d_kernel<IType, F>
        <<<grid_for(tiles * kGroup, kThreads), kThreads, 0, stream>>>(p);
    NVTE_CHECK_LAUNCH();
  }
  if (s.colwise) {
    const size_t items = ceil_div(s.rows, kN) * ceil_div(s.cols, kThreads);
    block_colwise_1d_kernel<IType, F><<<grid_for(items, 1), kThreads, 0, stream>>>(p);
    NVTE_CHECK_LAUNCH();
  }
}


// Dequantize: a thread per element of the stored copy ([rows, cols] row-wise, [cols, rows]
// column-wise), dequantized as stored, with block_quantize.cpp's scale lookup: one fp32 product
// (fp8 value x scale_inv, with x86's NaN results: x86_nan.cuh), then the output dtype's rounding
// (util/half.h, as the CPU's store_row).
struct BlockDequantParams {
  const uint8_t *q = nullptr;  // the stored copy's FP8 bytes
  const float *sc = nullptr;   // its scale_inv grid (GEMM_READY)
  void *out = nullptr;         // OType, the stored copy's shape
  size_t rows = 0, cols = 0;   // the original [rows, cols] view
  size_t sld = 0;              // inner (padded) dim of the grid
  bool row = true, two_d = false;
};

template <typename F, typename OType>
__global__ void __launch_bounds__(kThreads) block_dequantize_kernel(const BlockDequantParams p) {
  OType *dst = static_cast<OType *>(p.out);
  const size_t inner = p.row ? p.cols : p.rows, n = p.rows * p.cols;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t o = i / inner, j = i - o * inner;
    const size_t r = p.row ? o : j, c = p.row ? j : o;  // (r, c) in the original view
    float m;
    if (p.two_d)
      m = p.row ? p.sc[(r / kN) * p.sld + c / kN] : p.sc[(c / kN) * p.sld + r / kN];
    else
      m = p.row ? p.sc[(c / kN) * p.sld + r] : p.sc[(r / kN) * p.sld + c];
    // NaN codes (0x7FC00000 decoded), NaN or zero scale_inv (x Inf): the CPU's NaN bytes.
    dst[i] = from_float<OType>(x86_mul(fp8_decode<F>(p.q[i]), m));
  }
}

}  // namespace

void launch_block_quantize(const Tensor &in, const Tensor &out, const BlockSpec &s,
                           const QuantizationConfig &cfg, void *stream) {
  cudaStream_t st = as_stream(stream);
  // Padding entries of the scale grids are zeroed, as the CPU kernel does.
  if (s.rowwise)
    NVTE_CHECK_CUDA(
        cudaMemsetAsync(out.scale_inv.dptr, 0, out.scale_inv.numel() * sizeof(float), st));
  if (s.colwise)
    NVTE_CHECK_CUDA(cudaMemsetAsync(out.columnwise_scale_inv.dptr, 0,
                                    out.columnwise_scale_inv.numel() * sizeof(float), st));
  if (s.rows == 0 || s.cols == 0) return;
  BlockParams p;
  p.src = in.data.dptr;
  p.q = s.rowwise ? static_cast<uint8_t *>(out.data.dptr) : nullptr;
  p.qt = s.colwise ? static_cast<uint8_t *>(out.columnwise_data.dptr) : nullptr;
  p.sinv = s.rowwise ? static_cast<float *>(out.scale_inv.dptr) : nullptr;
  p.sinv_t = s.colwise ? static_cast<float *>(out.columnwise_scale_inv.dptr) : nullptr;
  p.rows = s.rows;
  p.cols = s.cols;
  p.sld = block_scale_shape(s.rows, s.cols, s.two_d, false).d1;
  p.sld_t = block_scale_shape(s.rows, s.cols, s.two_d, true).d1;
  p.eps = cfg.amax_epsilon;
  p.vinf = block_value_for_inf(in.data.dtype);
  p.pow2 = cfg.force_pow_2_scales;
  dispatch_dtype<HighPrecisionTypes>(in.data.dtype, "input", [&](auto itag) {
    using IType = typename decltype(itag)::type;
    if (s.dtype == kNVTEFloat8E4M3)
      launch_typed<IType, FormatE4M3>(p, s, st);
    else  // validate_block_output admits E4M3 and E5M2 only
      launch_typed<IType, FormatE5M2>(p, s, st);
  });
}

void launch_block_dequantize(const Tensor &in, const BlockSpec &s, const SimpleTensor &out,
                             void *stream) {
  if (s.rows == 0 || s.cols == 0) return;
  BlockDequantParams p;
  p.row = s.rowwise;
  p.two_d = s.two_d;
  p.q = (p.row ? in.data : in.columnwise_data).ptr<const uint8_t>();
  p.sc = (p.row ? in.scale_inv : in.columnwise_scale_inv).ptr<const float>();
  p.out = out.dptr;
  p.rows = s.rows;
  p.cols = s.cols;
  p.sld = block_scale_shape(s.rows, s.cols, s.two_d, !p.row).d1;
  const unsigned grid = grid_for(s.rows * s.cols, kThreads);
  cudaStream_t st = as_stream(stream);
  dispatch_dtype<HighPrecisionTypes>(out.dtype, "output", [&](auto otag) {
    using OType = typename decltype(otag)::type;
    if (s.dtype == kNVTEFloat8E4M3)
      block_dequantize_kernel<FormatE4M3, OType><<<grid, kThreads, 0, st>>>(p);
    else  // validate_block_input admits E4M3 and E5M2 only
      block_dequantize_kernel<FormatE5M2, OType><<<grid, kThreads, 0, st>>>(p);
    NVTE_CHECK_LAUNCH();
  });
}

}  // namespace gpu
}  // namespace nvte
