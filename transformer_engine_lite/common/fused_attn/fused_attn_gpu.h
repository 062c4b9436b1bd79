// GPU flash attention launchers (fused_attn.cu; hipified for ROCm). Plain C++ header: no runtime
// headers, streams as void*. Same semantics as fused_attn_cpu.h; arguments validated by
// fused_attn.cpp.
#pragma once

#include <cstddef>

#include "attn_params.h"

namespace nvte {
namespace gpu {

// Bytes of device workspace the backward needs for p (fp32 dQ accumulators etc.); 0 for the forward.
size_t flash_attn_bwd_workspace_bytes(const AttnParams &p);
void launch_flash_attn_fwd(const AttnParams &p, void *stream);
// workspace: at least flash_attn_bwd_workspace_bytes(p) bytes of device memory.
void launch_flash_attn_bwd(const AttnParams &p, bool deterministic, void *workspace, void *stream);
// Learnable softmax with nothing to differentiate (no batch or no query rows): d offset = 0.
void zero_softmax_offset_grad(const AttnParams &p, void *stream);
void launch_dropout_mask(const AttnParams &p, uint8_t *mask, void *stream);

}  // namespace gpu
}  // namespace nvte
