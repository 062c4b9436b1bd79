// GPU kernels of the cast family: quantize (per-tensor FP8 with an optional transposed copy, MXFP8
// row- and column-wise), dequantize, amax and the current-scaling scale. Every value comes from the
// scalar functions the CPU kernels use (util/fp8.h, cast/mx_scale.h, recipe/scaling_math.h), so the
// bytes, scales and amaxes agree with quantize_cpu.cpp / emit_cpu.cpp bit for bit.
#include <algorithm>

#include "../recipe/scaling_math.h"
#include "emit_gpu.cuh"
#include "mx_scale.h"
#include "quantize_gpu.h"

namespace nvte {
namespace gpu {

namespace {

// Threads per block: a multiple of 64, so 32-lane MX groups never straddle a CDNA wavefront's
// halves unevenly and every block_reduce sees whole warps.
constexpr int kThreads = 256;
// Grid-stride loops bound the grid; 4096 blocks fill any current GPU and keep the amax atomics
// (one per block) few.
constexpr size_t kMaxBlocks = 4096;
// Edge of the square tiles that make the transposed FP8 copy.
constexpr int kTile = 32;
constexpr int kTileRows = kThreads / kTile;  // tile rows covered per step of a block (8)
// MXFP8 block length: one 32-lane group of threads per row-wise block.
constexpr int kMx = static_cast<int>(OutputSpec::kBlock);
static_assert(kMx == 32 && kThreads % 64 == 0, "MX groups must tile blocks and wavefronts");

__host__ __device__ __forceinline__ size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// At least one block: per-tensor outputs also get scale_inv when they are empty.
unsigned grid_for(size_t work, size_t per_block) {
  const size_t blocks = std::min(ceil_div(work, per_block), kMaxBlocks);
  return static_cast<unsigned>(std::max<size_t>(1, blocks));
}

// |v| as its magnitude bits: positive floats order like their bit patterns and every NaN pattern
// lies above +Inf's, so an integer max gives the amax and the NaN flag exactly as the CPU's.
__device__ __forceinline__ uint32_t magnitude_bits(float v) { return float_bits(v) & 0x7FFFFFFFu; }
__device__ __forceinline__ uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

// Grid-stride loop bounds over a flat index space.
__device__ __forceinline__ size_t global_thread() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t grid_threads() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

// ---------------------------------------------------------------- per-tensor / plain outputs
struct QuantizeParams {
  const void *src = nullptr;  // input [rows, cols] of IType (fp32 for fused producers' staging)
  OutputParams out;           // output: data, transposed copy, scale, amax, scale_inv, dtype
};

// Row-wise only: element i of the input becomes element i of the output.
template <typename IType, typename OType>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const QuantizeParams p) {
  __shared__ float scratch[kThreads / kWarpSize];
  const IType *src = static_cast<const IType *>(p.src);
  OType *dst = static_cast<OType *>(p.out.data);
  const size_t n = p.out.rows * p.out.cols;
  const float scale = output_scale(p.out);
  uint32_t amax = 0;
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    const float v = to_float(src[i]);
    amax = max_u32(amax, magnitude_bits(v));
    // Plain outputs store v itself, as the CPU's store_row.
    dst[i] = from_float<OType>(p.out.fp8 ? v * scale : v);
  }
  record_amax(p.out, bits_float(amax), scratch);
  write_scale_inv(p.out);
}

// Per-tensor FP8 with the transposed copy [cols, rows]: each 32x32 tile is encoded once, stored
// row-wise (if wanted) and staged as bytes in shared memory, then leaves column by column as
// contiguous runs of the transposed copy, so both copies hold the same bytes by construction.
template <typename IType, typename OType>
__global__ void __launch_bounds__(kThreads) quantize_transpose_kernel(const QuantizeParams p) {
  __shared__ float scratch[kThreads / kWarpSize];
  __shared__ uint8_t tile[kTile][kTile + 1];  // +1: column reads hit distinct banks
  const IType *src = static_cast<const IType *>(p.src);
  OType *dst = static_cast<OType *>(p.out.data);
  OType *dst_t = static_cast<OType *>(p.out.colwise);
  const size_t rows = p.out.rows, cols = p.out.cols;
  const size_t col_tiles = ceil_div(cols, kTile), ntiles = ceil_div(rows, kTile) * col_tiles;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const float scale = *p.out.scale;
  uint32_t amax = 0;
  // Every thread of the block runs every tile: the loop holds barriers.
  for (size_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
    const size_t r0 = (t / col_tiles) * kTile, c0 = (t % col_tiles) * kTile;
    for (int i = ty; i < kTile; i += kTileRows) {
      const size_t r = r0 + i, c = c0 + tx;
      if (r < rows && c < cols) {
        const float v = to_float(src[r * cols + c]);
        amax = max_u32(amax, magnitude_bits(v));
        const OType q = from_float<OType>(v * scale);
        if (p.out.rowwise) dst[r * cols + c] = q;
        tile[i][tx] = q.x;
      }
    }
    __syncthreads();
    for (int j = ty; j < kTile; j += kTileRows) {  // transposed row c0 + j = input column c0 + j
      const size_t c = c0 + j, r = r0 + tx;
      if (c < cols && r < rows) dst_t[c * rows + r] = OType{tile[tx][j]};
    }
    __syncthreads();  // the tile is rewritten by the next iteration
  }
  record_amax(p.out, bits_float(amax), scratch);
  write_scale_inv(p.out);
}

// ---------------------------------------------------------------- MXFP8
struct MxParams {
  const void *src = nullptr;  // input [rows, cols] of IType
  void *data = nullptr;       // FP8 output [rows, cols] (row-wise or column-wise copy)
  uint8_t *scales = nullptr;  // E8M0 [rows, ceil(cols/32)] row-wise, [ceil(rows/32), cols] col-wise
  size_t rows = 0, cols = 0;
};

// Row-wise: one group of 32 consecutive lanes per block of 32 elements of a row (lane i holds
// element i; lanes past the row's end hold 0, which changes no max). The block amax is a width-32
// integer max, so a 64-lane wavefront reduces its two blocks independently.
template <typename IType, typename OType>
__global__ void __launch_bounds__(kThreads) quantize_mx_rowwise_kernel(const MxParams p) {
  const IType *src = static_cast<const IType *>(p.src);
  OType *dst = static_cast<OType *>(p.data);
  const int lane = threadIdx.x % kMx;
  const size_t scale_cols = ceil_div(p.cols, kMx), nblocks = p.rows * scale_cols;
  const size_t groups = blockDim.x / kMx, stride = grid_threads() / kMx;
  // Block-uniform trip count: every thread of the block iterates while any of its groups has a
  // block to quantize (the others compute on zeros and store nothing). A 64-lane wavefront holds two
  // groups; with per-group trip counts, one group's shuffles would run with the other group's lanes
  // gone from the loop.
  for (size_t first = blockIdx.x * groups; first < nblocks; first += stride) {
    const size_t b = first + threadIdx.x / kMx;
    const bool active = b < nblocks;
    const size_t r = active ? b / scale_cols : 0, c = (b - r * scale_cols) * kMx + lane;
    const bool inside = active && c < p.cols;
    const float v = inside ? to_float(src[r * p.cols + c]) : 0.0f;
    const uint32_t block_amax = warp_reduce_max_u32(magnitude_bits(v), kMx);
    const uint8_t s = mx_scale_byte<OType>(block_amax);
    // 1 / scale is a power of two, so the product is the exact scaled value before encoding.
    if (inside) dst[r * p.cols + c] = from_float<OType>(v * e8m0_inverse_to_float(s));
    if (active && lane == 0) p.scales[b] = s;
  }
}

// Column-wise: one thread per (block of 32 rows, column); neighbouring threads take neighbouring
// columns, so every row access is coalesced. The 32 values are read twice (amax, then encode); the
// second read hits the cache.
template <typename IType, typename OType>
__global__ void __launch_bounds__(kThreads) quantize_mx_colwise_kernel(const MxParams p) {
  const IType *src = static_cast<const IType *>(p.src);
  OType *dst = static_cast<OType *>(p.data);
  const size_t n = ceil_div(p.rows, kMx) * p.cols;
  for (size_t t = global_thread(); t < n; t += grid_threads()) {
    const size_t rb = t / p.cols, c = t - rb * p.cols;
    const size_t r0 = rb * kMx, r1 = r0 + kMx < p.rows ? r0 + kMx : p.rows;
    uint32_t block_amax = 0;
    for (size_t r = r0; r < r1; ++r) {
      block_amax = max_u32(block_amax, magnitude_bits(to_float(src[r * p.cols + c])));
    }
    const uint8_t s = mx_scale_byte<OType>(block_amax);
    const float mult = e8m0_inverse_to_float(s);
    for (size_t r = r0; r < r1; ++r) {
      dst[r * p.cols + c] = from_float<OType>(to_float(src[r * p.cols + c]) * mult);
    }
    p.scales[t] = s;  // t = rb * cols + c
  }
}

// ---------------------------------------------------------------- amax
struct AmaxParams {
  const void *src = nullptr;  // input of IType
  size_t n = 0;               // elements
  float *amax = nullptr;      // zeroed before the launch; receives max |x| (canonical NaN if any)
};

template <typename IType>
__global__ void __launch_bounds__(kThreads) compute_amax_kernel(const AmaxParams p) {
  __shared__ float scratch[kThreads / kWarpSize];
  const IType *src = static_cast<const IType *>(p.src);
  uint32_t amax = 0;
  for (size_t i = global_thread(); i < p.n; i += grid_threads()) {
    amax = max_u32(amax, magnitude_bits(to_float(src[i])));
  }
  OutputParams out;  // only the amax of the output-side reduction is used
  out.amax = p.amax;
  record_amax(out, bits_float(amax), scratch);
}

// amax = max |src| over n elements of IType, stream-ordered; 0 for an empty input.
template <typename IType>
void launch_amax(const IType *src, size_t n, float *amax, cudaStream_t stream) {
  NVTE_CHECK_CUDA(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (n == 0) return;
  AmaxParams p;
  p.src = src;
  p.n = n;
  p.amax = amax;
  compute_amax_kernel<IType><<<grid_for(n, kThreads), kThreads, 0, stream>>>(p);
  NVTE_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- dequantize
struct DequantizeParams {
  const uint8_t *q = nullptr;        // FP8 codes [rows, cols] (row-wise or column-wise copy)
  void *out = nullptr;               // output [rows, cols] of OType
  const float *scale_inv = nullptr;  // per-tensor: device scalar 1 / scale; unused for MXFP8
  const uint8_t *scales = nullptr;   // MXFP8 E8M0 scales; null for per-tensor
  size_t rows = 0, cols = 0;
  // MXFP8 scales run down columns, [ceil(rows/32), cols], instead of [rows, ceil(cols/32)].
  bool colwise_scales = false;
};

template <typename IType, typename OType>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const DequantizeParams p) {
  OType *dst = static_cast<OType *>(p.out);
  const size_t n = p.rows * p.cols, scale_cols = ceil_div(p.cols, kMx);
  const float per_tensor = p.scales == nullptr ? *p.scale_inv : 1.0f;
  for (size_t i = global_thread(); i < n; i += grid_threads()) {
    float m = per_tensor;
    if (p.scales != nullptr) {
      const size_t r = i / p.cols, c = i - r * p.cols;
      m = e8m0_to_float(p.colwise_scales ? p.scales[(r / kMx) * p.cols + c]
                                         : p.scales[r * scale_cols + c / kMx]);
    }
    const float v = to_float(IType{p.q[i]}) * m;
    // A NaN code or scale: the CPU's quiet NaN (x86 passes the operand's 0x7FC00000 through), not
    // the GPU's 0x7FFFFFFF, so both backends write the same bytes (seen on an H200).
    dst[i] = from_float<OType>(v != v ? bits_float(0x7FC00000u) : v);
  }
}

// ---------------------------------------------------------------- current scaling
struct ScaleFromAmaxParams {
  const float *amax = nullptr;  // device scalar
  float *scale = nullptr;       // device scalar, written
  float *scale_inv = nullptr;   // optional device scalar, written as 1 / scale
  float fp8_max = 0.0f;         // largest finite value of the output's FP8 dtype
  float eps = 0.0f;             // amax clamp
  bool force_pow_2 = false;     // round the scale down to a power of two
};

// One thread: the scalar rule the CPU entry runs (recipe/scaling_math.h).
__global__ void compute_scale_from_amax_kernel(const ScaleFromAmaxParams p) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const float s = compute_scale_from_amax(*p.amax, p.fp8_max, p.eps, p.force_pow_2);
  *p.scale = s;
  if (p.scale_inv != nullptr) *p.scale_inv = 1.0f / s;
}

// ---------------------------------------------------------------- quantize driver
// Writes every copy `spec` asks for from `src` (IType [rows, cols] in device memory).
template <typename IType>
void quantize_from(const IType *src, const Tensor &out, const OutputSpec &spec,
                   cudaStream_t stream) {
  const size_t n = spec.rows * spec.cols;
  if (spec.mx) {
    // As the CPU emitter: an MXFP8 output with an amax buffer records max |x| too.
    if (out.amax.has_data()) launch_amax(src, n, out.amax.ptr<float>(), stream);
    if (n == 0) return;
    dispatch_dtype<Fp8Types>(spec.dtype, "output", [&](auto tag) {
      using OType = typename decltype(tag)::type;
      MxParams p;
      p.src = src;
      p.rows = spec.rows;
      p.cols = spec.cols;
      if (spec.rowwise) {
        p.data = out.data.dptr;
        p.scales = out.scale_inv.ptr<uint8_t>();
        const size_t groups = spec.rows * ceil_div(spec.cols, kMx);
        quantize_mx_rowwise_kernel<IType, OType>
            <<<grid_for(groups * kMx, kThreads), kThreads, 0, stream>>>(p);
        NVTE_CHECK_LAUNCH();
      }
      if (spec.colwise) {
        p.data = out.columnwise_data.dptr;
        p.scales = out.columnwise_scale_inv.ptr<uint8_t>();
        const size_t work = ceil_div(spec.rows, kMx) * spec.cols;
        quantize_mx_colwise_kernel<IType, OType>
            <<<grid_for(work, kThreads), kThreads, 0, stream>>>(p);
        NVTE_CHECK_LAUNCH();
      }
    });
    return;
  }
  QuantizeParams p;
  p.src = src;
  p.out = make_output_params(out, spec);
  begin_output(p.out, stream);
  if (spec.colwise) {  // per-tensor FP8 with the transposed copy (validate_output: FP8 only)
    dispatch_dtype<Fp8Types>(spec.dtype, "output", [&](auto tag) {
      using OType = typename decltype(tag)::type;
      const size_t tiles = ceil_div(spec.rows, kTile) * ceil_div(spec.cols, kTile);
      quantize_transpose_kernel<IType, OType><<<grid_for(tiles, 1), kThreads, 0, stream>>>(p);
      NVTE_CHECK_LAUNCH();
    });
    return;
  }
  dispatch_dtype<OutputTypes>(spec.dtype, "output", [&](auto tag) {
    using OType = typename decltype(tag)::type;
    quantize_kernel<IType, OType><<<grid_for(n, kThreads), kThreads, 0, stream>>>(p);
    NVTE_CHECK_LAUNCH();
  });
}

}  // namespace

// ---------------------------------------------------------------- launchers
void launch_quantize(const Tensor &in, const Tensor &out, const OutputSpec &spec, void *stream) {
  dispatch_dtype<HighPrecisionTypes>(in.data.dtype, "input", [&](auto tag) {
    using IType = typename decltype(tag)::type;
    quantize_from(in.data.ptr<const IType>(), out, spec, as_stream(stream));
  });
}

void launch_quantize_f32(const float *src, const Tensor &out, const OutputSpec &spec,
                         void *stream) {
  // src may be null for an empty output (no staging buffer was allocated); nothing reads it then.
  quantize_from(src, out, spec, as_stream(stream));
}

void launch_dequantize(const Tensor &in, const Tensor &out, void *stream) {
  const bool mx = in.is_mxfp8(), row = in.data.has_data();
  const SimpleTensor &q = row ? in.data : in.columnwise_data;
  DequantizeParams p;
  p.q = q.ptr<const uint8_t>();
  p.out = out.data.dptr;
  p.rows = q.rows();
  p.cols = q.cols();
  if (mx) {
    p.scales = (row ? in.scale_inv : in.columnwise_scale_inv).ptr<const uint8_t>();
    p.colwise_scales = !row;
  } else {
    p.scale_inv = in.scale_inv.ptr<const float>();
  }
  const size_t n = p.rows * p.cols;
  if (n == 0) return;
  cudaStream_t s = as_stream(stream);
  dispatch_dtype<Fp8Types>(q.dtype, "input", [&](auto itag) {
    using IType = typename decltype(itag)::type;
    dispatch_dtype<HighPrecisionTypes>(out.data.dtype, "output", [&](auto otag) {
      using OType = typename decltype(otag)::type;
      dequantize_kernel<IType, OType><<<grid_for(n, kThreads), kThreads, 0, s>>>(p);
      NVTE_CHECK_LAUNCH();
    });
  });
}

void launch_compute_amax(const Tensor &in, const Tensor &out, void *stream) {
  dispatch_dtype<HighPrecisionTypes>(in.data.dtype, "input", [&](auto tag) {
    using IType = typename decltype(tag)::type;
    launch_amax(in.data.ptr<const IType>(), in.data.numel(), out.amax.ptr<float>(),
                as_stream(stream));
  });
}

void launch_compute_scale_from_amax(const Tensor &out, const QuantizationConfig &config,
                                    void *stream) {
  // The FP8 dtype the output is meant to hold, as the entry determines it: that of its row-wise
  // data, else of its column-wise data, else the dtype its (null) row-wise description names.
  const bool named_by_row = out.data.has_data() || !out.columnwise_data.has_data();
  const DType t = named_by_row ? out.data.dtype : out.columnwise_data.dtype;
  ScaleFromAmaxParams p;
  p.amax = out.amax.ptr<const float>();
  p.scale = out.scale.ptr<float>();
  p.scale_inv = out.scale_inv.has_data() ? out.scale_inv.ptr<float>() : nullptr;
  p.fp8_max = fp8_max(t);
  p.eps = config.amax_epsilon;
  p.force_pow_2 = config.force_pow_2_scales;
  compute_scale_from_amax_kernel<<<1, 1, 0, as_stream(stream)>>>(p);
  NVTE_CHECK_LAUNCH();
}

}  // namespace gpu
}  // namespace nvte
