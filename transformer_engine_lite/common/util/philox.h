// Counter-based RNG for attention dropout: Philox4x32-10 (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3", SC'11). Host+device, no state: the keep decision of one logit is a pure
// function of (seed, offset, its linear position), so forward and backward, CPU and GPU, any tiling
// and any thread count regenerate the same mask.
#pragma once

#include <cstdint>

#include "../platform/host_device.h"

namespace nvte {

struct Philox4 {
  uint32_t v[4];
};

NVTE_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// Ten rounds of Philox4x32 with the published multipliers and Weyl key increments.
NVTE_HOST_DEVICE Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, ctr.v[0], &hi0, &lo0);
    philox_mulhilo(0xCD9E8D57u, ctr.v[2], &hi1, &lo1);
    Philox4 next;
    next.v[0] = hi1 ^ ctr.v[1] ^ k0;
    next.v[1] = lo1;
    next.v[2] = hi0 ^ ctr.v[3] ^ k1;
    next.v[3] = lo0;
    ctr = next;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ctr;
}

// Dropout threshold: a logit is dropped when its 32-bit draw is below round(p * 2^32) (p in [0, 1)).
NVTE_HOST_DEVICE uint32_t dropout_threshold(float p) {
  const double t = static_cast<double>(p) * 4294967296.0 + 0.5;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

// Draws for the four consecutive linear positions 4*g .. 4*g+3 (g = position >> 2): one Philox
// block with counter {g, offset} and key seed.
NVTE_HOST_DEVICE Philox4 dropout_block(uint64_t seed, uint64_t offset, uint64_t g) {
  Philox4 ctr;
  ctr.v[0] = static_cast<uint32_t>(g);
  ctr.v[1] = static_cast<uint32_t>(g >> 32);
  ctr.v[2] = static_cast<uint32_t>(offset);
  ctr.v[3] = static_cast<uint32_t>(offset >> 32);
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Whether the logit at linear position `pos` is kept.
NVTE_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t pos, uint32_t threshold) {
  const Philox4 r = dropout_block(seed, offset, pos >> 2);
  return r.v[pos & 3] >= threshold;
}

}  // namespace nvte
