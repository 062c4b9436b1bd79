// Memory-access checks of NVTE_GPUSIM_CHECK builds: the kernel sources are compiled with GCC's
// kernel-address instrumentation in call mode (-fsanitize=kernel-address
// --param asan-instrumentation-with-call-threshold=0), which turns every load and store the
// compiler cannot prove local into a call __asan_{load,store}N_noabort(addr). No sanitizer runtime
// is linked: this file defines those functions and checks, per access of a running GPU thread:
//  - shared memory: inside one __shared__ allocation of the block (else out of bounds); a read of a
//    byte no thread of the block wrote (uninitialised); a write and another thread's access of the
//    same byte between the same two __syncthreads (a race: the GPU orders them by nothing);
//  - global memory: an access that misses every cudaMalloc allocation but lies just past one's end
//    (up to the end of its page; check builds map each allocation on its own pages, with an
//    inaccessible page after it) or up to 256 bytes before its start is out of bounds. Other
//    addresses (the thread's stack, the library's constant data) are not device memory and pass.
// Warp-level operations do not order memory (CUDA: only __syncwarp does): lanes of a warp that
// communicate through shared memory without __syncthreads are reported as racing.
#include <cstring>

#include "scheduler_state.h"

namespace gpusim {

void shadow_reset(Worker &w, size_t offset, size_t bytes) {
  if (w.shadow.empty()) return;
  std::memset(&w.shadow[offset], 0, bytes * sizeof(ShadowByte));
}

#if defined(GPUSIM_ACCESS_HOOKS)
bool access_checks_enabled() { return true; }

namespace {

constexpr uintptr_t kBeforeSlack = 256;

// The last allocation an access of this host thread hit (allocations do not change while kernels
// run: the runtime holds its lock).
thread_local uintptr_t tls_hit_lo = 0, tls_hit_hi = 0;

const SharedAlloc *region_of(const Worker &w, size_t off, size_t n) {
  for (const SharedAlloc &a : w.allocs) {
    if (off >= a.offset && off + n <= a.offset + a.bytes) return &a;
  }
  return nullptr;
}

std::string other_thread(const Worker &w, uint16_t id) {
  return id == 0 || id > w.nthreads ? std::string("another thread") : thread_str(w.threads[id - 1]);
}

void shared_access(Worker &w, size_t off, size_t n, bool write) {
  const SimThread &t = *w.current;
  const SharedAlloc *r = region_of(w, off, n);
  if (r == nullptr) {
    const SharedAlloc *near = nullptr;
    for (const SharedAlloc &a : w.allocs) {
      if (a.offset <= off && (near == nullptr || a.offset > near->offset)) near = &a;
    }
    if (near == nullptr) {
      violation(w, "%s: %zu-byte %s at shared offset %zu, outside every __shared__ allocation",
                thread_str(t).c_str(), n, write ? "write" : "read", off);
    }
    violation(w,
              "%s: %zu-byte %s of __shared__ %s at byte %zu, out of bounds (it has %zu bytes)",
              thread_str(t).c_str(), n, write ? "write" : "read", near->name, off - near->offset,
              near->bytes);
  }
  const uint16_t me = static_cast<uint16_t>(t.linear + 1);
  const uint32_t epoch = t.barriers;
  for (size_t i = off; i < off + n; ++i) {
    ShadowByte &sb = w.shadow[i];
    const size_t byte = i - r->offset;
    if (sb.writer != 0 && sb.writer != me && sb.write_epoch == epoch) {
      violation(w,
                "shared-memory race on __shared__ %s byte %zu: %s %s it after %s wrote it, with "
                "no __syncthreads between (after barrier #%u)",
                r->name, byte, thread_str(t).c_str(), write ? "writes" : "reads",
                other_thread(w, sb.writer).c_str(), epoch);
    }
    if (write) {
      if (sb.reader != 0 && sb.read_epoch == epoch &&
          (sb.reader != me || (sb.flags & kManyReaders) != 0)) {
        violation(w,
                  "shared-memory race on __shared__ %s byte %zu: %s writes it after %s read it, "
                  "with no __syncthreads between (after barrier #%u)",
                  r->name, byte, thread_str(t).c_str(),
                  other_thread(w, sb.reader != me ? sb.reader : 0).c_str(), epoch);
      }
      sb.writer = me;
      sb.write_epoch = epoch;
      sb.flags |= kInit;
    } else {
      if ((sb.flags & kInit) == 0) {
        violation(w,
                  "%s reads __shared__ %s byte %zu (a %zu-byte read at byte %zu), which no "
                  "thread of the block wrote",
                  thread_str(t).c_str(), r->name, byte, n, off - r->offset);
      }
      if (sb.reader != 0 && sb.read_epoch == epoch) {
        if (sb.reader != me) sb.flags |= kManyReaders;
      } else {
        sb.flags &= static_cast<uint8_t>(~kManyReaders);
      }
      sb.reader = me;
      sb.read_epoch = epoch;
    }
  }
}

void global_access(Worker &w, uintptr_t a, size_t n, bool write) {
  uintptr_t base = 0;
  size_t size = 0, mapped = 0;
  if (!find_allocation(a, n, &base, &size, &mapped)) return;
  if (a >= base && a + n <= base + size) {
    tls_hit_lo = base;
    tls_hit_hi = base + size;
    return;
  }
  const SimThread &t = *w.current;
  if (a + n > base + size && a < base + mapped) {
    violation(w,
              "%s: %zu-byte %s at %#zx, %zu bytes past the end of a %zu-byte device allocation "
              "at %#zx",
              thread_str(t).c_str(), n, write ? "write" : "read", static_cast<size_t>(a),
              static_cast<size_t>(a + n - (base + size)), size, static_cast<size_t>(base));
  }
  if (a < base && base - a <= kBeforeSlack) {
    violation(w,
              "%s: %zu-byte %s at %#zx, %zu bytes before the start of a %zu-byte device "
              "allocation at %#zx",
              thread_str(t).c_str(), n, write ? "write" : "read", static_cast<size_t>(a),
              static_cast<size_t>(base - a), size, static_cast<size_t>(base));
  }
}

inline void on_access(uintptr_t a, size_t n, bool write) {
  Worker *w = tls_worker;
  if (w == nullptr || w->current == nullptr || n == 0) return;  // host code of the kernel files
  const uintptr_t arena = reinterpret_cast<uintptr_t>(w->arena.data());
  if (a - arena < w->arena.size()) {
    shared_access(*w, a - arena, n, write);
    return;
  }
  if (a >= tls_hit_lo && a + n <= tls_hit_hi) return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(w->current_fiber->guard_end());
  if (a >= lo && a < lo + w->current_fiber->stack_bytes()) return;  // the thread's own stack
  global_access(*w, a, n, write);
}

}  // namespace
}  // namespace gpusim

// The instrumentation's entry points (GCC -fsanitize=kernel-address, call mode), with the types
// GCC declares them with as built-ins.
// Both spellings: *_noabort by default, the plain ones under -fno-sanitize-recover (CI's UBSan
// flags); every report aborts either way.
#define GPUSIM_HOOK(name, n, write)                                                           \
  extern "C" GPUSIM_API void name(void *a) {                                                 \
    gpusim::on_access(reinterpret_cast<uintptr_t>(a), n, write);                             \
  }
#define GPUSIM_HOOKS(n)                                                                       \
  GPUSIM_HOOK(__asan_load##n##_noabort, n, false)                                            \
  GPUSIM_HOOK(__asan_store##n##_noabort, n, true)                                            \
  GPUSIM_HOOK(__asan_load##n, n, false)                                                      \
  GPUSIM_HOOK(__asan_store##n, n, true)
GPUSIM_HOOKS(1)
GPUSIM_HOOKS(2)
GPUSIM_HOOKS(4)
GPUSIM_HOOKS(8)
GPUSIM_HOOKS(16)
#undef GPUSIM_HOOKS
#undef GPUSIM_HOOK
#define GPUSIM_HOOK_N(name, write)                                                            \
  extern "C" GPUSIM_API void name(void *a, long n) {                                         \
    gpusim::on_access(reinterpret_cast<uintptr_t>(a), static_cast<size_t>(n), write);        \
  }
GPUSIM_HOOK_N(__asan_loadN_noabort, false)
GPUSIM_HOOK_N(__asan_storeN_noabort, true)
GPUSIM_HOOK_N(__asan_loadN, false)
GPUSIM_HOOK_N(__asan_storeN, true)
#undef GPUSIM_HOOK_N
// Bookkeeping calls the instrumentation also emits (no-return calls, dynamic initialisers of
// globals): nothing to check.
extern "C" GPUSIM_API void __asan_handle_no_return() {}
extern "C" GPUSIM_API void __asan_before_dynamic_init(const void *) {}
extern "C" GPUSIM_API void __asan_after_dynamic_init() {}

#else
bool access_checks_enabled() { return false; }
}  // namespace gpusim
#endif
