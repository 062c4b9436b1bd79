// Template part of emit_cpu.h: the row-block driver.
#pragma once

#include <vector>

#include "../util/parallel.h"

namespace nvte {

template <typename Produce>
void emit_rows(const OutputEmitter &em, Produce &&produce) {
  const size_t rows = em.rows(), cols = em.cols(), br = em.block_rows();
  const size_t nblocks = (rows + br - 1) / br;
  std::vector<AbsMax> per_chunk;
  // Chunk over blocks; each chunk reduces its own amax, then chunks are merged in order.
  const size_t nchunks = std::min<size_t>(nblocks, static_cast<size_t>(max_threads()));
  per_chunk.resize(nchunks);
  parallel_for(nchunks, 1, [&](size_t c0, size_t c1) {
    std::vector<float> vals(br * cols);
    for (size_t c = c0; c < c1; ++c) {
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
