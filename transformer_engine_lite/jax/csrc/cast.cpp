// te_lite cast handlers (pytorch/csrc/cast.cpp's ops): quantize / dequantize (per-tensor, MXFP8),
// compute_amax, transpose, cast_transpose. The FP8 dtype of quantizing ops is their data result's.
#include <transformer_engine_lite/cast.h>
#include <transformer_engine_lite/transpose.h>

#include "handler.h"

namespace te_lite {
namespace {

constexpr int64_t kMxBlock = 32;  // MXFP8: one E8M0 scale per 32 consecutive elements

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// [rows, cols] view of a buffer: leading dims flattened (the core's 2-D view).
std::pair<int64_t, int64_t> rows_cols(const Buffer &t) {
  const int64_t cols = ndim(t) == 0 ? 1 : dim(t, -1);
  return {cols == 0 ? 0 : numel(t) / cols, cols};
}

ffi::Error quantize(const Device &dev, Buffer x, Buffer scale, Buffer data, Buffer amax,
                    Buffer scale_inv) {
  constexpr const char *kOp = "te_lite::quantize";
  TE_LITE_TRY(check_dtype(kOp, "x", x, kHighPrecision));
  TE_LITE_TRY(check_dtype(kOp, "fp8_dtype", data, kFP8));
  TE_LITE_TRY(check_fp32_scalar(kOp, "scale", scale));
  TE_LITE_TRY(check_result(kOp, "data", data, data.element_type(), shape_of(x)));
  TE_LITE_TRY(check_fp8_side_results(kOp, amax, scale_inv, true));
  TensorWrapper in(dev), out(dev);
  in.data(x);
  out.data(data).scale(scale).amax(amax).scale_inv(scale_inv);
  return check_nvte(kOp, nvte_quantize(in.get(), out.get(), dev.stream));
}

// Copies not requested are [0] (the torch op gives fp8 / uint8 [0]; any dtype is accepted).
ffi::Error quantize_mxfp8(const Device &dev, Buffer x, Buffer row, Buffer row_s, Buffer col,
                          Buffer col_s, bool rowwise, bool columnwise) {
  constexpr const char *kOp = "te_lite::quantize_mxfp8";
  TE_LITE_TRY(check_dtype(kOp, "x", x, kHighPrecision));
  TE_LITE_TRY(check_min_ndim(kOp, "x", x, 1));
  TE_LITE_CHECK(rowwise || columnwise, kOp,
                ": arguments 'rowwise' and 'columnwise': expected at least one true, got both "
                "false");
  const DataType fp8 = rowwise ? row.element_type() : col.element_type();
  TE_LITE_TRY(check_dtype(kOp, "fp8_dtype", fp8, kFP8));
  const auto [rows, cols] = rows_cols(x);
  const char *kNotRequested = "copy not requested";
  if (rowwise) {
    TE_LITE_TRY(check_result(kOp, "row_data", row, fp8, shape_of(x)));
    TE_LITE_TRY(check_result(kOp, "row_scale_inv", row_s, DataType::U8,
                             {rows, ceil_div(cols, kMxBlock)}));
  } else {
    TE_LITE_TRY(check_absent(kOp, "row_data", row, kNotRequested));
    TE_LITE_TRY(check_absent(kOp, "row_scale_inv", row_s, kNotRequested));
  }
  if (columnwise) {
    TE_LITE_TRY(check_result(kOp, "col_data", col, fp8, shape_of(x)));
    TE_LITE_TRY(check_result(kOp, "col_scale_inv", col_s, DataType::U8,
                             {ceil_div(rows, kMxBlock), cols}));
  } else {
    TE_LITE_TRY(check_absent(kOp, "col_data", col, kNotRequested));
    TE_LITE_TRY(check_absent(kOp, "col_scale_inv", col_s, kNotRequested));
  }
  TensorWrapper in(dev), out(dev, NVTE_MXFP8_1D_SCALING);
  in.data(x);
  if (rowwise) out.data(row).scale_inv(row_s, kNVTEFloat8E8M0);
  if (columnwise) out.columnwise_data(col).columnwise_scale_inv(col_s, kNVTEFloat8E8M0);
  return check_nvte(kOp, nvte_quantize(in.get(), out.get(), dev.stream));
}

ffi::Error dequantize(const Device &dev, Buffer data, Buffer scale_inv, Buffer out) {
  constexpr const char *kOp = "te_lite::dequantize";
  TE_LITE_TRY(check_dtype(kOp, "data", data, kFP8));
  TE_LITE_TRY(check_fp32_scalar(kOp, "scale_inv", scale_inv));
  TE_LITE_TRY(check_dtype(kOp, "out_dtype", out, kHighPrecision));
  TE_LITE_TRY(check_result(kOp, "out", out, out.element_type(), shape_of(data)));
  TensorWrapper in(dev), o(dev);
  in.data(data).scale_inv(scale_inv);
  o.data(out);
  return check_nvte(kOp, nvte_dequantize(in.get(), o.get(), dev.stream));
}

ffi::Error dequantize_mxfp8(const Device &dev, Buffer data, Buffer scale_inv, Buffer out,
                            bool columnwise) {
  constexpr const char *kOp = "te_lite::dequantize_mxfp8";
  TE_LITE_TRY(check_dtype(kOp, "data", data, kFP8));
  TE_LITE_TRY(check_min_ndim(kOp, "data", data, 1));
  TE_LITE_CHECK(scale_inv.element_type() == DataType::U8, kOp,
                ": argument 'scale_inv': expected uint8 E8M0 scales, got ",
                dtype_name(scale_inv.element_type()));
  TE_LITE_TRY(check_dtype(kOp, "out_dtype", out, kHighPrecision));
  const auto [rows, cols] = rows_cols(data);
  const Shape expected = columnwise ? Shape{ceil_div(rows, kMxBlock), cols}
                                    : Shape{rows, ceil_div(cols, kMxBlock)};
  TE_LITE_CHECK(shape_of(scale_inv) == expected, kOp, ": argument 'scale_inv': expected shape ",
                shape_str(expected), " (", columnwise ? "column-wise" : "row-wise",
                " scales of data ", shape_str(data), "), got ", shape_str(scale_inv));
  TE_LITE_TRY(check_result(kOp, "out", out, out.element_type(), shape_of(data)));
  TensorWrapper in(dev, NVTE_MXFP8_1D_SCALING), o(dev);
  if (columnwise) {
    in.columnwise_data(data).columnwise_scale_inv(scale_inv, kNVTEFloat8E8M0);
  } else {
    in.data(data).scale_inv(scale_inv, kNVTEFloat8E8M0);
  }
  o.data(out);
  return check_nvte(kOp, nvte_dequantize(in.get(), o.get(), dev.stream));
}

ffi::Error compute_amax(const Device &dev, Buffer x, Buffer amax) {
  constexpr const char *kOp = "te_lite::compute_amax";
  TE_LITE_TRY(check_dtype(kOp, "x", x, kHighPrecision));
  TE_LITE_TRY(check_result(kOp, "amax", amax, DataType::F32, {1}));
  TensorWrapper in(dev), out(dev);
  in.data(x);
  out.amax(amax);
  return check_nvte(kOp, nvte_compute_amax(in.get(), out.get(), dev.stream));
}

ffi::Error transpose(const Device &dev, Buffer x, Buffer out) {
  constexpr const char *kOp = "te_lite::transpose";
  TE_LITE_TRY(check_ndim(kOp, "x", x, 2));
  TE_LITE_CHECK(nvte_dtype_of(x.element_type()).has_value(), kOp,
                ": argument 'x': expected a float, FP8 or integer dtype, got ",
                dtype_name(x.element_type()));
  TE_LITE_TRY(check_result(kOp, "out", out, x.element_type(), {dim(x, 1), dim(x, 0)}));
  if (numel(x) == 0) return ffi::Error::Success();
  TensorWrapper in(dev), o(dev);
  in.data(x);
  o.data(out);
  return check_nvte(kOp, nvte_transpose(in.get(), o.get(), dev.stream));
}

ffi::Error cast_transpose(const Device &dev, Buffer x, Buffer scale, Buffer data, Buffer data_t,
                          Buffer amax, Buffer scale_inv) {
  constexpr const char *kOp = "te_lite::cast_transpose";
  TE_LITE_TRY(check_dtype(kOp, "x", x, kHighPrecision));
  TE_LITE_TRY(check_ndim(kOp, "x", x, 2));
  TE_LITE_TRY(check_dtype(kOp, "fp8_dtype", data, kFP8));
  TE_LITE_TRY(check_fp32_scalar(kOp, "scale", scale));
  TE_LITE_TRY(check_result(kOp, "data", data, data.element_type(), shape_of(x)));
  TE_LITE_TRY(check_result(kOp, "data_t", data_t, data.element_type(), {dim(x, 1), dim(x, 0)}));
  TE_LITE_TRY(check_fp8_side_results(kOp, amax, scale_inv, true));
  TensorWrapper in(dev), out(dev);
  in.data(x);
  out.data(data).columnwise_data(data_t).scale(scale).amax(amax).scale_inv(scale_inv);
  return check_nvte(kOp, nvte_cast_transpose(in.get(), out.get(), dev.stream));
}

}  // namespace

TE_LITE_FFI_HANDLERS(quantize, quantize,
                     .Arg<Buffer>()  // x: float32 / float16 / bfloat16
                     .Arg<Buffer>()  // scale: float32 [1]
                     .Ret<Buffer>()  // data: x's shape, the FP8 dtype (fp8_dtype)
                     .Ret<Buffer>()  // amax: float32 [1]
                     .Ret<Buffer>()  // scale_inv: float32 [1]
);

TE_LITE_FFI_HANDLERS(quantize_mxfp8, quantize_mxfp8,
                     .Arg<Buffer>()             // x: [..., cols], high precision
                     .Ret<Buffer>()             // row_data: x's shape, FP8 (or [0])
                     .Ret<Buffer>()             // row_scale_inv: uint8 [rows, ceil(cols/32)]
                     .Ret<Buffer>()             // col_data: x's shape, FP8 (or [0])
                     .Ret<Buffer>()             // col_scale_inv: uint8 [ceil(rows/32), cols]
                     .Attr<bool>("rowwise")     // write the row-wise copy
                     .Attr<bool>("columnwise")  // write the column-wise copy
);

TE_LITE_FFI_HANDLERS(dequantize, dequantize,
                     .Arg<Buffer>()  // data: FP8
                     .Arg<Buffer>()  // scale_inv: float32 [1]
                     .Ret<Buffer>()  // out: data's shape, high precision (out_dtype)
);

TE_LITE_FFI_HANDLERS(dequantize_mxfp8, dequantize_mxfp8,
                     .Arg<Buffer>()             // data: FP8
                     .Arg<Buffer>()             // scale_inv: uint8 E8M0
                     .Ret<Buffer>()             // out: data's shape, high precision (out_dtype)
                     .Attr<bool>("columnwise")  // data is the column-wise copy
);

TE_LITE_FFI_HANDLERS(compute_amax, compute_amax,
                     .Arg<Buffer>()  // x: high precision
                     .Ret<Buffer>()  // amax: float32 [1]
);

TE_LITE_FFI_HANDLERS(transpose, transpose,
                     .Arg<Buffer>()  // x: 2-D, any dtype with an NVTE equivalent
                     .Ret<Buffer>()  // out: [cols, rows], x's dtype
);

TE_LITE_FFI_HANDLERS(cast_transpose, cast_transpose,
                     .Arg<Buffer>()  // x: 2-D, high precision
                     .Arg<Buffer>()  // scale: float32 [1]
                     .Ret<Buffer>()  // data: x's shape, FP8 (fp8_dtype)
                     .Ret<Buffer>()  // data_t: [cols, rows], data's dtype
                     .Ret<Buffer>()  // amax: float32 [1]
                     .Ret<Buffer>()  // scale_inv: float32 [1]
);

}  // namespace te_lite
