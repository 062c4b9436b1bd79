// The C ABI boundary: nvte::guarded() runs an op body, turns any exception into a status plus a
// thread-local message prefixed with the op name, and clears the message on success.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "error.h"

namespace nvte {

void set_last_error(NVTEStatus status, const std::string &msg);

template <typename F>
NVTEStatus guarded(const char *op, F &&body) noexcept {
  try {
    body();
    set_last_error(NVTE_SUCCESS, "");
    return NVTE_SUCCESS;
  } catch (const Error &e) {
    set_last_error(e.status(), std::string(op) + ": " + e.what());
    return e.status();
  } catch (const std::bad_alloc &) {
    set_last_error(NVTE_ERROR_INTERNAL, std::string(op) + ": out of memory");
    return NVTE_ERROR_INTERNAL;
  } catch (const std::exception &e) {
    set_last_error(NVTE_ERROR_INTERNAL, std::string(op) + ": internal error: " + e.what());
    return NVTE_ERROR_INTERNAL;
  } catch (...) {
    set_last_error(NVTE_ERROR_INTERNAL, std::string(op) + ": unknown internal error");
    return NVTE_ERROR_INTERNAL;
  }
}

}  // namespace nvte
