// The one dtype-dispatch helper: dispatch_dtype<List>(dtype, "arg", [&](auto tag) { using T =
// typename decltype(tag)::type; ... }) runs the lambda with the storage type of `dtype` if it is in
// the named list, and otherwise raises an error naming the argument and the dtypes expected.
#pragma once

#include <string>
#include <type_traits>
#include <utility>

#include "error.h"
#include "fp8.h"
#include "half.h"
#include "tensor.h"

namespace nvte {

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename... Ts>
struct TypeList {};

// Storage type <-> dtype.
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return kNVTEFloat32; }
template <> constexpr DType dtype_of<fp16>() { return kNVTEFloat16; }
template <> constexpr DType dtype_of<bf16>() { return kNVTEBFloat16; }
template <> constexpr DType dtype_of<fp8e4m3>() { return kNVTEFloat8E4M3; }
template <> constexpr DType dtype_of<fp8e5m2>() { return kNVTEFloat8E5M2; }
template <> constexpr DType dtype_of<fp8e4m3fnuz>() { return kNVTEFloat8E4M3FNUZ; }
template <> constexpr DType dtype_of<fp8e5m2fnuz>() { return kNVTEFloat8E5M2FNUZ; }
template <> constexpr DType dtype_of<e8m0>() { return kNVTEFloat8E8M0; }
template <> constexpr DType dtype_of<uint8_t>() { return kNVTEByte; }
template <> constexpr DType dtype_of<int32_t>() { return kNVTEInt32; }
template <> constexpr DType dtype_of<int64_t>() { return kNVTEInt64; }
template <> constexpr DType dtype_of<int16_t>() { return kNVTEInt16; }

template <typename T> struct is_fp8_type : std::false_type {};
template <> struct is_fp8_type<fp8e4m3> : std::true_type {};
template <> struct is_fp8_type<fp8e5m2> : std::true_type {};
template <> struct is_fp8_type<fp8e4m3fnuz> : std::true_type {};
template <> struct is_fp8_type<fp8e5m2fnuz> : std::true_type {};
template <typename T> constexpr bool is_fp8_v = is_fp8_type<T>::value;

// Named dtype lists.
using HighPrecisionTypes = TypeList<float, fp16, bf16>;
using Fp8Types = TypeList<fp8e4m3, fp8e5m2, fp8e4m3fnuz, fp8e5m2fnuz>;
using OutputTypes = TypeList<float, fp16, bf16, fp8e4m3, fp8e5m2, fp8e4m3fnuz, fp8e5m2fnuz>;
using AllFloatTypes = OutputTypes;
// Element sizes 1, 2, 4, 8 as plain integers (for layout-only ops like transpose).
using ByteWidthTypes = TypeList<uint8_t, uint16_t, uint32_t, uint64_t>;

template <typename... Ts>
std::string type_list_names(TypeList<Ts...>) {
  std::string s;
  ((s += std::string(s.empty() ? "" : ", ") + dtype_name(dtype_of<Ts>())), ...);
  return s;
}

namespace detail {
template <typename F, typename... Ts>
bool dispatch_in(DType dtype, F &f, TypeList<Ts...>) {
  bool found = false;
  ((!found && dtype == dtype_of<Ts>() ? (found = true, f(TypeTag<Ts>{}), 0) : 0), ...);
  return found;
}
}  // namespace detail

template <typename List, typename F>
void dispatch_dtype(DType dtype, const char *arg, F &&f) {
  const bool found = detail::dispatch_in(dtype, f, List{});
  NVTE_CHECK(found, "argument '", arg, "': expected dtype in {", type_list_names(List{}), "}, got ",
             dtype_name(dtype));
}

}  // namespace nvte
