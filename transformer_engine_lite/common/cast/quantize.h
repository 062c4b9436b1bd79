// Argument checks shared by the quantizing C API entries (nvte_quantize, nvte_cast_transpose).
#pragma once

#include "../util/tensor.h"
#include "output_spec.h"

namespace nvte {

struct QuantizeArgs {
  NVTEDevice device;  // where input and output live (the entry routes on it)
  OutputSpec spec;    // the validated output
};

// Checks input (fp32/fp16/bf16 row-wise data) and output (FP8, buffers fitting input's shape,
// disjoint from the input, on the input's device). Reads no tensor memory, so it serves CPU and GPU
// tensors alike; throws before anything is written.
QuantizeArgs check_quantize_args(const Tensor &in, const Tensor &out);

}  // namespace nvte
