// Shared by every te_lite op binding: at::Tensor -> NVTETensor wrapping, torch <-> NVTE dtypes,
// argument checks that name the argument, status -> TORCH_CHECK, device guard + stream.
//
// Bindings only validate, wrap and call nvte_* (ARCHITECTURE.md §3). NVTE_TORCH_CUDA is defined by
// build_tools/pytorch.py when the core has a GPU backend and torch was built with CUDA; without it
// only CPU implementations are registered and nothing here touches a GPU header.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#ifdef NVTE_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <transformer_engine_lite/cast.h>
#include <transformer_engine_lite/transformer_engine.h>

namespace te_lite {

// ------------------------------------------------------------------------------------ dtypes
// Named dtype lists used by the checks (STYLE.md item 5): messages print the expected list.
inline constexpr at::ScalarType kHighPrecision[] = {at::kFloat, at::kHalf, at::kBFloat16};
inline constexpr at::ScalarType kFP8[] = {at::ScalarType::Float8_e4m3fn,
                                          at::ScalarType::Float8_e5m2,
                                          at::ScalarType::Float8_e4m3fnuz,
                                          at::ScalarType::Float8_e5m2fnuz};

template <size_t N>
inline bool one_of(at::ScalarType t, const at::ScalarType (&list)[N]) {
  for (at::ScalarType x : list) {
    if (x == t) return true;
  }
  return false;
}
inline bool is_fp8(at::ScalarType t) { return one_of(t, kFP8); }
inline bool is_high_precision(at::ScalarType t) { return one_of(t, kHighPrecision); }

// torch dtype -> NVTEDType. uint8 is kNVTEByte (masks, raw bytes); MXFP8 E8M0 scales are uint8
// tensors whose NVTE dtype the wrapper overrides with kNVTEFloat8E8M0.
inline std::optional<NVTEDType> nvte_dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kNVTEFloat32;
    case at::kHalf: return kNVTEFloat16;
    case at::kBFloat16: return kNVTEBFloat16;
    case at::ScalarType::Float8_e4m3fn: return kNVTEFloat8E4M3;
    case at::ScalarType::Float8_e5m2: return kNVTEFloat8E5M2;
    case at::ScalarType::Float8_e4m3fnuz: return kNVTEFloat8E4M3FNUZ;
    case at::ScalarType::Float8_e5m2fnuz: return kNVTEFloat8E5M2FNUZ;
    case at::kByte:
    case at::kBool: return kNVTEByte;
    case at::kShort: return kNVTEInt16;
    case at::kInt: return kNVTEInt32;
    case at::kLong: return kNVTEInt64;
    default: return std::nullopt;
  }
}

// NVTEDType -> torch dtype, for buffers the core sizes itself (workspaces).
inline at::ScalarType torch_dtype_of(NVTEDType t) {
  switch (t) {
    case kNVTEFloat32: return at::kFloat;
    case kNVTEFloat16: return at::kHalf;
    case kNVTEBFloat16: return at::kBFloat16;
    case kNVTEInt16: return at::kShort;
    case kNVTEInt32: return at::kInt;
    case kNVTEInt64: return at::kLong;
    case kNVTEFloat8E4M3: return at::ScalarType::Float8_e4m3fn;
    case kNVTEFloat8E5M2: return at::ScalarType::Float8_e5m2;
    case kNVTEFloat8E4M3FNUZ: return at::ScalarType::Float8_e4m3fnuz;
    case kNVTEFloat8E5M2FNUZ: return at::ScalarType::Float8_e5m2fnuz;
    default: return at::kByte;  // kNVTEByte, kNVTEFloat8E8M0
  }
}

// torch's Python name of a dtype ("float32", "float8_e4m3fn"), for messages.
inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case at::ScalarType::Float8_e5m2: return "float8_e5m2";
    case at::ScalarType::Float8_e4m3fnuz: return "float8_e4m3fnuz";
    case at::ScalarType::Float8_e5m2fnuz: return "float8_e5m2fnuz";
    case at::kByte: return "uint8";
    case at::kChar: return "int8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kBool: return "bool";
    default: return c10::toString(t);
  }
}

// ------------------------------------------------------------------------------------ checks
// Every message: "<op>: argument '<arg>': expected ..., got ...". TORCH_CHECK -> RuntimeError.

template <size_t N>
inline void check_dtype(const char *op, const char *arg, at::ScalarType got,
                        const at::ScalarType (&allowed)[N]) {
  if (one_of(got, allowed)) return;
  std::string names;
  for (size_t i = 0; i < N; ++i) {
    names += (i ? ", " : "");
    names += dtype_name(allowed[i]);
  }
  TORCH_CHECK(false, op, ": argument '", arg, "': expected dtype in {", names, "}, got ",
              dtype_name(got));
}
template <size_t N>
inline void check_dtype(const char *op, const char *arg, const at::Tensor &t,
                        const at::ScalarType (&allowed)[N]) {
  check_dtype(op, arg, t.scalar_type(), allowed);
}

inline void check_ndim(const char *op, const char *arg, const at::Tensor &t, int64_t ndim) {
  TORCH_CHECK(t.dim() == ndim, op, ": argument '", arg, "': expected ", ndim,
              "-D tensor, got shape ", t.sizes());
}

inline void check_min_ndim(const char *op, const char *arg, const at::Tensor &t, int64_t ndim) {
  TORCH_CHECK(t.dim() >= ndim, op, ": argument '", arg, "': expected at least ", ndim,
              " dims, got shape ", t.sizes());
}

// Per-tensor scale / scale_inv / amax: float32 with one element.
inline void check_fp32_scalar(const char *op, const char *arg, const at::Tensor &t) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.numel() == 1, op, ": argument '", arg,
              "': expected a float32 tensor with one element, got ", dtype_name(t.scalar_type()),
              " of shape ", t.sizes());
}

// All tensors of one call live on one device (the core also checks its device tags).
inline void check_same_device(const char *op, const at::Tensor &ref, const char *ref_arg,
                              const at::Tensor &t, const char *arg) {
  TORCH_CHECK(t.device() == ref.device(), op, ": argument '", arg, "': expected device ",
              ref.device(), " (that of '", ref_arg, "'), got ", t.device());
}

// A failed nvte_* call: the core's message names the C argument and what it expected.
// NVTE_ERROR_UNSUPPORTED becomes NotImplementedError (a RuntimeError), the rest RuntimeError.
inline void check_nvte(NVTEStatus status, const char *op) {
  if (status == NVTE_SUCCESS) return;
  TORCH_CHECK_NOT_IMPLEMENTED(status != NVTE_ERROR_UNSUPPORTED, op, ": ", nvte_get_last_error());
  TORCH_CHECK(false, op, ": ", nvte_get_last_error());
}

// ------------------------------------------------------------------------------------ tensors
// Address given to empty tensors (see TensorWrapper::set); never read or written.
inline void *empty_tensor_address() {
  alignas(64) static unsigned char dummy[64];
  return dummy;
}

