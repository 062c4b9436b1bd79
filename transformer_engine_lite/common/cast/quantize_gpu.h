// GPU launchers of the cast family (cast/quantize.cu, cast/transpose.cu). Plain C++: no runtime
// headers, streams as void*. Arguments are validated by the API entries before these are called.
#pragma once

#include "../util/tensor.h"
#include "block_quantize.h"
#include "nvfp4_quantize.h"
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

// Float8BlockScaling quantize (cast/block_quantize.cu), the CPU kernel's bytes and scale grids.
void launch_block_quantize(const Tensor &in, const Tensor &out, const BlockSpec &spec,
                           const QuantizationConfig &cfg, void *stream);
// Float8BlockScaling dequantize of the copy `spec` names (validate_block_input), the CPU bytes.
void launch_block_dequantize(const Tensor &in, const BlockSpec &spec, const SimpleTensor &out,
                             void *stream);
// NVFP4 quantize (cast/nvfp4_quantize.cu), the CPU kernel's bytes, scales and amaxes.
void launch_nvfp4_quantize(const Tensor &in, const Tensor &out, const Nvfp4Spec &spec,
                           void *stream);
// NVFP4 dequantize of the copy `spec` names (validate_nvfp4_input), the CPU bytes.
void launch_nvfp4_dequantize(const Tensor &in, const Nvfp4Spec &spec, const SimpleTensor &out,
                             void *stream);

}  // namespace gpu
}  // namespace nvte
