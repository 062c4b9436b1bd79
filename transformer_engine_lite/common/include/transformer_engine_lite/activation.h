/* Activations and gated activations, forward and backward, with optional fused FP8 output. */
#ifndef TRANSFORMER_ENGINE_LITE_ACTIVATION_H_
#define TRANSFORMER_ENGINE_LITE_ACTIVATION_H_

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element-wise: output = act(input), same shape. input fp32/fp16/bf16; output fp32/fp16/bf16 or FP8
 * (per-tensor: scale from output's kNVTEScale, amax recorded, scale_inv written; or MXFP8).
 * Backward: output = grad * act'(input), grad and input of the same shape and dtype; output of that
 *   shape in any dtype the forward accepts (FP8 included). Math is fp32 throughout. No output buffer
 *   may overlap an input (no in-place activations).
 *   gelu:  tanh approximation 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
 *   qgelu: x * sigmoid(1.702x)         relu: max(x, 0)
 *   srelu: max(x, 0)^2                 silu: x * sigmoid(x)
 */
NVTE_API NVTEStatus nvte_gelu(const NVTETensor input, NVTETensor output, NVTEStream stream);
NVTE_API NVTEStatus nvte_qgelu(const NVTETensor input, NVTETensor output, NVTEStream stream);
NVTE_API NVTEStatus nvte_relu(const NVTETensor input, NVTETensor output, NVTEStream stream);
NVTE_API NVTEStatus nvte_srelu(const NVTETensor input, NVTETensor output, NVTEStream stream);
NVTE_API NVTEStatus nvte_silu(const NVTETensor input, NVTETensor output, NVTEStream stream);

NVTE_API NVTEStatus nvte_dgelu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                               NVTEStream stream);
NVTE_API NVTEStatus nvte_dqgelu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                                NVTEStream stream);
NVTE_API NVTEStatus nvte_drelu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                               NVTEStream stream);
NVTE_API NVTEStatus nvte_dsrelu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                                NVTEStream stream);
NVTE_API NVTEStatus nvte_dsilu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                               NVTEStream stream);

/* Gated (TE layout): input [..., 2H] = [a | b], output [..., H] = act(a) * b.
 * Backward: grad [..., H] (input's dtype), input [..., 2H], output [..., 2H] =
 * [grad*b*act'(a) | grad*act(a)] in any output dtype of the forward. An odd last dim is rejected.
 * geglu = gelu gate, qgeglu = qgelu, reglu = relu, sreglu = srelu, swiglu = silu,
 * glu = sigmoid (TE's GLU: sigmoid(a) * b). */
NVTE_API NVTEStatus nvte_geglu(const NVTETensor input, NVTETensor output, NVTEStream stream);
NVTE_API NVTEStatus nvte_qgeglu(const NVTETensor input, NVTETensor output, NVTEStream stream);
NVTE_API NVTEStatus nvte_reglu(const NVTETensor input, NVTETensor output, NVTEStream stream);
NVTE_API NVTEStatus nvte_sreglu(const NVTETensor input, NVTETensor output, NVTEStream stream);
NVTE_API NVTEStatus nvte_swiglu(const NVTETensor input, NVTETensor output, NVTEStream stream);
NVTE_API NVTEStatus nvte_glu(const NVTETensor input, NVTETensor output, NVTEStream stream);

NVTE_API NVTEStatus nvte_dgeglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                                NVTEStream stream);
NVTE_API NVTEStatus nvte_dqgeglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                                 NVTEStream stream);
NVTE_API NVTEStatus nvte_dreglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                                NVTEStream stream);
NVTE_API NVTEStatus nvte_dsreglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                                 NVTEStream stream);
NVTE_API NVTEStatus nvte_dswiglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                                 NVTEStream stream);
NVTE_API NVTEStatus nvte_dglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                              NVTEStream stream);

/* Clamped SwiGLU (TE's, GPT-OSS): input [..., 2H] = [a | b], output [..., H] =
 * min(a, limit) * sigmoid(alpha * min(a, limit)) * (clamp(b, -limit, limit) + 1), in fp32 then
 * the output dtype (HP or FP8, per-tensor or MXFP8). Backward: output [..., 2H] = [da | db], zero
 * where the clamp is active (a > limit; |b| > limit). limit: finite and > 0; alpha: finite. */
NVTE_API NVTEStatus nvte_clamped_swiglu(const NVTETensor input, NVTETensor output, float limit,
                                        float alpha, NVTEStream stream);
NVTE_API NVTEStatus nvte_clamped_dswiglu(const NVTETensor grad, const NVTETensor input,
                                         NVTETensor output, float limit, float alpha,
                                         NVTEStream stream);
/* TE's _v2: the same with (clamp(b, -limit, limit) + glu_linear_offset) as the linear half
 * (nvte_clamped_swiglu is glu_linear_offset = 1); glu_linear_offset: finite. */
NVTE_API NVTEStatus nvte_clamped_swiglu_v2(const NVTETensor input, NVTETensor output, float limit,
                                           float alpha, float glu_linear_offset,
                                           NVTEStream stream);
NVTE_API NVTEStatus nvte_clamped_dswiglu_v2(const NVTETensor grad, const NVTETensor input,
                                            NVTETensor output, float limit, float alpha,
                                            float glu_linear_offset, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif
