// C API entry of nvte_delayed_scaling_recipe_amax_and_scale_update: argument checks (in-place
// aliasing allowed, partial overlaps rejected), then routing on the tensors' device to the CPU
// kernel or the GPU launcher (delayed_scaling.cu).
#include "transformer_engine_lite/recipe.h"

#include <cmath>
#include <cstring>
#include <string>

#include "../util/api.h"
#include "../util/tensor.h"
#include "delayed_scaling_cpu.h"
#include "delayed_scaling_gpu.h"

namespace nvte {
namespace {

// An output may be the very buffer of its input (in-place) but must not partly overlap it or any
// other buffer of the call.
void check_alias_or_disjoint(const SimpleTensor &out, const char *out_arg, const SimpleTensor &in,
                             const char *in_arg) {
  if (out.dptr == in.dptr && out.shape == in.shape) return;
  check_no_overlap(in, in_arg, out, out_arg);
}

}  // namespace
}  // namespace nvte

using namespace nvte;

NVTEStatus nvte_delayed_scaling_recipe_amax_and_scale_update(
    const NVTETensor amax_history, const NVTETensor scale, NVTETensor updated_amax_history,
    NVTETensor updated_scale, const char *amax_compute_algo, NVTEDType fp8_dtype, float margin,
    NVTEStream stream) {
  return guarded("nvte_delayed_scaling_recipe_amax_and_scale_update", [&] {
    (void)stream;  // only the GPU launcher takes it: the CPU path is synchronous
    const Tensor &hist = as_tensor(amax_history, "amax_history");
    const Tensor &sc = as_tensor(scale, "scale");
    const Tensor &uhist = as_tensor(updated_amax_history, "updated_amax_history");
    const Tensor &usc = as_tensor(updated_scale, "updated_scale");
    NVTE_CHECK(amax_compute_algo != nullptr,
               "argument 'amax_compute_algo': expected \"max\" or \"most_recent\", got NULL");
    const std::string algo = amax_compute_algo;
    NVTE_CHECK(algo == "max" || algo == "most_recent",
               "argument 'amax_compute_algo': expected \"max\" or \"most_recent\", got \"", algo,
               "\"");
    NVTE_CHECK(is_fp8(fp8_dtype), "argument 'fp8_dtype': expected an FP8 dtype (float8_e4m3, ",
               "float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz), got ", dtype_name(fp8_dtype));
    NVTE_CHECK(std::isfinite(margin), "argument 'margin': expected a finite number, got ", margin);

    check_has_data(hist, "amax_history");
    check_has_data(sc, "scale");
    check_has_data(uhist, "updated_amax_history");
    check_has_data(usc, "updated_scale");
    check_dtype(hist.data, "amax_history", {kNVTEFloat32});
    check_dtype(sc.data, "scale", {kNVTEFloat32});
    check_dtype(uhist.data, "updated_amax_history", {kNVTEFloat32});
    check_dtype(usc.data, "updated_scale", {kNVTEFloat32});
    check_ndim(hist.data, "amax_history", 2);
    const size_t length = hist.data.shape[0], num_scales = hist.data.shape[1];
    NVTE_CHECK(length >= 1, "argument 'amax_history': expected a history length >= 1, got shape ",
               shape_str(hist.data.shape));
    check_shape(sc.data, "scale", {num_scales});
    check_same_shape(hist.data, "amax_history", uhist.data, "updated_amax_history");
    check_shape(usc.data, "updated_scale", {num_scales});

    check_alias_or_disjoint(uhist.data, "updated_amax_history", hist.data, "amax_history");
    check_alias_or_disjoint(usc.data, "updated_scale", sc.data, "scale");
    check_no_overlap(sc.data, "scale", uhist.data, "updated_amax_history");
    check_no_overlap(hist.data, "amax_history", usc.data, "updated_scale");
    check_no_overlap(uhist.data, "updated_amax_history", usc.data, "updated_scale");

    const NVTEDevice device = check_same_device({{&hist, "amax_history"},
                                                 {&sc, "scale"},
                                                 {&uhist, "updated_amax_history"},
                                                 {&usc, "updated_scale"}});

    DelayedScalingParams p;
    p.amax_history = hist.data.ptr<const float>();
    p.scale = sc.data.ptr<const float>();
    p.updated_amax_history = uhist.data.ptr<float>();
    p.updated_scale = usc.data.ptr<float>();
    p.history_length = length;
    p.num_scales = num_scales;
    p.most_recent = algo == "most_recent";
    p.fp8_max = fp8_max(fp8_dtype);
    // 2^margin rounded once to fp32 (exact for integer margins).
    p.margin_factor = static_cast<float>(std::exp2(static_cast<double>(margin)));
    if (use_gpu(device, "nvte_delayed_scaling_recipe_amax_and_scale_update")) {
#ifdef NVTE_WITH_GPU
      gpu::launch_delayed_scaling_update(p, stream);
#endif
      return;
    }
    launch_delayed_scaling_update(p);
  });
}
