// GPU launchers of the activation family (activation.cu). Plain C++: no runtime headers, streams as
// void*. Arguments arrive validated by activation.cpp; results are the CPU kernels' fp32 formulas
// (activation_cpu.cpp) written into any OutputSpec (per-tensor FP8 fused, MXFP8 staged).
#pragma once

#include "../cast/output_spec.h"
#include "../util/tensor.h"
#include "activation_kind.h"

namespace nvte {
namespace gpu {

// output = act(input); gated: input [rows, 2H] = [a | b], output [rows, H] = act(a) * b.
void launch_activation_fwd(Activation act, bool gated, const Tensor &input, const Tensor &out,
                           const OutputSpec &spec, void *stream);
// output = grad * act'(input); gated: grad [rows, H], output [rows, 2H] =
// [grad * b * act'(a) | grad * act(a)].
void launch_activation_bwd(Activation act, bool gated, const Tensor &grad, const Tensor &input,
                           const Tensor &out, const OutputSpec &spec, void *stream);

// Clamped SwiGLU (util/math.h ClampedSwiGLU): the gated layout above with limit / alpha and the
// linear half's offset.
void launch_clamped_swiglu_fwd(const Tensor &input, float limit, float alpha, float offset,
                               const Tensor &out, const OutputSpec &spec, void *stream);
void launch_clamped_swiglu_bwd(const Tensor &grad, const Tensor &input, float limit, float alpha,
                               float offset, const Tensor &out, const OutputSpec &spec,
                               void *stream);

}  // namespace gpu
}  // namespace nvte
