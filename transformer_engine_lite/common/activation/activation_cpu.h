// CPU launchers of the activation family: element-wise and gated, forward and backward.
// Results are fp32, written through an OutputEmitter (any output dtype, FP8 included).
#pragma once

#include "../cast/emit_cpu.h"
#include "../util/tensor.h"
#include "activation_kind.h"

namespace nvte {

// Callers validate first: inputs have data, a high-precision dtype (grad the dtype of input) and
// the shapes the emitter was built for; the emitter has validated the output.

// output = act(input); input [rows, cols] as the emitter's view.
void launch_activation_fwd(Activation act, const Tensor &input, const OutputEmitter &out);
// output = grad * act'(input); grad, input and output share one shape.
void launch_activation_bwd(Activation act, const Tensor &grad, const Tensor &input,
                           const OutputEmitter &out);
// input [rows, 2H] = [a | b], output [rows, H] = act(a) * b.
void launch_gated_activation_fwd(Activation act, const Tensor &input, const OutputEmitter &out);
// grad [rows, H], input [rows, 2H], output [rows, 2H] = [grad * b * act'(a) | grad * act(a)].
void launch_gated_activation_bwd(Activation act, const Tensor &grad, const Tensor &input,
                                 const OutputEmitter &out);

// Clamped SwiGLU (util/math.h ClampedSwiGLU): input [rows, 2H] = [a | b], output [rows, H].
void launch_clamped_swiglu_fwd(const Tensor &input, float limit, float alpha, float offset,
                               const OutputEmitter &out);
// grad [rows, H], input [rows, 2H], output [rows, 2H] = [da | db].
void launch_clamped_swiglu_bwd(const Tensor &grad, const Tensor &input, float limit, float alpha,
                               float offset, const OutputEmitter &out);

}  // namespace nvte
