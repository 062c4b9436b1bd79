// GPU kernel of nvte_ordered_batched_gemm (gemm.h): every output an fmaf chain over K in index
// order from +0, the CPU kernel's bits (ordered_gemm_cpu.cpp). SIMT on purpose: a tensor core's
// accumulation order inside an MMA is unspecified, fmaf's rounding is IEEE's. A 64 x 64 output
// tile per block of 256 threads, 4 x 4 outputs per thread (rows ty + 16 i, columns tx + 16 j: a
// warp's shared-memory reads are broadcasts or consecutive words); K in stages of 16 staged in
// shared memory k-major, whichever of A / B is transposed. Only the first K terms of a stage are
// added (a zero-padded term would turn a -0 sum into +0; the chain from +0 never holds -0, but the
// guard keeps the chain exactly the K terms). Batches: grid z, strided past the grid's z limit.
#include <cstddef>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "ordered_gemm.h"

namespace nvte {
namespace gpu {

namespace {

constexpr int kTile = 64, kStage = 16, kThreads = 256, kPer = 4;
constexpr int kPad = kTile + 1;  // staged row stride: the non-transposed loads' stores spread banks
static_assert(kTile * kStage == kPer * kThreads, "each thread stages 4 elements per operand");
static_assert((kThreads / 16) * kPer == kTile, "16 x 16 threads of 4 x 4 outputs cover the tile");

// Stage of `x` (an operand viewed as rows x k, its rows being the output's rows for A and
// columns for B): dst[kk][r] = x(row0 + r, k0 + kk), zeros outside. `kmajor`: the operand is
// stored [k][rows] (A with transa, B without transb), else [rows][k]. Consecutive threads read
// consecutive addresses either way.
__device__ __forceinline__ void stage(const float *x, size_t rows, size_t k, bool kmajor,
                                      size_t row0, size_t k0, float (*dst)[kPad]) {
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    const int idx = tid + q * kThreads;
    const int kk = kmajor ? idx / kTile : idx % kStage;
    const int r = kmajor ? idx % kTile : idx / kStage;
    const size_t gr = row0 + r, gk = k0 + kk;
    float v = 0.0f;
    if (gr < rows && gk < k) v = kmajor ? x[gk * rows + gr] : x[gr * k + gk];
    dst[kk][r] = v;
  }
}

__global__ void __launch_bounds__(kThreads) ordered_gemm_kernel(const OrderedGemmProblem p) {
  __shared__ float sa[kStage][kPad];
  __shared__ float sb[kStage][kPad];
  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  const size_t n0 = static_cast<size_t>(blockIdx.x) * kTile;
  const size_t m0 = static_cast<size_t>(blockIdx.y) * kTile;
  for (size_t b = blockIdx.z; b < p.batch; b += gridDim.z) {
    const float *a = p.a + b * p.m * p.k;
    const float *bm = p.b + b * p.k * p.n;
    float c[kPer][kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i)
#pragma unroll
      for (int j = 0; j < kPer; ++j) c[i][j] = 0.0f;
    for (size_t k0 = 0; k0 < p.k; k0 += kStage) {
      stage(a, p.m, p.k, p.transa, m0, k0, sa);
      stage(bm, p.n, p.k, !p.transb, n0, k0, sb);
      __syncthreads();
      const size_t left = p.k - k0;
      const int kn = left < static_cast<size_t>(kStage) ? static_cast<int>(left) : kStage;
#pragma unroll
      for (int kk = 0; kk < kStage; ++kk) {
        if (kk < kn) {  // (a guard, not a break: the loop stays unrolled)
          float av[kPer], bv[kPer];
#pragma unroll
          for (int i = 0; i < kPer; ++i) av[i] = sa[kk][ty + 16 * i];
#pragma unroll
          for (int j = 0; j < kPer; ++j) bv[j] = sb[kk][tx + 16 * j];
#pragma unroll
          for (int i = 0; i < kPer; ++i)
#pragma unroll
            for (int j = 0; j < kPer; ++j) c[i][j] = fmaf(av[i], bv[j], c[i][j]);
        }
      }
      __syncthreads();
    }
    float *d = p.d + b * p.m * p.n;
#pragma unroll
    for (int i = 0; i < kPer; ++i)
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const size_t row = m0 + ty + 16 * i, col = n0 + tx + 16 * j;
        if (row < p.m && col < p.n) d[row * p.n + col] = c[i][j];
      }
  }
}

}  // namespace

void launch_ordered_batched_gemm(const OrderedGemmProblem &p, void *stream) {
  if (p.batch == 0 || p.m == 0 || p.n == 0) return;
  cudaStream_t cs = as_stream(stream);
  if (p.k == 0) {  // an empty chain: its starting +0
    NVTE_CHECK_CUDA(cudaMemsetAsync(p.d, 0, p.batch * p.m * p.n * sizeof(float), cs));
    return;
  }
  const size_t nt = (p.n + kTile - 1) / kTile, mt = (p.m + kTile - 1) / kTile;
  NVTE_CHECK(mt <= 65535, "argument 'A': expected at most ", 65535 * kTile,
             " rows of op(A) (the grid's y limit), got ", p.m);
  NVTE_CHECK(nt <= 0x7FFFFFFFu, "argument 'B': too many columns of op(B) for one grid, got ", p.n);
  const size_t bz = p.batch < 65535 ? p.batch : 65535;  // the kernel strides over the rest
  const dim3 grid(static_cast<unsigned>(nt), static_cast<unsigned>(mt), static_cast<unsigned>(bz));
  ordered_gemm_kernel<<<grid, kThreads, 0, cs>>>(p);
  NVTE_CHECK_LAUNCH();
}

}  // namespace gpu
}  // namespace nvte
