// Tensor handle plumbing for the C API and the shared argument checks.
#include "tensor.h"

#include <cstring>
#include <sstream>

#include "api.h"

namespace nvte {

const char *dtype_name(DType t) {
  switch (t) {
    case kNVTEByte: return "byte";
    case kNVTEInt16: return "int16";
    case kNVTEInt32: return "int32";
    case kNVTEInt64: return "int64";
    case kNVTEFloat32: return "float32";
    case kNVTEFloat16: return "float16";
    case kNVTEBFloat16: return "bfloat16";
    case kNVTEFloat8E4M3: return "float8_e4m3";
    case kNVTEFloat8E5M2: return "float8_e5m2";
    case kNVTEFloat8E8M0: return "float8_e8m0";
    case kNVTEFloat8E4M3FNUZ: return "float8_e4m3fnuz";
    case kNVTEFloat8E5M2FNUZ: return "float8_e5m2fnuz";
    default: return "unknown";
  }
}

size_t dtype_size(DType t) {
  switch (t) {
    case kNVTEByte: case kNVTEFloat8E4M3: case kNVTEFloat8E5M2: case kNVTEFloat8E8M0:
    case kNVTEFloat8E4M3FNUZ: case kNVTEFloat8E5M2FNUZ: return 1;
    case kNVTEInt16: case kNVTEFloat16: case kNVTEBFloat16: return 2;
    case kNVTEInt32: case kNVTEFloat32: return 4;
    case kNVTEInt64: return 8;
    default: return 0;
  }
}

bool is_fp8(DType t) {
  return t == kNVTEFloat8E4M3 || t == kNVTEFloat8E5M2 || t == kNVTEFloat8E4M3FNUZ ||
         t == kNVTEFloat8E5M2FNUZ;
}

float fp8_max(DType t) {
  switch (t) {
    case kNVTEFloat8E4M3: return 448.0f;
    case kNVTEFloat8E5M2: return 57344.0f;
    case kNVTEFloat8E4M3FNUZ: return 240.0f;
    case kNVTEFloat8E5M2FNUZ: return 57344.0f;
    default: NVTE_ERROR("fp8_max: expected an FP8 dtype, got ", dtype_name(t));
  }
}

size_t SimpleTensor::numel() const {
  size_t n = 1;
  for (size_t d : shape) n *= d;
  return n;
}

size_t SimpleTensor::rows() const {
  size_t n = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
  return n;
}

std::string shape_str(const std::vector<size_t> &shape) {
  std::ostringstream ss;
  ss << "[";
  for (size_t i = 0; i < shape.size(); ++i) ss << (i ? ", " : "") << shape[i];
  ss << "]";
  return ss.str();
}

std::string SimpleTensor::describe() const {
  return std::string(dtype_name(dtype)) + shape_str(shape) + (dptr ? "" : " (no data)");
}

const Tensor &as_tensor(const NVTETensor t, const char *arg) {
  NVTE_CHECK(t != nullptr, "argument '", arg, "': expected a tensor handle, got NULL");
  return *static_cast<const Tensor *>(t);
}

Tensor &as_tensor_mut(NVTETensor t, const char *arg) {
  NVTE_CHECK(t != nullptr, "argument '", arg, "': expected a tensor handle, got NULL");
  return *static_cast<Tensor *>(t);
}

const Tensor *as_tensor_opt(const NVTETensor t) { return static_cast<const Tensor *>(t); }

void check_has_data(const Tensor &t, const char *arg) {
  NVTE_CHECK(t.data.has_data(), "argument '", arg, "': expected row-wise data, got a null pointer (",
             t.data.describe(), ")");
}

void check_dtype(const SimpleTensor &t, const char *arg, std::initializer_list<DType> allowed) {
  for (DType d : allowed)
    if (t.dtype == d) return;
  std::string names;
  for (DType d : allowed) names += std::string(names.empty() ? "" : ", ") + dtype_name(d);
  NVTE_ERROR("argument '", arg, "': expected dtype in {", names, "}, got ", dtype_name(t.dtype));
}

void check_shape(const SimpleTensor &t, const char *arg, const std::vector<size_t> &expected) {
  NVTE_CHECK(t.shape == expected, "argument '", arg, "': expected shape ", shape_str(expected),
             ", got ", shape_str(t.shape));
}

void check_same_shape(const SimpleTensor &a, const char *arg_a, const SimpleTensor &b,
                      const char *arg_b) {
  NVTE_CHECK(a.shape == b.shape, "argument '", arg_b, "': expected the shape of '", arg_a, "' ",
             shape_str(a.shape), ", got ", shape_str(b.shape));
}

void check_ndim(const SimpleTensor &t, const char *arg, size_t ndim) {
  NVTE_CHECK(t.ndim() == ndim, "argument '", arg, "': expected a ", ndim, "-D tensor, got ",
             t.ndim(), "-D ", shape_str(t.shape));
}

void check_ndim_at_least(const SimpleTensor &t, const char *arg, size_t ndim) {
  NVTE_CHECK(t.ndim() >= ndim, "argument '", arg, "': expected at least ", ndim,
             " dims, got ", t.ndim(), "-D ", shape_str(t.shape));
}

void check_fp32_scalar(const SimpleTensor &t, const char *arg, const char *what) {
  NVTE_CHECK(t.has_data(), "argument '", arg, "': expected a ", what,
             " (fp32 scalar), got a null pointer");
  NVTE_CHECK(t.dtype == kNVTEFloat32 && t.numel() == 1, "argument '", arg, "': expected ", what,
             " to be float32 with one element, got ", t.describe());
}

bool overlaps(const SimpleTensor &a, const SimpleTensor &b) {
  if (!a.has_data() || !b.has_data()) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.dptr), b0 = reinterpret_cast<uintptr_t>(b.dptr);
  const uintptr_t a1 = a0 + a.numel() * dtype_size(a.dtype);
  const uintptr_t b1 = b0 + b.numel() * dtype_size(b.dtype);
  return a0 < b1 && b0 < a1;
}

