// Fused MoE router: kernel parameters and the per-token math, shared by the CPU kernels (one token
// per task) and the GPU kernels (one token per thread), so both pick the same experts and round
// alike up to expf / log1pf. No scratch: intermediate_output and routing_map rows double as it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "../platform/host_device.h"
#include "../util/half.h"

namespace nvte {

// TE's numbering of score_function.
enum class ScoreFunction { kSigmoid = 0, kSoftmax = 1, kSqrtSoftplus = 2 };

// Added to normalization denominators (TE's and Megatron's 1e-20).
constexpr float kRouterEpsilon = 1e-20f;

struct RouterParams {
  size_t tokens = 0;           // rows of logits
  size_t experts = 0;          // columns of logits
  int topk = 1;                // experts selected per token, 1 <= topk <= experts
  bool pre_softmax = false;    // softmax: before the top-k (else over the k selected logits)
  int num_groups = 0;          // > 0 (with group_topk > 0): group-limited top-k
  int group_topk = 0;          // groups kept per token
  float scaling_factor = 1.0f;  // multiplies probs
  ScoreFunction score = ScoreFunction::kSoftmax;
  const float *expert_bias = nullptr;  // [experts] or null: added for the selection only
};

// routing_map byte values while a token is being routed; only 0 and kSelected remain.
constexpr uint8_t kSelected = 1;
constexpr uint8_t kTaken = 2;    // counted in a group's score / in a dropped group
constexpr uint8_t kKeptGroup = 3;

NVTE_HOST_DEVICE float router_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// sqrt(softplus(x)); softplus(x) = x above 20, as torch's softplus threshold.
NVTE_HOST_DEVICE float router_sqrtsoftplus(float x) {
  return sqrtf(x > 20.0f ? x : log1pf(expf(x)));
}

// d sqrtsoftplus / dx at x, given y = sqrtsoftplus(x) (epsilon: y underflows to 0 far below 0).
NVTE_HOST_DEVICE float router_sqrtsoftplus_grad(float x, float y) {
  return (x > 20.0f ? 1.0f : router_sigmoid(x)) / (2.0f * y + kRouterEpsilon);
}

// Selection key: NaN ranks lowest.
NVTE_HOST_DEVICE float router_key(float v) { return v != v ? -INFINITY : v; }

// Index in [begin, end) of the best key among experts whose map byte is 0: the highest key, ties to
// the lower index. Returns `end` when none is free.
template <typename Key>
NVTE_HOST_DEVICE size_t router_pick(const Key &key, const uint8_t *map, size_t begin, size_t end) {
  size_t best = end;
  float best_key = -INFINITY;
  for (size_t i = begin; i < end; ++i) {
    if (map[i] != 0) continue;
    const float k = router_key(key(i));
    if (best == end || k > best_key) {
      best = i;
      best_key = k;
    }
  }
  return best;
}

// out = softmax(x) over n values (fp32; exp in `out`, then divided by their sum).
template <typename T>
NVTE_HOST_DEVICE void router_softmax(const T *x, float *out, size_t n) {
  float m = -INFINITY;
  for (size_t i = 0; i < n; ++i) m = to_float(x[i]) > m ? to_float(x[i]) : m;
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    out[i] = expf(to_float(x[i]) - m);
    sum += out[i];
  }
  for (size_t i = 0; i < n; ++i) out[i] = out[i] / sum;
}

