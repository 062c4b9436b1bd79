// GPU kernels of NVFP4 quantize and dequantize (NVTE_NVFP4_1D_SCALING): 1x16 and 16x16 blocks,
// row-wise and column-wise (transposed) copies, the per-tensor global scale from the copy's amax,
// row-scaled amaxes, the random Hadamard transform of the column-wise copy, stochastic rounding and
// 4over6. Layouts and arithmetic are nvfp4_quantize.cpp's (every value comes from nvfp4_math.h in
// the same order), so bytes, scales and amaxes equal the CPU kernel's bit for bit
// (tests/cpp/gpu/test_gpu_nvfp4.cpp).
#include <algorithm>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "../util/dtype_dispatch.h"
#include "nvfp4_math.h"
#include "nvfp4_quantize.h"
#include "quantize_gpu.h"
#include "x86_nan.cuh"

namespace nvte {
namespace gpu {

namespace {

constexpr int kThreads = 256;        // a multiple of 64: block reductions see whole warps
constexpr size_t kMaxBlocks = 4096;  // grid-stride loops bound the grid
constexpr int kB = static_cast<int>(kNvfp4BlockLen);
// Canonical quiet NaN of a NaN amax. The CPU keeps a NaN element's own bits (sign cleared); for
// the canonical NaN every framework produces that is this pattern, and canonicalizing keeps a
// real GPU's different NaN arithmetic (RHT sums give 0x7FFFFFFF there) out of the stored amax.
constexpr uint32_t kNanBits = 0x7FC00000u;

__host__ __device__ __forceinline__ size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

unsigned grid_for(size_t work, size_t per_block) {
  const size_t blocks = std::min(ceil_div(work, per_block), kMaxBlocks);
  return static_cast<unsigned>(std::max<size_t>(1, blocks));
}

// One copy to write: the row-wise copy is the input [R, C] itself, the column-wise copy its
// transpose [C, R] (RHT'd along its rows when asked). Its rows are split into 16-element blocks.
struct CopyParams {
  const void *src = nullptr;  // input [R, C] of IType
  size_t R = 0, C = 0;        // input view
  bool colwise = false;       // this copy is the transpose
  size_t rows = 0, cols = 0;  // the copy: [rows, cols] = colwise ? [C, R] : [R, C]
  uint8_t *q = nullptr;       // packed E2M1 [rows, cols / 2]
  uint8_t *sc = nullptr;      // E4M3 scales, [.., sld] (padded grid)
  size_t sld = 0;
  float *amax = nullptr;      // the copy's amax: a scalar, or [rows] when row-scaled
  bool row_scaled = false, two_d = false, rht = false, stochastic = false;
  uint32_t sign_mask = 0;
  uint64_t seed = 0, offset = 0;
  const int64_t *rng = nullptr;  // when set: seed and offset in device memory (TE's rng_state)
  int e4m3_max = 448;         // E4M3 bound of S_enc (256 only with 4over6)
  uint8_t four_over_six = 0;  // NVTENVFP44Over6Mode
  bool fast_err = false;      // 4over6 errors in the E4M3-scaled domain
};

// Work items of a copy: (row group, block) with a row group of 1 row (1x16 blocks) or 16 rows
// (16x16 blocks). Row-wise: blocks fastest, so neighbouring threads read neighbouring 16-element
// runs of a row; column-wise: row groups fastest, so neighbouring threads read neighbouring input
// columns (coalesced reads; their 8-byte stores land a copy row apart and do not coalesce).
struct Item {
  size_t group, block;
};
__device__ __forceinline__ Item item_of(const CopyParams &p, size_t t, size_t groups,
                                        size_t blocks) {
  if (p.colwise) return Item{t % groups, t / groups};
  return Item{t / blocks, t % blocks};
}

// Values j0..j0+len of row i of the copy into v[0..len). The column-wise RHT runs over the 16
// values of a block (blocks start at multiples of 16 and R % 16 == 0 is validated, so len is 16)
// and rounds to the input dtype, as the CPU's colwise_rows.
template <typename IType>
__device__ __forceinline__ void load_block(const CopyParams &p, size_t i, size_t j0, int len,
                                           float *v) {
  const IType *src = static_cast<const IType *>(p.src);
#pragma unroll
  for (int k = 0; k < kB; ++k) {
    const size_t j = j0 + k;
    v[k] = k < len ? to_float(p.colwise ? src[j * p.C + i] : src[i * p.C + j]) : 0.0f;
  }
  if (p.colwise && p.rht) {
    float y[kB];
    nvfp4_rht16(v, p.sign_mask, y);
#pragma unroll
    for (int k = 0; k < kB; ++k) v[k] = to_float(from_float<IType>(y[k]));
  }
}

// acc folded with v[0..len) in element order (the CPU's). Fixed-trip loops over a block with
// k < len as a predicate unroll fully, so the block's arrays stay in registers.
__device__ __forceinline__ float amax_over(float acc, const float *v, int len) {
#pragma unroll
  for (int k = 0; k < kB; ++k)
    if (k < len) acc = nvfp4_amax_acc(acc, v[k]);
  return acc;
}

__device__ __forceinline__ int block_len(const CopyParams &p, size_t b) {
  const size_t j0 = b * kB;
  return static_cast<int>(j0 + kB < p.cols ? kB : p.cols - j0);
}

// Magnitude bits of an amax for the integer max: every NaN as the canonical one (above +Inf).
__device__ __forceinline__ uint32_t amax_key(float a) {
  return a != a ? kNanBits : (float_bits(a) & 0x7FFFFFFFu);
}
__device__ __forceinline__ float canonical_amax(float a) { return bits_float(amax_key(a)); }

// Per-tensor amax of a copy (zeroed before the launch): each thread's NaN-sticky max over its
// blocks, a block-wide integer max, one atomic per thread block.
template <typename IType>
__global__ void __launch_bounds__(kThreads) copy_amax_kernel(const CopyParams p) {
  __shared__ uint32_t scratch[kThreads / kWarpSize];
  const size_t blocks = ceil_div(p.cols, kB), n = p.rows * blocks;
  float acc = 0.0f;
  for (size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n;
       t += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const Item it = item_of(p, t, p.rows, blocks);
    const int len = block_len(p, it.block);
    float v[kB];
    load_block<IType>(p, it.group, it.block * kB, len, v);
    acc = amax_over(acc, v, len);
  }
  uint32_t m = warp_reduce_max_u32(amax_key(acc));
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < static_cast<int>(blockDim.x) / kWarpSize; ++w)
      m = scratch[w] > m ? scratch[w] : m;
    atomic_max_abs(p.amax, bits_float(m));
  }
}

// Row-scaled NVFP4: one thread per row of the copy, its amax in element order (the CPU's).
template <typename IType>
__global__ void __launch_bounds__(kThreads) row_amax_kernel(const CopyParams p) {
  const size_t blocks = ceil_div(p.cols, kB);
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.rows;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (size_t b = 0; b < blocks; ++b) {
      const int len = block_len(p, b);
      float v[kB];
      load_block<IType>(p, i, b * kB, len, v);
      acc = amax_over(acc, v, len);
    }
    p.amax[i] = canonical_amax(acc);
  }
}

