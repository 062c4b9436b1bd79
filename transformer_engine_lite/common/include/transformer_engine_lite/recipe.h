/* FP8 scaling recipes: the delayed-scaling amax-history and scale update. */
#ifndef TRANSFORMER_ENGINE_LITE_RECIPE_H_
#define TRANSFORMER_ENGINE_LITE_RECIPE_H_

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! Delayed-scaling update for `num_scales` FP8 tensors (TE semantics).
 *
 *  amax_history: fp32 [history_length, num_scales]; scale: fp32 [num_scales].
 *  For each column: amax = max over history ("max", NaN entries ignored) or history[0]
 *  ("most_recent"); the history rolls by -1 with the new row 0 zeroed; scale = (fp8_max / amax) /
 *  2^margin if amax is finite and > 0, else the previous scale; an infinite scale becomes FLT_MAX.
 *  fp8_max is that of `fp8_dtype`. Outputs may alias the inputs (in-place update).
 *
 *  Arithmetic: fp8_max / amax and the division by 2^margin are each one IEEE fp32 division, with
 *  2^margin rounded once to fp32 (exact for integer margins). "max" starts at 0, so an all-zero or
 *  all-NaN column keeps its previous scale; the "infinite scale becomes FLT_MAX" rule also applies
 *  to an infinite previous scale. margin must be finite; amax_compute_algo is case-sensitive; a
 *  partial overlap between any two buffers (other than an exact in-place alias) is an error.
 */
NVTE_API NVTEStatus nvte_delayed_scaling_recipe_amax_and_scale_update(
    const NVTETensor amax_history, const NVTETensor scale, NVTETensor updated_amax_history,
    NVTETensor updated_scale, const char *amax_compute_algo, NVTEDType fp8_dtype, float margin,
    NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif
