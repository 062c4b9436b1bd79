// The project's own GPU GEMM: 64x64 output tiles staged through shared memory, FP32 accumulation
// of operands decoded on load (fp16, bf16, all four FP8 formats via util/fp8.h, scale_inv applied),
// and every epilogue of gemm.h fused: bias, GELU with the pre-GELU output, dGELU, accumulate, output
// in any dtype through cast/emit_gpu.cuh (per-tensor FP8 with amax, scale_inv, transposed copy).
// Bias gradients are fixed-order reductions, so results repeat bit for bit. The ROCm GEMM
// (hipified) and the CUDA fallback behind cuBLASLt (gemm_gpu.cu).
#include <algorithm>
#include <climits>

#include "../cast/staged_output_gpu.cuh"
#include "../util/hp_access.h"
#include "../util/math.h"
#include "gemm_gpu.h"

namespace nvte {
namespace gpu {

namespace {

// 16 x 16 threads, each owning a 4 x 4 micro-tile of the 64 x 64 output tile: per k step 8 shared
// loads feed 16 FMAs. Its rows and columns are strided by 16 (thread (tx, ty) holds rows ty + 16 r,
// columns tx + 16 c), so a warp's shared reads are 16 consecutive words plus broadcasts and its
// global stores 16 consecutive elements per row.
constexpr int kTile = 64;
constexpr int kTileK = 16;  // depth of one shared-memory stage
constexpr int kThreadsPerDim = 16;
constexpr int kThreads = kThreadsPerDim * kThreadsPerDim;
constexpr int kMicro = kTile / kThreadsPerDim;
constexpr int kLoads = kTileK * kTile / kThreads;  // elements per thread, operand and stage
// Tile rows are padded to 66 words: stores of k-contiguous operands (16 k values x 2 tile rows per
// warp) then land on 32 distinct banks, as do stores of row-contiguous ones (32 consecutive words).
constexpr int kPad = 2;
constexpr int kTileStride = kTile + kPad;
static_assert(kTileK * kTile % kThreads == 0, "stage loads must divide evenly among threads");
static_assert(kTileK >= kThreadsPerDim, "the bias-gradient pass reuses a tile as [16][kTile]");

// Bias-gradient reductions: threads per block, and rows each partial column sum covers.
constexpr int kReduceThreads = 256;
constexpr size_t kReduceRows = 128;
constexpr size_t kMaxGridY = 65535;

// One GEMM as the kernels see it (row-major terms, see gemm_gpu.h).
struct TiledParams {
  const void *a = nullptr;             // A, read as opA [k, m]
  const void *b = nullptr;             // B, read as opB [n, k]
  DType a_dtype = kNVTEFloat32;        // any input dtype (decoded to fp32 on load)
  DType b_dtype = kNVTEFloat32;
  const float *a_scale_inv = nullptr;  // FP8 operands' scale_inv (device); nullptr: 1
  const float *b_scale_inv = nullptr;
  size_t m = 0, n = 0, k = 0;
  bool transa = false, transb = false;
  bool grad = false;                   // dGELU epilogue when pre is set
  bool accumulate = false;             // D (high precision) = beta * D + result
  float alpha = 1.0f;                  // scales the product with the scale_inv
  float beta = 1.0f;                   // used when accumulate
  const void *bias = nullptr;          // forward bias [m]; nullptr: none
  DType bias_dtype = kNVTEFloat32;
  void *pre = nullptr;                 // pre_gelu_out [n, m]: written (forward) or read (grad)
  DType pre_dtype = kNVTEFloat32;
  float *dbias_partial = nullptr;      // dGELU bias gradient: [gridDim.y, m] per-tile column sums
};

// Element i of an operand buffer as fp32 (FP8 unscaled: scale_inv multiplies the dot product).
__device__ __forceinline__ float load_operand(const void *p, DType t, size_t i) {
  const uint8_t *bytes = static_cast<const uint8_t *>(p);
  switch (t) {
    case kNVTEFloat8E4M3: return fp8_decode<FormatE4M3>(bytes[i]);
    case kNVTEFloat8E5M2: return fp8_decode<FormatE5M2>(bytes[i]);
    case kNVTEFloat8E4M3FNUZ: return fp8_decode<FormatE4M3Fnuz>(bytes[i]);
    case kNVTEFloat8E5M2FNUZ: return fp8_decode<FormatE5M2Fnuz>(bytes[i]);
    default: return load_hp(p, t, i);
  }
}

// An operand as the tiles see it: element (r, kk) of a [rows, k] matrix (opB: rows = n; opA read
// transposed: rows = m), stored k-contiguous (r * k + kk) or row-contiguous (kk * rows + r).
struct OperandView {
  const void *ptr;
  DType dtype;
  size_t rows;
  bool k_contiguous;
};

// Which (kk, r) of a stage thread element l covers. Consecutive threads walk the operand's
// contiguous dimension, so each warp's global loads are coalesced whatever the transposes.
__device__ __forceinline__ void stage_coords(bool k_contiguous, int l, int *kk, int *r) {
  const int e = static_cast<int>(threadIdx.x) + l * kThreads;
  *kk = k_contiguous ? e % kTileK : e / kTile;
  *r = k_contiguous ? e / kTileK : e % kTile;
}

// Loads the stage at (r0, k0) into registers, zero outside the matrix: partial tiles add nothing.
__device__ __forceinline__ void fetch_stage(const OperandView &v, size_t r0, size_t k0, size_t k,
                                            float (&reg)[kLoads]) {
#pragma unroll
  for (int l = 0; l < kLoads; ++l) {
    int kk, r;
    stage_coords(v.k_contiguous, l, &kk, &r);
    const size_t gr = r0 + r, gk = k0 + kk;
    const size_t idx = v.k_contiguous ? gr * k + gk : gk * v.rows + gr;
    reg[l] = gr < v.rows && gk < k ? load_operand(v.ptr, v.dtype, idx) : 0.0f;
  }
}

__device__ __forceinline__ void store_stage(const OperandView &v, const float (&reg)[kLoads],
                                            float (*tile)[kTileStride]) {
#pragma unroll
  for (int l = 0; l < kLoads; ++l) {
    int kk, r;
    stage_coords(v.k_contiguous, l, &kk, &r);
    tile[kk][r] = reg[l];
  }
}

// D tile (blockIdx.y, blockIdx.x) = epilogue(opB rows i0.. @ opA columns j0..). Global loads of the
// next stage are issued before the current one is multiplied, so they overlap the FMAs.
template <typename OType>
__global__ void __launch_bounds__(kThreads)
    gemm_tiled_kernel(const TiledParams p, const OutputParams out) {
  __shared__ float a_tile[kTileK][kTileStride];  // opA[k0 + kk, j0 + c]
  __shared__ float b_tile[kTileK][kTileStride];  // opB[i0 + r, k0 + kk]
  __shared__ float scratch[kThreads / kWarpSize];
  const OperandView av{p.a, p.a_dtype, p.m, p.transa};
  const OperandView bv{p.b, p.b_dtype, p.n, !p.transb};
  const size_t j0 = static_cast<size_t>(blockIdx.x) * kTile;
  const size_t i0 = static_cast<size_t>(blockIdx.y) * kTile;
  const int tx = static_cast<int>(threadIdx.x) % kThreadsPerDim;
  const int ty = static_cast<int>(threadIdx.x) / kThreadsPerDim;

  float acc[kMicro][kMicro] = {};
  float a_reg[kLoads], b_reg[kLoads];
  if (p.k > 0) {
    fetch_stage(av, j0, 0, p.k, a_reg);
    fetch_stage(bv, i0, 0, p.k, b_reg);
  }
  for (size_t k0 = 0; k0 < p.k; k0 += kTileK) {
    __syncthreads();  // every thread is done reading the previous stage
    store_stage(av, a_reg, a_tile);
    store_stage(bv, b_reg, b_tile);
    __syncthreads();
    if (k0 + kTileK < p.k) {
      fetch_stage(av, j0, k0 + kTileK, p.k, a_reg);
      fetch_stage(bv, i0, k0 + kTileK, p.k, b_reg);
    }
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[kMicro], b[kMicro];
#pragma unroll
      for (int c = 0; c < kMicro; ++c) a[c] = a_tile[kk][tx + c * kThreadsPerDim];
#pragma unroll
      for (int r = 0; r < kMicro; ++r) b[r] = b_tile[kk][ty + r * kThreadsPerDim];
#pragma unroll
      for (int r = 0; r < kMicro; ++r) {
#pragma unroll
        for (int c = 0; c < kMicro; ++c) acc[r][c] = fmaf(b[r], a[c], acc[r][c]);
      }
    }
  }

  // Epilogue, in the CPU's order (gemm_cpu.cpp run_epilogue): x = dot * scale_inv_a * scale_inv_b;
  // forward y = x + bias, pre = y, v = gelu(y); grad v = x * gelu'(pre); then v += beta * D_prev.
  // alpha joins the scale_inv product (exact for alpha = 1: the bytes of nvte_cublas_gemm).
  const float scale_ab = (p.a_scale_inv != nullptr ? *p.a_scale_inv : 1.0f) *
                         (p.b_scale_inv != nullptr ? *p.b_scale_inv : 1.0f) * p.alpha;
  const float out_scale = output_scale(out);
  float thread_amax = 0.0f;
  float dbias[kMicro] = {};  // this thread's column sums of the dGELU product, rows in order
#pragma unroll
  for (int r = 0; r < kMicro; ++r) {
#pragma unroll
    for (int c = 0; c < kMicro; ++c) {
      const size_t i = i0 + ty + r * kThreadsPerDim, j = j0 + tx + c * kThreadsPerDim;
      if (i >= p.n || j >= p.m) continue;
      const size_t idx = i * p.m + j;
      float v = acc[r][c] * scale_ab;
      if (!p.grad) {
        if (p.bias != nullptr) v = v + load_hp(p.bias, p.bias_dtype, j);
        if (p.pre != nullptr) {
          store_hp(p.pre, p.pre_dtype, idx, v);
          v = Gelu::fwd(v);
        }
      } else if (p.pre != nullptr) {
        v = v * Gelu::bwd(load_hp(p.pre, p.pre_dtype, idx));
        dbias[c] += v;
      }
      if constexpr (!is_fp8_v<OType>) {  // accumulate into an FP8 D is rejected by gemm.cpp
        // beta * prev is exact for beta = 1, so a contracted fmaf rounds as v + prev did.
        if (p.accumulate) v = v + p.beta * to_float(static_cast<const OType *>(out.data)[idx]);
      }
      store_output<OType>(out, i, j, v, out_scale);
      thread_amax = abs_max_update(thread_amax, v);
    }
  }

  if (p.dbias_partial != nullptr) {
    // Column sums over this tile's 64 rows: each thread's 4 rows, then the 16 row groups in order.
    __syncthreads();  // the tiles are free
    float (*colsum)[kTileStride] = a_tile;  // [kThreadsPerDim][kTile]
#pragma unroll
    for (int c = 0; c < kMicro; ++c) colsum[ty][tx + c * kThreadsPerDim] = dbias[c];
    __syncthreads();
    const size_t j = j0 + threadIdx.x;
    if (threadIdx.x < kTile && j < p.m) {
      float s = 0.0f;
      for (int t = 0; t < kThreadsPerDim; ++t) s += colsum[t][threadIdx.x];
      p.dbias_partial[blockIdx.y * p.m + j] = s;
    }
  }
  record_amax(out, thread_amax, scratch);  // every thread of the block: it holds barriers
  write_scale_inv(out);
}

// out[c] = scale * sum_r partial[r, c] over `parts` rows, in row order; stored in out's dtype.
__global__ void __launch_bounds__(kReduceThreads)
    sum_partials_kernel(const float *partial, size_t parts, size_t cols, const float *scale,
                        void *out, DType out_dtype) {
  const size_t c = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (size_t r = 0; r < parts; ++r) s += partial[r * cols + c];
  store_hp(out, out_dtype, c, scale != nullptr ? s * *scale : s);
}

// Bias gradient of op(B) with B [n, k] (not transposed): out[i] = scale * sum_kk B[i, kk], one
// block per row, strided partial sums combined by the fixed-order block_reduce.
__global__ void __launch_bounds__(kReduceThreads)
    row_sums_kernel(const void *b, DType b_dtype, size_t n, size_t k, const float *scale,
                    void *out, DType out_dtype) {
  __shared__ float scratch[kReduceThreads / kWarpSize];
  for (size_t i = blockIdx.x; i < n; i += gridDim.x) {
    float s = 0.0f;
    for (size_t kk = threadIdx.x; kk < k; kk += blockDim.x) {
      s += load_operand(b, b_dtype, i * k + kk);
    }
    s = block_reduce<false>(s, scratch);
    if (threadIdx.x == 0) store_hp(out, out_dtype, i, scale != nullptr ? s * *scale : s);
  }
}

// Bias gradient of op(B) with B [k, n] (transposed): partial[chunk, i] = sum of B[kk, i] over the
// chunk's kReduceRows rows in order, one thread per column (coalesced across the warp).
__global__ void __launch_bounds__(kReduceThreads)
    column_partials_kernel(const void *b, DType b_dtype, size_t k, size_t n, float *partial) {
  const size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const size_t k0 = blockIdx.y * kReduceRows, k1 = std::min(k, k0 + kReduceRows);
  float s = 0.0f;
  for (size_t kk = k0; kk < k1; ++kk) s += load_operand(b, b_dtype, kk * n + i);
  partial[blockIdx.y * n + i] = s;
}

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Stream-ordered fp32 scratch, freed on the stream when it goes out of scope (errors included).
class DeviceScratch {
 public:
  DeviceScratch(size_t count, cudaStream_t stream) : stream_(stream) {
    if (count > 0) {
      NVTE_CHECK_CUDA(
          cudaMallocAsync(reinterpret_cast<void **>(&ptr_), count * sizeof(float), stream));
    }
  }
  ~DeviceScratch() {
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
  }
  DeviceScratch(const DeviceScratch &) = delete;
  DeviceScratch &operator=(const DeviceScratch &) = delete;
  float *get() const { return ptr_; }

 private:
  float *ptr_ = nullptr;
  cudaStream_t stream_;
};

unsigned reduce_blocks(size_t count) {
  return static_cast<unsigned>(std::max<size_t>(1, ceil_div(count, kReduceThreads)));
}

const float *scale_inv_of(const Tensor &t) {
  return is_fp8(t.data.dtype) ? t.scale_inv.ptr<const float>() : nullptr;
}

}  // namespace

void launch_gemm_tiled(const GemmArgs &g, const OutputSpec &d_spec, void *stream) {
  const cudaStream_t s = as_stream(stream);
  const Tensor &A = *g.A, &B = *g.B;
  TiledParams p;
  p.a = A.data.dptr;
  p.a_dtype = A.data.dtype;
  p.a_scale_inv = scale_inv_of(A);
  p.b = B.data.dptr;
  p.b_dtype = B.data.dtype;
  p.b_scale_inv = scale_inv_of(B);
  p.m = g.m;
  p.n = g.n;
  p.k = g.k;
  p.transa = g.transa;
  p.transb = g.transb;
  p.grad = g.grad;
  p.accumulate = g.accumulate;
  p.alpha = g.alpha;
  p.beta = g.beta;
  if (g.pre_gelu_out != nullptr) {
    p.pre = g.pre_gelu_out->data.dptr;
    p.pre_dtype = g.pre_gelu_out->data.dtype;
  }
  if (g.bias != nullptr && !g.grad) {
    p.bias = g.bias->data.dptr;
    p.bias_dtype = g.bias->data.dtype;
  }
  // At least one block: it writes amax and scale_inv, which an empty D still gets.
  const size_t grid_x = std::max<size_t>(1, ceil_div(g.m, kTile));
  const size_t grid_y = std::max<size_t>(1, ceil_div(g.n, kTile));
  NVTE_CHECK_SUPPORTED(grid_y <= kMaxGridY && grid_x <= static_cast<size_t>(INT_MAX),
                       "argument 'D': the tiled GPU GEMM handles up to ", kMaxGridY * kTile,
                       " rows (n) and ", static_cast<size_t>(INT_MAX) * kTile,
                       " columns (m), got [n, m] = [", g.n, ", ", g.m, "]");

  // Scratch first: an allocation failure leaves every output untouched.
  const bool dgelu_bias = g.grad && g.bias != nullptr && g.pre_gelu_out != nullptr;
  const bool b_bias = g.grad && g.bias != nullptr && g.pre_gelu_out == nullptr;
  const size_t b_chunks = b_bias && g.transb ? ceil_div(g.k, kReduceRows) : 0;
  NVTE_CHECK_SUPPORTED(b_chunks <= kMaxGridY, "argument 'B': the GPU bias gradient handles up to ",
                       kMaxGridY * kReduceRows, " rows of a transposed B (k), got k = ", g.k);
  DeviceScratch dbias_partial(dgelu_bias ? grid_y * g.m : 0, s);
  DeviceScratch b_partial(b_chunks * g.n, s);
  p.dbias_partial = dbias_partial.get();

  const OutputParams out = make_output_params(*g.D, d_spec);
  begin_output(out, s);
  dispatch_dtype<GpuOutputTypes>(d_spec.dtype, "D", [&](auto tag) {
    using OType = typename decltype(tag)::type;
    gemm_tiled_kernel<OType><<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)),
                               kThreads, 0, s>>>(p, out);
    NVTE_CHECK_LAUNCH();
  });

  if (dgelu_bias && g.m > 0) {  // bias [m]: column sums of the dGELU product over the n rows
    sum_partials_kernel<<<reduce_blocks(g.m), kReduceThreads, 0, s>>>(
        dbias_partial.get(), grid_y, g.m, nullptr, g.bias->data.dptr, g.bias->data.dtype);
    NVTE_CHECK_LAUNCH();
  }
  if (b_bias && g.n > 0) {  // bias [n]: row sums of op(B) [n, k], times B's scale_inv
    const Tensor &bias = *g.bias;
    if (!g.transb) {
      const unsigned blocks = static_cast<unsigned>(std::min<size_t>(g.n, INT_MAX));
      row_sums_kernel<<<blocks, kReduceThreads, 0, s>>>(B.data.dptr, B.data.dtype, g.n, g.k,
                                                        p.b_scale_inv, bias.data.dptr,
                                                        bias.data.dtype);
      NVTE_CHECK_LAUNCH();
    } else {
      if (b_chunks > 0) {
        const dim3 grid(reduce_blocks(g.n), static_cast<unsigned>(b_chunks));
        column_partials_kernel<<<grid, kReduceThreads, 0, s>>>(B.data.dptr, B.data.dtype, g.k,
                                                               g.n, b_partial.get());
        NVTE_CHECK_LAUNCH();
      }
      // k = 0: no partials, the sums are 0.
      sum_partials_kernel<<<reduce_blocks(g.n), kReduceThreads, 0, s>>>(
          b_partial.get(), b_chunks, g.n, p.b_scale_inv, bias.data.dptr, bias.data.dtype);
      NVTE_CHECK_LAUNCH();
    }
  }
}

}  // namespace gpu
}  // namespace nvte
