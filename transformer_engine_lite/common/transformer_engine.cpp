// C API of tensor handles, errors, quantization configs and build info.
#include "transformer_engine_lite/transformer_engine.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "util/api.h"
#include "util/build_info.h"
#include "util/tensor.h"

namespace nvte {

namespace {
thread_local std::string g_last_error;
thread_local NVTEStatus g_last_status = NVTE_SUCCESS;

SimpleTensor *param_slot(Tensor &t, NVTETensorParam p) {
  switch (p) {
    case kNVTERowwiseData: return &t.data;
    case kNVTEColumnwiseData: return &t.columnwise_data;
    case kNVTEScale: return &t.scale;
    case kNVTEAmax: return &t.amax;
    case kNVTERowwiseScaleInv: return &t.scale_inv;
    case kNVTEColumnwiseScaleInv: return &t.columnwise_scale_inv;
    case kNVTEColumnwiseAmax: return &t.columnwise_amax;
    default: return nullptr;
  }
}
}  // namespace

void set_last_error(NVTEStatus status, const std::string &msg) {
  g_last_status = status;
  g_last_error = msg;
}

}  // namespace nvte

using namespace nvte;

NVTETensor nvte_create_tensor(NVTEScalingMode scaling_mode) {
  Tensor *t = new (std::nothrow) Tensor();
  if (t) t->scaling_mode = scaling_mode;
  return t;
}

void nvte_destroy_tensor(NVTETensor tensor) { delete static_cast<Tensor *>(tensor); }

NVTEStatus nvte_set_tensor_param(NVTETensor *tensor, NVTETensorParam param_name,
                                 const NVTEBasicTensor *param) {
  return guarded("nvte_set_tensor_param", [&] {
    NVTE_CHECK(tensor != nullptr, "argument 'tensor': expected a pointer to a handle, got NULL");
    Tensor &t = as_tensor_mut(*tensor, "tensor");
    NVTE_CHECK(param != nullptr, "argument 'param': expected a tensor description, got NULL");
    SimpleTensor *slot = param_slot(t, param_name);
    NVTE_CHECK(slot != nullptr, "argument 'param_name': expected 0..", kNVTENumTensorParams - 1,
               ", got ", static_cast<int>(param_name));
    NVTE_CHECK(param->dtype >= 0 && param->dtype < kNVTENumTypes,
               "argument 'param.dtype': expected 0..", kNVTENumTypes - 1, ", got ",
               static_cast<int>(param->dtype));
    NVTE_CHECK(param->shape.ndim <= NVTE_MAX_NDIM, "argument 'param.shape': expected at most ",
               NVTE_MAX_NDIM, " dims, got ", param->shape.ndim);
    // The buffer's size must be one memory can have (at most PTRDIFF_MAX bytes): a product of dims
    // that wraps around size_t would make every op see a few elements while the rows and columns
    // it walks span far more. An empty shape (a dim of 0) may declare any other dims.
    const std::vector<size_t> dims(param->shape.data, param->shape.data + param->shape.ndim);
    bool empty = false;
    for (size_t d : dims) empty = empty || d == 0;
    if (!empty) {
      const size_t limit = static_cast<size_t>(PTRDIFF_MAX) / std::max<size_t>(dtype_size(param->dtype), 1);
      size_t n = 1;
      for (size_t d : dims) {
        NVTE_CHECK(n <= limit / d, "argument 'param.shape': expected at most ", limit, " ",
                   dtype_name(param->dtype), " elements (PTRDIFF_MAX bytes), got shape ",
                   shape_str(dims));
        n *= d;
      }
    }
    slot->dptr = param->data_ptr;
    slot->dtype = param->dtype;
    slot->shape.assign(param->shape.data, param->shape.data + param->shape.ndim);
  });
}

NVTEBasicTensor nvte_get_tensor_param(const NVTETensor tensor, NVTETensorParam param_name) {
  NVTEBasicTensor out;
  std::memset(&out, 0, sizeof(out));
  if (tensor == nullptr) return out;
  SimpleTensor *slot = param_slot(*static_cast<Tensor *>(tensor), param_name);
  if (slot == nullptr) return out;
  out.data_ptr = slot->dptr;
  out.dtype = slot->dtype;
  out.shape.ndim = slot->shape.size();
  for (size_t i = 0; i < slot->shape.size(); ++i) out.shape.data[i] = slot->shape[i];
  return out;
}