// RAII NVTETensor over caller-owned at::Tensors (which must outlive it and be contiguous). A buffer
// on a CUDA device tags the handle kNVTEDeviceGPU.
class TensorWrapper {
 public:
  explicit TensorWrapper(NVTEScalingMode mode = NVTE_DELAYED_TENSOR_SCALING)
      : handle_(nvte_create_tensor(mode)) {
    TORCH_CHECK(handle_ != nullptr, "nvte_create_tensor: out of memory");
  }
  ~TensorWrapper() { nvte_destroy_tensor(handle_); }
  TensorWrapper(const TensorWrapper &) = delete;
  TensorWrapper &operator=(const TensorWrapper &) = delete;
  TensorWrapper(TensorWrapper &&other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)) {}
  TensorWrapper &operator=(TensorWrapper &&) = delete;

  TensorWrapper &data(const at::Tensor &t) { return set(kNVTERowwiseData, t); }
  TensorWrapper &columnwise_data(const at::Tensor &t) { return set(kNVTEColumnwiseData, t); }
  TensorWrapper &scale(const at::Tensor &t) { return set(kNVTEScale, t); }
  TensorWrapper &amax(const at::Tensor &t) { return set(kNVTEAmax, t); }
  // Per-tensor: fp32 scalar. MXFP8 (uint8 E8M0 bytes): pass kNVTEFloat8E8M0.
  TensorWrapper &scale_inv(const at::Tensor &t, std::optional<NVTEDType> as = std::nullopt) {
    return set(kNVTERowwiseScaleInv, t, as);
  }
  TensorWrapper &columnwise_scale_inv(const at::Tensor &t,
                                      std::optional<NVTEDType> as = std::nullopt) {
    return set(kNVTEColumnwiseScaleInv, t, as);
  }
  // Row-wise description without memory: tells the core which dtype an output is meant to hold
  // (nvte_compute_scale_from_amax takes fp8_max from it).
  TensorWrapper &declare_dtype(NVTEDType dtype) {
    NVTEBasicTensor bt{};
    bt.dtype = dtype;
    bt.shape.ndim = 1;
    bt.shape.data[0] = 0;
    set_param(kNVTERowwiseData, bt);
    return *this;
  }

  // Sets `param` from a contiguous tensor; `as` overrides the NVTE dtype (E8M0 bytes).
  TensorWrapper &set(NVTETensorParam param, const at::Tensor &t,
                     std::optional<NVTEDType> as = std::nullopt) {
    TORCH_CHECK(t.is_contiguous(), "te_lite: internal: tensor param ", static_cast<int>(param),
                " is not contiguous (strides ", t.strides(), ")");
    TORCH_CHECK(t.dim() <= NVTE_MAX_NDIM, "te_lite: expected at most ", NVTE_MAX_NDIM,
                " dims, got shape ", t.sizes());
    const std::optional<NVTEDType> dtype = as ? as : nvte_dtype_of(t.scalar_type());
    TORCH_CHECK(dtype.has_value(), "te_lite: dtype ", dtype_name(t.scalar_type()),
                " has no transformer_engine_lite equivalent");
    NVTEBasicTensor bt{};
    bt.data_ptr = t.data_ptr();
    // An empty tensor (torch gives it no storage) is still present: the core reads a null pointer as
    // "absent", so it gets an address that is never dereferenced (no element to read or write).
    if (t.numel() == 0 && bt.data_ptr == nullptr) bt.data_ptr = empty_tensor_address();
    bt.dtype = *dtype;
    // A 0-dim tensor (a scalar) is described as [1].
    bt.shape.ndim = t.dim() == 0 ? 1 : static_cast<size_t>(t.dim());
    bt.shape.data[0] = 1;
    for (int64_t i = 0; i < t.dim(); ++i) bt.shape.data[i] = static_cast<size_t>(t.size(i));
    set_param(param, bt);
    if (!t.device().is_cpu()) {
      check_nvte(nvte_set_tensor_device(handle_, kNVTEDeviceGPU), "te_lite");
    }
    return *this;
  }

  NVTETensor get() const { return handle_; }

 private:
  void set_param(NVTETensorParam param, const NVTEBasicTensor &bt) {
    check_nvte(nvte_set_tensor_param(&handle_, param, &bt), "te_lite");
  }
  NVTETensor handle_;
};

// An "absent" optional tensor for the core: a handle with no data.
inline TensorWrapper optional_tensor(const std::optional<at::Tensor> &t) {
  TensorWrapper w;
  if (t.has_value() && t->numel() > 0) w.data(*t);
  return w;
}

// Allocates a buffer of the shape and dtype the core reported for `query` (TE's workspace protocol:
// call once with an empty workspace, allocate, call again).
inline at::Tensor allocate_workspace(const TensorWrapper &query, const at::Tensor &like) {
  const NVTEBasicTensor bt = nvte_get_tensor_param(query.get(), kNVTERowwiseData);
  std::vector<int64_t> shape(bt.shape.data, bt.shape.data + bt.shape.ndim);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  // At least one element, so an empty workspace still has a pointer (a null one means "query").
  return at::empty({std::max<int64_t>(numel, 1)}, like.options().dtype(torch_dtype_of(bt.dtype)))
      .narrow(0, 0, numel)
      .view(shape);
}

