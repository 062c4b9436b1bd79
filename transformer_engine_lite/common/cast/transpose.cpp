// C API entries of nvte_transpose and nvte_cast_transpose: argument checks, then routing on the
// tensors' device to the CPU kernels or the GPU launchers (transpose.cu).
#include "transformer_engine_lite/transpose.h"

#include "../util/api.h"
#include "../util/tensor.h"
#include "emit_cpu.h"
#include "quantize.h"
#include "quantize_cpu.h"
#include "quantize_gpu.h"

using namespace nvte;

NVTEStatus nvte_transpose(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return guarded("nvte_transpose", [&] {
    (void)stream;  // only GPU launchers take it: the CPU path is synchronous
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
    if (use_gpu(check_same_device({{&in, "input"}, {&out, "output"}}), "nvte_transpose")) {
#ifdef NVTE_WITH_GPU
      gpu::launch_transpose(in, out, stream);
#endif
      return;
    }
    launch_transpose(in.data, out.data);
  });
}

NVTEStatus nvte_cast_transpose(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return guarded("nvte_cast_transpose", [&] {
    (void)stream;  // only GPU launchers take it: the CPU path is synchronous
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
    const QuantizeArgs args = check_quantize_args(in, out);
    if (use_gpu(args.device, "nvte_cast_transpose")) {
#ifdef NVTE_WITH_GPU
      gpu::launch_cast_transpose(in, out, args.spec, stream);
#endif
      return;
    }
    // The emitter writes the transposed copy in the same pass as the row-wise one: nvte_quantize
    // with a column-wise buffer is the fused cast-transpose.
    launch_quantize(in, OutputEmitter(out, args.spec));
  });
}