NVTEStatus nvte_set_tensor_param_v2(NVTETensor tensor, NVTETensorParam param, const void *buf,
                                    size_t size_in_bytes) {
  return guarded("nvte_set_tensor_param_v2", [&] {
    Tensor &t = as_tensor_mut(tensor, "tensor");
    NVTE_CHECK(buf != nullptr, "argument 'buf': expected a pointer to the value, got NULL");
    switch (param) {
      case kNVTERowScaledNVFP4: {
        NVTE_CHECK(size_in_bytes == sizeof(uint8_t), "argument 'size_in_bytes': expected 1 "
                   "(uint8) for kNVTERowScaledNVFP4, got ", size_in_bytes);
        const uint8_t v = *static_cast<const uint8_t *>(buf);
        NVTE_CHECK(v <= 1, "argument 'buf': expected 0 or 1 for kNVTERowScaledNVFP4, got ",
                   static_cast<int>(v));
        t.row_scaled_nvfp4 = v != 0;
        break;
      }
      case kNVTENVFP4E4M3Max: {
        NVTE_CHECK(size_in_bytes == sizeof(int32_t), "argument 'size_in_bytes': expected 4 "
                   "(int32) for kNVTENVFP4E4M3Max, got ", size_in_bytes);
        int32_t v;
        std::memcpy(&v, buf, sizeof(v));
        NVTE_CHECK(v == 448 || v == 256, "argument 'buf': expected an NVFP4 E4M3 max of 448 or "
                   "256, got ", v);
        t.nvfp4_e4m3_max = v;
        break;
      }
      default:
        NVTE_ERROR("argument 'param': expected kNVTERowScaledNVFP4 (8) or kNVTENVFP4E4M3Max (9) "
                   "(buffers are set with nvte_set_tensor_param), got ", static_cast<int>(param));
    }
  });
}

void nvte_get_tensor_param_v2(const NVTETensor tensor, NVTETensorParam param, void *buf,
                              size_t size_in_bytes, size_t *size_written) {
  if (tensor == nullptr) return;
  const Tensor &t = *static_cast<const Tensor *>(tensor);
  if (param == kNVTERowScaledNVFP4) {
    if (size_written) *size_written = sizeof(uint8_t);
    if (buf && size_in_bytes >= sizeof(uint8_t))
      *static_cast<uint8_t *>(buf) = t.row_scaled_nvfp4 ? 1 : 0;
  } else if (param == kNVTENVFP4E4M3Max) {
    if (size_written) *size_written = sizeof(int32_t);
    const int32_t v = t.nvfp4_e4m3_max;
    if (buf && size_in_bytes >= sizeof(int32_t)) std::memcpy(buf, &v, sizeof(v));
  } else if (size_written) {
    *size_written = 0;
  }
}

NVTEStatus nvte_set_tensor_device(NVTETensor tensor, NVTEDevice device) {
  return guarded("nvte_set_tensor_device", [&] {
    Tensor &t = as_tensor_mut(tensor, "tensor");
    NVTE_CHECK(device == kNVTEDeviceCPU || device == kNVTEDeviceGPU,
               "argument 'device': expected kNVTEDeviceCPU (0) or kNVTEDeviceGPU (1), got ",
               static_cast<int>(device));
    t.device = device;
  });
}

NVTEDevice nvte_tensor_device(const NVTETensor tensor) {
  return tensor ? static_cast<const Tensor *>(tensor)->device : kNVTEDeviceCPU;
}

NVTEShape nvte_tensor_shape(const NVTETensor tensor) {
  return nvte_get_tensor_param(tensor, kNVTERowwiseData).shape;
}

NVTEDType nvte_tensor_type(const NVTETensor tensor) {
  return nvte_get_tensor_param(tensor, kNVTERowwiseData).dtype;
}

void *nvte_tensor_data(const NVTETensor tensor) {
  return nvte_get_tensor_param(tensor, kNVTERowwiseData).data_ptr;
}

NVTEScalingMode nvte_tensor_scaling_mode(const NVTETensor tensor) {
  return tensor ? static_cast<const Tensor *>(tensor)->scaling_mode : NVTE_INVALID_SCALING;
}

size_t nvte_tensor_numel(const NVTETensor tensor) {
  return tensor ? static_cast<const Tensor *>(tensor)->data.numel() : 0;
}

size_t nvte_dtype_size(NVTEDType dtype) { return dtype_size(dtype); }
const char *nvte_dtype_name(NVTEDType dtype) { return dtype_name(dtype); }

const char *nvte_get_last_error(void) { return g_last_error.c_str(); }
NVTEStatus nvte_get_last_status(void) { return g_last_status; }

const char *nvte_get_version(void) { return NVTE_VERSION_STRING; }
const char *nvte_get_build_info(void) { return build_info_json(); }

NVTEQuantizationConfig nvte_create_quantization_config(void) {
  return new (std::nothrow) QuantizationConfig();
}