// ------------------------------------------------------------------------------------ devices
// Sets the current device to that of `t` for the call and provides the stream and SM count the
// core takes (nullptr and 0 on the CPU).
class DeviceContext {
 public:
  explicit DeviceContext(const at::Tensor &t) : device_(t.device()) {
#ifdef NVTE_TORCH_CUDA
    if (device_.is_cuda()) guard_.reset_device(device_);
#endif
  }
  NVTEStream stream() const {
#ifdef NVTE_TORCH_CUDA
    if (device_.is_cuda()) return c10::cuda::getCurrentCUDAStream(device_.index()).stream();
#endif
    return nullptr;
  }
  int sm_count() const {
#ifdef NVTE_TORCH_CUDA
    if (device_.is_cuda()) {
      // Not ATen/cuda/CUDAContext: that header pulls in cuBLAS/cuSPARSE and slows every TU.
      int count = 0;
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount,
                                            device_.index()));
      return count;
    }
#endif
    return 0;
  }
  bool is_gpu() const { return !device_.is_cpu(); }

 private:
  c10::Device device_;
  c10::OptionalDeviceGuard guard_;
};

// ------------------------------------------------------------------------------------ outputs
// Per-tensor FP8 side outputs: amax and scale_inv are float32 [1] for an FP8 output, else [0].
inline at::Tensor fp32_buffer(const at::Tensor &like, bool present) {
  return at::empty({present ? 1 : 0}, like.options().dtype(at::kFloat));
}

// The dtype of an optional-FP8 output, and its `scale` rule: required for FP8, refused otherwise.
inline at::ScalarType output_dtype(const char *op, const at::Tensor &x,
                                   std::optional<at::ScalarType> out_dtype,
                                   const std::optional<at::Tensor> &scale) {
  const at::ScalarType out = out_dtype.value_or(x.scalar_type());
  TORCH_CHECK(is_high_precision(out) || is_fp8(out), op,
              ": argument 'out_dtype': expected float32, float16, bfloat16 or an FP8 dtype, got ",
              dtype_name(out));
  if (is_fp8(out)) {
    TORCH_CHECK(scale.has_value(), op, ": argument 'scale': expected a float32 scale for FP8 ",
                "out_dtype ", dtype_name(out), ", got None");
    check_fp32_scalar(op, "scale", *scale);
    check_same_device(op, x, "x", *scale, "scale");
  } else {
    TORCH_CHECK(!scale.has_value(), op, ": argument 'scale': expected None for out_dtype ",
                dtype_name(out), " (a scale is only used for FP8 outputs), got a tensor");
  }
  return out;
}

// A quantization config (cast.h) carrying the scale rule's attributes: the amax floor and
// power-of-two scales, as nvte_compute_scale_from_amax and nvte_quantize_v2 read them.
struct QuantizationConfigDeleter {
  void operator()(void *c) const { nvte_destroy_quantization_config(c); }
};
using QuantizationConfig = std::unique_ptr<void, QuantizationConfigDeleter>;

inline QuantizationConfig scale_rule_config(const char *op, double amax_epsilon,
                                            bool force_pow_2_scales) {
  QuantizationConfig config(nvte_create_quantization_config());
  TORCH_CHECK(config != nullptr, op, ": nvte_create_quantization_config: out of memory");
  const float eps = static_cast<float>(amax_epsilon);
  check_nvte(nvte_set_quantization_config_attribute(
                 config.get(), kNVTEQuantizationConfigAmaxEpsilon, &eps, sizeof(eps)),
             op);
  check_nvte(nvte_set_quantization_config_attribute(config.get(),
                                                    kNVTEQuantizationConfigForcePow2Scales,
                                                    &force_pow_2_scales, sizeof(bool)),
             op);
  return config;
}

}  // namespace te_lite
