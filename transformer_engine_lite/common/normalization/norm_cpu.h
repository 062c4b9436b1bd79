// CPU launchers of LayerNorm / RMSNorm forward and backward; params arrive already validated.
#pragma once

#include "../cast/emit_cpu.h"
#include "norm_params.h"

namespace nvte {

void launch_norm_fwd(const NormFwdParams &p, const OutputEmitter &z);
void launch_norm_bwd(const NormBwdParams &p);

}  // namespace nvte
