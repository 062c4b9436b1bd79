// OpenMP helpers for CPU kernels: split a range into contiguous chunks, one per thread.
#pragma once

#include <algorithm>
#include <cstddef>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace nvte {

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Runs f(begin, end) over [0, n) in chunks of at least `grain` items, in parallel when worthwhile.
template <typename F>
void parallel_for(size_t n, size_t grain, F &&f) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t chunks = (n + grain - 1) / grain;
#ifdef _OPENMP
  const int threads = static_cast<int>(std::min<size_t>(chunks, static_cast<size_t>(max_threads())));
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    {
      const size_t t = static_cast<size_t>(omp_get_thread_num());
      const size_t nt = static_cast<size_t>(omp_get_num_threads());
      const size_t per = (n + nt - 1) / nt;
      const size_t b = std::min(n, t * per), e = std::min(n, b + per);
      if (b < e) f(b, e);
    }
    return;
  }
#endif
  (void)chunks;
  f(size_t{0}, n);
}

}  // namespace nvte
