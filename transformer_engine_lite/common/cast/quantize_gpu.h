// GPU launchers of the cast family (cast/quantize.cu, cast/transpose.cu). Plain C++: no runtime
// headers, streams as void*. Arguments are validated by the API entries before these are called.
#pragma once

#include "../util/tensor.h"
#include "output_spec.h"

namespace nvte {
namespace gpu {

void launch_quantize(const Tensor &in, const Tensor &out, const OutputSpec &spec, void *stream);
void launch_dequantize(const Tensor &in, const Tensor &out, void *stream);
void launch_compute_amax(const Tensor &in, const Tensor &out, void *stream);
void launch_compute_scale_from_amax(const Tensor &out, const QuantizationConfig &config,
                                    void *stream);
void launch_transpose(const Tensor &in, const Tensor &out, void *stream);
void launch_cast_transpose(const Tensor &in, const Tensor &out, const OutputSpec &spec,
                           void *stream);

// Quantizes fp32 values in device memory, `src` [spec.rows, spec.cols], into `out` (any OutputSpec:
// plain, per-tensor FP8 with amax/scale_inv/transposed copy, or MXFP8 row/column-wise). Fused GPU
// producers (norms, activations, GEMM) stage MXFP8 outputs through this.
void launch_quantize_f32(const float *src, const Tensor &out, const OutputSpec &spec, void *stream);

}  // namespace gpu
}  // namespace nvte
