/* GEMM with TE's nvte_cublas_gemm semantics (column-major): CPU through oneDNN; GPU through cuBLASLt
 * (CUDA, when loadable) or the project's tiled kernel (ROCm, and CUDA combinations cuBLASLt lacks). */
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
 *  Tensors of more than 2 dims are read as [product of leading dims, last dim] (D, pre_gelu_out too).
 *
 *  A, B: fp32, fp16, bf16 or FP8 (E4M3/E5M2/FNUZ, per-tensor; their kNVTERowwiseScaleInv is applied).
 *    Pairs: the same high-precision dtype, or any two FP8 formats (e.g. E4M3 x E5M2); other mixes
 *    give NVTE_ERROR_UNSUPPORTED, as do MXFP8 (block-scaled) operands.
 *  D: fp32, fp16, bf16, or FP8 (per-tensor: scale from kNVTEScale, amax recorded, scale_inv written;
 *    an optional column-wise buffer [m, n] receives the transposed FP8 copy). A D of any dtype with an
 *    amax buffer gets max |result| recorded. accumulate with an FP8 D is NVTE_ERROR_UNSUPPORTED.
 *  X = scale_inv_A * scale_inv_B * op(B)op(A) (scale_inv = 1 for non-FP8 operands), accumulated in
 *    FP32. bias and pre_gelu_out are fp32, fp16 or bf16; "empty" means a NULL handle or no data.
 *  Forward (grad=false): bias [m] (may be empty) is added to every row: Y = X + bias. If pre_gelu_out
 *    is non-empty ([n, m]) it receives Y and D = acc + gelu(Y) (GELU is applied only then, as in TE);
 *    otherwise D = acc + Y. acc = D's previous value when accumulate, else 0.
 *  Backward (grad=true): if pre_gelu_out is non-empty, D = acc + X * gelu'(pre_gelu_out) and a
 *    non-empty bias receives the sum of that product over the n rows ([m], dgelu + bias-grad);
 *    otherwise a non-empty bias receives the bias gradient of op(B): bias[j] = sum_k opB(B)[j, k]
 *    ([n], with B's scale_inv applied), and D = acc + X.
 *  GELU is the tanh approximation. Outputs (D; bias in grad mode; pre_gelu_out in forward) must not
 *  share memory with any other argument. On any error no output is modified.
 *  workspace, use_split_accumulator and math_sm_count are accepted and ignored on the CPU (oneDNN
 *  manages its own scratch; accumulation is always FP32). On the GPU, a workspace with data is
 *  cuBLASLt's scratch (its bytes; without one, scratch is allocated on the stream per call),
 *  math_sm_count > 0 is the SM count cuBLASLt targets, and use_split_accumulator is ignored
 *  (FP8 fast accumulation stays off: accumulation is FP32 everywhere).
 */
NVTE_API NVTEStatus nvte_cublas_gemm(const NVTETensor A, const NVTETensor B, NVTETensor D,
                                     const NVTETensor bias, NVTETensor pre_gelu_out, bool transa,
                                     bool transb, bool grad, NVTETensor workspace, bool accumulate,
                                     bool use_split_accumulator, int math_sm_count,
                                     NVTEStream stream);

/*! nvte_cublas_gemm with TE's scaling factors (TE 2.8's nvte_cublas_gemm_scaled): the product
 *  is scaled by alpha and D's previous value by beta; nvte_cublas_gemm(..., accumulate, ...) is
 *  exactly this call with alpha = 1 and beta = accumulate ? 1 : 0 (same bytes). With X as above:
 *  Forward: Y = alpha * X + bias; pre_gelu_out (if non-empty) = Y and D = beta * D + gelu(Y),
 *    otherwise D = beta * D + Y (TE: "D = GELU(alpha*AB + bias)"; as for accumulate, D's previous
 *    value is added after the GELU).
 *  Backward: D = beta * D + (alpha * X) [* gelu'(pre_gelu_out)]; the dGELU bias gradient sums that
 *    product, so it carries alpha; the bias gradient of op(B) (no pre_gelu_out) is a function of B
 *    alone and does not.
 *  beta = 0 does not read D (its previous contents may be anything, NaN included), as in cuBLAS;
 *  beta != 0 with an FP8 D is NVTE_ERROR_UNSUPPORTED (as accumulate). alpha = 0 still forms the
 *  product (IEEE: a non-finite A or B entry gives NaN). Non-finite alpha or beta is
 *  NVTE_ERROR_INVALID_ARGUMENT (TE does not check; cuBLAS would spread Inf/NaN over all of D).
 *  Rounding: every path computes the whole expression in FP32 and rounds D once: alpha multiplies
 *  the FP32 accumulator together with the FP8 scale_inv (CPU: one oneDNN runtime scale of
 *  scale_inv_B * alpha; GPU: scale_inv_A * scale_inv_B * alpha in the epilogue, or cuBLASLt's
 *  alpha), before bias and GELU; beta * D is added last, in FP32.
 */
NVTE_API NVTEStatus nvte_cublas_gemm_scaled(const NVTETensor A, const NVTETensor B, NVTETensor D,
                                            const NVTETensor bias, NVTETensor pre_gelu_out,
                                            bool transa, bool transb, bool grad,
                                            NVTETensor workspace, float alpha, float beta,
                                            bool use_split_accumulator, int math_sm_count,
                                            NVTEStream stream);

/*! The NVFP4 GEMM in the FP4 tensor core's summation order (TE's reference qgemm's), before its
 *  per-tensor factor. Row-major D[m, n] (fp32, overwritten) =
 *    sum over 16-element K blocks j, in K order, starting from +0, in fp32, of
 *    sB[r, j] * sA[c, j] * (sum over the block of e2m1_B[r, .] * e2m1_A[c, .])
 *  Each block term is exact (<= 12 significant bits per E2M1 product, 4 + 4 more from the E4M3
 *  scales), so the only roundings are the fp32 adds of the block terms, in K order: the result is
 *  the same bits on every CPU level (NVTE_CPU_ISA) and equals TE's reference.
 *  B ([m, K]) and A ([n, K]): NVTE_NVFP4_1D_SCALING tensors whose row-wise copy has its blocks
 *    along K (a column-wise copy is passed as the row-wise copy of its transposed [rows, K] view):
 *    data uint8 [rows, K / 2] (more dims: leading ones are rows), two E2M1 codes per byte with
 *    element 2i in the low nibble; scale_inv E4M3 (kNVTEFloat8E4M3 or kNVTEByte) 2-D, at least
 *    [rows, ceil(K / 16)] (TE's padded grid; its row stride is its column count). A partial last
 *    block adds its K elements only. amax is not read: the per-tensor factor
 *    amax_B * amax_A / (36 * e4m3_max_B * e4m3_max_A), alpha, beta, bias and the output cast are the
 *    caller's, in fp32 after this sum (the front ends apply them alike).
 *  K = 0 gives zeros. CPU or GPU tensors (all on one device): the GPU kernel forms each block term
 *  with a bf16 tensor-core product (exact, see above) and adds them in the same order, so both
 *  devices give the same bits (NaN payloads aside). stream: the GPU's queue (unused on the CPU).
 */
NVTE_API NVTEStatus nvte_nvfp4_block_gemm(const NVTETensor B, const NVTETensor A, NVTETensor D,
                                          NVTEStream stream);

/*! The fp32 batched GEMM in one canonical summation order, for computations that must give the
 *  same bits on every device (FP8 attention's emulation: pytorch/attention). Row-major, per batch b:
 *    D[b, i, j] = fmaf(a_{K-1}, b_{K-1}, ... fmaf(a_1, b_1, fmaf(a_0, b_0, +0.0f)) ...)
 *  with a_p = op(A)[b, i, p], b_p = op(B)[b, p, j]: every output is summed over K in index order,
 *  from +0, with one fused multiply-add (one rounding) per term. No other order, no split of K, no
 *  tensor cores (their accumulation order is unspecified): the CPU (any thread count) and the GPU
 *  give the same bits (NaN payloads aside). CPU: the attention tile kernel's FMA clones
 *  (x86-64-v4 / -v3) where the level allows, else (NVTE_CPU_ISA=baseline: no FMA hardware) a
 *  scalar loop of exact fmaf, slower but the same bits. GPU: a SIMT kernel calling fmaf in K order.
 *  A: fp32 [batch, m, K], or [batch, K, m] with transa (op(A) = A[b]^T).
 *  B: fp32 [batch, K, n], or [batch, n, K] with transb (op(B) = B[b]^T).
 *  D: fp32 [batch, m, n], overwritten. All three contiguous, 3-D, on one device (CPU or GPU).
 *  K = 0 gives zeros. stream: the GPU's queue (unused on the CPU).
 */
NVTE_API NVTEStatus nvte_ordered_batched_gemm(const NVTETensor A, const NVTETensor B, NVTETensor D,
                                              bool transa, bool transb, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif
