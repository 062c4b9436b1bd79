// nvte_nvfp4_block_gemm (gemm.h): the NVFP4 GEMM in the FP4 tensor core's summation order: the API
// entry (checks, then the GPU launcher of nvfp4_gemm.cu for GPU tensors) and the CPU kernel. Both operands are decoded once to their exact block-scaled values (e2m1 * e4m3, exact in
// bf16 and fp32), B's K-runs into panels of 64 columns, and the register-tiled micro-kernels of
// platform/cpu_nvfp4_tile.h sum each 16-K block exactly and add the block terms in K order. Level
// rule: AVX-512 BF16 dot products where the level allows (twice the fp32 FMA rate on Zen 4),
// else fp32 vectors of the clone's width; every path gives the same bits (see the header).
#include <algorithm>
#include <cstring>
#include <vector>

#include "../cast/nvfp4_math.h"
#include "../platform/cpu_nvfp4_tile.h"
#include "../util/api.h"
#include "../util/parallel.h"
#include "../util/tensor.h"
#include "nvfp4_gemm.h"
#include "transformer_engine_lite/gemm.h"

namespace nvte {
namespace {

using nvfp4_tile::kBlock;
using nvfp4_tile::kPanel;

using Nvfp4Operand = Nvfp4GemmOperand;  // nvfp4_gemm.h

Nvfp4Operand operand(const Tensor &t, const char *arg, size_t *k) {
  NVTE_CHECK(t.scaling_mode == NVTE_NVFP4_1D_SCALING, "argument '", arg,
             "': expected an NVFP4 tensor (scaling mode NVTE_NVFP4_1D_SCALING), got scaling mode ",
             static_cast<int>(t.scaling_mode));
  NVTE_CHECK(t.data.has_data() || t.data.numel() == 0, "argument '", arg,
             "': expected the row-wise NVFP4 data (the copy whose blocks run along K), got a null "
             "pointer");
  check_dtype(t.data, arg, {kNVTEByte});
  check_ndim_at_least(t.data, arg, 2);
  const size_t rows = t.data.rows(), kk = 2 * t.data.cols();
  const size_t blocks = (kk + kBlock - 1) / kBlock;
  check_dtype(t.scale_inv, arg, {kNVTEFloat8E4M3, kNVTEByte});
  check_ndim(t.scale_inv, arg, 2);
  const size_t srows = t.scale_inv.shape[0], scols = t.scale_inv.shape[1];
  NVTE_CHECK(srows >= rows && scols >= blocks, "argument '", arg, "': expected an E4M3 scale_inv ",
             "grid of at least [", rows, ", ", blocks, "] (one scale per 16 of K = ", kk,
             "), got ", t.scale_inv.describe());
  NVTE_CHECK(t.scale_inv.has_data() || rows * blocks == 0, "argument '", arg,
             "': expected E4M3 scale_inv data, got a null pointer");
  *k = kk;
  return {t.data.ptr<uint8_t>(), t.scale_inv.ptr<uint8_t>(), rows, scols};
}

// The exact value of code c (4 bits) under E4M3 scale s; 16 per scale, looked up.
struct DecodeTable {
  float v[256][16];
  DecodeTable() {
    for (int s = 0; s < 256; ++s)
      for (int c = 0; c < 16; ++c)
        v[s][c] = e2m1_value(static_cast<uint8_t>(c)) *
                  fp8_decode<FormatE4M3>(static_cast<uint8_t>(s));
  }
};
const DecodeTable &decode_table() {
  static const DecodeTable t;
  return t;
}

// Row r of an operand decoded into out[0, kp) (zeros past K: zero terms in the last block).
// E: float, or uint16_t for bf16 bits (the values are exact in bf16: truncation keeps them, NaN
// included, whose quiet bit is in the upper half).
template <typename E>
void decode_row(const Nvfp4Operand &op, size_t r, size_t k, size_t kp, E *out, size_t stride) {
  const DecodeTable &tab = decode_table();
  const uint8_t *d = op.data + r * (k / 2);
  const uint8_t *s = op.scale + r * op.lds;
  for (size_t j = 0; j < kp; ++j) {
    float v = 0.0f;
    if (j < k) {
      const uint8_t code = (j & 1) ? (d[j / 2] >> 4) : (d[j / 2] & 0x0F);
      v = tab.v[s[j / kBlock]][code];
    }
    if constexpr (sizeof(E) == 2) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof(bits));
      out[j * stride] = static_cast<E>(bits >> 16);
    } else {
      out[j * stride] = v;
    }
  }
}

// The fp32 clones' panel kernel at this level's blocking (platform/cpu_nvfp4_tile.h).
void panel_f32_cloned(int M, const float *A, size_t lda, const float *B, int blocks, float *C,
                      size_t ldc) {
  const CpuIsa isa = cpu_isa_level();
  if (isa >= CpuIsa::kAvx512Core) {
    NVTE_CPU_DISPATCH(nvfp4_tile::panel_f32<tile::F32Blocking::kAvx512>(M, A, lda, B, blocks, C,
                                                                        ldc));
  } else if (isa >= CpuIsa::kAvx2) {
    NVTE_CPU_DISPATCH(nvfp4_tile::panel_f32<tile::F32Blocking::kAvx2>(M, A, lda, B, blocks, C,
                                                                      ldc));
  } else {
    NVTE_CPU_DISPATCH(nvfp4_tile::panel_f32<tile::F32Blocking::kSse2>(M, A, lda, B, blocks, C,
                                                                      ldc));
  }
}

