// Environment switches of the core library, read at every call: tests and front ends change
// os.environ between calls, so nothing is cached. Call these with the variable's name as a string
// literal, so tests/python/test_config.py finds each read and checks it is registered in
// transformer_engine_lite/common/config.py.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "error.h"

namespace nvte {

// The variable's value, or nullptr when it is unset or empty (config.py's get() also treats an empty
// value as unset, so `NVTE_X=` means "use the default" on both sides).
inline const char *env_value(const char *name) {
  const char *v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// Exactly "0" (the switches' disable value; "false", "00" or "" do not disable).
inline bool env_is_zero(const char *name) {
  const char *v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

// Exactly "1" (the logging switches' enable value).
inline bool env_is_one(const char *name) {
  const char *v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Decimal integer value, `dflt` when unset or empty. Anything else (trailing text, overflow) is an
// error naming the variable: a mistyped knob must not silently fall back to its default.
inline int64_t env_int(const char *name, int64_t dflt) {
  const char *v = env_value(name);
  if (v == nullptr) return dflt;
  char *end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  NVTE_CHECK(errno == 0 && end != v && *end == '\0', "environment variable ", name,
             ": expected a decimal integer, got '", v, "'");
  return static_cast<int64_t>(x);
}

// NVTE_CPU_GEMM_COMPUTE: how CPU matrix products (the GEMM and the flash-attention tiles) take
// bf16/fp16/FP8 operands: "auto" (default: the CPU's fastest exact path, platform/cpu_isa.h),
// "native" (as they are, bf16 dot products or tiles where the CPU has them) or "fp32" (widened to
// fp32 everywhere).
inline std::string cpu_compute_mode() {
  const char *v = env_value("NVTE_CPU_GEMM_COMPUTE");
  const std::string mode = v ? v : "auto";
  NVTE_CHECK(mode == "auto" || mode == "native" || mode == "fp32",
             "environment variable NVTE_CPU_GEMM_COMPUTE: expected auto, native or fp32, got '",
             mode, "'");
  return mode;
}

}  // namespace nvte
