// The scheduler's per-host-thread state (scheduler.cpp), shared with the access checks
// (access_check.cpp). Internal to the runtime.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "fiber.h"
#include "internal.h"

namespace gpusim {

constexpr int kWarp = GPUSIM_WARP_SIZE;
constexpr size_t kRedZone = 64;  // poisoned gap around each shared allocation (ASan builds)

// Shadow of one shared-memory byte for the access checks (access_check.cpp).
struct ShadowByte {
  uint16_t writer, reader;  // thread linear id + 1 of the last write / read (0: none)
  uint32_t write_epoch, read_epoch;  // __syncthreads count of those accesses
  uint8_t flags;  // kInit: written in this block; kManyReaders: >1 reader in read_epoch
};
constexpr uint8_t kInit = 1, kManyReaders = 2;

enum class Wait : unsigned char { kRunnable, kBlockBarrier, kWarpOp, kDone };

struct SimThread {
  Coords coords;
  unsigned linear = 0;
  Wait wait = Wait::kRunnable;
  unsigned barriers = 0;   // __syncthreads passed
  uint64_t warp_ops = 0;   // warp operations completed
  const char *file = nullptr;
  int line = 0;
};

struct WarpState {
  uint64_t value[2][kWarp];
  // The warp-op index each lane deposited per phase (UINT64_MAX: none). Two phases, like the values:
  // a lane that has read op n may deposit op n + 1 before a slower lane reads op n.
  uint64_t op[2][kWarp];
};

struct SharedAlloc {
  const void *key;
  size_t offset, bytes;
  const char *name;  // the declaration's variable name, "extern __shared__" for the dynamic part
};

// One host thread's execution state: its fibers (one per GPU thread of the largest block seen) and
// the block it runs.
struct Worker {
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<SimThread> threads;
  std::vector<WarpState> warps;
  std::vector<unsigned char> arena;  // dynamic shared memory first, then static allocations
  std::vector<SharedAlloc> allocs;
  size_t arena_used = 0;
  const LaunchSpec *spec = nullptr;
  uint3 block{0, 0, 0};
  unsigned nthreads = 0;
  SimThread *current = nullptr;
  Fiber *current_fiber = nullptr;
  // Access checks (NVTE_GPUSIM_CHECK builds, access_check.cpp): per arena byte, who wrote and read
  // it since the last barrier; reset per allocation.
  std::vector<struct ShadowByte> shadow;
};

extern thread_local Worker *tls_worker;

// Access checks: the shadow of [offset, offset + bytes) made fresh (no writes, no reads).
void shadow_reset(Worker &w, size_t offset, size_t bytes);

inline std::string block_str(const Worker &w) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "block (%u,%u,%u)", w.block.x, w.block.y, w.block.z);
  return buf;
}

inline std::string thread_str(const SimThread &t) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "thread (%u,%u,%u)", t.coords.thread_idx.x,
                t.coords.thread_idx.y, t.coords.thread_idx.z);
  return buf;
}

// Reports a broken rule of the running block (kernel, launch site, block, message) and aborts.
[[noreturn]] void violation(const Worker &w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

}  // namespace gpusim
