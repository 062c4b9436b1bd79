/* GEMM with TE's nvte_cublas_gemm semantics (column-major), on the CPU through oneDNN. */
#ifndef TRANSFORMER_ENGINE_LITE_GEMM_H_
#define TRANSFORMER_ENGINE_LITE_GEMM_H_

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! D = op(A) * op(B) in cuBLAS's column-major terms, exactly as TE's nvte_cublas_gemm:
 *  A, B, D are row-major tensors [rows, cols]; seen column-major, A is cols x rows.
 *  m = transa ? A.rows : A.cols, k = transa ? A.cols : A.rows, n = transb ? B.cols : B.rows;
 *  D has row-major shape [n, m]. In row-major terms: D = opB(B) @ opA(A) with
 *  opB(B) = transb ? B^T : B ([n, k]) and opA(A) = transa ? A^T : A ([k, m]).
 *  (TE's Linear forward is gemm(weight, input, transa=true, transb=false): D = input @ weight^T.)
 *
 *  A, B: fp32, fp16, bf16 or FP8 (E4M3/E5M2/FNUZ, per-tensor; their kNVTERowwiseScaleInv is applied).
 *  D: fp32, fp16, bf16, or FP8 (per-tensor: scale from kNVTEScale, amax recorded, scale_inv written).
 *  Forward (grad=false): D = acc + gelu(X + bias) where X = op(B)op(A); bias [m] (may be empty);
 *    if pre_gelu_out is non-empty it receives X + bias and D gets gelu of it; acc = D's previous
 *    value when accumulate, else 0.
 *  Backward (grad=true): if pre_gelu_out is non-empty, D = acc + X * gelu'(pre_gelu_out) and a
 *    non-empty bias receives the sum of that product over the n rows ([m], dgelu + bias-grad);
 *    otherwise a non-empty bias receives the bias gradient of op(B): bias[j] = sum_k opB(B)[j, k]
 *    ([n]), and D = acc + X.
 *  workspace, use_split_accumulator and math_sm_count are accepted and ignored on the CPU (oneDNN
 *  manages its own scratch; accumulation is always FP32).
 */
NVTE_API NVTEStatus nvte_cublas_gemm(const NVTETensor A, const NVTETensor B, NVTETensor D,
                                     const NVTETensor bias, NVTETensor pre_gelu_out, bool transa,
                                     bool transb, bool grad, NVTETensor workspace, bool accumulate,
                                     bool use_split_accumulator, int math_sm_count,
                                     NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif
