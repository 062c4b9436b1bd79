// te_lite cast ops: quantize / dequantize (per-tensor, MXFP8), amax, current and delayed scaling,
// transpose, cast_transpose. Functional (outputs are new tensors) except delayed_scaling_update_.
#include <torch/library.h>

#include <string>

#include <transformer_engine_lite/cast.h>
#include <transformer_engine_lite/recipe.h>
#include <transformer_engine_lite/transpose.h>

#include "common.h"

namespace te_lite {
namespace {

constexpr int64_t kMxBlock = 32;  // MXFP8: one E8M0 scale per 32 consecutive elements

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// [rows, cols] view of a tensor: leading dims flattened (the core's 2-D view).
// The 2-D view [prod(leading dims), last dim] the core uses. The rows are the product of the
// leading dims, not numel / cols: with an empty last dim ([64, 0]) there are still 64 rows, and the
// MXFP8 row-wise scales must be [64, 0] as the core expects.
std::pair<int64_t, int64_t> rows_cols(const at::Tensor &t) {
  if (t.dim() == 0) return {1, 1};
  int64_t rows = 1;
  for (int64_t i = 0; i + 1 < t.dim(); ++i) rows *= t.size(i);
  return {rows, t.size(-1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize(const at::Tensor &x_,
                                                        const at::Tensor &scale,
                                                        at::ScalarType fp8_dtype) {
  constexpr const char *kOp = "te_lite::quantize";
  check_dtype(kOp, "x", x_, kHighPrecision);
  check_dtype(kOp, "fp8_dtype", fp8_dtype, kFP8);
  check_fp32_scalar(kOp, "scale", scale);
  check_same_device(kOp, x_, "x", scale, "scale");
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous();
  at::Tensor data = at::empty(x.sizes(), x.options().dtype(fp8_dtype));
  at::Tensor amax = fp32_buffer(x, true), scale_inv = fp32_buffer(x, true);
  TensorWrapper in, out;
  in.data(x);
  out.data(data).scale(scale.contiguous()).amax(amax).scale_inv(scale_inv);
  check_nvte(nvte_quantize(in.get(), out.get(), ctx.stream()), kOp);
  return {data, amax, scale_inv};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_mxfp8(
    const at::Tensor &x_, at::ScalarType fp8_dtype, bool rowwise, bool columnwise) {
  constexpr const char *kOp = "te_lite::quantize_mxfp8";
  check_dtype(kOp, "x", x_, kHighPrecision);
  check_min_ndim(kOp, "x", x_, 1);
  check_dtype(kOp, "fp8_dtype", fp8_dtype, kFP8);
  TORCH_CHECK(rowwise || columnwise, kOp,
              ": arguments 'rowwise' and 'columnwise': expected at least one true, got both false");
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous();
  const auto [rows, cols] = rows_cols(x);
  const auto fp8 = x.options().dtype(fp8_dtype), bytes = x.options().dtype(at::kByte);
  const std::vector<int64_t> none{0};  // shape of the copies not requested
  at::Tensor row = at::empty(rowwise ? x.sizes() : at::IntArrayRef(none), fp8);
  at::Tensor row_s = at::empty(rowwise ? std::vector<int64_t>{rows, ceil_div(cols, kMxBlock)}
                                       : none,
                               bytes);
  at::Tensor col = at::empty(columnwise ? x.sizes() : at::IntArrayRef(none), fp8);
  at::Tensor col_s = at::empty(columnwise ? std::vector<int64_t>{ceil_div(rows, kMxBlock), cols}
                                          : none,
                               bytes);
  TensorWrapper in, out(NVTE_MXFP8_1D_SCALING);
  in.data(x);
  if (rowwise) out.data(row).scale_inv(row_s, kNVTEFloat8E8M0);
  if (columnwise) out.columnwise_data(col).columnwise_scale_inv(col_s, kNVTEFloat8E8M0);
  check_nvte(nvte_quantize(in.get(), out.get(), ctx.stream()), kOp);
  return {row, row_s, col, col_s};
}

at::Tensor dequantize(const at::Tensor &data_, const at::Tensor &scale_inv,
                      at::ScalarType out_dtype) {
  constexpr const char *kOp = "te_lite::dequantize";
  check_dtype(kOp, "data", data_, kFP8);
  check_fp32_scalar(kOp, "scale_inv", scale_inv);
  check_same_device(kOp, data_, "data", scale_inv, "scale_inv");
  check_dtype(kOp, "out_dtype", out_dtype, kHighPrecision);
  const DeviceContext ctx(data_);
  const at::Tensor data = data_.contiguous();
  at::Tensor out = at::empty(data.sizes(), data.options().dtype(out_dtype));
  TensorWrapper in, o;
  in.data(data).scale_inv(scale_inv.contiguous());
  o.data(out);
  check_nvte(nvte_dequantize(in.get(), o.get(), ctx.stream()), kOp);
  return out;
}

at::Tensor dequantize_mxfp8(const at::Tensor &data_, const at::Tensor &scale_inv_,
                            bool columnwise, at::ScalarType out_dtype) {
  constexpr const char *kOp = "te_lite::dequantize_mxfp8";
  check_dtype(kOp, "data", data_, kFP8);
  check_min_ndim(kOp, "data", data_, 1);
  TORCH_CHECK(scale_inv_.scalar_type() == at::kByte, kOp,
              ": argument 'scale_inv': expected uint8 E8M0 scales, got ",
              dtype_name(scale_inv_.scalar_type()));
  check_same_device(kOp, data_, "data", scale_inv_, "scale_inv");
  check_dtype(kOp, "out_dtype", out_dtype, kHighPrecision);
  const auto [rows, cols] = rows_cols(data_);
  const std::vector<int64_t> expected = columnwise
                                            ? std::vector<int64_t>{ceil_div(rows, kMxBlock), cols}
                                            : std::vector<int64_t>{rows, ceil_div(cols, kMxBlock)};
  TORCH_CHECK(scale_inv_.sizes() == at::IntArrayRef(expected), kOp,
              ": argument 'scale_inv': expected shape ", at::IntArrayRef(expected), " (",
              columnwise ? "column-wise" : "row-wise", " scales of data ", data_.sizes(), "), got ",
              scale_inv_.sizes());
  const DeviceContext ctx(data_);
  const at::Tensor data = data_.contiguous(), scale_inv = scale_inv_.contiguous();
  at::Tensor out = at::empty(data.sizes(), data.options().dtype(out_dtype));
  TensorWrapper in(NVTE_MXFP8_1D_SCALING), o;
  if (columnwise) {
    in.columnwise_data(data).columnwise_scale_inv(scale_inv, kNVTEFloat8E8M0);
  } else {
    in.data(data).scale_inv(scale_inv, kNVTEFloat8E8M0);
  }
  o.data(out);
  check_nvte(nvte_dequantize(in.get(), o.get(), ctx.stream()), kOp);
  return out;
}

at::Tensor compute_amax(const at::Tensor &x_) {
  constexpr const char *kOp = "te_lite::compute_amax";
  check_dtype(kOp, "x", x_, kHighPrecision);
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous();
  at::Tensor amax = fp32_buffer(x, true);
  TensorWrapper in, out;
  in.data(x);
  out.amax(amax);
  check_nvte(nvte_compute_amax(in.get(), out.get(), ctx.stream()), kOp);
  return amax;
}

// RAII NVTEQuantizationConfig.
std::tuple<at::Tensor, at::Tensor> compute_scale_from_amax(const at::Tensor &amax_,
                                                           at::ScalarType fp8_dtype, double epsilon,
                                                           bool force_pow_2_scales) {
  constexpr const char *kOp = "te_lite::compute_scale_from_amax";
  check_fp32_scalar(kOp, "amax", amax_);
  check_dtype(kOp, "fp8_dtype", fp8_dtype, kFP8);
  const DeviceContext ctx(amax_);
  const at::Tensor amax = amax_.contiguous();
  at::Tensor scale = fp32_buffer(amax, true), scale_inv = fp32_buffer(amax, true);
  const QuantizationConfig config = scale_rule_config(kOp, epsilon, force_pow_2_scales);
  TensorWrapper out;
  out.declare_dtype(*nvte_dtype_of(fp8_dtype)).amax(amax).scale(scale).scale_inv(scale_inv);
  check_nvte(nvte_compute_scale_from_amax(out.get(), config.get(), ctx.stream()), kOp);
  return {scale, scale_inv};
}

// Shared by the functional and in-place delayed-scaling updates (the core allows exact aliasing).
void run_delayed_scaling_update(const char *op, const at::Tensor &history, const at::Tensor &scale,
                                const at::Tensor &new_history, const at::Tensor &new_scale,
                                c10::string_view algo, at::ScalarType fp8_dtype, double margin) {
  check_dtype(op, "fp8_dtype", fp8_dtype, kFP8);
  const DeviceContext ctx(history);
  TensorWrapper h, s, nh, ns;
  h.data(history);
  s.data(scale);
  nh.data(new_history);
  ns.data(new_scale);
  const std::string algo_str(algo);
  check_nvte(nvte_delayed_scaling_recipe_amax_and_scale_update(
                 h.get(), s.get(), nh.get(), ns.get(), algo_str.c_str(),
                 *nvte_dtype_of(fp8_dtype), static_cast<float>(margin), ctx.stream()),
             op);
}

void check_recipe_args(const char *op, const at::Tensor &history, const at::Tensor &scale) {
  check_dtype(op, "amax_history", history, {at::kFloat});
  check_ndim(op, "amax_history", history, 2);
  check_dtype(op, "scale", scale, {at::kFloat});
  check_ndim(op, "scale", scale, 1);
  TORCH_CHECK(scale.size(0) == history.size(1), op, ": argument 'scale': expected shape [",
              history.size(1), "] (one scale per amax_history column), got ", scale.sizes());
  check_same_device(op, history, "amax_history", scale, "scale");
}

std::tuple<at::Tensor, at::Tensor> delayed_scaling_update(const at::Tensor &history_,
                                                          const at::Tensor &scale_,
                                                          c10::string_view algo,
                                                          at::ScalarType fp8_dtype,
                                                          double margin) {
  constexpr const char *kOp = "te_lite::delayed_scaling_update";
  check_recipe_args(kOp, history_, scale_);
  const at::Tensor history = history_.contiguous(), scale = scale_.contiguous();
  at::Tensor new_history = at::empty(history.sizes(), history.options());
  at::Tensor new_scale = at::empty(scale.sizes(), scale.options());
  run_delayed_scaling_update(kOp, history, scale, new_history, new_scale, algo, fp8_dtype, margin);
  return {new_history, new_scale};
}

void delayed_scaling_update_(const at::Tensor &history, const at::Tensor &scale,
                             c10::string_view algo, at::ScalarType fp8_dtype, double margin) {
  constexpr const char *kOp = "te_lite::delayed_scaling_update_";
  check_recipe_args(kOp, history, scale);
  TORCH_CHECK(history.is_contiguous() && scale.is_contiguous(), kOp,
              ": arguments 'amax_history' and 'scale': expected contiguous tensors (updated in "
              "place), got strides ",
              history.strides(), " and ", scale.strides());
  run_delayed_scaling_update(kOp, history, scale, history, scale, algo, fp8_dtype, margin);
}

at::Tensor transpose(const at::Tensor &x_) {
  constexpr const char *kOp = "te_lite::transpose";
  check_ndim(kOp, "x", x_, 2);
  TORCH_CHECK(nvte_dtype_of(x_.scalar_type()).has_value(), kOp,
              ": argument 'x': expected a float, FP8 or integer dtype, got ",
              dtype_name(x_.scalar_type()));
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous();
  at::Tensor out = at::empty({x.size(1), x.size(0)}, x.options());
  if (x.numel() == 0) return out;
  TensorWrapper in, o;
  in.data(x);
  o.data(out);
  check_nvte(nvte_transpose(in.get(), o.get(), ctx.stream()), kOp);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cast_transpose(
    const at::Tensor &x_, const at::Tensor &scale, at::ScalarType fp8_dtype) {
  constexpr const char *kOp = "te_lite::cast_transpose";
  check_dtype(kOp, "x", x_, kHighPrecision);
  check_ndim(kOp, "x", x_, 2);
  check_dtype(kOp, "fp8_dtype", fp8_dtype, kFP8);
  check_fp32_scalar(kOp, "scale", scale);
  check_same_device(kOp, x_, "x", scale, "scale");
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous();
  const auto fp8 = x.options().dtype(fp8_dtype);
  at::Tensor data = at::empty(x.sizes(), fp8);
  at::Tensor data_t = at::empty({x.size(1), x.size(0)}, fp8);
  at::Tensor amax = fp32_buffer(x, true), scale_inv = fp32_buffer(x, true);
  TensorWrapper in, out;
  in.data(x);
  out.data(data).columnwise_data(data_t).scale(scale.contiguous()).amax(amax).scale_inv(scale_inv);
  check_nvte(nvte_cast_transpose(in.get(), out.get(), ctx.stream()), kOp);
  return {data, data_t, amax, scale_inv};
}

void register_impls(torch::Library &m) {
  m.impl("quantize", &quantize);
  m.impl("quantize_mxfp8", &quantize_mxfp8);
  m.impl("dequantize", &dequantize);
  m.impl("dequantize_mxfp8", &dequantize_mxfp8);
  m.impl("compute_amax", &compute_amax);
  m.impl("compute_scale_from_amax", &compute_scale_from_amax);
  m.impl("delayed_scaling_update", &delayed_scaling_update);
  m.impl("delayed_scaling_update_", &delayed_scaling_update_);
  m.impl("transpose", &transpose);
  m.impl("cast_transpose", &cast_transpose);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif

// Not differentiable (quantization, statistics, scale math): outputs never require grad, instead of
// torch's fallback that tracks them and warns on backward. transpose gets autograd in te_lite_ops.py; the
// in-place ops keep the fallback, which bumps the version counters of what they mutate.
TORCH_LIBRARY_IMPL(te_lite, Autograd, m) {
  for (const char *op : {"quantize", "quantize_mxfp8", "dequantize", "dequantize_mxfp8",
                         "compute_amax", "compute_scale_from_amax", "delayed_scaling_update",
                         "cast_transpose"}) {
    m.impl(op, torch::CppFunction::makeFallthrough());
  }
}
