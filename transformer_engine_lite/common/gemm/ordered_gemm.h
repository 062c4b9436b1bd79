// nvte_ordered_batched_gemm's problem description and its GPU launcher (ordered_gemm.cu); the API
// entry and the CPU kernel are in ordered_gemm_cpu.cpp. Plain C++: no runtime headers, streams as
// void*.
#pragma once

#include <cstddef>

namespace nvte {

// D[b] = op(A[b]) . op(B[b]), fp32, row-major, contiguous batches (see gemm.h). Host or device
// pointers, as the tensors' device; validated by the entry.
struct OrderedGemmProblem {
  const float *a;  // [batch, m, k], or [batch, k, m] when transa
  const float *b;  // [batch, k, n], or [batch, n, k] when transb
  float *d;        // [batch, m, n]
  size_t batch, m, n, k;
  bool transa, transb;
};

namespace gpu {
// The GEMM on `stream`: every output an fmaf chain over k in index order from +0 (the CPU's bits).
void launch_ordered_batched_gemm(const OrderedGemmProblem &p, void *stream);
}  // namespace gpu

}  // namespace nvte
