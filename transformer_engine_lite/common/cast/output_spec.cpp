// validate_output(): the device-independent checks of an FP8-capable output (shapes, dtypes, scale and
// amax buffers, MXFP8 scale layouts). Reads no buffer, so it serves CPU and GPU tensors alike.
#include "output_spec.h"

namespace nvte {

namespace {
size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
}  // namespace

OutputSpec validate_output(const Tensor &out, const char *arg, const std::vector<size_t> &shape) {
  OutputSpec spec;
  SimpleTensor view;
  view.shape = shape;
  spec.rows = view.rows();
  spec.cols = view.cols();
  const bool has_row = out.data.has_data(), has_col = out.columnwise_data.has_data();
  NVTE_CHECK(has_row || has_col, "argument '", arg,
             "': expected row-wise and/or column-wise data, got neither (null pointers)");
  const DType t = has_row ? out.data.dtype : out.columnwise_data.dtype;
  spec.dtype = t;
  spec.fp8 = nvte::is_fp8(t);
  if (out.amax.has_data()) check_fp32_scalar(out.amax, arg, "amax");

  if (out.scaling_mode == NVTE_MXFP8_1D_SCALING) {
    NVTE_CHECK(spec.fp8, "argument '", arg, "': expected an FP8 dtype with MXFP8 scaling, got ",
               dtype_name(t));
    spec.mx = true;
    if (has_row) {
      check_shape(out.data, arg, shape);
      NVTE_CHECK(out.scale_inv.has_data(), "argument '", arg,
                 "': expected row-wise E8M0 scale_inv for MXFP8 row-wise data, got a null pointer");
      check_dtype(out.scale_inv, arg, {kNVTEFloat8E8M0, kNVTEByte});
      NVTE_CHECK(out.scale_inv.shape == std::vector<size_t>({spec.rows, ceil_div(spec.cols, OutputSpec::kBlock)}),
                 "argument '", arg, "': expected row-wise scale_inv shape ",
                 shape_str({spec.rows, ceil_div(spec.cols, OutputSpec::kBlock)}), ", got ",
                 shape_str(out.scale_inv.shape));
      spec.rowwise = true;
    }
    if (has_col) {
      check_shape(out.columnwise_data, arg, shape);
      NVTE_CHECK(!has_row || out.columnwise_data.dtype == t, "argument '", arg,
                 "': expected column-wise data of dtype ", dtype_name(t), ", got ",
                 dtype_name(out.columnwise_data.dtype));
      NVTE_CHECK(out.columnwise_scale_inv.has_data(), "argument '", arg,
                 "': expected column-wise E8M0 scale_inv for MXFP8 column-wise data, got a null "
                 "pointer");
      check_dtype(out.columnwise_scale_inv, arg, {kNVTEFloat8E8M0, kNVTEByte});
      NVTE_CHECK(
          out.columnwise_scale_inv.shape == std::vector<size_t>({ceil_div(spec.rows, OutputSpec::kBlock), spec.cols}),
          "argument '", arg, "': expected column-wise scale_inv shape ",
          shape_str({ceil_div(spec.rows, OutputSpec::kBlock), spec.cols}), ", got ",
          shape_str(out.columnwise_scale_inv.shape));
      spec.colwise = true;
    }
    return spec;
  }

  NVTE_CHECK(out.scaling_mode == NVTE_DELAYED_TENSOR_SCALING, "argument '", arg,
             "': expected scaling mode NVTE_DELAYED_TENSOR_SCALING or NVTE_MXFP8_1D_SCALING, got ",
             static_cast<int>(out.scaling_mode));
  if (!spec.fp8) {
    NVTE_CHECK(has_row, "argument '", arg, "': expected row-wise data for a ", dtype_name(t),
               " output, got only column-wise data");
    check_dtype(out.data, arg, {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
    check_shape(out.data, arg, shape);
    NVTE_CHECK(!has_col, "argument '", arg,
               "': column-wise data is only produced for FP8 outputs, got a ", dtype_name(t),
               " output with column-wise data");
    spec.rowwise = true;
    return spec;
  }
  check_fp32_scalar(out.scale, arg, "scale");
  if (out.scale_inv.has_data()) check_fp32_scalar(out.scale_inv, arg, "scale_inv");
  if (has_row) {
    check_shape(out.data, arg, shape);
    spec.rowwise = true;
  }
  if (has_col) {
    NVTE_CHECK(out.columnwise_data.dtype == t, "argument '", arg,
               "': expected column-wise data of dtype ", dtype_name(t), ", got ",
               dtype_name(out.columnwise_data.dtype));
    NVTE_CHECK(out.columnwise_data.shape == std::vector<size_t>({spec.cols, spec.rows}), "argument '", arg,
               "': expected column-wise (transposed) data of shape ", shape_str({spec.cols, spec.rows}),
               ", got ", shape_str(out.columnwise_data.shape));
    spec.colwise = true;
  }
  return spec;
}


}  // namespace nvte