void nvte_destroy_quantization_config(NVTEQuantizationConfig config) {
  delete static_cast<QuantizationConfig *>(config);
}

NVTEStatus nvte_set_quantization_config_attribute(NVTEQuantizationConfig config,
                                                  NVTEQuantizationConfigAttribute attr,
                                                  const void *buf, size_t size_in_bytes) {
  return guarded("nvte_set_quantization_config_attribute", [&] {
    NVTE_CHECK(config != nullptr, "argument 'config': expected a config handle, got NULL");
    NVTE_CHECK(buf != nullptr, "argument 'buf': expected a pointer to the value, got NULL");
    auto &c = *static_cast<QuantizationConfig *>(config);
    switch (attr) {
      case kNVTEQuantizationConfigForcePow2Scales:
        NVTE_CHECK(size_in_bytes == sizeof(bool), "argument 'size_in_bytes': expected ",
                   sizeof(bool), " (bool), got ", size_in_bytes);
        std::memcpy(&c.force_pow_2_scales, buf, sizeof(bool));
        break;
      case kNVTEQuantizationConfigAmaxEpsilon:
        NVTE_CHECK(size_in_bytes == sizeof(float), "argument 'size_in_bytes': expected ",
                   sizeof(float), " (float), got ", size_in_bytes);
        {
          float eps;
          std::memcpy(&eps, buf, sizeof(float));
          NVTE_CHECK(eps >= 0.0f, "argument 'buf': expected amax epsilon >= 0, got ", eps);
          c.amax_epsilon = eps;
        }
        break;
      case kNVTEQuantizationConfigRNGState:
        NVTE_CHECK(size_in_bytes == sizeof(NVTETensor), "argument 'size_in_bytes': expected ",
                   sizeof(NVTETensor), " (NVTETensor), got ", size_in_bytes);
        std::memcpy(&c.rng_state, buf, sizeof(NVTETensor));
        break;
      case kNVTEQuantizationConfigNVFP42DQuantization:
      case kNVTEQuantizationConfigStochasticRounding:
      case kNVTEQuantizationConfigNVFP4RHT:
      case kNVTEQuantizationConfigNVFP4AmaxGiven:
        NVTE_CHECK(size_in_bytes == sizeof(bool), "argument 'size_in_bytes': expected ",
                   sizeof(bool), " (bool), got ", size_in_bytes);
        std::memcpy(attr == kNVTEQuantizationConfigNVFP42DQuantization ? &c.nvfp4_2d_quantization
                    : attr == kNVTEQuantizationConfigStochasticRounding ? &c.stochastic_rounding
                    : attr == kNVTEQuantizationConfigNVFP4RHT           ? &c.nvfp4_rht
                                                                        : &c.nvfp4_amax_given,
                    buf, sizeof(bool));
        break;
      case kNVTEQuantizationConfigNVFP4RHTSignMask:
        NVTE_CHECK(size_in_bytes == sizeof(uint32_t), "argument 'size_in_bytes': expected ",
                   sizeof(uint32_t), " (uint32), got ", size_in_bytes);
        std::memcpy(&c.nvfp4_rht_sign_mask, buf, sizeof(uint32_t));
        NVTE_CHECK(c.nvfp4_rht_sign_mask <= 0xFFFFu, "argument 'buf': expected a 16-bit RHT "
                   "sign mask, got ", c.nvfp4_rht_sign_mask);
        break;
      case kNVTEQuantizationConfigNVFP44Over6Mode: {
        NVTE_CHECK(size_in_bytes == sizeof(uint8_t), "argument 'size_in_bytes': expected 1 "
                   "(uint8 NVTENVFP44Over6Mode), got ", size_in_bytes);
        const uint8_t m = *static_cast<const uint8_t *>(buf);
        NVTE_CHECK(m <= kNVTENVFP44Over6MinMSE, "argument 'buf': expected an NVTENVFP44Over6Mode "
                   "(0 disabled, 1 MAE, 2 MSE), got ", static_cast<int>(m));
        c.nvfp4_4over6_mode = m;
        break;
      }
      case kNVTEQuantizationConfigNVFP44Over6ErrUseFastMath:
        NVTE_CHECK(size_in_bytes == sizeof(bool), "argument 'size_in_bytes': expected ",
                   sizeof(bool), " (bool), got ", size_in_bytes);
        std::memcpy(&c.nvfp4_4over6_err_fast_math, buf, sizeof(bool));
        break;
      default:
        NVTE_ERROR("argument 'attr': expected 0, 1, 4, 5, 6, 8, 9, 64, 65 or 66, got ",
                   static_cast<int>(attr));
    }
  });
}
