// C API of LayerNorm forward/backward; checks and routing: norm_api.cpp (shared with RMSNorm).
#include "transformer_engine_lite/normalization.h"

#include "../util/api.h"
#include "norm_api.h"

NVTEStatus nvte_layernorm_fwd(const NVTETensor x, const NVTETensor gamma, const NVTETensor beta,
                              const float epsilon, NVTETensor z, NVTETensor mu, NVTETensor rsigma,
                              NVTETensor workspace, const int multiprocessorCount,
                              const bool zero_centered_gamma, NVTEStream stream) {
  (void)multiprocessorCount;  // launch hint of TE's kernels; ours size their grids themselves
  return nvte::guarded("nvte_layernorm_fwd", [&] {
    nvte::norm_fwd_api(nvte::NormKind::kLayerNorm, "nvte_layernorm_fwd", x, gamma, beta, epsilon, z,
                       mu, rsigma, workspace, zero_centered_gamma, stream);
  });
}

NVTEStatus nvte_layernorm_bwd(const NVTETensor dz, const NVTETensor x, const NVTETensor mu,
                              const NVTETensor rsigma, const NVTETensor gamma, NVTETensor dx,
                              NVTETensor dgamma, NVTETensor dbeta, NVTETensor workspace,
                              const int multiprocessorCount, const bool zero_centered_gamma,
                              NVTEStream stream) {
  (void)multiprocessorCount;
  return nvte::guarded("nvte_layernorm_bwd", [&] {
    nvte::norm_bwd_api(nvte::NormKind::kLayerNorm, "nvte_layernorm_bwd", dz, x, mu, rsigma, gamma,
                       dx, dgamma, dbeta, workspace, zero_centered_gamma, stream);
  });
}
