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
// The tensor-core forward (fused_attn_fwd_mma.cu) when it serves p (bf16/fp16 is the caller's
// check; head dims up to 128, CUDA and gpusim): launches and returns true, else returns false.
bool launch_flash_attn_fwd_mma(const AttnParams &p, void *stream);
// workspace: at least flash_attn_bwd_workspace_bytes(p) bytes of device memory.
void launch_flash_attn_bwd(const AttnParams &p, bool deterministic, void *workspace, void *stream);
// Learnable softmax with nothing to differentiate (no batch or no query rows): d offset = 0.
void zero_softmax_offset_grad(const AttnParams &p, void *stream);
void launch_dropout_mask(const AttnParams &p, uint8_t *mask, void *stream);

}  // namespace gpu
}  // namespace nvte

// Test hook of the GPU builds (tests/cpp/gpu/test_gpu_mma.cpp): d (16x8 fp32, row-major, device) +=
// a (16x16) * b (16x8, as b[k][n]), both row-major 16-bit of `dtype` (bf16 or fp16) in device
// memory, as one warp-level m16n8k16 product of platform/gpu_mma.h.
extern "C" NVTE_API NVTEStatus nvte_gpu_mma_m16n8k16_check(const void *a, const void *b, float *d,
                                                          NVTEDType dtype, NVTEStream stream);
