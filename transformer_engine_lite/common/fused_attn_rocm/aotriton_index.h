// The AOTriton image table: one entry per compiled Triton kernel variant and arch. The definitions
// are generated at build time by build_tools/aotriton.py (aotriton_index.cpp in the build tree, the
// images embedded); nothing here is committed but this declaration.
#pragma once

#include <cstddef>

namespace nvte {
namespace aotriton {

struct KernelImage {
  const char *kernel;  // attn_fwd, attn_bwd_preprocess, attn_bwd_dkdv, attn_bwd_dq
  const char *arch;    // gfx90a, gfx942, gfx950, sm_80, sm_90
  const char *dtype;   // bf16, fp16
  int block_d;
  int stride_align;  // 16: compiled assuming every stride_* % 16 == 0 (vector loads); 1: any
  int block_m, block_n;
  const char *entry;  // the symbol in the image
  int num_warps, warp_size;
  unsigned shared;     // dynamic shared memory / LDS bytes per block (Triton's metadata.shared)
  const char *params;  // "name:type,..." non-constexpr params in order, then the scratch pointers
  const char *grid;    // "q_blocks|kv_blocks,batch_heads|batch_heads_kv"
  const unsigned char *image;
  size_t image_size;
  const char *sha256;
};

extern const char kArchs[];  // "gfx90a,gfx942": archs with images in this build
extern const size_t kKernelCount;
extern const KernelImage kKernels[];

}  // namespace aotriton
}  // namespace nvte
