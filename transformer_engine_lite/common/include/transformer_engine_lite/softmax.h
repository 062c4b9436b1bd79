/* Fused scaled softmax variants used by unfused attention (TE's Megatron-style kernels). */
#ifndef TRANSFORMER_ENGINE_LITE_SOFTMAX_H_
#define TRANSFORMER_ENGINE_LITE_SOFTMAX_H_

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* All variants: softmax over the last dim of scale_factor * input, computed in fp32; input and
 * softmax_results have the same shape and dtype (fp32, fp16 or bf16). Backward:
 * output_grads = scale_factor * y * (dy - sum(dy * y)), with y = softmax_results, dy = incoming_grads
 * (output_grads may alias incoming_grads, as in TE); all three tensors share one shape and dtype.
 * An output may be the very buffer of an input (same pointer, in place) but must not partly overlap
 * one. scale_factor must be finite. */

/*! input [b, h, sq, sk]. */
NVTE_API NVTEStatus nvte_scaled_softmax_forward(const NVTETensor input, NVTETensor softmax_results,
                                                float scale_factor, NVTEStream stream);
NVTE_API NVTEStatus nvte_scaled_softmax_backward(const NVTETensor incoming_grads,
                                                 const NVTETensor softmax_results,
                                                 NVTETensor output_grads, float scale_factor,
                                                 NVTEStream stream);

/*! input [b, h, sq, sk]; mask byte (kNVTEByte) [b or 1, 1, sq, sk], broadcast over heads; 1 (any
 *  nonzero byte) = masked: the logit becomes -10000, unscaled (a fully masked row is uniform, as in
 *  TE). The backward needs no mask: y is 0 at masked positions. */
NVTE_API NVTEStatus nvte_scaled_masked_softmax_forward(const NVTETensor input,
                                                       const NVTETensor mask,
                                                       NVTETensor softmax_results,
                                                       float scale_factor, NVTEStream stream);
NVTE_API NVTEStatus nvte_scaled_masked_softmax_backward(const NVTETensor incoming_grads,
                                                        const NVTETensor softmax_results,
                                                        NVTETensor output_grads,
                                                        float scale_factor, NVTEStream stream);

/*! input [attn_batches, sq, sq]: position j > i is masked (probability exactly 0). */
NVTE_API NVTEStatus nvte_scaled_upper_triang_masked_softmax_forward(const NVTETensor input,
                                                                    NVTETensor softmax_results,
                                                                    float scale_factor,
                                                                    NVTEStream stream);
NVTE_API NVTEStatus nvte_scaled_upper_triang_masked_softmax_backward(
    const NVTETensor incoming_grads, const NVTETensor softmax_results, NVTETensor output_grads,
    float scale_factor, NVTEStream stream);

/*! input [b, h, sq, sk], causal mask aligned to the bottom right: row i keeps j <= i + (sk - sq);
 *  a row with nothing kept gets probability 0 everywhere. */
NVTE_API NVTEStatus nvte_scaled_aligned_causal_masked_softmax_forward(const NVTETensor input,
                                                                      NVTETensor softmax_results,
                                                                      float scale_factor,
                                                                      NVTEStream stream);
NVTE_API NVTEStatus nvte_scaled_aligned_causal_masked_softmax_backward(
    const NVTETensor incoming_grads, const NVTETensor softmax_results, NVTETensor output_grads,
    float scale_factor, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif
