/* LayerNorm and RMSNorm, forward and backward, with optional fused FP8 output. */
#ifndef TRANSFORMER_ENGINE_LITE_NORMALIZATION_H_
#define TRANSFORMER_ENGINE_LITE_NORMALIZATION_H_

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Conventions shared by all four functions (TE's):
 *  - x, z, dz, dx: [rows, hidden] (leading dims flattened), fp32/fp16/bf16; z may be FP8 (per-tensor
 *    scale from z's kNVTEScale, amax into kNVTEAmax, 1/scale into kNVTERowwiseScaleInv) or MXFP8;
 *  - gamma, beta, dgamma, dbeta: [hidden], fp32 or x's dtype; mu, rsigma: fp32 [rows];
 *  - zero_centered_gamma: the weight applied is (1 + gamma);
 *  - workspace query: if `workspace` has no data pointer, the call only sets workspace's shape and
 *    dtype and returns; allocate that and call again. The backward's workspace holds fp32 partial
 *    sums of dgamma/dbeta whose number fixes the reduction order, so results are deterministic;
 *  - multiprocessorCount: ignored on the CPU (kept for TE source compatibility).
 */
NVTE_API NVTEStatus nvte_layernorm_fwd(const NVTETensor x, const NVTETensor gamma,
                                       const NVTETensor beta, const float epsilon, NVTETensor z,
                                       NVTETensor mu, NVTETensor rsigma, NVTETensor workspace,
                                       const int multiprocessorCount,
                                       const bool zero_centered_gamma, NVTEStream stream);

NVTE_API NVTEStatus nvte_layernorm_bwd(const NVTETensor dz, const NVTETensor x,
                                       const NVTETensor mu, const NVTETensor rsigma,
                                       const NVTETensor gamma, NVTETensor dx, NVTETensor dgamma,
                                       NVTETensor dbeta, NVTETensor workspace,
                                       const int multiprocessorCount,
                                       const bool zero_centered_gamma, NVTEStream stream);

NVTE_API NVTEStatus nvte_rmsnorm_fwd(const NVTETensor x, const NVTETensor gamma,
                                     const float epsilon, NVTETensor z, NVTETensor rsigma,
                                     NVTETensor workspace, const int multiprocessorCount,
                                     const bool zero_centered_gamma, NVTEStream stream);

NVTE_API NVTEStatus nvte_rmsnorm_bwd(const NVTETensor dz, const NVTETensor x,
                                     const NVTETensor rsigma, const NVTETensor gamma, NVTETensor dx,
                                     NVTETensor dgamma, NVTETensor workspace,
                                     const int multiprocessorCount,
                                     const bool zero_centered_gamma, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif
