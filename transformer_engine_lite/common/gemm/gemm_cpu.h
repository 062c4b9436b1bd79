// CPU launchers of nvte_cublas_gemm: take arguments already validated by gemm.cpp and write outputs.
#pragma once

#include <cstddef>

#include "../cast/emit_cpu.h"
#include "../util/tensor.h"

namespace nvte {
namespace gemm {

// `d_out` is the OutputEmitter over D built (and thereby validated) by gemm.cpp.

// One GEMM in row-major terms: D[n, m] = opB(B)[n, k] @ opA(A)[k, m] (see gemm.h for the
// column-major view). Every pointer and shape here has been checked by gemm.cpp.
struct GemmParams {
  const Tensor *A = nullptr;             // row-major [k, m], or [m, k] when transa
  const Tensor *B = nullptr;             // row-major [n, k], or [k, n] when transb
  const Tensor *D = nullptr;             // output [n, m]; written through its data pointers
  const Tensor *bias = nullptr;          // nullptr when empty; an output in grad mode
  const Tensor *pre_gelu_out = nullptr;  // nullptr when empty; output (fwd) or input (grad)
  size_t m = 0, n = 0, k = 0;
  bool transa = false, transb = false;
  bool accumulate = false;  // beta != 0: D's previous value is read
  float alpha = 1.0f;        // scales the product (nvte_cublas_gemm_scaled)
  float beta = 1.0f;         // scales D's previous value (used when accumulate)
  float scale_inv_a = 1.0f;  // FP8 operands' scale_inv (1 for other dtypes)
  float scale_inv_b = 1.0f;
};

// With X = alpha * op(B)op(A) and acc = beta * D's previous value (0 without accumulate):
// grad = false: D = acc + [gelu](X + bias), pre_gelu_out = X + bias.
void launch_gemm_fwd(const GemmParams &p, const OutputEmitter &d_out);
// grad = true: D = acc + X [* gelu'(pre_gelu_out)], bias = column sums of that product (dgelu) or
// row sums of op(B) (no pre_gelu_out; alpha does not enter).
void launch_gemm_bwd(const GemmParams &p, const OutputEmitter &d_out);

}  // namespace gemm
}  // namespace nvte
