// CPU launchers of the cast family (quantize, dequantize, amax, current-scaling scales,
// transposes). Arguments are validated by the C API entries before a launcher runs; launchers never
// fail.
#pragma once

#include "../util/tensor.h"
#include "emit_cpu.h"

namespace nvte {

// Reads `in` (fp32/fp16/bf16) row block by row block as fp32 and hands each block to `em`, which
// writes every requested copy (per-tensor FP8 + optional transposed copy, MXFP8 row/column-wise)
// and the amax / scale_inv. Also the kernel of nvte_cast_transpose.
void launch_quantize(const Tensor &in, const OutputEmitter &em);

// FP8 -> fp32/fp16/bf16. Per-tensor: decode(q) * scale_inv from `in.data`. MXFP8: row-wise data and
// scales if present, else column-wise data and scales. `out` has the shape of `in`.
void launch_dequantize(const Tensor &in, const SimpleTensor &out);

// max |x| over `in` (fp32/fp16/bf16); NaN if any element is NaN.
float launch_compute_amax(const SimpleTensor &in);

// output[j, i] = input[i, j] for a [rows, cols] buffer of any element width.
void launch_transpose(const SimpleTensor &in, const SimpleTensor &out);

}  // namespace nvte
