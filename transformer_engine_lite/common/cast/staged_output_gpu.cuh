// Output side of fused GPU producers (norms, activations): one object that gives a kernel the plain
// OutputParams to store into, staging MXFP8 outputs through an fp32 scratch buffer that
// launch_quantize_f32 then quantizes, so producers never contain MX block logic.
#pragma once

#include <cstddef>

#include "emit_gpu.cuh"
#include "quantize_gpu.h"

namespace nvte {
namespace gpu {

// Running max of |v| as producers accumulate it per thread; NaN propagates (as the CPU's AbsMax).
__device__ __forceinline__ float abs_max_update(float m, float v) {
  const float a = bits_float(float_bits(v) & 0x7FFFFFFFu);
  return (a > m || a != a) ? a : m;
}

class StagedOutput {
 public:
  // Per-tensor / plain outputs: params target `out` directly and amax is zeroed on `stream` (the
  // producer accumulates into it). MXFP8: params target a [rows, cols] fp32 scratch buffer.
  StagedOutput(const Tensor &out, const OutputSpec &spec, cudaStream_t stream)
      : out_(out), spec_(spec), stream_(stream) {
    if (!spec.mx) {
      params_ = make_output_params(out, spec);
      begin_output(params_, stream);
      return;
    }
    const size_t bytes = spec.rows * spec.cols * sizeof(float);
    if (bytes > 0) {
      NVTE_CHECK_CUDA(cudaMallocAsync(reinterpret_cast<void **>(&scratch_), bytes, stream));
    }
    params_.data = scratch_;
    params_.rows = spec.rows;
    params_.cols = spec.cols;
    params_.dtype = kNVTEFloat32;
    params_.rowwise = true;
  }
  StagedOutput(const StagedOutput &) = delete;
  StagedOutput &operator=(const StagedOutput &) = delete;
  // Frees the scratch if finish() was not reached (an error on the way); errors here are dropped,
  // the first one has already been raised.
  ~StagedOutput() {
    if (scratch_ != nullptr) (void)cudaFreeAsync(scratch_, stream_);
  }

  const OutputParams &params() const { return params_; }
  // The element type the producer kernel stores (fp32 when staged).
  DType store_dtype() const { return params_.dtype; }

  // After the producer kernel: MXFP8 outputs are quantized from the scratch, which is then freed
  // (stream-ordered, so after the quantize kernel has read it).
  void finish() {
    if (!spec_.mx) return;
    launch_quantize_f32(scratch_, out_, spec_, stream_);  // empty outputs too: it writes amax
    float *s = scratch_;
    scratch_ = nullptr;
    if (s != nullptr) NVTE_CHECK_CUDA(cudaFreeAsync(s, stream_));
  }

 private:
  const Tensor &out_;
  OutputSpec spec_;
  cudaStream_t stream_;
  OutputParams params_;
  float *scratch_ = nullptr;
};

}  // namespace gpu
}  // namespace nvte
