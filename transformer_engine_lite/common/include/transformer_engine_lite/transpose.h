/* Transposes of 2-D tensors, alone and fused with the FP8 cast. */
#ifndef TRANSFORMER_ENGINE_LITE_TRANSPOSE_H_
#define TRANSFORMER_ENGINE_LITE_TRANSPOSE_H_

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! output[j, i] = input[i, j] for a 2-D input of any dtype; output has the same dtype, shape
 *  [cols, rows]. Elements are moved as bytes (NaN payloads kept). Not in place: output must not
 *  overlap input. MXFP8-scaled tensors are rejected (their block scales would not follow). */
NVTE_API NVTEStatus nvte_transpose(const NVTETensor input, NVTETensor output, NVTEStream stream);

/*! Per-tensor FP8 cast of `input` [rows, cols] (fp32/fp16/bf16) into output's row-wise data [rows, cols]
 *  and column-wise data [cols, rows] (transposed) in one pass; amax and scale_inv as nvte_quantize.
 *  Both copies are required; their bytes equal nvte_quantize's and its transpose. */
NVTE_API NVTEStatus nvte_cast_transpose(const NVTETensor input, NVTETensor output,
                                        NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif
