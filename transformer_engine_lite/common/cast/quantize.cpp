// C API entries of nvte_quantize, nvte_dequantize, nvte_compute_amax, nvte_compute_scale_from_amax:
// argument checks (all before any write, none reading tensor memory), then routing on the tensors'
// device to the CPU kernels (quantize_cpu.cpp) or the GPU launchers (quantize.cu).
#include "transformer_engine_lite/cast.h"

#include <optional>


#include "../recipe/scaling_math.h"
#include "../util/api.h"
#include "../util/tensor.h"
#include "block_quantize.h"
#include "nvfp4_quantize.h"
#include "emit_cpu.h"
#include "quantize.h"
#include "quantize_cpu.h"
#include "quantize_gpu.h"

namespace nvte {
namespace {

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// The FP8 dtype an output is meant to hold: that of its row-wise data, else of its column-wise
// data, else the dtype its (null) row-wise description names.
DType declared_dtype(const Tensor &t) {
  if (t.data.has_data() || !t.columnwise_data.has_data()) return t.data.dtype;
  return t.columnwise_data.dtype;
}

// Every output buffer of a quantize must be disjoint from the input it reads.
void check_outputs_disjoint(const SimpleTensor &in, const Tensor &out) {
  check_no_overlap(in, "input", out.data, "output (row-wise data)");
  check_no_overlap(in, "input", out.columnwise_data, "output (column-wise data)");
  check_no_overlap(in, "input", out.scale_inv, "output (scale_inv)");
  check_no_overlap(in, "input", out.columnwise_scale_inv, "output (column-wise scale_inv)");
  check_no_overlap(in, "input", out.amax, "output (amax)");
}

// Float8BlockScaling outputs: checks, then the CPU kernel or the GPU launcher (block_quantize.cu).
void quantize_block(const Tensor &in, const Tensor &out, const QuantizationConfig &cfg,
                    NVTEStream stream) {
  check_has_data(in, "input");
  check_dtype(in.data, "input", {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
  const NVTEDevice dev = check_same_device({{&in, "input"}, {&out, "output"}});
  const BlockSpec spec = validate_block_output(out, "output", in.data.shape);
  check_outputs_disjoint(in.data, out);
  check_no_overlap(out.data, "output (row-wise data)", out.columnwise_data,
                   "output (column-wise data)");
  if (use_gpu(dev, "nvte_quantize (block scaling)")) {
#ifdef NVTE_WITH_GPU
    gpu::launch_block_quantize(in, out, spec, cfg, stream);
#endif
    return;
  }
  (void)stream;  // the CPU path is synchronous
  launch_block_quantize(in, out, spec, cfg);
}

// NVFP4 outputs: checks, then the CPU kernel or the GPU launcher (nvfp4_quantize.cu).
void quantize_nvfp4(const Tensor &in, const Tensor &out, const QuantizationConfig &cfg,
                    NVTEStream stream) {
  check_has_data(in, "input");
  check_dtype(in.data, "input", {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
  const NVTEDevice dev = check_same_device({{&in, "input"}, {&out, "output"}});
  const Nvfp4Spec spec = validate_nvfp4_output(out, "output", in.data.shape, cfg);
  check_outputs_disjoint(in.data, out);
  check_no_overlap(in.data, "input", out.columnwise_amax, "output (columnwise_amax)");
  check_no_overlap(out.data, "output (row-wise data)", out.columnwise_data,
                   "output (column-wise data)");
  if (use_gpu(dev, "nvte_quantize (NVFP4)")) {
#ifdef NVTE_WITH_GPU
    gpu::launch_nvfp4_quantize(in, out, spec, stream);
#endif
    return;
  }
  (void)stream;  // the CPU path is synchronous
  launch_nvfp4_quantize(in, out, spec);
}

}  // namespace

QuantizeArgs check_quantize_args(const Tensor &in, const Tensor &out) {
  check_has_data(in, "input");
  check_dtype(in.data, "input", {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
  NVTE_CHECK(is_fp8(declared_dtype(out)), "argument 'output': expected an FP8 dtype (",
             dtype_name(kNVTEFloat8E4M3), ", ", dtype_name(kNVTEFloat8E5M2), ", ",
             dtype_name(kNVTEFloat8E4M3FNUZ), ", ", dtype_name(kNVTEFloat8E5M2FNUZ), "), got ",
             dtype_name(declared_dtype(out)));
  QuantizeArgs args;
  args.device = check_same_device({{&in, "input"}, {&out, "output"}});
  args.spec = validate_output(out, "output", in.data.shape);
  check_outputs_disjoint(in.data, out);
  check_no_overlap(out.data, "output (row-wise data)", out.columnwise_data,
                   "output (column-wise data)");
  return args;
}

}  // namespace nvte

using namespace nvte;

NVTEStatus nvte_quantize(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return guarded("nvte_quantize", [&] {
    (void)stream;  // only GPU launchers take it: the CPU path is synchronous
    const Tensor &in = as_tensor(input, "input");
    const Tensor &out = as_tensor(output, "output");
    if (is_block_scaling(out.scaling_mode))
      return quantize_block(in, out, QuantizationConfig{}, stream);
    if (out.scaling_mode == NVTE_NVFP4_1D_SCALING)
      return quantize_nvfp4(in, out, QuantizationConfig{}, stream);
    const QuantizeArgs args = check_quantize_args(in, out);
    if (use_gpu(args.device, "nvte_quantize")) {
#ifdef NVTE_WITH_GPU
      gpu::launch_quantize(in, out, args.spec, stream);
#endif
      return;
    }
    // The CPU emitter reads the output's scale, so it is built only after routing (host memory).
    launch_quantize(in, OutputEmitter(out, args.spec));
  });
}

NVTEStatus nvte_quantize_v2(const NVTETensor input, NVTETensor output,
                            const NVTEQuantizationConfig config, NVTEStream stream) {
  const NVTEScalingMode mode = nvte_tensor_scaling_mode(output);
  if (!config || !(is_block_scaling(mode) || mode == NVTE_NVFP4_1D_SCALING))
    return nvte_quantize(input, output, stream);  // other modes take their scales from `output`
  return guarded("nvte_quantize_v2", [&] {
    const auto &cfg = *static_cast<const QuantizationConfig *>(config);
    if (mode == NVTE_NVFP4_1D_SCALING)
      quantize_nvfp4(as_tensor(input, "input"), as_tensor(output, "output"), cfg, stream);
    else
      quantize_block(as_tensor(input, "input"), as_tensor(output, "output"), cfg, stream);
  });
}

NVTEStatus nvte_dequantize(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return guarded("nvte_dequantize", [&] {
    (void)stream;  // only GPU launchers take it: the CPU path is synchronous
    const Tensor &in = as_tensor(input, "input");
    const Tensor &out = as_tensor(output, "output");
    const bool has_row = in.data.has_data(), has_col = in.columnwise_data.has_data();
    if (in.scaling_mode == NVTE_NVFP4_1D_SCALING) {
      check_has_data(out, "output");
      check_dtype(out.data, "output", {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
      const Nvfp4Spec spec = validate_nvfp4_input(in, "input", out.data.shape);
      for (const SimpleTensor *b : {&in.data, &in.columnwise_data, &in.scale_inv,
                                    &in.columnwise_scale_inv, &in.amax, &in.columnwise_amax})
        check_no_overlap(*b, "input", out.data, "output");
      const NVTEDevice dev = check_same_device({{&in, "input"}, {&out, "output"}});
      if (use_gpu(dev, "nvte_dequantize (NVFP4)")) {
#ifdef NVTE_WITH_GPU
        gpu::launch_nvfp4_dequantize(in, spec, out.data, stream);
#endif
        return;
      }
      launch_nvfp4_dequantize(in, spec, out.data);
      return;
    }
    std::optional<BlockSpec> block;  // set for NVTE_BLOCK_SCALING_1D/2D input
    if (is_block_scaling(in.scaling_mode)) {
      block = validate_block_input(in, "input");
    } else if (in.scaling_mode == NVTE_MXFP8_1D_SCALING) {
      NVTE_CHECK(has_row || has_col,
                 "argument 'input': expected MXFP8 row-wise or column-wise data, "
                 "got neither (null pointers)");
      // The row-wise copy is preferred; a column-wise copy alone holds the same values.
      const SimpleTensor &q = has_row ? in.data : in.columnwise_data;
      const SimpleTensor &s = has_row ? in.scale_inv : in.columnwise_scale_inv;
      const char *what = has_row ? "row-wise" : "column-wise";
      NVTE_CHECK(is_fp8(q.dtype), "argument 'input': expected ", what,
                 " data of an FP8 dtype, got ", dtype_name(q.dtype));
      NVTE_CHECK(s.has_data(), "argument 'input': expected ", what,
                 " E8M0 scale_inv for MXFP8 data, got a null pointer");
      check_dtype(s, "input (scale_inv)", {kNVTEFloat8E8M0, kNVTEByte});
      const std::vector<size_t> expected =
          has_row ? std::vector<size_t>{q.rows(), ceil_div(q.cols(), 32)}
                  : std::vector<size_t>{ceil_div(q.rows(), 32), q.cols()};
      NVTE_CHECK(s.shape == expected, "argument 'input': expected ", what, " scale_inv shape ",
                 shape_str(expected), " for data ", q.describe(), ", got ", shape_str(s.shape));
    } else {
      NVTE_CHECK(in.scaling_mode == NVTE_DELAYED_TENSOR_SCALING,
                 "argument 'input': expected scaling mode NVTE_DELAYED_TENSOR_SCALING, "
                 "NVTE_MXFP8_1D_SCALING, NVTE_BLOCK_SCALING_1D/2D or NVTE_NVFP4_1D_SCALING, got ",
                 static_cast<int>(in.scaling_mode));
      NVTE_CHECK(has_row, "argument 'input': expected per-tensor FP8 row-wise data, got a null ",
                 "pointer (", in.data.describe(), ")");
      NVTE_CHECK(is_fp8(in.data.dtype), "argument 'input': expected an FP8 dtype, got ",
                 dtype_name(in.data.dtype));
      check_fp32_scalar(in.scale_inv, "input", "scale_inv");
    }
    const SimpleTensor &q = has_row ? in.data : in.columnwise_data;
    check_has_data(out, "output");
    check_dtype(out.data, "output", {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
    check_same_shape(q, "input", out.data, "output");
    check_no_overlap(q, "input", out.data, "output");
    check_no_overlap(has_row ? in.scale_inv : in.columnwise_scale_inv, "input (scale_inv)",
                     out.data, "output");
    const NVTEDevice dev = check_same_device({{&in, "input"}, {&out, "output"}});
    if (block) {
      if (use_gpu(dev, "nvte_dequantize (block scaling)")) {
#ifdef NVTE_WITH_GPU
        gpu::launch_block_dequantize(in, *block, out.data, stream);
#endif
        return;
      }
      launch_block_dequantize(in, *block, out.data);
      return;
    }
    if (use_gpu(dev, "nvte_dequantize")) {
#ifdef NVTE_WITH_GPU
      gpu::launch_dequantize(in, out, stream);
#endif
      return;
    }
    launch_dequantize(in, out.data);
  });
}

NVTEStatus nvte_compute_amax(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return guarded("nvte_compute_amax", [&] {
    (void)stream;  // only GPU launchers take it: the CPU path is synchronous
    const Tensor &in = as_tensor(input, "input");
    Tensor &out = as_tensor_mut(output, "output");
    check_has_data(in, "input");
    check_dtype(in.data, "input", {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
    check_fp32_scalar(out.amax, "output", "amax");
    check_no_overlap(in.data, "input", out.amax, "output (amax)");
    if (use_gpu(check_same_device({{&in, "input"}, {&out, "output"}}), "nvte_compute_amax")) {
#ifdef NVTE_WITH_GPU
      gpu::launch_compute_amax(in, out, stream);
#endif
      return;
    }
    *out.amax.ptr<float>() = launch_compute_amax(in.data);
  });
}

NVTEStatus nvte_compute_scale_from_amax(NVTETensor output, const NVTEQuantizationConfig config,
                                        NVTEStream stream) {
  return guarded("nvte_compute_scale_from_amax", [&] {
    (void)stream;  // only GPU launchers take it: the CPU path is synchronous
    Tensor &out = as_tensor_mut(output, "output");
    NVTE_CHECK(out.scaling_mode == NVTE_DELAYED_TENSOR_SCALING,
               "argument 'output': expected scaling mode NVTE_DELAYED_TENSOR_SCALING (per-tensor "
               "current scaling), got ",
               static_cast<int>(out.scaling_mode));
    const DType t = declared_dtype(out);
    NVTE_CHECK(is_fp8(t), "argument 'output': expected an FP8 dtype to take fp8_max from, got ",
               dtype_name(t));
    check_fp32_scalar(out.amax, "output", "amax");
    check_fp32_scalar(out.scale, "output", "scale");
    if (out.scale_inv.has_data()) check_fp32_scalar(out.scale_inv, "output", "scale_inv");
    QuantizationConfig defaults;
    const QuantizationConfig &cfg =
        config ? *static_cast<const QuantizationConfig *>(config) : defaults;
    if (use_gpu(out.device, "nvte_compute_scale_from_amax")) {
#ifdef NVTE_WITH_GPU
      gpu::launch_compute_scale_from_amax(out, cfg, stream);
#endif
      return;
    }
    const float scale = compute_scale_from_amax(*out.amax.ptr<const float>(), fp8_max(t),
                                                cfg.amax_epsilon, cfg.force_pow_2_scales);
    *out.scale.ptr<float>() = scale;
    if (out.scale_inv.has_data()) *out.scale_inv.ptr<float>() = 1.0f / scale;
  });
}