// Group-limited top-k, first half: keeps the group_topk groups with the best sums of their
// topk / group_topk best keys and marks every expert of the other groups kTaken.
template <typename Key>
NVTE_HOST_DEVICE void router_limit_groups(const RouterParams &p, const Key &key, uint8_t *map) {
  const size_t groups = static_cast<size_t>(p.num_groups), size = p.experts / groups;
  const int per_group = p.topk / p.group_topk;
  for (int pick = 0; pick < p.group_topk; ++pick) {
    size_t best = groups;
    float best_sum = -INFINITY;
    for (size_t g = 0; g < groups; ++g) {
      uint8_t *m = map + g * size;
      if (m[0] == kKeptGroup) continue;
      float sum = 0.0f;  // best `per_group` keys, highest first
      for (int j = 0; j < per_group; ++j) {
        const size_t i = router_pick(key, map, g * size, (g + 1) * size);
        sum += router_key(key(i));
        map[i] = kTaken;
      }
      for (size_t i = 0; i < size; ++i) m[i] = 0;
      sum = router_key(sum);
      if (best == groups || sum > best_sum) {
        best = g;
        best_sum = sum;
      }
    }
    for (size_t i = 0; i < size; ++i) map[best * size + i] = kKeptGroup;
  }
  for (size_t i = 0; i < p.experts; ++i) map[i] = map[i] == kKeptGroup ? 0 : kTaken;
}

// One token of the top-k router forward (fused_router.h): x, probs, map, inter are its rows.
template <typename T>
NVTE_HOST_DEVICE void router_topk_fwd_token(const RouterParams &p, const T *x, T *probs,
                                            uint8_t *map, float *inter) {
  const size_t n = p.experts;
  const bool softmax = p.score == ScoreFunction::kSoftmax;
  const bool sigmoid = p.score == ScoreFunction::kSigmoid;
  if (softmax) {
    if (p.pre_softmax) router_softmax(x, inter, n);
  } else {
    for (size_t i = 0; i < n; ++i) {
      inter[i] = sigmoid ? router_sigmoid(to_float(x[i])) : to_float(x[i]);
    }
  }
  // The unbiased score of expert i (softmax post: not used).
  auto act = [&](size_t i) -> float {
    if (softmax || sigmoid) return inter[i];
    return router_sqrtsoftplus(inter[i]);
  };
  auto key = [&](size_t i) -> float {
    if (softmax) return p.pre_softmax ? inter[i] : to_float(x[i]);
    return p.expert_bias != nullptr ? act(i) + p.expert_bias[i] : act(i);
  };
  for (size_t i = 0; i < n; ++i) map[i] = 0;
  if (p.num_groups > 0 && p.group_topk > 0) router_limit_groups(p, key, map);
  for (int k = 0; k < p.topk; ++k) map[router_pick(key, map, 0, n)] = kSelected;
  for (size_t i = 0; i < n; ++i) map[i] = map[i] == kSelected ? 1 : 0;

  float denom = 1.0f;
  if (softmax && !p.pre_softmax) {  // softmax over the selected logits; 0 elsewhere
    float m = -INFINITY, sum = 0.0f;
    for (size_t i = 0; i < n; ++i) {
      if (map[i] && to_float(x[i]) > m) m = to_float(x[i]);
    }
    for (size_t i = 0; i < n; ++i) {
      inter[i] = map[i] ? expf(to_float(x[i]) - m) : 0.0f;
      sum += inter[i];
    }
    for (size_t i = 0; i < n; ++i) inter[i] = inter[i] / sum;
  } else if (!softmax && p.topk > 1) {
    float sum = 0.0f;
    for (size_t i = 0; i < n; ++i) sum += map[i] ? act(i) : 0.0f;
    denom = sum + kRouterEpsilon;
  }
  for (size_t i = 0; i < n; ++i) {
    const float v = map[i] ? p.scaling_factor * (act(i) / denom) : 0.0f;
    probs[i] = from_float<T>(v);
  }
}

