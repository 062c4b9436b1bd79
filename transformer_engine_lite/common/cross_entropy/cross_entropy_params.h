// Vocab-parallel cross entropy: kernel parameters and the per-row combine / loss math, shared by
// the CPU kernels and the GPU kernels (cross_entropy.h gives the formulas).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "../platform/host_device.h"
#include "../util/math.h"

namespace nvte {

// Columns of the stats rows: {max, sum of exp(x - max), target logit, sum of (x - max)}.
constexpr int kStatM = 0, kStatD = 1, kStatXt = 2, kStatS = 3, kNumStats = 4;

struct CrossEntropyParams {
  size_t rows = 0;              // tokens (numel of target)
  size_t vocab = 0;             // V: this rank's logits columns
  int rank = 0;                 // this rank's shard starts at column rank * vocab of the vocab
  int world_size = 1;           // ranks; the vocab is vocab * world_size
  int64_t ignore_idx = -100;    // rows with this target: loss 0, grad 0
  float label_smoothing = 0.0f;  // in [0, 1]
  float grad_scale = 1.0f;      // 1 / rows for reduce_loss, else 1
  const float *stats = nullptr;  // forward: [world_size, rows, kNumStats]
};

// A target that is neither ignored nor in [0, vocab * world_size).
NVTE_HOST_DEVICE bool target_invalid(const CrossEntropyParams &p, int64_t t) {
  const int64_t total = static_cast<int64_t>(p.vocab) * p.world_size;
  return t != p.ignore_idx && (t < 0 || t >= total);
}

// Column of target t in this shard, or -1 when another rank holds it.
NVTE_HOST_DEVICE int64_t local_column(const CrossEntropyParams &p, int64_t t) {
  const int64_t start = static_cast<int64_t>(p.vocab) * p.rank;
  return t >= start && t < start + static_cast<int64_t>(p.vocab) ? t - start : -1;
}

// The combined statistics of one row, and its loss.
struct RowCombined {
  float max;      // M
  float inv_sum;  // 1 / D
  float eps;      // label_smoothing / (vocab * world_size)
  float loss;
};

// Combines every rank's stats of `row`: the max first, then each rank's sums rescaled to it once
// (exp(m_r - M)). A rank whose shard is all -inf (m = -inf) adds nothing to D, instead of the NaN
// of exp(-inf - -inf). NaN logits make the row's d, hence its loss and gradient, NaN (as the
// unfused loss). The loss is formed from differences to the max, as TE's (x_t - m) - log d: for
// large logits (1e4) M + log D would round away log D's digits. The smoothing term
// ls lse - eps sum_j x_j equals ls log D - eps sum_j (x_j - M) (eps V_total = ls), free of that
// cancellation too.
NVTE_HOST_DEVICE RowCombined combine_row(const CrossEntropyParams &p, size_t row) {
  const float *base = p.stats + row * kNumStats;
  const size_t rank_stride = p.rows * kNumStats;
  float m = -INFINITY, xt = -INFINITY;
  for (int r = 0; r < p.world_size; ++r) {
    const float *st = base + r * rank_stride;
    m = fmaxf(m, st[kStatM]);
    xt = fmaxf(xt, st[kStatXt]);
  }
  float d = 0.0f, s = 0.0f;
  const float v = static_cast<float>(p.vocab);
  for (int r = 0; r < p.world_size; ++r) {
    const float *st = base + r * rank_stride;
    const float mr = st[kStatM];
    if (mr != -INFINITY) d += st[kStatD] * exp_f32(mr - m);
    s += st[kStatS] + v * (mr - m);  // sum over the shard of (x_j - M)
  }
  RowCombined c;
  c.max = m;
  c.inv_sum = 1.0f / d;
  const float ls = p.label_smoothing;
  c.eps = ls / (v * static_cast<float>(p.world_size));
  const float log_d = logf(d);
  float loss = (m - xt) + log_d;
  if (ls > 0.0f) loss = loss * (1.0f - ls) + (ls * log_d - c.eps * s);
  c.loss = loss;
  return c;
}

// Gradient of column j: c (exp(x_j - M) / D - eps).
NVTE_HOST_DEVICE float grad_of(const RowCombined &c, float x, float scale) {
  return (exp_f32(x - c.max) * c.inv_sum - c.eps) * scale;
}

}  // namespace nvte