constexpr size_t kRowChunk = 96;  // rows per work item (a multiple of the kernels' 3-row tiles)

// D[m, n] = blocked sum of b (rows m) . a (rows n); E is the decoded element type.
template <typename E>
void run(const Nvfp4Operand &b, const Nvfp4Operand &a, size_t k, float *d) {
  const size_t m = b.rows, n = a.rows;
  const size_t blocks = (k + kBlock - 1) / kBlock, kp = blocks * kBlock;
  const size_t panels = (n + kPanel - 1) / kPanel, np = panels * kPanel;
  // bf16 panels pair K-neighbours ([kp/2][64][2]); fp32 ones are [kp][64]. Columns past n: zeros.
  constexpr bool kPairs = sizeof(E) == 2;
  std::vector<E> av(m * kp), bv(np * kp, E{});
  parallel_for(m, 64, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) decode_row(b, r, k, kp, av.data() + r * kp, 1);
  });
  parallel_for(n, 64, [&](size_t c0, size_t c1) {
    std::vector<E> tmp(kPairs ? kp : 0);
    for (size_t c = c0; c < c1; ++c) {
      E *panel = bv.data() + (c / kPanel) * kPanel * kp;
      const size_t col = c % kPanel;
      if (kPairs) {  // element j of column col at [j / 2][col][j % 2]: two interleaved runs
        decode_row(a, c, k, kp, tmp.data(), 1);
        for (size_t j = 0; j < kp; ++j) panel[(j / 2) * kPanel * 2 + col * 2 + (j % 2)] = tmp[j];
      } else {
        decode_row(a, c, k, kp, panel + col, kPanel);
      }
    }
  });
  // Output: straight into D when n fills whole panels, else a padded buffer copied out.
  std::vector<float> cbuf(np == n ? 0 : m * np);
  float *c = np == n ? d : cbuf.data();
  const size_t chunks = (m + kRowChunk - 1) / kRowChunk;
  // Work items panel-major: a thread's consecutive items reuse its B panel from cache.
  parallel_for(panels * chunks, 1, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      const size_t p = i / chunks, r0 = (i % chunks) * kRowChunk;
      const int rows = static_cast<int>(std::min(kRowChunk, m - r0));
      const E *A = av.data() + r0 * kp;
      const E *B = bv.data() + p * kPanel * kp;
      float *C = c + r0 * np + p * kPanel;
      if constexpr (kPairs) {
        nvfp4_tile::panel_bf16(rows, A, kp, B, static_cast<int>(blocks), C, np);
      } else {
        panel_f32_cloned(rows, A, kp, B, static_cast<int>(blocks), C, np);
      }
    }
  });
  if (np != n && n != 0) {  // n == 0: nothing to copy (and d may hold no buffer)
    for (size_t r = 0; r < m; ++r) std::memcpy(d + r * n, c + r * np, n * sizeof(float));
  }
}

}  // namespace
}  // namespace nvte

NVTEStatus nvte_nvfp4_block_gemm(const NVTETensor B, const NVTETensor A, NVTETensor D,
                                 NVTEStream stream) {
  using namespace nvte;
  return guarded("nvte_nvfp4_block_gemm", [&] {
    const Tensor &b = as_tensor(B, "B");
    const Tensor &a = as_tensor(A, "A");
    const Tensor &d = as_tensor(D, "D");
    const NVTEDevice dev = check_same_device({{&b, "B"}, {&a, "A"}, {&d, "D"}});
    size_t kb = 0, ka = 0;
    const Nvfp4Operand ob = operand(b, "B", &kb), oa = operand(a, "A", &ka);
    NVTE_CHECK(kb == ka, "arguments 'B' and 'A': expected the same K (2 x packed columns), got ",
               kb, " and ", ka);
    check_dtype(d.data, "D", {kNVTEFloat32});
    check_shape(d.data, "D", {ob.rows, oa.rows});
    const size_t m = ob.rows, n = oa.rows, k = kb;
    if (m == 0 || n == 0) return;
    NVTE_CHECK(d.data.has_data(), "argument 'D': expected fp32 [", m, ", ", n,
               "] data, got a null pointer");
    float *out = d.data.ptr<float>();
    for (const auto &[o, arg] : {std::pair{&ob, "B"}, std::pair{&oa, "A"}}) {
      NVTE_CHECK(k == 0 || o->data != nullptr, "argument '", arg,
                 "': expected NVFP4 data, got a null pointer");
    }
    if (use_gpu(dev, "nvte_nvfp4_block_gemm")) {
#ifdef NVTE_WITH_GPU
      gpu::launch_nvfp4_block_gemm(ob, oa, k, out, stream);
#endif
      return;
    }
    (void)stream;  // the CPU path is synchronous
    if (k == 0) {  // no blocks: the sum is its starting 0
      std::fill(out, out + m * n, 0.0f);
      return;
    }
    if (tile::has_bf16_dot()) {
      run<uint16_t>(ob, oa, k, out);
    } else {
      run<float>(ob, oa, k, out);
    }
  });
}
