// fp64 reference of the vocab-parallel cross entropy (cross_entropy.h) over the full vocab, written
// from the definition (log-softmax, smoothed one-hot target), not from the kernels' combine.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace test {

struct CrossEntropyRef {
  std::vector<double> loss;  // [rows]
  std::vector<double> grad;  // [rows, vocab]: d(sum of loss, or the mean) / d logits
};

// logits [rows, vocab] (the whole vocab); q = (1 - ls) onehot(t) + ls / vocab;
// loss = -sum_j q_j log softmax(x)_j; grad = (softmax(x) - q) * (reduce ? 1 / rows : 1).
inline CrossEntropyRef cross_entropy_reference(const std::vector<double> &x,
                                               const std::vector<int64_t> &target, size_t vocab,
                                               double ls, bool reduce, int64_t ignore_idx) {
  const size_t rows = target.size();
  CrossEntropyRef r{std::vector<double>(rows, 0.0), std::vector<double>(rows * vocab, 0.0)};
  const double scale = reduce ? 1.0 / static_cast<double>(rows) : 1.0;
  for (size_t i = 0; i < rows; ++i) {
    if (target[i] == ignore_idx) continue;
    const double *row = x.data() + i * vocab;
    const double m = *std::max_element(row, row + vocab);
    double z = 0.0;
    for (size_t j = 0; j < vocab; ++j) z += std::exp(row[j] - m);
    const double lse = m + std::log(z);
    double loss = 0.0;
    for (size_t j = 0; j < vocab; ++j) {
      const double q = (static_cast<int64_t>(j) == target[i] ? 1.0 - ls : 0.0) + ls / vocab;
      if (q != 0.0) loss -= q * (row[j] - lse);  // 0 * -inf logits add nothing
      r.grad[i * vocab + j] = (std::exp(row[j] - lse) - q) * scale;
    }
    r.loss[i] = loss;
  }
  return r;
}

}  // namespace test
