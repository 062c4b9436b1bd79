// GPU launchers of the fused MoE router (fused_router.cu). Plain C++: no runtime headers, streams
// as void*. Arguments arrive validated by fused_router.cpp; the same contracts as
// fused_router_cpu.h, but const_buf (Const_buf's device copy of c) is read on the device.
#pragma once

#include "../util/tensor.h"
#include "fused_router_params.h"

namespace nvte {
namespace gpu {

void launch_router_topk_fwd(const RouterParams &p, DType dtype, const void *logits, void *probs,
                            uint8_t *map, float *inter, void *stream);
void launch_router_topk_bwd(const RouterParams &p, DType dtype, const uint8_t *map,
                            const float *inter, const void *grad_probs, void *grad_logits,
                            void *stream);
void launch_router_score_fwd(const RouterParams &p, DType dtype, const void *logits, float *scores,
                             uint8_t *map, float *inter, void *stream);
void launch_router_score_bwd(const RouterParams &p, DType dtype, const float *inter,
                             const float *grad_scores, void *grad_logits, void *stream);
// Also writes c into const_buf[0].
void launch_moe_aux_loss_fwd(size_t rows, size_t cols, float c, DType dtype, const void *probs,
                             DType count_dtype, const void *counts, void *aux_loss,
                             float *const_buf, void *stream);
void launch_moe_aux_loss_bwd(size_t rows, size_t cols, const float *const_buf, DType count_dtype,
                             const void *counts, DType dtype, const void *grad_aux_loss,
                             void *grad_probs, void *stream);

}  // namespace gpu
}  // namespace nvte
