// Shared by every te_lite XLA FFI handler: messages, XLA <-> NVTE dtypes, and the argument / result
// checks, which return ffi::Error (handler.h wraps buffers and defines the handlers).
//
// Handlers only validate, wrap and call nvte_* (ARCHITECTURE.md §3), like the PyTorch bindings in
// pytorch/csrc, whose checks and messages they repeat. Differences forced by XLA:
//  - results are allocated by the Python caller (jax.ffi.ffi_call result shapes), so every result's
//    shape and dtype is checked here; a result that does not apply is an empty [0] buffer;
//  - an optional tensor argument is always passed; 0 elements means None;
//  - a ScalarType argument whose dtype a result carries is read from that result (quantize's
//    fp8_dtype is data's dtype), and is named after the torch argument in messages;
//  - nothing may throw across the FFI boundary: checks return ffi::Error (TE_LITE_CHECK), and
//    guarded() (handler.h) turns anything thrown (allocation failure, a library bug) into an error.
// Only the XLA FFI headers are used (no CUDA headers): the GPU handler takes its stream as void *.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <transformer_engine_lite/transformer_engine.h>
#include <xla/ffi/api/ffi.h>

namespace te_lite {

namespace ffi = ::xla::ffi;
using Buffer = ffi::AnyBuffer;
using DataType = ffi::DataType;
using Shape = std::vector<int64_t>;

// ------------------------------------------------------------------------------------ messages
template <typename... Ts>
std::string cat(const Ts &...parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}

// "[2, 3]", as torch prints sizes.
template <typename Dims>
std::string shape_str(const Dims &dims) {
  std::string s = "[";
  bool first = true;
  for (int64_t d : dims) {
    s += (first ? "" : ", ") + std::to_string(d);
    first = false;
  }
  return s + "]";
}
inline std::string shape_str(const Buffer &b) { return shape_str(b.dimensions()); }

// Returns INVALID_ARGUMENT from the enclosing function when `cond` is false; the message parts are
// joined: TE_LITE_CHECK(ok, op, ": argument 'x': expected ..., got ", shape_str(x)).
#define TE_LITE_CHECK(cond, ...)                                                  \
  do {                                                                            \
    if (!(cond)) return ::xla::ffi::Error::InvalidArgument(::te_lite::cat(__VA_ARGS__)); \
  } while (0)

// Propagates a failed ffi::Error returned by a helper.
#define TE_LITE_TRY(expr)                                         \
  do {                                                            \
    ::xla::ffi::Error te_lite_error_ = (expr);                    \
    if (te_lite_error_.failure()) return te_lite_error_;          \
  } while (0)

// ------------------------------------------------------------------------------------ dtypes
// Named dtype lists (STYLE.md item 5); messages print the expected list.
inline constexpr DataType kHighPrecision[] = {DataType::F32, DataType::F16, DataType::BF16};
inline constexpr DataType kFP8[] = {DataType::F8E4M3FN, DataType::F8E5M2, DataType::F8E4M3FNUZ,
                                    DataType::F8E5M2FNUZ};

template <size_t N>
bool one_of(DataType t, const DataType (&list)[N]) {
  return std::find(list, list + N, t) != list + N;
}
inline bool is_fp8(DataType t) { return one_of(t, kFP8); }
inline bool is_high_precision(DataType t) { return one_of(t, kHighPrecision); }

// XLA dtype -> NVTEDType. U8 and PRED are kNVTEByte (masks, raw bytes); MXFP8 E8M0 scales are U8
// buffers whose NVTE dtype the wrapper overrides with kNVTEFloat8E8M0.
inline std::optional<NVTEDType> nvte_dtype_of(DataType t) {
  switch (t) {
    case DataType::F32: return kNVTEFloat32;
    case DataType::F16: return kNVTEFloat16;
    case DataType::BF16: return kNVTEBFloat16;
    case DataType::F8E4M3FN: return kNVTEFloat8E4M3;
    case DataType::F8E5M2: return kNVTEFloat8E5M2;
    case DataType::F8E4M3FNUZ: return kNVTEFloat8E4M3FNUZ;
    case DataType::F8E5M2FNUZ: return kNVTEFloat8E5M2FNUZ;
    case DataType::U8:
    case DataType::PRED: return kNVTEByte;
    case DataType::S16: return kNVTEInt16;
    case DataType::S32: return kNVTEInt32;
    case DataType::S64: return kNVTEInt64;
    default: return std::nullopt;
  }
}

// jnp's name of a dtype ("float32", "float8_e4m3fn"), for messages.
inline std::string dtype_name(DataType t) {
  switch (t) {
    case DataType::F32: return "float32";
    case DataType::F64: return "float64";
    case DataType::F16: return "float16";
    case DataType::BF16: return "bfloat16";
    case DataType::F8E4M3FN: return "float8_e4m3fn";
    case DataType::F8E5M2: return "float8_e5m2";
    case DataType::F8E4M3FNUZ: return "float8_e4m3fnuz";
    case DataType::F8E5M2FNUZ: return "float8_e5m2fnuz";
    case DataType::F8E8M0FNU: return "float8_e8m0fnu";
    case DataType::U8: return "uint8";
    case DataType::S8: return "int8";
    case DataType::S16: return "int16";
    case DataType::S32: return "int32";
    case DataType::S64: return "int64";
    case DataType::PRED: return "bool";
    default: return cat("xla dtype ", static_cast<int>(t));
  }
}

// An FP8 dtype given by name (string attributes), jnp's names.
inline std::optional<NVTEDType> fp8_dtype_from_name(std::string_view name) {
  if (name == "float8_e4m3fn") return kNVTEFloat8E4M3;
  if (name == "float8_e5m2") return kNVTEFloat8E5M2;
  if (name == "float8_e4m3fnuz") return kNVTEFloat8E4M3FNUZ;
  if (name == "float8_e5m2fnuz") return kNVTEFloat8E5M2FNUZ;
  return std::nullopt;
}

// ------------------------------------------------------------------------------------ checks
// Every message: "te_lite::<op>: argument '<arg>': expected ..., got ..." (the torch bindings'
// text); results are named "result '<name>'".

inline Shape shape_of(const Buffer &b) {
  return Shape(b.dimensions().begin(), b.dimensions().end());
}
inline int64_t ndim(const Buffer &b) { return static_cast<int64_t>(b.dimensions().size()); }
inline int64_t numel(const Buffer &b) { return static_cast<int64_t>(b.element_count()); }
// Size of dim `i`; negative counts from the end.
inline int64_t dim(const Buffer &b, int64_t i) { return b.dimensions()[i < 0 ? ndim(b) + i : i]; }
// Optional tensor arguments: 0 elements means None.
inline bool present(const Buffer &b) { return b.element_count() > 0; }

template <size_t N>
ffi::Error check_dtype(const char *op, const char *arg, DataType got,
                       const DataType (&allowed)[N]) {
  std::string names;
  for (size_t i = 0; i < N; ++i) names += (i ? ", " : "") + dtype_name(allowed[i]);
  TE_LITE_CHECK(one_of(got, allowed), op, ": argument '", arg, "': expected dtype in {", names,
                "}, got ", dtype_name(got));
  return ffi::Error::Success();
}
template <size_t N>
ffi::Error check_dtype(const char *op, const char *arg, const Buffer &t,
                       const DataType (&allowed)[N]) {
  return check_dtype(op, arg, t.element_type(), allowed);
}

inline ffi::Error check_ndim(const char *op, const char *arg, const Buffer &t, int64_t n) {
  TE_LITE_CHECK(ndim(t) == n, op, ": argument '", arg, "': expected ", n, "-D tensor, got shape ",
                shape_str(t));
  return ffi::Error::Success();
}

inline ffi::Error check_min_ndim(const char *op, const char *arg, const Buffer &t, int64_t n) {
  TE_LITE_CHECK(ndim(t) >= n, op, ": argument '", arg, "': expected at least ", n,
                " dims, got shape ", shape_str(t));
  return ffi::Error::Success();
}

// Per-tensor scale / scale_inv / amax: float32 with one element.
inline ffi::Error check_fp32_scalar(const char *op, const char *arg, const Buffer &t) {
  TE_LITE_CHECK(t.element_type() == DataType::F32 && numel(t) == 1, op, ": argument '", arg,
                "': expected a float32 tensor with one element, got ", dtype_name(t.element_type()),
                " of shape ", shape_str(t));
  return ffi::Error::Success();
}

// A result the caller allocated: exactly `dtype` and `shape` (the torch op's output).
inline ffi::Error check_result(const char *op, const char *name, const Buffer &r, DataType dtype,
                               const Shape &shape) {
  TE_LITE_CHECK(r.element_type() == dtype && shape_of(r) == shape, op, ": result '", name,
                "': expected ", dtype_name(dtype), " of shape ", shape_str(shape), ", got ",
                dtype_name(r.element_type()), " of shape ", shape_str(r));
  return ffi::Error::Success();
}

// A result that does not apply to this call: shape [0], any dtype (float32 by convention).
inline ffi::Error check_absent(const char *op, const char *name, const Buffer &r, const char *why) {
  TE_LITE_CHECK(shape_of(r) == Shape{0}, op, ": result '", name, "': expected shape [0] (", why,
                "), got ", dtype_name(r.element_type()), " of shape ", shape_str(r));
  return ffi::Error::Success();
}

// Per-tensor FP8 side outputs (amax, scale_inv): float32 [1] for an FP8 output, else [0].
inline ffi::Error check_fp8_side_results(const char *op, const Buffer &amax,
                                         const Buffer &scale_inv, bool fp8) {
  const Shape shape{fp8 ? 1 : 0};
  TE_LITE_TRY(check_result(op, "amax", amax, DataType::F32, shape));
  return check_result(op, "scale_inv", scale_inv, DataType::F32, shape);
}

// The optional-FP8 output rule of norms and activations (torch's output_dtype): `out` is the
// dtype of the output (its result buffer's); an FP8 one requires `scale`, any other refuses it.
inline ffi::Error check_output_dtype(const char *op, DataType out, const Buffer &scale) {
  TE_LITE_CHECK(is_high_precision(out) || is_fp8(out), op,
                ": argument 'out_dtype': expected float32, float16, bfloat16 or an FP8 dtype, got ",
                dtype_name(out));
  if (is_fp8(out)) {
    TE_LITE_CHECK(present(scale), op, ": argument 'scale': expected a float32 scale for FP8 ",
                  "out_dtype ", dtype_name(out), ", got None");
    return check_fp32_scalar(op, "scale", scale);
  }
  TE_LITE_CHECK(!present(scale), op, ": argument 'scale': expected None for out_dtype ",
                dtype_name(out), " (a scale is only used for FP8 outputs), got a tensor");
  return ffi::Error::Success();
}

// A failed nvte_* call: the core's message names the C argument and what it expected.
inline ffi::Error check_nvte(const char *op, NVTEStatus status) {
  if (status == NVTE_SUCCESS) return ffi::Error::Success();
  using Code = ffi::ErrorCode;
  const Code code = status == NVTE_ERROR_UNSUPPORTED        ? Code::kUnimplemented
                    : status == NVTE_ERROR_INVALID_ARGUMENT ? Code::kInvalidArgument
                                                            : Code::kInternal;
  return ffi::Error(code, cat(op, ": ", nvte_get_last_error()));
}

}  // namespace te_lite
