/* LayerNorm and RMSNorm, forward and backward, with optional fused FP8 output. */
#ifndef TRANSFORMER_ENGINE_LITE_NORMALIZATION_H_
#define TRANSFORMER_ENGINE_LITE_NORMALIZATION_H_

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Conventions shared by all four functions (TE's, with this library's choices spelled out):
 *  - x: [..., hidden] in fp32/fp16/bf16, leading dims flattened into rows (hidden > 0);
 *  - z: x's shape, in fp32/fp16/bf16 (any of them, not necessarily x's) or FP8, quantized in
 *    the same pass: per-tensor (scale from z's kNVTEScale, max|z| before scaling into kNVTEAmax,
 *    1/scale into kNVTERowwiseScaleInv, each when present; optional transposed copy in
 *    kNVTEColumnwiseData) or MXFP8 (row-wise and/or column-wise data with E8M0 scales). A plain z
 *    with an amax buffer also gets its amax;
 *  - dz, dx: x's shape, each in fp32/fp16/bf16 (not necessarily x's);
 *  - gamma: [hidden], fp32 or x's dtype; beta, dgamma, dbeta: [hidden] in gamma's dtype;
 *  - mu, rsigma: fp32 [rows], written by the forward and read by the backward;
 *    rsigma = 1 / sqrt(var + epsilon), var the biased variance over hidden (RMSNorm: mean of x^2);
 *  - epsilon: finite and >= 0 (TE takes any value; a negative one only yields NaN: refused here);
 *  - zero_centered_gamma: the weight applied is (1 + gamma), formed in fp32;
 *  - all math in fp32; no output may share memory with an input;
 *  - any invalid argument fails the call before a single output byte is written;
 *  - workspace query: if `workspace` has no data pointer, the call checks the other arguments, sets
 *    only workspace's shape and dtype and returns; allocate that and call again. Forward: byte [1]
 *    (the CPU needs no scratch). Backward: fp32 [chunks, hidden] (RMSNorm) or [chunks, 2 * hidden]
 *    (LayerNorm), the dgamma/dbeta partial sums of a fixed split of the rows into `chunks` (a
 *    function of rows only); they are summed in order, so results are deterministic and do not
 *    depend on the thread count. The call then accepts exactly the queried shape;
 *  - multiprocessorCount, stream: ignored on the CPU (kept for TE source compatibility).
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

/*! nvte_rmsnorm_bwd that also adds `add` ([N, H], fp32/fp16/bf16, x's shape) to dx: TE's fused
 *  residual-gradient add (dx = rmsnorm_bwd(dz) + add, added in fp32 before dx's one rounding).
 *  Workspace query and everything else as nvte_rmsnorm_bwd; `add` must not overlap an output. */
NVTE_API NVTEStatus nvte_rmsnorm_bwd_add(const NVTETensor dz, const NVTETensor x,
                                         const NVTETensor add, const NVTETensor rsigma,
                                         const NVTETensor gamma, NVTETensor dx, NVTETensor dgamma,
                                         NVTETensor workspace, const int multiprocessorCount,
                                         const bool zero_centered_gamma, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif
