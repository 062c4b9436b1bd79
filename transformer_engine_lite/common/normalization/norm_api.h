// Argument checks and device routing shared by nvte_layernorm_* and nvte_rmsnorm_* (one code path
// for both norms, so they reject the same inputs with the same messages).
#pragma once

#include "norm_params.h"
#include "transformer_engine_lite/transformer_engine.h"

namespace nvte {

// Body of nvte_{layernorm,rmsnorm}_fwd: beta and mu are NULL (and ignored) for RMSNorm. `op` names
// the C function in messages; `stream` is used by the GPU path only.
void norm_fwd_api(NormKind kind, const char *op, const NVTETensor x, const NVTETensor gamma,
                  const NVTETensor beta, float epsilon, NVTETensor z, NVTETensor mu,
                  NVTETensor rsigma, NVTETensor workspace, bool zero_centered_gamma, void *stream);

// Body of nvte_{layernorm,rmsnorm}_bwd: mu and dbeta are NULL (and ignored) for RMSNorm; add
// (nvte_rmsnorm_bwd_add) is added to dx when given.
void norm_bwd_api(NormKind kind, const char *op, const NVTETensor dz, const NVTETensor x,
                  const NVTETensor mu, const NVTETensor rsigma, const NVTETensor gamma,
                  NVTETensor dx, NVTETensor dgamma, NVTETensor dbeta, NVTETensor workspace,
                  bool zero_centered_gamma, void *stream, const NVTETensor add = nullptr);

}  // namespace nvte