// 4over6 candidates of one block (the CPU's fourover6_block): the map-to-6 [0] and map-to-4 [1]
// scales and each one's error summed over all 16 terms in element order (v is zero past len: the
// reference's padding, whose terms are added too).
__device__ __forceinline__ void fos_candidates(const float *v, float block_amax,
                                               const Nvfp4Global &g, const CopyParams &p,
                                               Nvfp4BlockScale *sc, float *err) {
  const float denom = kNvfp4E2M1Max * static_cast<float>(p.e4m3_max);
  const bool mse = p.four_over_six == kNVTENVFP44Over6MinMSE;
  for (int c = 0; c < 2; ++c) {
    sc[c] = nvfp4_4over6_scale(block_amax, g, c == 1);
    float e = 0.0f;
#pragma unroll
    for (int k = 0; k < kB; ++k) {
      const uint8_t code = e2m1_rne(nvfp4_scaled(v[k], sc[c].enc));
      e += nvfp4_4over6_err_term(v[k], code, sc[c].e4m3, g, denom, p.fast_err, mse);
    }
    err[c] = e;
  }
}

// Quantize: one thread per (row group, block). 16x16 blocks take their amax over the group's rows
// first (row-major, as the CPU), then every row of the group is encoded with that block scale.
template <typename IType>
__global__ void __launch_bounds__(kThreads) nvfp4_quantize_kernel(const CopyParams p) {
  const size_t rpg = p.two_d ? kB : 1, groups = ceil_div(p.rows, rpg);
  const size_t blocks = ceil_div(p.cols, kB), n = groups * blocks;
  const int copy = p.colwise ? 1 : 0;  // the stochastic-rounding stream of this copy
  const uint64_t seed = p.rng ? static_cast<uint64_t>(p.rng[0]) : p.seed;
  const uint64_t offset = p.rng ? static_cast<uint64_t>(p.rng[1]) : p.offset;
  for (size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n;
       t += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const Item it = item_of(p, t, groups, blocks);
    const size_t i0 = it.group * rpg, i1 = i0 + rpg < p.rows ? i0 + rpg : p.rows;
    const size_t j0 = it.block * kB;
    const int len = block_len(p, it.block);
    const bool fos = p.four_over_six != kNVTENVFP44Over6Disabled;
    float v[kB];
    float amax = 0.0f;
    if (p.two_d) {
      for (size_t i = i0; i < i1; ++i) {
        load_block<IType>(p, i, j0, len, v);
        amax = amax_over(amax, v, len);
      }
    }
    // 2D 4over6: one choice per 16x16 block from its 16 rows' errors (rows past the end are the
    // reference's zero padding), summed in TE's warp-tree order: rows i and i+8, then i and i+4,
    // i and i+2, i and i+1. The candidate scales do not depend on the row.
    Nvfp4BlockScale fos_sc[2];
    int pick = 0;
    if (p.two_d && fos) {
      const Nvfp4Global g = nvfp4_global(p.amax[0], p.e4m3_max);
      float e[2][kB];
      for (int r = 0; r < kB; ++r) {
        if (i0 + r < i1) {
          load_block<IType>(p, i0 + r, j0, len, v);
        } else {
#pragma unroll
          for (int k = 0; k < kB; ++k) v[k] = 0.0f;
        }
        float err[2];
        fos_candidates(v, amax, g, p, fos_sc, err);
        e[0][r] = err[0];
        e[1][r] = err[1];
      }
      for (int w = kB / 2; w >= 1; w /= 2)
        for (int r = 0; r < w; ++r) {
          e[0][r] = e[0][r] + e[0][r + w];
          e[1][r] = e[1][r] + e[1][r + w];
        }
      pick = e[1][0] < e[0][0] ? 1 : 0;  // ties keep map-to-6
    }
    for (size_t i = i0; i < i1; ++i) {
      load_block<IType>(p, i, j0, len, v);
      if (!p.two_d) amax = amax_over(0.0f, v, len);
      const Nvfp4Global g = nvfp4_global(p.amax[p.row_scaled ? i : 0], p.e4m3_max);
      Nvfp4BlockScale bs;
      if (!fos) {
        bs = nvfp4_block_scale(amax, g);
      } else {
        if (!p.two_d) {  // 1D 4over6: the candidate of lower error for this block alone
          float err[2];
          fos_candidates(v, amax, g, p, fos_sc, err);
          pick = err[1] < err[0] ? 1 : 0;  // ties keep map-to-6
        }
        bs = fos_sc[pick];
      }
      p.sc[i * p.sld + it.block] = bs.e4m3;
      uint8_t codes[kB];
      uint64_t sr_q = ~uint64_t{0};
      Philox4 sr_rnd{};
#pragma unroll
      for (int k = 0; k < kB; ++k) {
        const float x = nvfp4_scaled(v[k], bs.enc);
        if (k >= len || !p.stochastic) {  // (validation: no stochastic rounding with 4over6)
          codes[k] = e2m1_rne(x);
          continue;
        }
        // Element idx of the copy draws lane idx % 4 of Philox call idx / 4 (nvfp4_sr_block);
        // one call serves four consecutive elements.
        const uint64_t idx = static_cast<uint64_t>(i) * p.cols + j0 + k;
        if (idx / 4 != sr_q) {
          sr_q = idx / 4;
          sr_rnd = nvfp4_sr_block(seed, offset, copy, sr_q);
        }
        codes[k] = e2m1_stochastic(x, sr_rnd.v[idx % 4] >> 8);
      }
      uint8_t *dst = p.q + i * (p.cols / 2) + j0 / 2;
#pragma unroll
      for (int k = 0; k < kB; k += 2)  // len is even: the copy's row length is
        if (k < len) dst[k / 2] = static_cast<uint8_t>(codes[k] | (codes[k + 1] << 4));
    }
  }
}

template <typename IType>
void launch_copy(const CopyParams &p, bool amax_done, cudaStream_t stream) {
  const size_t blocks = ceil_div(p.cols, kB);
  if (!amax_done) {
    if (p.row_scaled) {
      row_amax_kernel<IType><<<grid_for(p.rows, kThreads), kThreads, 0, stream>>>(p);
    } else {
      copy_amax_kernel<IType><<<grid_for(p.rows * blocks, kThreads), kThreads, 0, stream>>>(p);
    }
    NVTE_CHECK_LAUNCH();
  }
  const size_t groups = ceil_div(p.rows, p.two_d ? kB : 1);
  nvfp4_quantize_kernel<IType><<<grid_for(groups * blocks, kThreads), kThreads, 0, stream>>>(p);
  NVTE_CHECK_LAUNCH();
}


// Dequantize: a thread per element of the stored copy [rows, cols] (the column-wise copy as
// stored, transposed), nvfp4_quantize.cpp's arithmetic: E2M1 value x (E4M3 block scale x amax x
// 1 / (6 * e4m3_max)), products only (no FMA to contract), then the output dtype's rounding.
struct Nvfp4DequantParams {
  const uint8_t *q = nullptr;     // packed E2M1 [rows, cols / 2], low nibble first
  const uint8_t *sc = nullptr;    // E4M3 scales [.., sld]
  const float *amax = nullptr;    // a scalar, or [rows] when row-scaled
  void *out = nullptr;            // OType [rows, cols]
  size_t rows = 0, cols = 0, sld = 0;
  bool row_scaled = false;
  float inv = 0.0f;               // 1 / (6 * e4m3_max), as nvfp4_dequant_factor rounds it
};

template <typename OType>
__global__ void __launch_bounds__(kThreads) nvfp4_dequantize_kernel(const Nvfp4DequantParams p) {
  OType *dst = static_cast<OType *>(p.out);
  const size_t n = p.rows * p.cols, stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const size_t r = i / p.cols, c = i - r * p.cols;
    const uint8_t byte = p.q[r * (p.cols / 2) + c / 2];
    const uint8_t code = (c % 2) ? (byte >> 4) : (byte & 0xF);
    const float amax = p.amax[p.row_scaled ? r : 0];
    // nvfp4_dequant_factor's products in its order, with x86's NaN results (x86_nan.cuh): an
    // E4M3 NaN scale or NaN amax propagates, a zero scale or code times an Inf amax is 0xFFC00000.
    const float factor =
        x86_mul(x86_mul(fp8_decode<FormatE4M3>(p.sc[r * p.sld + c / kNvfp4BlockLen]), amax),
                p.inv);
    dst[i] = from_float<OType>(x86_mul(e2m1_value(code), factor));
  }
}

}  // namespace

void launch_nvfp4_quantize(const Tensor &in, const Tensor &out, const Nvfp4Spec &s,
                           void *stream) {
  cudaStream_t st = as_stream(stream);
  // Padding entries of the scale grids are zeroed and the amaxes start at 0 (the atomics' base;
  // an empty tensor's amax, a max over nothing), as the CPU kernel leaves them.
  const auto zero = [&](const SimpleTensor &t, size_t elem) {
    NVTE_CHECK_CUDA(cudaMemsetAsync(t.dptr, 0, t.numel() * elem, st));
  };
  // Given amaxes (kNVTEQuantizationConfigNVFP4AmaxGiven) are read as they are, not zeroed.
  if (s.rowwise) {
    zero(out.scale_inv, 1);
    if (!s.amax_given) zero(out.amax, sizeof(float));
  }
  if (s.colwise) {
    zero(out.columnwise_scale_inv, 1);
    if (!s.amax_given) zero(out.columnwise_amax, sizeof(float));
  }
  if (s.rows == 0 || s.cols == 0) return;
  CopyParams base;
  base.src = in.data.dptr;
  base.R = s.rows;
  base.C = s.cols;
  base.row_scaled = s.row_scaled;
  base.two_d = s.two_d;
  base.stochastic = s.stochastic;
  base.seed = s.seed;
  base.offset = s.offset;
  base.rng = s.stochastic ? s.rng_device : nullptr;
  base.e4m3_max = s.e4m3_max;
  base.four_over_six = s.four_over_six;
  base.fast_err = s.fast_err;
  dispatch_dtype<HighPrecisionTypes>(in.data.dtype, "input", [&](auto itag) {
    using IType = typename decltype(itag)::type;
    if (s.rowwise) {
      CopyParams p = base;
      p.rows = s.rows;
      p.cols = s.cols;
      p.q = out.data.ptr<uint8_t>();
      p.sc = out.scale_inv.ptr<uint8_t>();
      p.sld = out.scale_inv.shape[1];
      p.amax = out.amax.ptr<float>();
      launch_copy<IType>(p, s.amax_given, st);
    }
    if (s.colwise) {
      CopyParams p = base;
      p.colwise = true;
      p.rows = s.cols;
      p.cols = s.rows;
      p.q = out.columnwise_data.ptr<uint8_t>();
      p.sc = out.columnwise_scale_inv.ptr<uint8_t>();
      p.sld = out.columnwise_scale_inv.shape[1];
      p.amax = out.columnwise_amax.ptr<float>();
      p.rht = s.rht;
      p.sign_mask = s.rht_sign_mask;
      // Without the RHT (and row scaling) both copies share the input's amax: copied, not
      // recomputed.
      const bool shared = s.rowwise && !s.rht && !s.row_scaled && !s.amax_given;
      if (shared) {
        NVTE_CHECK_CUDA(cudaMemcpyAsync(p.amax, out.amax.ptr<const float>(), sizeof(float),
                                        cudaMemcpyDeviceToDevice, st));
      }
      launch_copy<IType>(p, shared || s.amax_given, st);
    }
  });
}

void launch_nvfp4_dequantize(const Tensor &in, const Nvfp4Spec &s, const SimpleTensor &out,
                             void *stream) {
  if (s.rows == 0 || s.cols == 0) return;
  const bool row = s.rowwise;
  const SimpleTensor &st = row ? in.scale_inv : in.columnwise_scale_inv;
  Nvfp4DequantParams p;
  p.q = (row ? in.data : in.columnwise_data).ptr<const uint8_t>();
  p.sc = st.ptr<const uint8_t>();
  p.sld = st.shape[1];
  p.amax = (row ? in.amax : in.columnwise_amax).ptr<const float>();
  p.out = out.dptr;
  p.rows = s.rows;
  p.cols = s.cols;
  p.row_scaled = s.row_scaled;
  p.inv = 1.0f / (kNvfp4E2M1Max * static_cast<float>(s.e4m3_max));
  const unsigned grid = grid_for(s.rows * s.cols, kThreads);
  cudaStream_t cs = as_stream(stream);
  dispatch_dtype<HighPrecisionTypes>(out.dtype, "output", [&](auto otag) {
    using OType = typename decltype(otag)::type;
    nvfp4_dequantize_kernel<OType><<<grid, kThreads, 0, cs>>>(p);
    NVTE_CHECK_LAUNCH();
  });
}

}  // namespace gpu
}  // namespace nvte
