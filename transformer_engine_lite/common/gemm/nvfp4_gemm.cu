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

// A 128 x 128 output tile per block of 8 warps; warp w owns rows (w / 2) * 32 and columns
// (w % 2) * 64 of it: 2 x 8 fragments of 16 x 8. A shared-memory stage holds 64 K (4 NVFP4 blocks)
// of both operands as bf16 pairs, one 32-bit word per pair of K-neighbours (one packed byte). The
// large tile amortises the decode (shared-memory table loads, the scale multiplies) over four
// times the tensor-core work of a 64 x 64 one.
constexpr int kTile = 128;
constexpr int kThreads = 256;
constexpr int kFragM = 2, kFragN = 8;  // 16 x 8 fragments per warp
constexpr int kStageK = 64;
constexpr int kBlk = 16;                    // NVFP4 block length along K
constexpr int kStageBytes = kStageK / 2;    // packed bytes of one row per stage
constexpr int kRowWords = kStageBytes + 4;  // padded: a warp's fragment loads hit 32 banks
constexpr int kBytesPerThread = kTile * kStageBytes / kThreads;  // 16: one uint4
static_assert(kBytesPerThread == 16 && kStageBytes == 2 * kBytesPerThread,
              "a thread stages half a row (two NVFP4 blocks) of one operand");
static_assert((kThreads / kMmaLanes) * 16 * kFragM * 8 * kFragN == kTile * kTile &&
                  (kThreads / kMmaLanes / 2) * 16 * kFragM == kTile,
              "the warps' fragments cover the tile: 4 warp rows x 2 warp columns");

struct Params {
  Nvfp4GemmOperand b, a;  // b: the output's rows (m), a: its columns (n)
  size_t k = 0, blocks = 0;
  float *d = nullptr;  // [m, n]
};

// What a thread fetches from global memory for one stage of one operand: the 16 packed bytes of
// half a staged row (two NVFP4 blocks), how many of them lie inside the row and K (the rest are
// zeros, whatever the scale: the CPU pads K with zero terms), and the two blocks' decoded scales.
struct Fetched {
  uint32_t w[kBytesPerThread / 4];
  int valid;
  float s0, s1;
};

// Thread i fetches half i % 2 of row row0 + i / 2, K from k0, of `op`. Issued a stage ahead of
// its use, so the global loads overlap the previous stage's tensor-core work.
__device__ __forceinline__ Fetched fetch(const Nvfp4GemmOperand &op, size_t row0, size_t k0,
                                         const Params &p) {
  const int tid = static_cast<int>(threadIdx.x);
  const size_t row = row0 + tid / 2;
  const size_t kbytes = p.k / 2, byte0 = k0 / 2 + (tid % 2) * kBytesPerThread;
  Fetched f{{0u, 0u, 0u, 0u}, 0, 0.0f, 0.0f};
  if (row >= op.rows || byte0 >= kbytes) return f;
  const uint8_t *src = op.data + row * kbytes + byte0;
  const size_t blk0 = byte0 * 2 / kBlk;  // the first of the two blocks
  f.s0 = fp8_decode<FormatE4M3>(op.scale[row * op.lds + blk0]);
  if (blk0 + 1 < p.blocks) f.s1 = fp8_decode<FormatE4M3>(op.scale[row * op.lds + blk0 + 1]);
  if (byte0 + kBytesPerThread <= kbytes && (reinterpret_cast<uintptr_t>(src) & 15u) == 0) {
    const uint4 v = *reinterpret_cast<const uint4 *>(src);
    f.w[0] = v.x, f.w[1] = v.y, f.w[2] = v.z, f.w[3] = v.w;
    f.valid = kBytesPerThread;
    return f;
  }
  // The row's tail, or rows not 16-byte aligned (K not a multiple of 32): byte by byte.
  const size_t left = kbytes - byte0;
  f.valid = left < kBytesPerThread ? static_cast<int>(left) : kBytesPerThread;
#pragma unroll
  for (int j = 0; j < kBytesPerThread; ++j) {
    if (j < f.valid) f.w[j / 4] |= static_cast<uint32_t>(src[j]) << (8 * (j % 4));
  }
  return f;
}

// Decodes a fetch into its staged half row, dst [64][kRowWords] of bf16 pairs: each byte's two
// codes times the block scale (the lower K index in the low half). e2m1 * e4m3 is exact in fp32
// and in bf16, so truncating the fp32 bits is exact (NaN stays NaN: its quiet bit is in the upper
// half), as the CPU's decode_row. e2m1: the 16 code values in shared memory (distinct banks).
__device__ __forceinline__ void store(const Fetched &f, const float *e2m1, uint32_t *dst) {
  const int tid = static_cast<int>(threadIdx.x);
  uint32_t w[kBytesPerThread];
#pragma unroll
  for (int j = 0; j < kBytesPerThread; ++j) {
    const uint32_t byte = (f.w[j / 4] >> (8 * (j % 4))) & 0xFFu;
    const float sc = j < kBlk / 2 ? f.s0 : f.s1;
    const float lo = e2m1[byte & 0xFu] * sc, hi = e2m1[byte >> 4] * sc;
    w[j] = j < f.valid ? (float_bits(lo) >> 16) | (float_bits(hi) & 0xFFFF0000u) : 0u;
  }
  uint4 *out = reinterpret_cast<uint4 *>(dst + (tid / 2) * kRowWords + (tid % 2) * kBytesPerThread);
#pragma unroll
  for (int q = 0; q < kBytesPerThread / 4; ++q) {
    out[q] = make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
  }
}

__global__ void __launch_bounds__(kThreads, 2) nvfp4_block_gemm_kernel(const Params p) {
  __shared__ uint4 sb_raw[kTile * kRowWords / 4];
  __shared__ uint4 sa_raw[kTile * kRowWords / 4];
  __shared__ float e2m1[16];
  uint32_t *sb = reinterpret_cast<uint32_t *>(sb_raw);
  uint32_t *sa = reinterpret_cast<uint32_t *>(sa_raw);
  const size_t m0 = static_cast<size_t>(blockIdx.x) * kTile;
  const size_t n0 = static_cast<size_t>(blockIdx.y) * kTile;
  const int lane = static_cast<int>(threadIdx.x) % kMmaLanes, g = lane / 4, t = lane % 4;
  const int warp = static_cast<int>(threadIdx.x) / kMmaLanes;
  const int wm = (warp / 2) * (16 * kFragM), wn = (warp % 2) * (8 * kFragN);

  float c[kFragM][kFragN][4];
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) c[i][j][e] = 0.0f;

  if (threadIdx.x < 16) e2m1[threadIdx.x] = e2m1_value(static_cast<uint8_t>(threadIdx.x));
  __syncthreads();
  Fetched fb = fetch(p.b, m0, 0, p), fa = fetch(p.a, n0, 0, p);
  for (size_t k0 = 0; k0 < p.k; k0 += kStageK) {
    store(fb, e2m1, sb);
    store(fa, e2m1, sa);
    __syncthreads();
    if (k0 + kStageK < p.k) {  // the next stage's loads, in flight during this stage's products
      fb = fetch(p.b, m0, k0 + kStageK, p);
      fa = fetch(p.a, n0, k0 + kStageK, p);
    }
    const size_t left = p.blocks - k0 / kBlk;  // blocks from this stage on
    const int nblk = left < kStageK / kBlk ? static_cast<int>(left) : kStageK / kBlk;
#pragma unroll
    for (int kb = 0; kb < kStageK / kBlk; ++kb) {
      if (kb < nblk) {  // (a guard, not a break: clang unrolls only loops without exits)
        const int kw = kb * (kBlk / 2);  // word offset of this block in a staged row
        uint32_t af[kFragM][4];
#pragma unroll
        for (int i = 0; i < kFragM; ++i) {
          const uint32_t *r0 = sb + (wm + i * 16 + g) * kRowWords + kw + t;
          const uint32_t *r8 = r0 + 8 * kRowWords;
          af[i][0] = r0[0];
          af[i][1] = r8[0];
          af[i][2] = r0[4];
          af[i][3] = r8[4];
        }
        // One B fragment at a time (registers: the accumulators take 64 per thread).
#pragma unroll
        for (int j = 0; j < kFragN; ++j) {
          const uint32_t *col = sa + (wn + j * 8 + g) * kRowWords + kw + t;
          const uint32_t bfr[2] = {col[0], col[4]};
#pragma unroll
          for (int i = 0; i < kFragM; ++i) {
            float term[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // the block term, exact (see the top)
            mma_m16n8k16<bf16>(term, af[i], bfr);
#pragma unroll
            for (int e = 0; e < 4; ++e) c[i][j][e] += term[e];  // K order, fp32, a plain add
          }
        }
      }
    }
    __syncthreads();
  }

  // c[i][j][0..1]: row g, columns 2t, 2t + 1 of fragment (i, j); c[i][j][2..3]: row g + 8.
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j)
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
