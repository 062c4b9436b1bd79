// The one check-macro family: failures become nvte::Error with file:line, the condition, and a message
// that names the argument, what was expected and what was got. Errors never leave the C API (see api.h).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "transformer_engine_lite/transformer_engine.h"

namespace nvte {

class Error : public std::runtime_error {
 public:
  Error(NVTEStatus status, const std::string &msg) : std::runtime_error(msg), status_(status) {}
  NVTEStatus status() const { return status_; }

 private:
  NVTEStatus status_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args &...args) {
  std::ostringstream ss;
  (ss << ... << args);
  return ss.str();
}
[[noreturn]] void throw_error(NVTEStatus status, const char *file, int line, const char *cond,
                              const std::string &msg);
}  // namespace detail

}  // namespace nvte

// User error: NVTE_CHECK(x.ndim() == 2, "argument 'x': expected a 2-D tensor, got ", x.ndim(), "-D").
#define NVTE_CHECK(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      ::nvte::detail::throw_error(NVTE_ERROR_INVALID_ARGUMENT, __FILE__, __LINE__, #cond, \
                                  ::nvte::detail::concat(__VA_ARGS__));                  \
    }                                                                                    \
  } while (0)

// A valid request this build or device cannot serve.
#define NVTE_CHECK_SUPPORTED(cond, ...)                                             \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      ::nvte::detail::throw_error(NVTE_ERROR_UNSUPPORTED, __FILE__, __LINE__, #cond, \
                                  ::nvte::detail::concat(__VA_ARGS__));             \
    }                                                                               \
  } while (0)

#define NVTE_ERROR(...)                                                                    \
  ::nvte::detail::throw_error(NVTE_ERROR_INVALID_ARGUMENT, __FILE__, __LINE__, "", \
                              ::nvte::detail::concat(__VA_ARGS__))
