// Test support for the multi-tensor ops: lists of TestTensors behind the C API's NVTETensor**,
// and fp64 references of the Adam and SGD updates (multi_tensor.h's formulas).
#pragma once

#include <cmath>
#include <vector>

#include "test_common.h"

namespace test {

// tensor_lists[i][j] handles of host (or mirrored device) tensors.
class HandleLists {
 public:
  explicit HandleLists(size_t lists) : h_(lists), ptrs_(lists) {}
  void add(size_t list, NVTETensor t) { h_[list].push_back(t); }
  NVTETensor **get() {
    for (size_t i = 0; i < h_.size(); ++i) ptrs_[i] = h_[i].data();
    return ptrs_.data();
  }
  size_t lists() const { return h_.size(); }
  size_t per_list() const { return h_.empty() ? 0 : h_[0].size(); }

 private:
  std::vector<std::vector<NVTETensor>> h_;
  std::vector<NVTETensor *> ptrs_;
};

struct AdamRef {
  double lr, beta1, beta2, eps, wd;
  int step, mode, bias_correction;
};

// One Adam step in fp64 on (p, m, v) with gradient g.
inline void adam_ref(const AdamRef &a, double g, double &p, double &m, double &v) {
  const double bc1 = a.bias_correction ? 1.0 - std::pow(a.beta1, a.step) : 1.0;
  const double bc2 = a.bias_correction ? 1.0 - std::pow(a.beta2, a.step) : 1.0;
  if (a.mode == 0) g += a.wd * p;
  m = a.beta1 * m + (1.0 - a.beta1) * g;
  v = a.beta2 * v + (1.0 - a.beta2) * g * g;
  double update = (m / bc1) / (std::sqrt(v / bc2) + a.eps);
  if (a.mode == 1) update += a.wd * p;
  p -= a.lr * update;
}

struct SgdRef {
  double wd, momentum, dampening, lr, scale;
  bool nesterov, first_run, wd_after_momentum;
};

inline void sgd_ref(const SgdRef &s, double g, double &w, double &mom) {
  g *= s.scale;
  if (s.wd != 0 && !s.wd_after_momentum) g += s.wd * w;
  if (s.momentum != 0) {
    mom = s.first_run ? g : s.momentum * mom + (1 - s.dampening) * g;
    g = s.nesterov ? g + s.momentum * mom : mom;
  }
  if (s.wd != 0 && s.wd_after_momentum) g += s.wd * w;
  w -= s.lr * g;
}

}  // namespace test
