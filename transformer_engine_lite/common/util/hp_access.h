// Access to elements of high-precision buffers (fp32, fp16, bf16) of a dtype known at run time,
// for host and device code: GPU kernels with several independently typed operands (a norm's x, dz,
// dx and gamma) use it instead of one template instance per dtype combination.
#pragma once

#include <cstddef>

#include "half.h"
#include "transformer_engine_lite/transformer_engine.h"

namespace nvte {

// Element i of `p` as fp32; `t` is kNVTEFloat32, kNVTEFloat16 or kNVTEBFloat16 (callers check).
NVTE_HOST_DEVICE float load_hp(const void *p, NVTEDType t, size_t i) {
  if (t == kNVTEFloat16) return fp16_to_float(static_cast<const fp16 *>(p)[i]);
  if (t == kNVTEBFloat16) return bf16_to_float(static_cast<const bf16 *>(p)[i]);
  return static_cast<const float *>(p)[i];
}

// Stores v into element i of `p`, rounded to nearest even for fp16 / bf16 (as the CPU's store_row).
NVTE_HOST_DEVICE void store_hp(void *p, NVTEDType t, size_t i, float v) {
  if (t == kNVTEFloat16) {
    static_cast<fp16 *>(p)[i] = float_to_fp16(v);
  } else if (t == kNVTEBFloat16) {
    static_cast<bf16 *>(p)[i] = float_to_bf16(v);
  } else {
    static_cast<float *>(p)[i] = v;
  }
}

}  // namespace nvte
