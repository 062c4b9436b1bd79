// te_lite scaling-recipe handlers (pytorch/csrc/cast.cpp's scale ops): current scaling's
// compute_scale_from_amax and the functional delayed_scaling_update. No result carries the FP8
// dtype here, so it is a string attribute with jnp's name ("float8_e4m3fn", ...).
#include <memory>
#include <string>

#include <transformer_engine_lite/cast.h>
#include <transformer_engine_lite/recipe.h>

#include "handler.h"

namespace te_lite {
namespace {

// The fp8_dtype attribute, checked with the torch binding's message (names are jnp's).
ffi::Error parse_fp8_dtype(const char *op, std::string_view name, NVTEDType *out) {
  const std::optional<NVTEDType> dtype = fp8_dtype_from_name(name);
  TE_LITE_CHECK(dtype.has_value(), op,
                ": argument 'fp8_dtype': expected dtype in {float8_e4m3fn, float8_e5m2, "
                "float8_e4m3fnuz, float8_e5m2fnuz}, got ",
                name);
  *out = *dtype;
  return ffi::Error::Success();
}

// RAII NVTEQuantizationConfig.
struct ConfigDeleter {
  void operator()(void *c) const { nvte_destroy_quantization_config(c); }
};

ffi::Error compute_scale_from_amax(const Device &dev, Buffer amax, Buffer scale, Buffer scale_inv,
                                   std::string_view fp8_dtype, double epsilon,
                                   bool force_pow_2_scales) {
  constexpr const char *kOp = "te_lite::compute_scale_from_amax";
  TE_LITE_TRY(check_fp32_scalar(kOp, "amax", amax));
  NVTEDType fp8 = kNVTEFloat8E4M3;
  TE_LITE_TRY(parse_fp8_dtype(kOp, fp8_dtype, &fp8));
  TE_LITE_TRY(check_result(kOp, "scale", scale, DataType::F32, {1}));
  TE_LITE_TRY(check_result(kOp, "scale_inv", scale_inv, DataType::F32, {1}));
  std::unique_ptr<void, ConfigDeleter> config(nvte_create_quantization_config());
  if (config == nullptr) throw std::bad_alloc();
  const float eps = static_cast<float>(epsilon);
  TE_LITE_TRY(check_nvte(kOp, nvte_set_quantization_config_attribute(
                                  config.get(), kNVTEQuantizationConfigAmaxEpsilon, &eps,
                                  sizeof(eps))));
  TE_LITE_TRY(check_nvte(kOp, nvte_set_quantization_config_attribute(
                                  config.get(), kNVTEQuantizationConfigForcePow2Scales,
                                  &force_pow_2_scales, sizeof(bool))));
  TensorWrapper out(dev);
  out.declare_dtype(fp8).amax(amax).scale(scale).scale_inv(scale_inv);
  return check_nvte(kOp, nvte_compute_scale_from_amax(out.get(), config.get(), dev.stream));
}

ffi::Error delayed_scaling_update(const Device &dev, Buffer history, Buffer scale,
                                  Buffer new_history, Buffer new_scale,
                                  std::string_view amax_compute_algo, std::string_view fp8_dtype,
                                  double margin) {
  constexpr const char *kOp = "te_lite::delayed_scaling_update";
  TE_LITE_TRY(check_dtype(kOp, "amax_history", history, {DataType::F32}));
  TE_LITE_TRY(check_ndim(kOp, "amax_history", history, 2));
  TE_LITE_TRY(check_dtype(kOp, "scale", scale, {DataType::F32}));
  TE_LITE_TRY(check_ndim(kOp, "scale", scale, 1));
  TE_LITE_CHECK(dim(scale, 0) == dim(history, 1), kOp, ": argument 'scale': expected shape [",
                dim(history, 1), "] (one scale per amax_history column), got ", shape_str(scale));
  NVTEDType fp8 = kNVTEFloat8E4M3;
  TE_LITE_TRY(parse_fp8_dtype(kOp, fp8_dtype, &fp8));
  TE_LITE_TRY(check_result(kOp, "new_history", new_history, DataType::F32, shape_of(history)));
  TE_LITE_TRY(check_result(kOp, "new_scale", new_scale, DataType::F32, shape_of(scale)));
  TensorWrapper h(dev), s(dev), nh(dev), ns(dev);
  h.data(history);
  s.data(scale);
  nh.data(new_history);
  ns.data(new_scale);
  const std::string algo(amax_compute_algo);  // the core takes a C string
  return check_nvte(kOp, nvte_delayed_scaling_recipe_amax_and_scale_update(
                             h.get(), s.get(), nh.get(), ns.get(), algo.c_str(), fp8,
                             static_cast<float>(margin), dev.stream));
}

}  // namespace

TE_LITE_FFI_HANDLERS(compute_scale_from_amax, compute_scale_from_amax,
                     .Arg<Buffer>()                        // amax: float32 [1]
                     .Ret<Buffer>()                        // scale: float32 [1]
                     .Ret<Buffer>()                        // scale_inv: float32 [1]
                     .Attr<std::string_view>("fp8_dtype")  // jnp name of the FP8 dtype
                     .Attr<double>("epsilon")              // amax is clamped to at least this
                     .Attr<bool>("force_pow_2_scales")     // round the scale down to 2^k
);

TE_LITE_FFI_HANDLERS(delayed_scaling_update, delayed_scaling_update,
                     .Arg<Buffer>()                                // amax_history: float32 [H, N]
                     .Arg<Buffer>()                                // scale: float32 [N]
                     .Ret<Buffer>()                                // new_history: float32 [H, N]
                     .Ret<Buffer>()                                // new_scale: float32 [N]
                     .Attr<std::string_view>("amax_compute_algo")  // "max" or "most_recent"
                     .Attr<std::string_view>("fp8_dtype")          // jnp name of the FP8 dtype
                     .Attr<double>("margin")                       // fp8_max / amax / 2^margin
);

}  // namespace te_lite
