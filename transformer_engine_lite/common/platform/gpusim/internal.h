// Internal interface between gpusim's runtime API (runtime.cpp) and its block scheduler
// (scheduler.cpp). Not part of what kernels or host code see.
#pragma once

#include <cstddef>
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

// The fill byte of fresh device and shared memory (GPUSIM_FILL, default 0xFF).
unsigned char fill_byte();

}  // namespace gpusim
