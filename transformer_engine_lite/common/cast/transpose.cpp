// C API entries of nvte_transpose and nvte_cast_transpose: argument checks, then the CPU kernels.
#include "transformer_engine_lite/transpose.h"

#include "../util/api.h"
#include "../util/tensor.h"
#include "quantize.h"
#include "quantize_cpu.h"

using namespace nvte;

NVTEStatus nvte_transpose(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return guarded("nvte_transpose", [&] {
    (void)stream;
    const Tensor &in = as_tensor(input, "input");
    const Tensor &out = as_tensor(output, "output");
    // Only the row-wise buffers move; MXFP8 block scales would not follow a transpose.
    NVTE_CHECK(in.scaling_mode != NVTE_MXFP8_1D_SCALING,
               "argument 'input': expected a tensor without MXFP8 block scaling (its scales do not ",
               "transpose), got NVTE_MXFP8_1D_SCALING");
    NVTE_CHECK(out.scaling_mode != NVTE_MXFP8_1D_SCALING,
               "argument 'output': expected a tensor without MXFP8 block scaling, got ",
               "NVTE_MXFP8_1D_SCALING");
    check_has_data(in, "input");
    check_has_data(out, "output");
    check_ndim(in.data, "input", 2);
    NVTE_CHECK(dtype_size(in.data.dtype) > 0, "argument 'input': expected a known dtype, got ",
               static_cast<int>(in.data.dtype));
    NVTE_CHECK(out.data.dtype == in.data.dtype, "argument 'output': expected dtype ",
               dtype_name(in.data.dtype), " (that of 'input'), got ", dtype_name(out.data.dtype));
    check_shape(out.data, "output", {in.data.shape[1], in.data.shape[0]});
    check_no_overlap(in.data, "input", out.data, "output");
    require_cpu_backend(check_same_device({{&in, "input"}, {&out, "output"}}), "nvte_transpose");
    launch_transpose(in.data, out.data);
  });
}

NVTEStatus nvte_cast_transpose(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return guarded("nvte_cast_transpose", [&] {
    (void)stream;
    const Tensor &in = as_tensor(input, "input");
    const Tensor &out = as_tensor(output, "output");
    check_has_data(in, "input");
    check_ndim(in.data, "input", 2);
    NVTE_CHECK(out.scaling_mode == NVTE_DELAYED_TENSOR_SCALING,
               "argument 'output': expected scaling mode NVTE_DELAYED_TENSOR_SCALING (per-tensor ",
               "FP8), got ", static_cast<int>(out.scaling_mode));
    NVTE_CHECK(out.data.has_data(), "argument 'output': expected row-wise FP8 data, got a null ",
               "pointer (", out.data.describe(), ")");
    NVTE_CHECK(out.columnwise_data.has_data(), "argument 'output': expected column-wise ",
               "(transposed) FP8 data, got a null pointer (", out.columnwise_data.describe(), ")");
    // The emitter writes the transposed copy in the same pass as the row-wise one: nvte_quantize
    // with a column-wise buffer is the fused cast-transpose.
    const OutputEmitter em = make_quantize_emitter(in, out, "nvte_cast_transpose");
    launch_quantize(in, em);
  });
}
