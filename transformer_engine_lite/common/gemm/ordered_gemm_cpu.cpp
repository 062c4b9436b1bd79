// nvte_ordered_batched_gemm (gemm.h): the fp32 batched GEMM in one canonical order (every output an
// fmaf chain over K in index order from +0), the same bits on the CPU and the GPU. The API entry
// (checks, then the GPU launcher of ordered_gemm.cu for GPU tensors) and the CPU kernel.
// CPU: at x86-64-v4 / -v3 the attention tiles' fp32 clones (platform/cpu_tile_gemm.h), whose
// every output is exactly that chain (accumulators from +0, one vfmadd per k, k ascending). The
// baseline clone multiplies and adds separately (no FMA hardware), which would round twice per
// term: at that level a scalar loop of std::fmaf (exact, in software) runs instead, slower but
// with the same bits, the point of this op. Threads split batches and rows, never K, so every
// thread count gives the same bits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../platform/cpu_isa.h"
#include "../platform/cpu_tile_gemm.h"
#include "../util/api.h"
#include "../util/parallel.h"
#include "../util/tensor.h"
#include "ordered_gemm.h"
#include "transformer_engine_lite/gemm.h"

namespace nvte {
namespace {

constexpr size_t kRowChunk = 96;  // rows per work item (a multiple of the tile kernel's 6 rows)

// op(A)[b, i, p] and op(B)[b, p, j] of a contiguous problem.
inline float op_a(const OrderedGemmProblem &p, size_t b, size_t i, size_t q) {
  return p.transa ? p.a[(b * p.k + q) * p.m + i] : p.a[(b * p.m + i) * p.k + q];
}
inline float op_b(const OrderedGemmProblem &p, size_t b, size_t q, size_t j) {
  return p.transb ? p.b[(b * p.n + j) * p.k + q] : p.b[(b * p.k + q) * p.n + j];
}

// Baseline level: the chain itself, one exact fmaf per term (glibc's, correctly rounded).
void run_scalar(const OrderedGemmProblem &p) {
  parallel_for(p.batch * p.m, 16, [&](size_t r0, size_t r1) {
    std::vector<float> row(p.k);
    for (size_t r = r0; r < r1; ++r) {
      const size_t b = r / p.m, i = r % p.m;
      for (size_t q = 0; q < p.k; ++q) row[q] = op_a(p, b, i, q);
      float *out = p.d + r * p.n;
      for (size_t j = 0; j < p.n; ++j) {
        float c = 0.0f;
        for (size_t q = 0; q < p.k; ++q) c = std::fmaf(row[q], op_b(p, b, q, j), c);
        out[j] = c;
      }
    }
  });
}

// FMA levels: op(B) packed once per batch into the tile kernel's panels ([k][64] per 64 columns,
// zeros past n), op(A) used in place (transa: each work item transposes its rows into a small
// buffer), outputs of a work item into a buffer whose row stride is n rounded up to 16 (the
// kernel writes whole 16-column groups).
void run_tiles(const OrderedGemmProblem &p) {
  const size_t m = p.m, n = p.n, k = p.k;
  const size_t panels = (n + tile::kPanel - 1) / tile::kPanel;
  const size_t panel_stride = k * tile::kPanel, bstride = panels * panel_stride;
  std::vector<float> bp(p.batch * bstride, 0.0f);
  parallel_for(p.batch, 1, [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) {
      float *dst = bp.data() + b * bstride;
      for (size_t q = 0; q < k; ++q)
        for (size_t j = 0; j < n; ++j)
          dst[(j / tile::kPanel) * panel_stride + q * tile::kPanel + j % tile::kPanel] =
              op_b(p, b, q, j);
    }
  });
  const size_t ldc = (n + 15) / 16 * 16;
  const size_t chunks = (m + kRowChunk - 1) / kRowChunk;
  parallel_for(p.batch * chunks, 1, [&](size_t w0, size_t w1) {
    std::vector<float> cbuf(ldc == n ? 0 : kRowChunk * ldc);
    std::vector<float> abuf(p.transa ? kRowChunk * k : 0);  // a work item's rows of A^T
    for (size_t w = w0; w < w1; ++w) {
      const size_t b = w / chunks, r0 = (w % chunks) * kRowChunk;
      const size_t rows = std::min(kRowChunk, m - r0);
      const float *a = p.a + (b * m + r0) * k;
      if (p.transa) {
        for (size_t q = 0; q < k; ++q)
          for (size_t i = 0; i < rows; ++i) abuf[i * k + q] = op_a(p, b, r0 + i, q);
        a = abuf.data();
      }
      float *out = p.d + (b * m + r0) * n;
      float *c = ldc == n ? out : cbuf.data();
      tile::gemm_f32_cloned(static_cast<int>(rows), static_cast<int>(n), static_cast<int>(k), a,
                            static_cast<int>(k), bp.data() + b * bstride, panel_stride, c,
                            static_cast<int>(ldc), false);
      if (ldc != n)
        for (size_t r = 0; r < rows; ++r) std::memcpy(out + r * n, c + r * ldc, n * sizeof(float));
    }
  });
}

// `arg` must be a 3-D fp32 tensor (`layout` names its dims for the message).
void check_operand(const Tensor &t, const char *arg, const char *layout) {
  check_dtype(t.data, arg, {kNVTEFloat32});
  NVTE_CHECK(t.data.shape.size() == 3, "argument '", arg, "': expected a 3-D fp32 tensor ", layout,
             ", got ", t.data.describe());
}

}  // namespace
}  // namespace nvte

