// Environment switches of the core library, read at every call: tests and front ends change
// os.environ between calls, so nothing is cached. Call these with the variable's name as a string
// literal, so tests/python/test_config.py finds each read and checks it is registered in
// transformer_engine_lite/common/config.py.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

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

}  // namespace nvte