// One token of the top-k router backward: dx = d probs / d x applied to g.
template <typename T>
NVTE_HOST_DEVICE void router_topk_bwd_token(const RouterParams &p, const uint8_t *map,
                                            const float *inter, const T *g, T *dx) {
  const size_t n = p.experts;
  const float sf = p.scaling_factor;
  if (p.score == ScoreFunction::kSoftmax) {
    // probs = sf * softmax (pre: over all experts, masked; post: over the selected ones).
    float dot = 0.0f;
    for (size_t i = 0; i < n; ++i) dot += map[i] ? sf * to_float(g[i]) * inter[i] : 0.0f;
    for (size_t i = 0; i < n; ++i) {
      const float gi = map[i] ? sf * to_float(g[i]) : 0.0f;
      dx[i] = from_float<T>(p.pre_softmax || map[i] ? inter[i] * (gi - dot) : 0.0f);
    }
    return;
  }
  const bool sigmoid = p.score == ScoreFunction::kSigmoid;
  auto act = [&](size_t i) { return sigmoid ? inter[i] : router_sqrtsoftplus(inter[i]); };
  float denom = 1.0f, dot = 0.0f;
  if (p.topk > 1) {  // probs = sf * a / (sum of the selected a + eps)
    float sum = 0.0f;
    for (size_t i = 0; i < n; ++i) {
      if (!map[i]) continue;
      sum += act(i);
      dot += sf * to_float(g[i]) * act(i);
    }
    denom = sum + kRouterEpsilon;
    dot = dot / (denom * denom);
  }
  for (size_t i = 0; i < n; ++i) {
    const float a = act(i);
    const float ga = map[i] ? sf * to_float(g[i]) / denom - dot : 0.0f;
    const float da = sigmoid ? a * (1.0f - a) : router_sqrtsoftplus_grad(inter[i], a);
    dx[i] = from_float<T>(ga * da);
  }
}

// One token of the aux-loss scores forward: scores (fp32) over all experts, map = their top-k.
template <typename T>
NVTE_HOST_DEVICE void router_score_fwd_token(const RouterParams &p, const T *x, float *scores,
                                             uint8_t *map, float *inter) {
  const size_t n = p.experts;
  if (p.score == ScoreFunction::kSoftmax) {
    router_softmax(x, inter, n);
    for (size_t i = 0; i < n; ++i) scores[i] = inter[i];
  } else {
    const bool sigmoid = p.score == ScoreFunction::kSigmoid;
    float sum = 0.0f;
    for (size_t i = 0; i < n; ++i) {
      const float xi = to_float(x[i]);
      inter[i] = sigmoid ? router_sigmoid(xi) : xi;
      scores[i] = sigmoid ? inter[i] : router_sqrtsoftplus(xi);
      sum += scores[i];
    }
    for (size_t i = 0; i < n; ++i) scores[i] = scores[i] / (sum + kRouterEpsilon);
  }
  auto key = [&](size_t i) { return scores[i]; };
  for (size_t i = 0; i < n; ++i) map[i] = 0;
  for (int k = 0; k < p.topk; ++k) map[router_pick(key, map, 0, n)] = kSelected;
}

// One token of the aux-loss scores backward: g is d loss / d scores (fp32).
template <typename T>
NVTE_HOST_DEVICE void router_score_bwd_token(const RouterParams &p, const float *inter,
                                             const float *g, T *dx) {
  const size_t n = p.experts;
  float dot = 0.0f;
  if (p.score == ScoreFunction::kSoftmax) {
    for (size_t i = 0; i < n; ++i) dot += g[i] * inter[i];
    for (size_t i = 0; i < n; ++i) dx[i] = from_float<T>(inter[i] * (g[i] - dot));
    return;
  }
  const bool sigmoid = p.score == ScoreFunction::kSigmoid;
  auto act = [&](size_t i) { return sigmoid ? inter[i] : router_sqrtsoftplus(inter[i]); };
  float sum = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    sum += act(i);
    dot += g[i] * act(i);
  }
  const float denom = sum + kRouterEpsilon;
  dot = dot / (denom * denom);
  for (size_t i = 0; i < n; ++i) {
    const float a = act(i);
    const float da = sigmoid ? a * (1.0f - a) : router_sqrtsoftplus_grad(inter[i], a);
    dx[i] = from_float<T>((g[i] / denom - dot) * da);
  }
}

}  // namespace nvte
