// GPU launchers of nvte_cublas_gemm (gemm_gpu.cu routes, gemm_cublaslt.cu, gemm_tiled.cu). Plain
// C++: no runtime headers, streams as void*. Arguments arrive validated by gemm.cpp, which has read
// no tensor memory: scale_inv, scale and amax stay device pointers and are used as such.
#pragma once

#include <cstddef>

#include "../cast/output_spec.h"
#include "../util/tensor.h"

namespace nvte {
namespace gpu {

// One GEMM in row-major terms, as gemm.h defines it: D[n, m] = opB(B)[n, k] @ opA(A)[k, m].
struct GemmArgs {
  const Tensor *A = nullptr;             // row-major [k, m], or [m, k] when transa
  const Tensor *B = nullptr;             // row-major [n, k], or [k, n] when transb
  const Tensor *D = nullptr;             // output [n, m] (+ transposed FP8 copy [m, n])
  const Tensor *bias = nullptr;          // nullptr when empty; an output in grad mode
  const Tensor *pre_gelu_out = nullptr;  // nullptr when empty; output (forward) or input (grad)
  const Tensor *workspace = nullptr;     // nullptr when absent or without data; cuBLASLt scratch
  size_t m = 0, n = 0, k = 0;
  bool transa = false, transb = false;
  bool grad = false;        // backward epilogues (dGELU, bias gradients)
  bool accumulate = false;  // beta != 0: D's previous value is read
  float alpha = 1.0f;       // D = beta * D + epilogue(alpha * product) (gemm.h)
  float beta = 1.0f;        // used when accumulate
  int math_sm_count = 0;    // > 0: SM count cuBLASLt should target (TE's math_sm_count)
};

// Runs the GEMM on `stream`: cuBLASLt where it is built, loadable and supports the combination
// (CUDA), otherwise the project's tiled kernel (ROCm, FNUZ FP8, pre-sm_89 FP8, epilogue orders
// cuBLASLt does not have). `d_spec` is validate_output(D) for the shape [n, m].
void launch_gemm(const GemmArgs &args, const OutputSpec &d_spec, void *stream);

// ---- backends (used by launch_gemm; exposed for benchmarks)
// Returns false, having written nothing, when cuBLASLt is absent (not built, library not loadable)
// or rejects this combination; true once the GEMM is enqueued.
bool launch_gemm_cublaslt(const GemmArgs &args, const OutputSpec &d_spec, void *stream);
// The tiled kernel: every combination gemm.h allows (per-tensor D only).
void launch_gemm_tiled(const GemmArgs &args, const OutputSpec &d_spec, void *stream);

}  // namespace gpu
}  // namespace nvte
