// fp64 reference of the fused MoE router (fused_router.h) for test_fused_router.cpp: the top-k
// router forward and backward, and the aux-loss scores and their backward.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

namespace router_ref {

struct Config {
  int topk = 1;
  bool pre_softmax = false;
  int num_groups = 0, group_topk = 0;
  double scaling_factor = 1.0;
  int score = 1;  // 0 sigmoid, 1 softmax, 2 sqrtsoftplus
  const std::vector<double> *bias = nullptr;
};

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double sqrtsoftplus(double x) { return std::sqrt(x > 20.0 ? x : std::log1p(std::exp(x))); }
inline double sqrtsoftplus_grad(double x) {
  return (x > 20.0 ? 1.0 : sigmoid(x)) / (2.0 * sqrtsoftplus(x));
}
inline std::vector<double> softmax(const std::vector<double> &x) {
  const double m = *std::max_element(x.begin(), x.end());
  std::vector<double> e(x.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += (e[i] = std::exp(x[i] - m));
  for (double &v : e) v /= s;
  return e;
}

// Indices of the k best keys among `allowed`: higher first, ties to the lower index.
inline std::vector<size_t> topk(const std::vector<double> &key, size_t k,
                                const std::vector<bool> &allowed) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < key.size(); ++i) {
    if (allowed[i]) idx.push_back(i);
  }
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return key[a] > key[b]; });
  idx.resize(k);
  return idx;
}

// One token: probs (0 where not routed), map, and the activations the backward needs.
struct Token {
  std::vector<double> probs, act;
  std::vector<bool> map;
};

inline Token topk_fwd(const Config &c, const std::vector<double> &x) {
  const size_t n = x.size();
  Token t;
  t.probs.assign(n, 0.0);
  t.map.assign(n, false);
  const bool softmax_fn = c.score == 1;
  std::vector<double> key(n);
  t.act.resize(n);
  if (softmax_fn) {
    t.act = c.pre_softmax ? softmax(x) : x;
    key = t.act;
  } else {
    for (size_t i = 0; i < n; ++i) {
      t.act[i] = c.score == 0 ? sigmoid(x[i]) : sqrtsoftplus(x[i]);
      key[i] = t.act[i] + (c.bias ? (*c.bias)[i] : 0.0);
    }
  }
  std::vector<bool> allowed(n, true);
  if (c.num_groups > 0) {
    const size_t g = static_cast<size_t>(c.num_groups), size = n / g;
    std::vector<double> group_score(g);
    for (size_t gi = 0; gi < g; ++gi) {
      std::vector<double> part(key.begin() + gi * size, key.begin() + (gi + 1) * size);
      std::sort(part.rbegin(), part.rend());
      group_score[gi] = std::accumulate(part.begin(), part.begin() + c.topk / c.group_topk, 0.0);
    }
    const auto kept = topk(group_score, c.group_topk, std::vector<bool>(g, true));
    allowed.assign(n, false);
    for (size_t gi : kept) {
      for (size_t i = 0; i < size; ++i) allowed[gi * size + i] = true;
    }
  }
  const auto sel = topk(key, c.topk, allowed);
  for (size_t i : sel) t.map[i] = true;
  std::vector<double> v(sel.size());
  for (size_t j = 0; j < sel.size(); ++j) v[j] = t.act[sel[j]];
  if (softmax_fn && !c.pre_softmax) {
    v = softmax(v);
    t.act.assign(n, 0.0);  // the softmax over the selected logits
    for (size_t j = 0; j < sel.size(); ++j) t.act[sel[j]] = v[j];
  } else if (!softmax_fn && c.topk > 1) {
    const double s = std::accumulate(v.begin(), v.end(), 0.0) + 1e-20;
    for (double &e : v) e /= s;
  }
  for (size_t j = 0; j < sel.size(); ++j) t.probs[sel[j]] = c.scaling_factor * v[j];
  return t;
}

// d probs / d x applied to g, for the routing of topk_fwd(c, x).
inline std::vector<double> topk_bwd(const Config &c, const std::vector<double> &x,
                                    const std::vector<double> &g) {
  const size_t n = x.size();
  const Token t = topk_fwd(c, x);
  std::vector<double> dx(n, 0.0), gs(n, 0.0);
  for (size_t i = 0; i < n; ++i) gs[i] = t.map[i] ? c.scaling_factor * g[i] : 0.0;
  if (c.score == 1) {  // act is the softmax (pre: all experts; post: the selected ones)
    double dot = 0;
    for (size_t i = 0; i < n; ++i) dot += gs[i] * t.act[i];
    for (size_t i = 0; i < n; ++i) dx[i] = t.act[i] * (gs[i] - dot);
    return dx;
  }
  std::vector<double> ga = gs;
  if (c.topk > 1) {
    double s = 1e-20, dot = 0;
    for (size_t i = 0; i < n; ++i) {
      if (t.map[i]) {
        s += t.act[i];
        dot += gs[i] * t.act[i];
      }
    }
    for (size_t i = 0; i < n; ++i) ga[i] = t.map[i] ? gs[i] / s - dot / (s * s) : 0.0;
  }
  for (size_t i = 0; i < n; ++i) {
    const double a = t.act[i];
    dx[i] = ga[i] * (c.score == 0 ? a * (1 - a) : sqrtsoftplus_grad(x[i]));
  }
  return dx;
}

// Aux-loss scores of one token and their top-k map.
inline std::vector<double> scores(int score, const std::vector<double> &x) {
  if (score == 1) return softmax(x);
  std::vector<double> a(x.size());
  double s = 1e-20;
  for (size_t i = 0; i < x.size(); ++i) {
    a[i] = score == 0 ? sigmoid(x[i]) : sqrtsoftplus(x[i]);
    s += a[i];
  }
  for (double &v : a) v /= s;
  return a;
}

inline std::vector<double> scores_bwd(int score, const std::vector<double> &x,
                                      const std::vector<double> &g) {
  const size_t n = x.size();
  std::vector<double> dx(n);
  if (score == 1) {
    const auto y = softmax(x);
    double dot = 0;
    for (size_t i = 0; i < n; ++i) dot += g[i] * y[i];
    for (size_t i = 0; i < n; ++i) dx[i] = y[i] * (g[i] - dot);
    return dx;
  }
  std::vector<double> a(n), da(n);
  double s = 1e-20, dot = 0;
  for (size_t i = 0; i < n; ++i) {
    a[i] = score == 0 ? sigmoid(x[i]) : sqrtsoftplus(x[i]);
    da[i] = score == 0 ? a[i] * (1 - a[i]) : sqrtsoftplus_grad(x[i]);
    s += a[i];
    dot += g[i] * a[i];
  }
  for (size_t i = 0; i < n; ++i) dx[i] = (g[i] / s - dot / (s * s)) * da[i];
  return dx;
}

}  // namespace router_ref
