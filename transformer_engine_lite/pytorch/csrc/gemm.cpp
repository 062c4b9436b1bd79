// te_lite GEMM ops over nvte_cublas_gemm_scaled (TE's column-major semantics, see gemm.h): the
// functional gemm with its bias / GELU / bias-gradient epilogues, FP8 output and alpha;
// gemm_accumulate_ (D = beta * D + alpha * ... + bias).
#include <torch/library.h>

#include <cmath>
#include <limits>

#include <transformer_engine_lite/gemm.h>

#include "common.h"

namespace te_lite {
namespace {

// cuBLASLt scratch on the GPU (TE's size for Hopper); the CPU backend takes no workspace.
constexpr int64_t kGpuWorkspaceBytes = 32 << 20;

// An operand: high precision, or per-tensor FP8 with its scale_inv (given exactly when FP8).
void check_operand(const char *op, const char *arg, const char *scale_arg, const at::Tensor &t,
                   const std::optional<at::Tensor> &scale_inv) {
  TORCH_CHECK(is_high_precision(t.scalar_type()) || is_fp8(t.scalar_type()), op, ": argument '",
              arg, "': expected float32, float16, bfloat16 or an FP8 dtype, got ",
              dtype_name(t.scalar_type()));
  check_min_ndim(op, arg, t, 2);
  if (is_fp8(t.scalar_type())) {
    TORCH_CHECK(scale_inv.has_value(), op, ": argument '", scale_arg,
                "': expected a float32 scale_inv for FP8 operand '", arg, "' (",
                dtype_name(t.scalar_type()), "), got None");
    check_fp32_scalar(op, scale_arg, *scale_inv);
    check_same_device(op, t, arg, *scale_inv, scale_arg);
  } else {
    TORCH_CHECK(!scale_inv.has_value(), op, ": argument '", scale_arg, "': expected None for ",
                dtype_name(t.scalar_type()), " operand '", arg,
                "' (only FP8 operands are scaled), got a tensor");
  }
}

// The operand wrapper; `data` and `scale_inv` must stay alive while it is used.
TensorWrapper wrap_operand(const at::Tensor &data, const std::optional<at::Tensor> &scale_inv) {
  TensorWrapper w;
  w.data(data);
  if (scale_inv.has_value()) w.scale_inv(*scale_inv);
  return w;
}

// alpha and beta arrive as Python floats (double); the core takes fp32 and rejects non-finite ones,
// so a finite double that overflows fp32 is named here rather than reported as "inf".
float scale_arg(const char *op, const char *arg, double v) {
  TORCH_CHECK(!std::isfinite(v) || std::fabs(v) <= std::numeric_limits<float>::max(), op,
              ": argument '", arg, "': expected a value representable in float32, got ", v);
  return static_cast<float>(v);
}

// Column-major GEMM sizes (gemm.h): op(A) is [k, m] and op(B) [n, k] in row-major terms.
struct GemmDims {
  int64_t m, n, k;
};

GemmDims gemm_dims(const char *op, const at::Tensor &A, bool transa, const at::Tensor &B,
                   bool transb) {
  const int64_t a_cols = A.size(-1), a_rows = A.numel() / std::max<int64_t>(a_cols, 1);
  const int64_t b_cols = B.size(-1), b_rows = B.numel() / std::max<int64_t>(b_cols, 1);
  const GemmDims d{transa ? a_rows : a_cols, transb ? b_cols : b_rows, transa ? a_cols : a_rows};
  const int64_t kb = transb ? b_rows : b_cols;
  TORCH_CHECK(kb == d.k, op, ": argument 'B': expected op(B) of shape [n, k] with k = ", d.k,
              " (from A ", A.sizes(), ", transa=", transa, "), got B ", B.sizes(),
              " with transb=", transb, ", i.e. op(B) [", transb ? b_cols : b_rows, ", ", kb, "]");
  return d;
}

TensorWrapper gpu_workspace(const DeviceContext &ctx, const at::Tensor &like, at::Tensor &buffer) {
  TensorWrapper w;
  if (ctx.is_gpu()) {
    buffer = at::empty({kGpuWorkspaceBytes}, like.options().dtype(at::kByte));
    w.data(buffer);
  }
  return w;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gemm(
    const at::Tensor &A_, const std::optional<at::Tensor> &A_scale_inv, bool transa,
    const at::Tensor &B_, const std::optional<at::Tensor> &B_scale_inv, bool transb,
    at::ScalarType out_dtype, const std::optional<at::Tensor> &bias_, bool gelu, bool grad,
    const std::optional<at::Tensor> &gelu_input_, const std::optional<at::Tensor> &out_scale,
    double alpha_) {
  constexpr const char *kOp = "te_lite::gemm";
  const float alpha = scale_arg(kOp, "alpha", alpha_);
  check_operand(kOp, "A", "A_scale_inv", A_, A_scale_inv);
  check_operand(kOp, "B", "B_scale_inv", B_, B_scale_inv);
  check_same_device(kOp, A_, "A", B_, "B");
  const GemmDims dims = gemm_dims(kOp, A_, transa, B_, transb);
  TORCH_CHECK(is_high_precision(out_dtype) || is_fp8(out_dtype), kOp,
              ": argument 'out_dtype': expected float32, float16, bfloat16 or an FP8 dtype, got ",
              dtype_name(out_dtype));
  const bool fp8_out = is_fp8(out_dtype);
  if (fp8_out) {
    TORCH_CHECK(out_scale.has_value(), kOp, ": argument 'out_scale': expected a float32 scale for ",
                "FP8 out_dtype ", dtype_name(out_dtype), ", got None");
    check_fp32_scalar(kOp, "out_scale", *out_scale);
    check_same_device(kOp, A_, "A", *out_scale, "out_scale");
  } else {
    TORCH_CHECK(!out_scale.has_value(), kOp, ": argument 'out_scale': expected None for out_dtype ",
                dtype_name(out_dtype), " (a scale is only used for FP8 outputs), got a tensor");
  }
  if (bias_.has_value()) {
    check_dtype(kOp, "bias", *bias_, kHighPrecision);
    const bool grad_of_b = grad && !gelu;  // the bias gradient of op(B): one value per row of D
    const int64_t len = grad_of_b ? dims.n : dims.m;
    TORCH_CHECK(bias_->dim() == 1 && bias_->size(0) == len, kOp,
                ": argument 'bias': expected shape [", len, "] (",
                grad_of_b ? "n: grad=True without gelu gives the bias gradient of op(B)"
                          : "m: one value per column of D",
                "), got ", bias_->sizes());
    check_same_device(kOp, A_, "A", *bias_, "bias");
  }
  if (grad && gelu) {
    TORCH_CHECK(gelu_input_.has_value(), kOp, ": argument 'gelu_input': expected the pre-GELU ",
                "values [n, m] = [", dims.n, ", ", dims.m, "] for grad=True, gelu=True, got None");
    check_dtype(kOp, "gelu_input", *gelu_input_, kHighPrecision);
    TORCH_CHECK(gelu_input_->dim() >= 2 && gelu_input_->size(-1) == dims.m &&
                    gelu_input_->numel() == dims.n * dims.m,
                kOp, ": argument 'gelu_input': expected shape [n, m] = [", dims.n, ", ", dims.m,
                "] (leading dims may be split), got ", gelu_input_->sizes());
    check_same_device(kOp, A_, "A", *gelu_input_, "gelu_input");
  } else {
    TORCH_CHECK(!gelu_input_.has_value(), kOp, ": argument 'gelu_input': expected None unless ",
                "grad=True and gelu=True, got a tensor");
  }

  const DeviceContext ctx(A_);
  const at::Tensor A = A_.contiguous(), B = B_.contiguous();
  // D: [*B.shape[:-1], m] when B is not transposed (n = its leading dims), else [n, m].
  std::vector<int64_t> d_shape(B.sizes().begin(), B.sizes().end() - 1);
  if (transb) d_shape = {dims.n};
  d_shape.push_back(dims.m);
  const auto opts = A.options();
  at::Tensor D = at::empty(d_shape, opts.dtype(out_dtype));
  at::Tensor amax = fp32_buffer(A, fp8_out), scale_inv = fp32_buffer(A, fp8_out);
  // pre_gelu_out (forward with GELU): bias's dtype, else the output's, else A's, else bf16.
  const at::ScalarType pre_dtype = bias_.has_value()          ? bias_->scalar_type()
                                   : !fp8_out                 ? out_dtype
                                   : !is_fp8(A.scalar_type()) ? A.scalar_type()
                                                              : at::kBFloat16;
  at::Tensor pre_gelu_out = gelu && !grad ? at::empty(d_shape, opts.dtype(pre_dtype))
                                          : at::empty({0}, opts.dtype(at::kFloat));
  at::Tensor bias_grad = grad && bias_.has_value()
                             ? at::empty(bias_->sizes(), opts.dtype(bias_->scalar_type()))
                             : at::empty({0}, opts.dtype(at::kFloat));

  const std::optional<at::Tensor> sa =
      A_scale_inv ? std::optional(A_scale_inv->contiguous()) : std::nullopt;
  const std::optional<at::Tensor> sb =
      B_scale_inv ? std::optional(B_scale_inv->contiguous()) : std::nullopt;
  TensorWrapper ta = wrap_operand(A, sa), tb = wrap_operand(B, sb), td, tbias, tpre;
  td.data(D);
  if (fp8_out) td.scale(out_scale->contiguous()).amax(amax).scale_inv(scale_inv);
  at::Tensor bias, gelu_input;  // keep the contiguous copies alive during the call
  if (bias_.has_value()) {
    if (grad) {
      tbias.data(bias_grad);  // the core writes the bias gradient into its bias argument
    } else {
      bias = bias_->contiguous();
      tbias.data(bias);
    }
  }
  if (gelu) {
    if (grad) {
      gelu_input = gelu_input_->contiguous();
      tpre.data(gelu_input);  // read: D = X * gelu'(gelu_input)
    } else {
      tpre.data(pre_gelu_out);  // written: the pre-GELU values
    }
  }
  at::Tensor ws_buffer;
  TensorWrapper workspace = gpu_workspace(ctx, A, ws_buffer);
  check_nvte(nvte_cublas_gemm_scaled(ta.get(), tb.get(), td.get(), tbias.get(), tpre.get(), transa,
                                     transb, grad, workspace.get(), alpha, /*beta=*/0.0f,
                                     /*use_split_accumulator=*/true, /*math_sm_count=*/0,
                                     ctx.stream()),
             kOp);
  return {D, pre_gelu_out, bias_grad, amax, scale_inv};
}

void gemm_accumulate_(const at::Tensor &D, const at::Tensor &A_,
                      const std::optional<at::Tensor> &A_scale_inv, bool transa,
                      const at::Tensor &B_, const std::optional<at::Tensor> &B_scale_inv,
                      bool transb, const std::optional<at::Tensor> &bias_, double alpha_,
                      double beta_) {
  constexpr const char *kOp = "te_lite::gemm_accumulate_";
  const float alpha = scale_arg(kOp, "alpha", alpha_), beta = scale_arg(kOp, "beta", beta_);
  check_operand(kOp, "A", "A_scale_inv", A_, A_scale_inv);
  check_operand(kOp, "B", "B_scale_inv", B_, B_scale_inv);
  check_same_device(kOp, A_, "A", B_, "B");
  check_same_device(kOp, A_, "A", D, "D");
  const GemmDims dims = gemm_dims(kOp, A_, transa, B_, transb);
  check_dtype(kOp, "D", D, kHighPrecision);
  TORCH_CHECK(D.dim() >= 2 && D.size(-1) == dims.m && D.numel() == dims.n * dims.m, kOp,
              ": argument 'D': expected shape [n, m] = [", dims.n, ", ", dims.m,
              "] (leading dims may be split), got ", D.sizes());
  TORCH_CHECK(D.is_contiguous(), kOp,
              ": argument 'D': expected a contiguous tensor (updated in place), got strides ",
              D.strides());
  if (bias_.has_value()) {  // forward bias epilogue: one value per column of D
    check_dtype(kOp, "bias", *bias_, kHighPrecision);
    TORCH_CHECK(bias_->dim() == 1 && bias_->size(0) == dims.m, kOp,
                ": argument 'bias': expected shape [m] = [", dims.m,
                "] (one value per column of D), got ", bias_->sizes());
    check_same_device(kOp, A_, "A", *bias_, "bias");
  }
  const DeviceContext ctx(A_);
  const at::Tensor A = A_.contiguous(), B = B_.contiguous();
  const std::optional<at::Tensor> sa =
      A_scale_inv ? std::optional(A_scale_inv->contiguous()) : std::nullopt;
  const std::optional<at::Tensor> sb =
      B_scale_inv ? std::optional(B_scale_inv->contiguous()) : std::nullopt;
  TensorWrapper ta = wrap_operand(A, sa), tb = wrap_operand(B, sb), td, tbias, none;
  td.data(D);
  at::Tensor bias;  // the contiguous copy stays alive during the call
  if (bias_.has_value()) {
    bias = bias_->contiguous();
    tbias.data(bias);
  }
  at::Tensor ws_buffer;
  TensorWrapper workspace = gpu_workspace(ctx, A, ws_buffer);
  check_nvte(nvte_cublas_gemm_scaled(ta.get(), tb.get(), td.get(), tbias.get(), none.get(), transa,
                                     transb, /*grad=*/false, workspace.get(), alpha, beta,
                                     /*use_split_accumulator=*/true, /*math_sm_count=*/0,
                                     ctx.stream()),
             kOp);
}

void register_impls(torch::Library &m) {
  m.impl("gemm", &gemm);
  m.impl("gemm_accumulate_", &gemm_accumulate_);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
