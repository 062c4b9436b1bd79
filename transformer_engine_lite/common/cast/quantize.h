// Argument checks shared by the quantizing C API entries (nvte_quantize, nvte_cast_transpose).
#pragma once

#include "../util/tensor.h"
#include "emit_cpu.h"

namespace nvte {

// Checks input (fp32/fp16/bf16 row-wise data) and output (FP8, buffers fitting input's shape,
// disjoint from the input), routes on the device (`op` names the entry in the error), and returns
// the emitter that writes the output. Throws before anything is written.
OutputEmitter make_quantize_emitter(const Tensor &in, const Tensor &out, const char *op);

}  // namespace nvte
