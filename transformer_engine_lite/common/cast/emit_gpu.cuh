// GPU side of FP8-capable outputs, the counterpart of emit_cpu.h: a plain params struct built from a
// validated OutputSpec, and device functions that store fp32 values in the output's dtype with the
// per-tensor scale, record amax and write scale_inv. FP8 bytes come from util/fp8.h, as on the CPU.
// MXFP8 outputs of fused producers (norms, activations, GEMM) are staged: the producer writes fp32
// into a scratch buffer and launch_quantize_f32 (cast/quantize_gpu.h) quantizes it, so the MX
// block logic exists once per device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "../util/dtype_dispatch.h"
#include "output_spec.h"

namespace nvte {
namespace gpu {

struct OutputParams {
  void *data = nullptr;        // row-wise data [rows, cols]
  void *colwise = nullptr;     // per-tensor FP8: transposed copy [cols, rows]
  const float *scale = nullptr;  // per-tensor FP8 scale (device)
  float *amax = nullptr;         // optional amax (device), accumulated with atomic_max_abs
  float *scale_inv = nullptr;    // optional 1/scale (device)
  size_t rows = 0, cols = 0;
  DType dtype = kNVTEFloat32;
  bool fp8 = false, rowwise = false, transposed = false;
};

inline OutputParams make_output_params(const Tensor &out, const OutputSpec &spec) {
  NVTE_CHECK(!spec.mx, "make_output_params: MXFP8 outputs are staged through fp32 (internal)");
  OutputParams p;
  p.data = spec.rowwise ? out.data.dptr : nullptr;
  p.colwise = spec.colwise ? out.columnwise_data.dptr : nullptr;
  p.scale = spec.fp8 ? out.scale.ptr<const float>() : nullptr;
  p.amax = out.amax.has_data() ? out.amax.ptr<float>() : nullptr;
  p.scale_inv = spec.fp8 && out.scale_inv.has_data() ? out.scale_inv.ptr<float>() : nullptr;
  p.rows = spec.rows;
  p.cols = spec.cols;
  p.dtype = spec.dtype;
  p.fp8 = spec.fp8;
  p.rowwise = spec.rowwise;
  p.transposed = spec.colwise;
  return p;
}

// Zeroes amax before producers accumulate into it (stream-ordered).
inline void begin_output(const OutputParams &p, cudaStream_t stream) {
  if (p.amax != nullptr) NVTE_CHECK_CUDA(cudaMemsetAsync(p.amax, 0, sizeof(float), stream));
}

// Per-tensor scale as producers use it (1 for plain outputs).
__device__ __forceinline__ float output_scale(const OutputParams &p) {
  return p.fp8 ? *p.scale : 1.0f;
}

// Stores v at (row, col) as OType, scaled for FP8; writes the transposed copy too when requested.
template <typename OType>
__device__ __forceinline__ void store_output(const OutputParams &p, size_t row, size_t col, float v,
                                             float scale) {
  // Plain outputs store v itself, as the CPU's store_row (v * 1 would quiet a signaling NaN).
  const OType q = from_float<OType>(p.fp8 ? v * scale : v);
  if (p.rowwise) static_cast<OType *>(p.data)[row * p.cols + col] = q;
  if (p.transposed) static_cast<OType *>(p.colwise)[col * p.rows + row] = q;
}

// Folds a thread's |v| maximum into amax: reduce over the block first, one atomic per block.
// Must be called by every thread of the block; `scratch` as for block_reduce.
__device__ __forceinline__ void record_amax(const OutputParams &p, float thread_amax,
                                            float *scratch) {
  if (p.amax == nullptr) return;
  const float m = block_reduce<true>(thread_amax, scratch);
  // Any NaN becomes the canonical quiet NaN, as the CPU's AbsMax::value() (NAN): the atomic max of
  // bit patterns would otherwise keep the largest payload, and the amax bits would differ.
  if (threadIdx.x == 0) atomic_max_abs(p.amax, m != m ? bits_float(0x7FC00000u) : m);
}

// scale_inv = 1 / scale, written by one thread of the grid.
__device__ __forceinline__ void write_scale_inv(const OutputParams &p) {
  if (p.scale_inv != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    *p.scale_inv = 1.0f / *p.scale;
  }
}

// Output dtypes a GPU producer dispatches over (same list as the CPU).
using GpuOutputTypes = OutputTypes;

}  // namespace gpu
}  // namespace nvte