void check_no_overlap(const SimpleTensor &a, const char *arg_a, const SimpleTensor &b,
                      const char *arg_b) {
  NVTE_CHECK(!overlaps(a, b), "argument '", arg_b, "': expected memory disjoint from '", arg_a,
             "', got overlapping buffers (", b.describe(), " at ", b.dptr, ", ", a.describe(),
             " at ", a.dptr, ")");
}

NVTEDevice check_same_device(std::initializer_list<std::pair<const Tensor *, const char *>> ts) {
  const Tensor *first = nullptr;
  const char *first_name = "";
  for (const auto &[t, name] : ts) {
    if (t == nullptr) continue;
    if (first == nullptr) {
      first = t;
      first_name = name;
      continue;
    }
    NVTE_CHECK(t->device == first->device, "argument '", name, "': expected device ",
               first->device == kNVTEDeviceCPU ? "cpu" : "gpu", " (that of '", first_name,
               "'), got ", t->device == kNVTEDeviceCPU ? "cpu" : "gpu");
  }
  return first ? first->device : kNVTEDeviceCPU;
}

void require_cpu_backend(NVTEDevice device, const char *op) {
  (void)op;  // guarded() already prefixes the message with the op name
  NVTE_CHECK_SUPPORTED(device == kNVTEDeviceCPU,
                       "tensors are on the GPU, but this build has no GPU backend "
                       "(expected device cpu, got gpu)");
}

#ifdef NVTE_WITH_GPU
void gpu_require_device(const char *op);  // util/gpu_runtime.cu
#endif

bool use_gpu(NVTEDevice device, const char *op) {
  if (device == kNVTEDeviceCPU) return false;
#ifdef NVTE_WITH_GPU
  gpu_require_device(op);
  return true;
#else
  require_cpu_backend(device, op);
  return false;
#endif
}

namespace detail {
void throw_error(NVTEStatus status, const char *file, int line, const char *cond,
                 const std::string &msg) {
  std::ostringstream ss;
  ss << msg;
  const char *base = std::strrchr(file, '/');
  ss << " [" << (base ? base + 1 : file) << ":" << line;
  if (cond && *cond) ss << ", check: " << cond;
  ss << "]";
  throw Error(status, ss.str());
}
}  // namespace detail

}  // namespace nvte
