// GPU launchers of LayerNorm / RMSNorm (norm.cu). Plain C++: no runtime headers, streams as void*.
// Params arrive validated by norm_api.cpp; results follow the CPU kernels' formulas (norm_cpu.cpp).
#pragma once

#include "../cast/output_spec.h"
#include "norm_params.h"

namespace nvte {
namespace gpu {

// z in any OutputSpec (per-tensor FP8 fused with amax / scale_inv; MXFP8 staged through fp32).
void launch_norm_fwd(const NormFwdParams &p, const Tensor &z, const OutputSpec &spec, void *stream);
// dx per row; dgamma / dbeta through per-chunk partial sums in p.workspace (the CPU's chunking),
// reduced in chunk order: bit-identical to the CPU's dgamma / dbeta.
void launch_norm_bwd(const NormBwdParams &p, void *stream);

}  // namespace gpu
}  // namespace nvte
