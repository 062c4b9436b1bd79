// GPU kernel of nvte_nvfp4_block_gemm (gemm.h): the NVFP4 GEMM in the FP4 tensor core's summation
// order, giving the CPU kernel's bits (nvfp4_gemm_cpu.cpp). The packed E2M1 codes of both operands
// are decoded on load into shared memory as bf16 (e2m1 * e4m3 has at most 6 significant bits: exact
// in bf16, as on the CPU's bf16 path). Each 16-element block of K is one bf16 m16n8k16 tensor-core
// product started from +0: its 16 products share one scale product sB * sA and are integer
// multiples of a quarter of it below 2^12 such units in sum, so the block term is exact whatever
// order and accumulator width (>= 13 bits) the hardware uses (gpusim's lane-wise fallback in
// platform/gpu_mma.h gives the same value). The block terms are then added to fp32 accumulators
// in K order with plain adds, exactly as the CPU and TE's reference qgemm do: equal bits on every
// device. NaN scales give NaN, as on the CPU (its payload is the device's).
#include <algorithm>
#include <cstdint>

#include "../cast/nvfp4_math.h"
#include "../platform/device.h"
#include "../platform/gpu_mma.h"
#include "../platform/runtime.h"
#include "../util/fp8.h"
#include "../util/half.h"
#include "nvfp4_gemm.h"

