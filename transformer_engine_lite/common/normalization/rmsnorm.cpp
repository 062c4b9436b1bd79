// C API of RMSNorm forward/backward; checks and routing: norm_api.cpp (shared with LayerNorm).
#include "transformer_engine_lite/normalization.h"

#include "../util/api.h"
#include "norm_api.h"

NVTEStatus nvte_rmsnorm_fwd(const NVTETensor x, const NVTETensor gamma, const float epsilon,
                            NVTETensor z, NVTETensor rsigma, NVTETensor workspace,
                            const int multiprocessorCount, const bool zero_centered_gamma,
                            NVTEStream stream) {
  (void)multiprocessorCount;  // launch hint of TE's kernels; ours size their grids themselves
  return nvte::guarded("nvte_rmsnorm_fwd", [&] {
    nvte::norm_fwd_api(nvte::NormKind::kRMSNorm, "nvte_rmsnorm_fwd", x, gamma, nullptr, epsilon, z,
                       nullptr, rsigma, workspace, zero_centered_gamma, stream);
  });
}

NVTEStatus nvte_rmsnorm_bwd(const NVTETensor dz, const NVTETensor x, const NVTETensor rsigma,
                            const NVTETensor gamma, NVTETensor dx, NVTETensor dgamma,
                            NVTETensor workspace, const int multiprocessorCount,
                            const bool zero_centered_gamma, NVTEStream stream) {
  (void)multiprocessorCount;
  return nvte::guarded("nvte_rmsnorm_bwd", [&] {
    nvte::norm_bwd_api(nvte::NormKind::kRMSNorm, "nvte_rmsnorm_bwd", dz, x, nullptr, rsigma, gamma,
                       dx, dgamma, nullptr, workspace, zero_centered_gamma, stream);
  });
}

NVTEStatus nvte_rmsnorm_bwd_add(const NVTETensor dz, const NVTETensor x, const NVTETensor add,
                                const NVTETensor rsigma, const NVTETensor gamma, NVTETensor dx,
                                NVTETensor dgamma, NVTETensor workspace,
                                const int multiprocessorCount, const bool zero_centered_gamma,
                                NVTEStream stream) {
  (void)multiprocessorCount;
  return nvte::guarded("nvte_rmsnorm_bwd_add", [&] {
    nvte::norm_bwd_api(nvte::NormKind::kRMSNorm, "nvte_rmsnorm_bwd_add", dz, x, nullptr, rsigma,
                       gamma, dx, dgamma, nullptr, workspace, zero_centered_gamma, stream, add);
  });
}