NVTEStatus nvte_ordered_batched_gemm(const NVTETensor A, const NVTETensor B, NVTETensor D,
                                     bool transa, bool transb, NVTEStream stream) {
  using namespace nvte;
  return guarded("nvte_ordered_batched_gemm", [&] {
    const Tensor &a = as_tensor(A, "A");
    const Tensor &b = as_tensor(B, "B");
    const Tensor &d = as_tensor(D, "D");
    const NVTEDevice dev = check_same_device({{&a, "A"}, {&b, "B"}, {&d, "D"}});
    check_operand(a, "A", transa ? "[batch, K, m] (transa)" : "[batch, m, K]");
    check_operand(b, "B", transb ? "[batch, n, K] (transb)" : "[batch, K, n]");
    const auto &sa = a.data.shape, &sb = b.data.shape;
    OrderedGemmProblem p{};
    p.batch = sa[0];
    p.m = transa ? sa[2] : sa[1];
    p.k = transa ? sa[1] : sa[2];
    p.n = transb ? sb[1] : sb[2];
    const size_t kb = transb ? sb[2] : sb[1];
    NVTE_CHECK(sb[0] == p.batch, "arguments 'A' and 'B': expected the same batch, got ", p.batch,
               " and ", sb[0]);
    NVTE_CHECK(kb == p.k, "arguments 'A' and 'B': expected the same K (transa ", transa,
               ", transb ", transb, "), got ", p.k, " and ", kb);
    check_dtype(d.data, "D", {kNVTEFloat32});
    check_shape(d.data, "D", {p.batch, p.m, p.n});
    // The tile kernel's dimensions and strides are int.
    constexpr size_t kMax = 0x7FFFFFFF;
    NVTE_CHECK(p.m <= kMax && p.n <= kMax && p.k <= kMax, "arguments 'A' and 'B': expected m, n ",
               "and K below 2^31, got ", p.m, ", ", p.n, ", ", p.k);
    if (p.batch * p.m * p.n == 0) return;
    NVTE_CHECK(d.data.has_data(), "argument 'D': expected fp32 data, got a null pointer");
    if (p.k != 0) {
      NVTE_CHECK(a.data.has_data(), "argument 'A': expected fp32 data, got a null pointer");
      NVTE_CHECK(b.data.has_data(), "argument 'B': expected fp32 data, got a null pointer");
    }
    p.a = a.data.ptr<float>();
    p.b = b.data.ptr<float>();
    p.d = d.data.ptr<float>();
    p.transa = transa;
    p.transb = transb;
    if (use_gpu(dev, "nvte_ordered_batched_gemm")) {
#ifdef NVTE_WITH_GPU
      gpu::launch_ordered_batched_gemm(p, stream);
#endif
      return;
    }
    (void)stream;  // the CPU path is synchronous
    if (p.k == 0) {  // an empty chain: its starting +0
      std::fill(p.d, p.d + p.batch * p.m * p.n, 0.0f);
      return;
    }
#ifdef NVTE_HAVE_FMA_TILE_KERNELS
    if (cpu_isa_level() >= CpuIsa::kAvx2) {
      run_tiles(p);
      return;
    }
#endif
    run_scalar(p);
  });
}
