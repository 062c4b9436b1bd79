// The AOTriton backend's glue: picks the compiled Triton kernel variant for an attention call,
// packs its arguments by name from AttnParams, and launches it (fused_attn_aotriton.cpp). Built
// into GPU libraries that have AOTriton images (NVTE_WITH_AOTRITON).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../fused_attn/attn_params.h"
#include "aotriton_arch.h"
#include "aotriton_index.h"

namespace nvte {
namespace aotriton {

// The variant of `kernel` for (arch, dtype, head_dim): the smallest BLOCK_D >= head_dim, compiled
// for 16-aligned strides when strides16 (else for any stride); nullptr if this build has none.
const KernelImage *find_kernel(const char *kernel, const std::string &arch, NVTEDType dtype,
                               int64_t head_dim, bool strides16 = false);
// Whether every stride of p is a multiple of 16 elements (the aligned variants' assumption).
bool strides_aligned16(const AttnParams &p);

// "" when the kernels can run p on a device of this arch, else why not.
std::string unsupported_reason(const AttnParams &p, const std::string &device_arch);

// One packed kernel argument: its name, the bytes the kernel reads, their size.
struct Arg {
  std::string name;
  uint64_t bits = 0;
  size_t size = 0;
};
// k's parameters in order, valued from p (delta: the backward's rowsum(dO*O) buffer). Raises for a
// parameter name outside the launcher's vocabulary or a malformed type.
std::vector<Arg> pack_args(const KernelImage &k, const AttnParams &p, float *delta);
// Grid of k for p (its grid rule over BLOCK_M / BLOCK_N and b*h / b*h_kv).
void grid_of(const KernelImage &k, const AttnParams &p, unsigned grid[3]);

size_t bwd_workspace_bytes(const AttnParams &p);  // the fp32 Delta buffer [b, h, s_q]
void run_fwd(const AttnParams &p, int device, const std::string &device_arch, void *stream);
void run_bwd(const AttnParams &p, int device, const std::string &device_arch, void *workspace,
             void *stream);

}  // namespace aotriton
}  // namespace nvte
