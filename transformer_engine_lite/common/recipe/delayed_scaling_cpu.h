// CPU launcher of the delayed-scaling amax-history roll and scale update.
#pragma once

#include <cstddef>

namespace nvte {

// One update of `num_scales` FP8 tensors (see recipe.h). The output pointers may equal the input
// pointers (in-place); partial overlaps are rejected by the entry.
struct DelayedScalingParams {
  const float *amax_history = nullptr;    // [history_length, num_scales], row 0 = most recent
  const float *scale = nullptr;           // [num_scales]
  float *updated_amax_history = nullptr;  // [history_length, num_scales]
  float *updated_scale = nullptr;         // [num_scales]
  size_t history_length = 0;              // >= 1
  size_t num_scales = 0;
  bool most_recent = false;    // amax = history[0] instead of the max over the history
  float fp8_max = 0.0f;        // largest finite value of the FP8 format
  float margin_factor = 1.0f;  // 2^margin rounded to fp32
};

void launch_delayed_scaling_update(const DelayedScalingParams &p);

}  // namespace nvte
