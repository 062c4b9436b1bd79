// Internal interface between gpusim's runtime API (runtime.cpp) and its block scheduler
// (scheduler.cpp). Not part of what kernels or host code see.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "include/gpusim/kernel.h"

namespace gpusim {

// Runs every block of one launch to completion (blocks spread over the worker threads); aborts the
// process with a report when a kernel breaks a rule the runtime checks.
void execute(const LaunchSpec &spec);

// The kernel as the launch wrote it, without the parentheses the launch rewrite adds.
inline std::string kernel_name(const LaunchSpec &spec) {
  std::string s = spec.kernel;
  const size_t b = s.find_first_not_of("( \t"), e = s.find_last_not_of(") \t");
  return b == std::string::npos ? s : s.substr(b, e - b + 1);
}

// Shared-memory limits of the flavour (bytes): static per block, static + dynamic with opt-in.
constexpr size_t kStaticSharedLimit = GPUSIM_WARP_SIZE == 64 ? 64 * 1024 : 48 * 1024;
constexpr size_t kSharedLimitOptin = GPUSIM_WARP_SIZE == 64 ? 64 * 1024 : 227 * 1024;

// For the access checks: the live allocation that [p, p + n) overlaps or lies near (within its
// mapping, or 256 bytes before it): base, requested size and mapped size. Call only while kernels
// run (the allocation map is then fixed: the launching thread holds the runtime's lock).
bool find_allocation(uintptr_t p, size_t n, uintptr_t *base, size_t *size, size_t *mapped);

// Whether this build checks kernel memory accesses (NVTE_GPUSIM_CHECK; access_check.cpp).
bool access_checks_enabled();

// The fill byte of fresh device and shared memory (GPUSIM_FILL, default 0xFF).
unsigned char fill_byte();

}  // namespace gpusim
