// Template part of emit_cpu.h: the row-block driver.
#pragma once

#include <algorithm>
#include <atomic>
#include <vector>

#include "../util/parallel.h"

namespace nvte {

template <typename Produce>
void emit_rows(const OutputEmitter &em, Produce &&produce) {
  const size_t rows = em.rows(), cols = em.cols(), br = em.block_rows();
  // An empty result may declare any size in its other dim (an empty tensor's dims are free):
  // nothing to produce, only the side outputs (amax 0, scale_inv).
  if (rows == 0 || cols == 0) {
    em.finish(AbsMax{});
    return;
  }
  const size_t nblocks = (rows + br - 1) / br;
  const size_t threads = static_cast<size_t>(max_threads());
  // Runs of consecutive blocks handed out on demand (8 per thread): on a shared machine a thread
  // that gets descheduled no longer holds up a fixed half of the work (2 threads with one core busy
  // elsewhere: 2x slower with static halves). Each run reduces its own amax; runs merge in order.
  const size_t nchunks = std::min(nblocks, threads > 1 ? threads * 8 : size_t{1});
  std::vector<AbsMax> per_chunk(nchunks);
  std::atomic<size_t> next{0};
  parallel_for(std::min(threads, nchunks), 1, [&](size_t, size_t) {
    std::vector<float> vals(br * cols);
    for (size_t c = next++; c < nchunks; c = next++) {
      const size_t b0 = nblocks * c / nchunks, b1 = nblocks * (c + 1) / nchunks;
      AbsMax acc;
      for (size_t b = b0; b < b1; ++b) {
        const size_t row0 = b * br, n = std::min(br, rows - row0);
        produce(row0, n, vals.data());
        acc.merge(em.emit(vals.data(), row0, n));
      }
      per_chunk[c] = acc;
    }
  });
  AbsMax total;
  for (const AbsMax &a : per_chunk) total.merge(a);
  em.finish(total);
}

}  // namespace nvte