namespace nvte {
namespace gpu {

namespace {

// A 64 x 64 output tile per block of 4 warps; warp w owns rows (w / 2) * 32 and columns
// (w % 2) * 32 of it: 2 x 4 fragments of 16 x 8. A shared-memory stage holds 64 K (4 NVFP4 blocks)
// of both operands as bf16 pairs, one 32-bit word per pair of K-neighbours (one packed byte).
constexpr int kTile = 64;
constexpr int kThreads = 128;
constexpr int kStageK = 64;
constexpr int kBlk = 16;                    // NVFP4 block length along K
constexpr int kStageBytes = kStageK / 2;    // packed bytes of one row per stage
constexpr int kRowWords = kStageBytes + 4;  // padded: a warp's fragment loads hit 32 banks
constexpr int kBytesPerThread = kTile * kStageBytes / kThreads;  // 16: one uint4
static_assert(kBytesPerThread == 16 && kStageBytes == 2 * kBytesPerThread,
              "a thread stages half a row (two NVFP4 blocks) of one operand");

struct Params {
  Nvfp4GemmOperand b, a;  // b: the output's rows (m), a: its columns (n)
  size_t k = 0, blocks = 0;
  float *d = nullptr;  // [m, n]
};

// Two codes of one byte under E4M3 scale s as a bf16 pair (the lower K index in the low half).
// The values are exact in bf16, so truncating their fp32 bits is exact (NaN stays NaN: its quiet
// bit is in the upper half), as the CPU's decode_row.
__device__ __forceinline__ uint32_t decode_pair(uint32_t byte, float s) {
  const float lo = e2m1_value(static_cast<uint8_t>(byte & 0xFu)) * s;
  const float hi = e2m1_value(static_cast<uint8_t>(byte >> 4)) * s;
  return (float_bits(lo) >> 16) | (float_bits(hi) & 0xFFFF0000u);
}

// Stages 64 K from k0 of 64 rows from row0 of `op` into dst [64][kRowWords]: thread i decodes
// the 16 bytes (two NVFP4 blocks) of half i % 2 of row i / 2. Past the rows or K: zeros.
__device__ __forceinline__ void stage(const Nvfp4GemmOperand &op, size_t row0, size_t k0, const Params &p,
                                      uint32_t *dst) {
  const int tid = static_cast<int>(threadIdx.x);
  const int r = tid / 2, half = tid % 2;
  const size_t row = row0 + r;
  const size_t kbytes = p.k / 2, byte0 = k0 / 2 + half * kBytesPerThread;
  uint32_t w[kBytesPerThread];
  if (row < op.rows && byte0 < kbytes) {
    const uint8_t *src = op.data + row * kbytes + byte0;
    const size_t blk0 = byte0 * 2 / kBlk;  // the first of this thread's two blocks
    const float s0 = fp8_decode<FormatE4M3>(op.scale[row * op.lds + blk0]);
    const float s1 = blk0 + 1 < p.blocks ? fp8_decode<FormatE4M3>(op.scale[row * op.lds + blk0 + 1])
                                         : 0.0f;
    if (byte0 + kBytesPerThread <= kbytes && (reinterpret_cast<uintptr_t>(src) & 15u) == 0) {
      const uint4 v = *reinterpret_cast<const uint4 *>(src);
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < kBytesPerThread; ++j) {
        w[j] = decode_pair((words[j / 4] >> (8 * (j % 4))) & 0xFFu, j < kBlk / 2 ? s0 : s1);
      }
    } else {  // the row's tail, or rows not 16-byte aligned (K not a multiple of 32)
#pragma unroll
      for (int j = 0; j < kBytesPerThread; ++j) {
        w[j] = byte0 + j < kbytes ? decode_pair(src[j], j < kBlk / 2 ? s0 : s1) : 0u;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < kBytesPerThread; ++j) w[j] = 0u;
  }
  uint4 *out = reinterpret_cast<uint4 *>(dst + r * kRowWords + half * kBytesPerThread);
#pragma unroll
  for (int q = 0; q < kBytesPerThread / 4; ++q) {
    out[q] = make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
  }
}

__global__ void __launch_bounds__(kThreads) nvfp4_block_gemm_kernel(const Params p) {
  __shared__ uint4 sb_raw[kTile * kRowWords / 4];
  __shared__ uint4 sa_raw[kTile * kRowWords / 4];
  uint32_t *sb = reinterpret_cast<uint32_t *>(sb_raw);
  uint32_t *sa = reinterpret_cast<uint32_t *>(sa_raw);
  const size_t m0 = static_cast<size_t>(blockIdx.x) * kTile;
  const size_t n0 = static_cast<size_t>(blockIdx.y) * kTile;
  const int lane = static_cast<int>(threadIdx.x) % kMmaLanes, g = lane / 4, t = lane % 4;
  const int warp = static_cast<int>(threadIdx.x) / kMmaLanes;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;

  float c[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[i][j][e] = 0.0f;

  for (size_t k0 = 0; k0 < p.k; k0 += kStageK) {
    stage(p.b, m0, k0, p, sb);
    stage(p.a, n0, k0, p, sa);
    __syncthreads();
    const size_t left = p.blocks - k0 / kBlk;  // blocks from this stage on
    const int nblk = left < kStageK / kBlk ? static_cast<int>(left) : kStageK / kBlk;
    for (int kb = 0; kb < nblk; ++kb) {
      const int kw = kb * (kBlk / 2);  // word offset of this block in a staged row
      uint32_t af[2][4], bfr[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t *r0 = sb + (wm + i * 16 + g) * kRowWords + kw + t;
        const uint32_t *r8 = r0 + 8 * kRowWords;
        af[i][0] = r0[0];
        af[i][1] = r8[0];
        af[i][2] = r0[4];
        af[i][3] = r8[4];
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t *col = sa + (wn + j * 8 + g) * kRowWords + kw + t;
        bfr[j][0] = col[0];
        bfr[j][1] = col[4];
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float term[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // the block term, exact (see the top)
          mma_m16n8k16<bf16>(term, af[i], bfr[j]);
#pragma unroll
          for (int e = 0; e < 4; ++e) c[i][j][e] += term[e];  // K order, fp32 (--fmad=false: a plain add)
        }
    }
    __syncthreads();
  }

  // c[i][j][0..1]: row g, columns 2t, 2t + 1 of fragment (i, j); c[i][j][2..3]: row g + 8.
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const size_t row = m0 + wm + i * 16 + g + (e / 2) * 8;
        const size_t col = n0 + wn + j * 8 + 2 * t + (e % 2);
        if (row < p.b.rows && col < p.a.rows) p.d[row * p.a.rows + col] = c[i][j][e];
      }
}

}  // namespace

void launch_nvfp4_block_gemm(const Nvfp4GemmOperand &b, const Nvfp4GemmOperand &a, size_t k,
                             float *d, void *stream) {
  const size_t m = b.rows, n = a.rows;
  if (m == 0 || n == 0) return;
  cudaStream_t cs = as_stream(stream);
  if (k == 0) {  // no blocks: the sum is its starting +0
    NVTE_CHECK_CUDA(cudaMemsetAsync(d, 0, m * n * sizeof(float), cs));
    return;
  }
  const size_t mt = (m + kTile - 1) / kTile, nt = (n + kTile - 1) / kTile;
  NVTE_CHECK(nt <= 65535, "argument 'A': expected at most ", 65535 * kTile,
             " rows (the grid's y limit), got ", n);
  NVTE_CHECK(mt <= 0x7FFFFFFFu, "argument 'B': too many rows for one grid, got ", m);
  Params p;
  p.b = b;
  p.a = a;
  p.k = k;
  p.blocks = (k + kBlk - 1) / kBlk;
  p.d = d;
  const dim3 grid(static_cast<unsigned>(mt), static_cast<unsigned>(nt));
  nvfp4_block_gemm_kernel<<<grid, kThreads, 0, cs>>>(p);
  NVTE_CHECK_LAUNCH();
}

}  // namespace gpu
}  // namespace nvte
