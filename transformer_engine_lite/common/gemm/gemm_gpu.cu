// GPU GEMM routing: cuBLASLt first where it can take the call, the tiled kernel for the rest.
#include "gemm_gpu.h"

namespace nvte {
namespace gpu {

void launch_gemm(const GemmArgs &args, const OutputSpec &d_spec, void *stream) {
  if (launch_gemm_cublaslt(args, d_spec, stream)) return;
  launch_gemm_tiled(args, d_spec, stream);
}

}  // namespace gpu
}  // namespace nvte
