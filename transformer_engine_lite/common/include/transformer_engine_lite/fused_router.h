/* Fused MoE router: top-k with a score function, scores for the auxiliary loss, and the
 * load-balancing auxiliary loss, forward and backward (TE's fused_router.h, C ABI).
 *
 * score_function: 0 sigmoid, 1 softmax, 2 sqrtsoftplus (sqrt(softplus(x)), softplus(x) = x above
 * 20). Per token (a row of logits [num_tokens, num_experts], fp32 / fp16 / bf16), in fp32:
 *   softmax, use_pre_softmax:  s = softmax(x); select top-k of s; p = s at the selected experts.
 *   softmax, post:             select top-k of x; p = softmax over the k selected logits.
 *   sigmoid / sqrtsoftplus:    s = f(x); select top-k of s + expert_bias (bias for the selection
 *                              only); p = s at the selected experts, divided by their sum + 1e-20
 *                              when topk > 1 (use_pre_softmax is ignored).
 *   probs = scaling_factor * p at the selected experts, 0 elsewhere (logits' dtype); routing_map =
 *   1 there, 0 elsewhere (uint8 / torch bool).
 * Group-limited top-k (num_groups > 0 and group_topk > 0, DeepSeek-V3): the experts form
 * num_groups equal groups; a group's score is the sum of its topk / group_topk best selection
 * scores; the group_topk best groups are kept and the top-k is taken among their experts. Top-k
 * order: higher score first, ties to the lower index (torch.topk's order); NaN ranks lowest.
 * intermediate_output (fp32 [num_tokens, num_experts], for the backward): softmax: the softmax
 * (post: over the selected experts, 0 elsewhere); sigmoid: sigmoid(x); sqrtsoftplus: x.
 *
 * Scores for the aux loss: scores (fp32) = softmax(x), or f(x) / (sum f(x) + 1e-20) for sigmoid /
 * sqrtsoftplus, over all experts; routing_map = top-k of scores.
 *
 * Aux loss (Switch Transformer): probs [num_rows, num_cols] (fp32 / fp16 / bf16), num_cols a
 * multiple of num_experts, tokens_per_expert [num_cols] (int16/int32/int64/fp32/bf16):
 *   C = num_experts * coeff / (topk * total_num_tokens^2),
 *   aux_loss = C * sum_{r,c} probs[r, c] * tokens_per_expert[c]   (one element, probs' dtype),
 *   Const_buf = C (fp32, one element); backward: grad_probs[r, c] = C * tokens_per_expert[c] *
 *   grad_aux_loss (probs' dtype). Sums in fp32.
 *
 * Empty inputs (num_tokens or num_rows 0) are valid: nothing is written but the aux loss (0).
 * Differences from TE: calls return NVTEStatus; routing maps are byte maps (no BITMAP_U8 format,
 * dense top-k index outputs, Quantile Balancing or graph-safe aux-loss entry points).
 */
#ifndef TRANSFORMER_ENGINE_LITE_FUSED_ROUTER_H_
#define TRANSFORMER_ENGINE_LITE_FUSED_ROUTER_H_

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! probs, routing_map, intermediate_output = top-k routing of logits (see above). num_groups /
 *  group_topk <= 0: no group limit. expert_bias: NULL or fp32 [num_experts], sigmoid and
 *  sqrtsoftplus only. */
NVTE_API NVTEStatus nvte_fused_topk_with_score_function_forward(
    const NVTETensor logits, int num_tokens, int num_experts, int topk, int use_pre_softmax,
    int num_groups, int group_topk, float scaling_factor, int score_function,
    const NVTETensor expert_bias, NVTETensor probs, NVTETensor routing_map,
    NVTETensor intermediate_output, NVTEStream stream);

/*! grad_logits (grad_probs' dtype) from the forward's routing_map and intermediate_output. */
NVTE_API NVTEStatus nvte_fused_topk_with_score_function_backward(
    const NVTETensor routing_map, const NVTETensor intermediate_output,
    const NVTETensor grad_probs, int num_tokens, int num_experts, int topk, int use_pre_softmax,
    float scaling_factor, int score_function, NVTETensor grad_logits, NVTEStream stream);

/*! scores (fp32), routing_map, intermediate_output for the aux loss (see above). */
NVTE_API NVTEStatus nvte_fused_score_for_moe_aux_loss_forward(
    const NVTETensor logits, int num_tokens, int num_experts, int topk, int score_function,
    NVTETensor scores, NVTETensor routing_map, NVTETensor intermediate_output, NVTEStream stream);

/*! grad_logits from grad_scores (fp32) and the forward's intermediate_output. */
NVTE_API NVTEStatus nvte_fused_score_for_moe_aux_loss_backward(
    const NVTETensor intermediate_output, const NVTETensor grad_scores, int num_tokens,
    int num_experts, int topk, int score_function, NVTETensor grad_logits, NVTEStream stream);

/*! aux_loss and Const_buf (see above); total_num_tokens > 0, topk > 0. */
NVTE_API NVTEStatus nvte_fused_moe_aux_loss_forward(const NVTETensor probs,
                                                    const NVTETensor tokens_per_expert,
                                                    int total_num_tokens, int num_experts,
                                                    int num_rows, int num_cols, int topk,
                                                    float coeff, NVTETensor aux_loss,
                                                    NVTETensor Const_buf, NVTEStream stream);

/*! grad_probs = Const_buf * tokens_per_expert[c] * grad_aux_loss (one element, grad_probs'
 *  dtype). */
NVTE_API NVTEStatus nvte_fused_moe_aux_loss_backward(const NVTETensor Const_buf,
                                                     const NVTETensor tokens_per_expert,
                                                     int num_rows, int num_cols,
                                                     const NVTETensor grad_aux_loss,
                                                     NVTETensor grad_probs, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_LITE_FUSED_ROUTER_H_ */
