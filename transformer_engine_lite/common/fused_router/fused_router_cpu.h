// CPU launchers of the fused MoE router (fused_router.h). Arguments arrive validated by
// fused_router.cpp; every buffer is dense and row-major.
#pragma once

#include "../util/tensor.h"
#include "fused_router_params.h"

namespace nvte {

// logits, probs: [tokens, experts] of `dtype`; map: uint8; inter: fp32.
void launch_router_topk_fwd(const RouterParams &p, DType dtype, const void *logits, void *probs,
                            uint8_t *map, float *inter);
// grad_probs, grad_logits: [tokens, experts] of `dtype`.
void launch_router_topk_bwd(const RouterParams &p, DType dtype, const uint8_t *map,
                            const float *inter, const void *grad_probs, void *grad_logits);
// scores: fp32 [tokens, experts].
void launch_router_score_fwd(const RouterParams &p, DType dtype, const void *logits, float *scores,
                             uint8_t *map, float *inter);
void launch_router_score_bwd(const RouterParams &p, DType dtype, const float *inter,
                             const float *grad_scores, void *grad_logits);
// aux_loss[0] = c * sum_{r,c} probs[r, col] * counts[col] (probs' dtype).
void launch_moe_aux_loss_fwd(size_t rows, size_t cols, float c, DType dtype, const void *probs,
                             DType count_dtype, const void *counts, void *aux_loss);
// grad_probs[r, col] = c * counts[col] * grad_aux_loss[0] (all of `dtype` but counts).
void launch_moe_aux_loss_bwd(size_t rows, size_t cols, float c, DType count_dtype,
                             const void *counts, DType dtype, const void *grad_aux_loss,
                             void *grad_probs);

}  // namespace nvte
