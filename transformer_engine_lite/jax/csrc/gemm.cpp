// te_lite GEMM handler (pytorch/csrc/gemm.cpp's functional gemm) over nvte_cublas_gemm (TE's
// column-major semantics, see gemm.h): bias / GELU / bias-gradient epilogues and FP8 output.
// out_dtype is D's dtype; optional tensors are [0] buffers when absent (None).
#include <transformer_engine_lite/gemm.h>

#include "handler.h"

namespace te_lite {
namespace {

// cuBLASLt scratch on the GPU (TE's size for Hopper); the CPU backend takes no workspace.
constexpr size_t kGpuWorkspaceBytes = 32 << 20;

// An operand: high precision, or per-tensor FP8 with its scale_inv (given exactly when FP8).
ffi::Error check_operand(const char *op, const char *arg, const char *scale_arg, const Buffer &t,
                         const Buffer &scale_inv) {
  const DataType dt = t.element_type();
  TE_LITE_CHECK(is_high_precision(dt) || is_fp8(dt), op, ": argument '", arg,
                "': expected float32, float16, bfloat16 or an FP8 dtype, got ", dtype_name(dt));
  TE_LITE_TRY(check_min_ndim(op, arg, t, 2));
  if (is_fp8(dt)) {
    TE_LITE_CHECK(present(scale_inv), op, ": argument '", scale_arg,
                  "': expected a float32 scale_inv for FP8 operand '", arg, "' (", dtype_name(dt),
                  "), got None");
    return check_fp32_scalar(op, scale_arg, scale_inv);
  }
  TE_LITE_CHECK(!present(scale_inv), op, ": argument '", scale_arg, "': expected None for ",
                dtype_name(dt), " operand '", arg,
                "' (only FP8 operands are scaled), got a tensor");
  return ffi::Error::Success();
}

// Column-major GEMM sizes (gemm.h): op(A) is [k, m] and op(B) [n, k] in row-major terms.
struct GemmDims {
  int64_t m, n, k;
};

ffi::Error gemm_dims(const char *op, const Buffer &A, bool transa, const Buffer &B, bool transb,
                     GemmDims *d) {
  const int64_t a_cols = dim(A, -1), a_rows = numel(A) / std::max<int64_t>(a_cols, 1);
  const int64_t b_cols = dim(B, -1), b_rows = numel(B) / std::max<int64_t>(b_cols, 1);
  *d = GemmDims{transa ? a_rows : a_cols, transb ? b_cols : b_rows, transa ? a_cols : a_rows};
  const int64_t kb = transb ? b_rows : b_cols;
  TE_LITE_CHECK(kb == d->k, op, ": argument 'B': expected op(B) of shape [n, k] with k = ", d->k,
                " (from A ", shape_str(A), ", transa=", transa, "), got B ", shape_str(B),
                " with transb=", transb, ", i.e. op(B) [", transb ? b_cols : b_rows, ", ", kb,
                "]");
  return ffi::Error::Success();
}

// The argument checks of the torch op, in its order.
ffi::Error check_gemm_args(const char *op, const Buffer &A, const Buffer &A_scale_inv, bool transa,
                           const Buffer &B, const Buffer &B_scale_inv, bool transb,
                           DataType out_dtype, const Buffer &bias, bool gelu, bool grad,
                           const Buffer &gelu_input, const Buffer &out_scale, GemmDims *dims) {
  TE_LITE_TRY(check_operand(op, "A", "A_scale_inv", A, A_scale_inv));
  TE_LITE_TRY(check_operand(op, "B", "B_scale_inv", B, B_scale_inv));
  TE_LITE_TRY(gemm_dims(op, A, transa, B, transb, dims));
  TE_LITE_CHECK(is_high_precision(out_dtype) || is_fp8(out_dtype), op,
                ": argument 'out_dtype': expected float32, float16, bfloat16 or an FP8 dtype, got ",
                dtype_name(out_dtype));
  if (is_fp8(out_dtype)) {
    TE_LITE_CHECK(present(out_scale), op, ": argument 'out_scale': expected a float32 scale for ",
                  "FP8 out_dtype ", dtype_name(out_dtype), ", got None");
    TE_LITE_TRY(check_fp32_scalar(op, "out_scale", out_scale));
  } else {
    TE_LITE_CHECK(!present(out_scale), op, ": argument 'out_scale': expected None for out_dtype ",
                  dtype_name(out_dtype), " (a scale is only used for FP8 outputs), got a tensor");
  }
  if (present(bias)) {
    TE_LITE_TRY(check_dtype(op, "bias", bias, kHighPrecision));
    const bool grad_of_b = grad && !gelu;  // the bias gradient of op(B): one value per row of D
    const int64_t len = grad_of_b ? dims->n : dims->m;
    TE_LITE_CHECK(ndim(bias) == 1 && dim(bias, 0) == len, op,
                  ": argument 'bias': expected shape [", len, "] (",
                  grad_of_b ? "n: grad=True without gelu gives the bias gradient of op(B)"
                            : "m: one value per column of D",
                  "), got ", shape_str(bias));
  }
  if (grad && gelu) {
    TE_LITE_CHECK(present(gelu_input), op, ": argument 'gelu_input': expected the pre-GELU ",
                  "values [n, m] = [", dims->n, ", ", dims->m,
                  "] for grad=True, gelu=True, got None");
    TE_LITE_TRY(check_dtype(op, "gelu_input", gelu_input, kHighPrecision));
    TE_LITE_CHECK(ndim(gelu_input) >= 2 && dim(gelu_input, -1) == dims->m &&
                      numel(gelu_input) == dims->n * dims->m,
                  op, ": argument 'gelu_input': expected shape [n, m] = [", dims->n, ", ", dims->m,
                  "] (leading dims may be split), got ", shape_str(gelu_input));
  } else {
    TE_LITE_CHECK(!present(gelu_input), op, ": argument 'gelu_input': expected None unless ",
                  "grad=True and gelu=True, got a tensor");
  }
  return ffi::Error::Success();
}

ffi::Error gemm(const Device &dev, Buffer A, Buffer A_scale_inv, Buffer B, Buffer B_scale_inv,
                Buffer bias, Buffer gelu_input, Buffer out_scale, Buffer D, Buffer pre_gelu_out,
                Buffer bias_grad, Buffer amax, Buffer scale_inv, bool transa, bool transb,
                bool gelu, bool grad) {
  constexpr const char *kOp = "te_lite::gemm";
  const DataType out_dtype = D.element_type();
  GemmDims dims{};
  TE_LITE_TRY(check_gemm_args(kOp, A, A_scale_inv, transa, B, B_scale_inv, transb, out_dtype, bias,
                              gelu, grad, gelu_input, out_scale, &dims));
  const bool fp8_out = is_fp8(out_dtype);
  const bool has_bias = present(bias);

  // D: [*B.shape[:-1], m] when B is not transposed (n = its leading dims), else [n, m].
  Shape d_shape = shape_of(B);
  d_shape.pop_back();
  if (transb) d_shape = {dims.n};
  d_shape.push_back(dims.m);
  TE_LITE_TRY(check_result(kOp, "D", D, out_dtype, d_shape));
  TE_LITE_TRY(check_fp8_side_results(kOp, amax, scale_inv, fp8_out));
  // pre_gelu_out (forward with GELU): bias's dtype, else the output's, else A's, else bf16.
  const DataType pre_dtype = has_bias                      ? bias.element_type()
                             : !fp8_out                    ? out_dtype
                             : !is_fp8(A.element_type())   ? A.element_type()
                                                           : DataType::BF16;
  if (gelu && !grad) {
    TE_LITE_TRY(check_result(kOp, "pre_gelu_out", pre_gelu_out, pre_dtype, d_shape));
  } else {
    TE_LITE_TRY(check_absent(kOp, "pre_gelu_out", pre_gelu_out, "given for gelu=True, grad=False"));
  }
  if (grad && has_bias) {
    TE_LITE_TRY(check_result(kOp, "bias_grad", bias_grad, bias.element_type(), shape_of(bias)));
  } else {
    TE_LITE_TRY(check_absent(kOp, "bias_grad", bias_grad, "given for grad=True with a bias"));
  }

  TensorWrapper ta(dev), tb(dev), td(dev), tbias(dev), tpre(dev), workspace(dev);
  ta.data(A);
  if (present(A_scale_inv)) ta.scale_inv(A_scale_inv);
  tb.data(B);
  if (present(B_scale_inv)) tb.scale_inv(B_scale_inv);
  td.data(D);
  if (fp8_out) td.scale(out_scale).amax(amax).scale_inv(scale_inv);
  if (has_bias) {
    // grad: the core writes the bias gradient into its bias argument (only bias's shape is used).
    tbias.data(grad ? bias_grad : bias);
  }
  if (gelu) {
    // grad: read, D = X * gelu'(gelu_input); forward: written, the pre-GELU values.
    tpre.data(grad ? gelu_input : pre_gelu_out);
  }
  if (dev.is_gpu()) {
    // A workspace is optional for the core (it allocates on the stream without one); XLA's scratch
    // allocator gives it from XLA's pool instead.
    Scratch scratch;  // on the GPU the block is XLA's, freed when the handler returns
    void *ws = scratch.allocate(dev, kGpuWorkspaceBytes);
    if (ws != nullptr) {
      NVTEBasicTensor bt{};
      bt.data_ptr = ws;
      bt.dtype = kNVTEByte;
      bt.shape.ndim = 1;
      bt.shape.data[0] = kGpuWorkspaceBytes;
      workspace.set(kNVTERowwiseData, bt);
    }
  }
  return check_nvte(kOp, nvte_cublas_gemm(ta.get(), tb.get(), td.get(), tbias.get(), tpre.get(),
                                          transa, transb, grad, workspace.get(),
                                          /*accumulate=*/false, /*use_split_accumulator=*/true,
                                          /*math_sm_count=*/0, dev.stream));
}

}  // namespace

TE_LITE_FFI_HANDLERS(gemm, gemm,
                     .Arg<Buffer>()         // A: [.., k|m] (op(A) = A^T if transa: [k, m])
                     .Arg<Buffer>()         // A_scale_inv: float32 [1] for FP8 A, else [0]
                     .Arg<Buffer>()         // B: op(B) = B^T if transb: [n, k]
                     .Arg<Buffer>()         // B_scale_inv: float32 [1] for FP8 B, else [0]
                     .Arg<Buffer>()         // bias: [m] ([n] for grad without gelu), or [0]
                     .Arg<Buffer>()         // gelu_input: [n, m] for grad and gelu, else [0]
                     .Arg<Buffer>()         // out_scale: float32 [1] for FP8 D, else [0]
                     .Ret<Buffer>()         // D: [*B.shape[:-1], m] (transb: [n, m]), out_dtype
                     .Ret<Buffer>()         // pre_gelu_out: D's shape for gelu, not grad; or [0]
                     .Ret<Buffer>()         // bias_grad: bias's shape and dtype for grad; or [0]
                     .Ret<Buffer>()         // amax: float32 [1] for FP8 D, else [0]
                     .Ret<Buffer>()         // scale_inv: as amax
                     .Attr<bool>("transa")  // op(A) = A^T
                     .Attr<bool>("transb")  // op(B) = B^T
                     .Attr<bool>("gelu")    // GELU epilogue (forward) / dGELU (grad)
                     .Attr<bool>("grad")    // backward epilogues
);

}  // namespace te_lite
