// gpusim's block scheduler: runs each block's threads as fibers (fiber.h) and implements the
// barriers and warp-level exchanges between them, checking what a GPU leaves undefined:
//  - every live thread of a block reaches the same __syncthreads (same call site, same count);
//    a thread that exits while others wait at one is an error;
//  - every live lane of a warp takes part in each warp operation, from the same call site; a lane
//    that reads from (or a *_sync mask that names) a lane outside the block or exited is an error;
//  - static + dynamic shared memory within the flavour's per-block limit;
//  - a fiber stack overflow hits a guard page and is reported with the thread that overflowed.
// A violation prints the kernel, its launch site, the block and the threads involved, and aborts
// (a GPU would hang or compute garbage). Blocks run on GPUSIM_WORKERS host threads.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "scheduler_state.h"

extern "C" {
void __asan_poison_memory_region(void const volatile *addr, size_t size) __attribute__((weak));
void __asan_unpoison_memory_region(void const volatile *addr, size_t size) __attribute__((weak));
}

namespace gpusim {

thread_local const Coords *tls_coords = nullptr;

thread_local Worker *tls_worker = nullptr;

[[noreturn]] void violation(const Worker &w, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "gpusim: kernel %s (launched at %s:%d), %s: %s\n",
               kernel_name(*w.spec).c_str(),
               w.spec->file, w.spec->line, block_str(w).c_str(), msg);
  std::fflush(stderr);
  std::abort();
}

namespace {

size_t stack_bytes() {
  static const size_t n = [] {
    const char *e = std::getenv("GPUSIM_STACK_KB");
    const size_t kb = e != nullptr && *e != '\0' ? std::strtoul(e, nullptr, 10) : 256;
    return std::max<size_t>(kb, 16) * 1024;
  }();
  return n;
}

// "threads 0-31, 64" style list of the threads for which pred holds.
template <typename Pred>
std::string thread_list(const Worker &w, Pred pred) {
  std::string out;
  unsigned i = 0, shown = 0;
  while (i < w.nthreads) {
    if (!pred(w.threads[i])) {
      ++i;
      continue;
    }
    unsigned j = i;
    while (j + 1 < w.nthreads && pred(w.threads[j + 1])) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(i);
    if (j > i) out += "-" + std::to_string(j);
    if (++shown == 8) {
      out += ", ...";
      break;
    }
    i = j + 1;
  }
  return out.empty() ? "none" : "linear ids " + out;
}

// ------------------------------------------------------------------------- fibers
void fiber_entry() {
  Worker *w = tls_worker;
  Fiber *self = w->current_fiber;
  fiber_started(self);
  for (;;) {
    SimThread *t = w->current;
    w->spec->entry(w->spec->ctx);
    t->wait = Wait::kDone;
    self->suspend();
  }
}

void resume(Worker &w, unsigned i) {
  SimThread &t = w.threads[i];
  t.wait = Wait::kRunnable;
  w.current = &t;
  w.current_fiber = w.fibers[i].get();
  tls_coords = &t.coords;
  w.fibers[i]->resume();
  tls_coords = nullptr;
  w.current = nullptr;
}

// Called from a fiber: park until the scheduler releases the barrier.
void park(Wait why, const char *file, int line) {
  Worker *w = tls_worker;
  if (w == nullptr || w->current == nullptr) {
    std::fprintf(stderr, "gpusim: a barrier or warp operation outside a kernel (%s:%d)\n", file,
                 line);
    std::abort();
  }
  SimThread *t = w->current;
  Fiber *f = w->current_fiber;
  t->wait = why;
  t->file = file;
  t->line = line;
  f->suspend();
}

void fill_shared(unsigned char *p, size_t n) { std::memset(p, fill_byte(), n); }

// ------------------------------------------------------------------ one block
bool same_site(const SimThread &a, const SimThread &b) {
  return a.line == b.line && (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

// Releases the warps whose live lanes all wait at a warp op; true if any was released.
bool release_warps(Worker &w) {
  bool any = false;
  const unsigned nwarps = (w.nthreads + kWarp - 1) / kWarp;
  for (unsigned wi = 0; wi < nwarps; ++wi) {
    const unsigned lo = wi * kWarp, hi = std::min(w.nthreads, lo + kWarp);
    const SimThread *first = nullptr;
    bool all = true, some = false;
    for (unsigned i = lo; i < hi; ++i) {
      const SimThread &t = w.threads[i];
      if (t.wait == Wait::kDone) continue;
      if (t.wait != Wait::kWarpOp) {
        all = false;
        continue;
      }
      some = true;
      if (first == nullptr) first = &t;
    }
    if (!some || !all) continue;
    for (unsigned i = lo; i < hi; ++i) {
      const SimThread &t = w.threads[i];
      if (t.wait != Wait::kWarpOp) continue;
      if (!same_site(t, *first) || t.warp_ops != first->warp_ops) {
        violation(w,
                  "warp divergence: lanes of warp %u are in different warp operations (%s "
                  "at %s:%d, op #%llu; %s at %s:%d, op #%llu)",
                  wi, thread_str(*first).c_str(), first->file, first->line,
                  static_cast<unsigned long long>(first->warp_ops), thread_str(t).c_str(), t.file,
                  t.line, static_cast<unsigned long long>(t.warp_ops));
      }
    }
    for (unsigned i = lo; i < hi; ++i) {
      if (w.threads[i].wait == Wait::kWarpOp) w.threads[i].wait = Wait::kRunnable;
    }
    any = true;
  }
  return any;
}

void check_block_barrier(Worker &w) {
  const SimThread *first = nullptr;
  for (unsigned i = 0; i < w.nthreads; ++i) {
    const SimThread &t = w.threads[i];
    if (t.wait != Wait::kBlockBarrier) continue;
    if (first == nullptr) {
      first = &t;
      continue;
    }
    if (!same_site(t, *first) || t.barriers != first->barriers) {
      violation(w,
                "barrier divergence: %s waits at __syncthreads %s:%d (#%u), %s at %s:%d (#%u)",
                thread_str(*first).c_str(), first->file, first->line, first->barriers + 1,
                thread_str(t).c_str(), t.file, t.line, t.barriers + 1);
    }
  }
  for (unsigned i = 0; i < w.nthreads; ++i) {
    if (w.threads[i].wait == Wait::kDone) {
      violation(w,
                "barrier divergence: threads wait at __syncthreads %s:%d (#%u) that other "
                "threads exited without reaching (exited: %s)",
                first->file, first->line, first->barriers + 1,
                thread_list(w, [](const SimThread &t) { return t.wait == Wait::kDone; }).c_str());
    }
  }
}

void run_block(Worker &w, uint3 block) {
  const LaunchSpec &s = *w.spec;
  w.block = block;
  // Shared memory: dynamic part at the arena's start, fresh fill, static allocations on demand.
  w.allocs.clear();
  w.arena_used = (s.dynamic_smem + kRedZone + 15) / 16 * 16;
  if (__asan_poison_memory_region != nullptr)
    __asan_poison_memory_region(w.arena.data(), w.arena.size());
  if (s.dynamic_smem != 0) {
    if (__asan_unpoison_memory_region != nullptr)
      __asan_unpoison_memory_region(w.arena.data(), s.dynamic_smem);
    fill_shared(w.arena.data(), s.dynamic_smem);
    w.allocs.push_back({nullptr, 0, s.dynamic_smem, "extern __shared__"});
    shadow_reset(w, 0, s.dynamic_smem);
  }
  for (unsigned i = 0; i < w.nthreads; ++i) {
    SimThread &t = w.threads[i];
    t.coords.block_idx = block;
    t.wait = Wait::kRunnable;
    t.barriers = 0;
    t.warp_ops = 0;
  }
  for (WarpState &ws : w.warps) std::fill(&ws.op[0][0], &ws.op[0][0] + 2 * kWarp, ~uint64_t{0});

  for (;;) {
    for (unsigned i = 0; i < w.nthreads; ++i) {
      if (w.threads[i].wait == Wait::kRunnable) resume(w, i);
    }
    if (release_warps(w)) continue;
    bool any_live = false, all_at_barrier = true;
    for (unsigned i = 0; i < w.nthreads; ++i) {
      const Wait st = w.threads[i].wait;
      if (st == Wait::kDone) continue;
      any_live = true;
      if (st != Wait::kBlockBarrier) all_at_barrier = false;
    }
    if (!any_live) break;
    if (!all_at_barrier) {
      // Some lanes wait at a warp op while others of their warp wait at __syncthreads.
      std::string detail;
      for (unsigned i = 0; i < w.nthreads && detail.size() < 600; ++i) {
        const SimThread &t = w.threads[i];
        if (t.wait == Wait::kDone) continue;
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s%s at %s:%d", detail.empty() ? "" : "; ",
                      thread_str(t).c_str(), t.file, t.line);
        detail += buf;
      }
      violation(w, "deadlock: a warp's lanes wait at different barriers (%s)", detail.c_str());
    }
    check_block_barrier(w);
    for (unsigned i = 0; i < w.nthreads; ++i) {
      w.threads[i].wait = Wait::kRunnable;
      ++w.threads[i].barriers;
    }
  }
}

// Makes the worker ready for a launch of `spec` (fibers, thread coordinates, warps, arena).
void prepare(Worker &w, const LaunchSpec &spec) {
  w.spec = &spec;
  const dim3 b = spec.block;
  w.nthreads = b.x * b.y * b.z;
  tls_worker = &w;
  while (w.fibers.size() < w.nthreads) {
    w.fibers.push_back(std::make_unique<Fiber>(stack_bytes(), fiber_entry));
  }
  w.threads.resize(w.nthreads);
  for (unsigned i = 0; i < w.nthreads; ++i) {
    SimThread &t = w.threads[i];
    t.linear = i;
    t.coords.thread_idx = {i % b.x, (i / b.x) % b.y, i / (b.x * b.y)};
    t.coords.block_dim = b;
    t.coords.grid_dim = spec.grid;
  }
  w.warps.resize((w.nthreads + kWarp - 1) / kWarp);
  const size_t arena = kSharedLimitOptin + kStaticSharedLimit + 64 * kRedZone;
  if (w.arena.size() < arena) w.arena.assign(arena, 0);
  if (access_checks_enabled() && w.shadow.size() < arena) w.shadow.resize(arena);
}

// --------------------------------------------------------------- worker pool
class Pool {
 public:
  static Pool &get() {
    static Pool *p = new Pool();  // never destroyed: workers may outlive static destructors
    return *p;
  }

  void run(const LaunchSpec &spec) {
    const uint64_t blocks = 1ull * spec.grid.x * spec.grid.y * spec.grid.z;
    std::unique_lock<std::mutex> lk(m_);
    spec_ = &spec;
    blocks_ = blocks;
    next_.store(0);
    pending_ = static_cast<int>(threads_.size());
    ++generation_;
    cv_.notify_all();
    lk.unlock();
    work(spec, caller_);
    lk.lock();
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    spec_ = nullptr;
  }

 private:
  Pool() {
    const char *e = std::getenv("GPUSIM_WORKERS");
    unsigned n = e != nullptr && *e != '\0' ? static_cast<unsigned>(std::strtoul(e, nullptr, 10))
                                            : std::thread::hardware_concurrency();
    n = std::max(1u, std::min(n, 64u));
    for (unsigned i = 1; i < n; ++i) threads_.emplace_back([this] { loop(); });
    for (auto &t : threads_) t.detach();
  }

  void work(const LaunchSpec &spec, Worker &w) {
    prepare(w, spec);
    const dim3 g = spec.grid;
    for (;;) {
      const uint64_t b = next_.fetch_add(1);
      if (b >= blocks_) break;
      run_block(w, {static_cast<unsigned>(b % g.x), static_cast<unsigned>((b / g.x) % g.y),
                    static_cast<unsigned>(b / (1ull * g.x * g.y))});
    }
    tls_worker = nullptr;
  }

  void loop() {
    install_overflow_handler();
    Worker w;
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lk(m_);
      cv_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      const LaunchSpec *spec = spec_;
      lk.unlock();
      work(*spec, w);
      lk.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

 public:
  static void install_overflow_handler();

 private:
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> threads_;
  const LaunchSpec *spec_ = nullptr;
  uint64_t blocks_ = 0, generation_ = 0;
  std::atomic<uint64_t> next_{0};
  int pending_ = 0;
  Worker caller_;  // the launching host thread's own worker state
};

// ------------------------------------------------------------- stack overflow
// A fault inside the running fiber's guard page is a GPU-thread stack overflow: say which thread
// and how to give it more (GPUSIM_STACK_KB). Anything else goes to the default action. Not
// installed under a sanitizer, whose own handler reports stack overflows.
extern "C" void gpusim_segv(int sig, siginfo_t *info, void *) {
  Worker *w = tls_worker;
  const char *addr = static_cast<const char *>(info->si_addr);
  if (w != nullptr && w->current_fiber != nullptr && addr >= w->current_fiber->guard_begin() &&
      addr < w->current_fiber->guard_end()) {
    char msg[512];
    const int n = std::snprintf(msg, sizeof msg,
                                "gpusim: kernel %s (launched at %s:%d): GPU thread %u of block "
                                "(%u,%u,%u) overflowed its %zu KiB stack (GPUSIM_STACK_KB)\n",
                                w->spec->kernel + std::strspn(w->spec->kernel, "( "),
                                w->spec->file, w->spec->line, w->current->linear,
                                w->block.x, w->block.y, w->block.z, stack_bytes() / 1024);
    if (n > 0) (void)!write(2, msg, static_cast<size_t>(std::min(n, 511)));
  } else if (w != nullptr && w->current != nullptr) {
    char msg[512];
    const int n = std::snprintf(msg, sizeof msg,
                                "gpusim: kernel %s (launched at %s:%d): GPU thread %u of block "
                                "(%u,%u,%u) faulted at address %p\n",
                                w->spec->kernel + std::strspn(w->spec->kernel, "( "),
                                w->spec->file, w->spec->line, w->current->linear, w->block.x,
                                w->block.y, w->block.z, info->si_addr);
    if (n > 0) (void)!write(2, msg, static_cast<size_t>(std::min(n, 511)));
  }
  signal(sig, SIG_DFL);  // returning re-runs the access, which now takes the default action
}

extern "C" void __sanitizer_print_stack_trace() __attribute__((weak));

void Pool::install_overflow_handler() {
  if (__sanitizer_print_stack_trace != nullptr) return;
  static thread_local std::vector<char> alt(64 * 1024);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa{};
    sa.sa_sigaction = gpusim_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
  });
}

}  // namespace

// ------------------------------------------------------------------ kernel-side API
void syncthreads(const char *file, int line) {
  park(Wait::kBlockBarrier, file, line);
}

uint64_t warp_op(Shfl kind, uint64_t bits, int arg, int width, uint64_t mask, bool has_mask,
                 const char *file, int line) {
  Worker *w = tls_worker;
  if (w == nullptr || w->current == nullptr) park(Wait::kWarpOp, file, line);  // reports it
  SimThread *t = w->current;
  const unsigned lane = t->linear % kWarp, warp = t->linear / kWarp;
  if (width <= 0 || width > kWarp || (width & (width - 1)) != 0)
    violation(*w, "%s at %s:%d: width %d, expected a power of two <= %d",
              thread_str(*t).c_str(), file, line, width, kWarp);
  const uint64_t op = t->warp_ops;
  WarpState &ws = w->warps[warp];
  ws.value[op & 1][lane] = bits;
  ws.op[op & 1][lane] = op;
  park(Wait::kWarpOp, file, line);
  t->warp_ops = op + 1;
  const unsigned base = warp * kWarp;
  auto took_part = [&](unsigned l) { return base + l < w->nthreads && ws.op[op & 1][l] == op; };
  if (has_mask) {
    if (((mask >> lane) & 1) == 0)
      violation(*w, "%s at %s:%d: a *_sync mask (%#llx) without the calling lane %u",
                thread_str(*t).c_str(), file, line, static_cast<unsigned long long>(mask), lane);
    for (unsigned l = 0; l < static_cast<unsigned>(kWarp); ++l) {
      if (((mask >> l) & 1) != 0 && !took_part(l))
        violation(*w,
                  "%s at %s:%d: the *_sync mask %#llx names lane %u of warp %u, which did not "
                  "take part (exited, or beyond the block's %u threads)",
                  thread_str(*t).c_str(), file, line, static_cast<unsigned long long>(mask), l,
                  warp, w->nthreads);
    }
  }
  const unsigned seg = lane & ~static_cast<unsigned>(width - 1);
  unsigned src = lane;
  switch (kind) {
    case Shfl::kIdx: src = seg + (static_cast<unsigned>(arg) & static_cast<unsigned>(width - 1)); break;
    case Shfl::kUp: src = static_cast<int>(lane) - arg < static_cast<int>(seg) ? lane : lane - arg; break;
    case Shfl::kDown: src = lane + arg >= seg + width ? lane : lane + arg; break;
    case Shfl::kXor: src = (lane ^ static_cast<unsigned>(arg)) >= seg + width ? lane : lane ^ arg; break;
    case Shfl::kBallot: {
      uint64_t r = 0;
      for (unsigned l = 0; l < static_cast<unsigned>(kWarp); ++l) {
        if (took_part(l) && (!has_mask || ((mask >> l) & 1) != 0) && ws.value[op & 1][l] != 0)
          r |= uint64_t{1} << l;
      }
      return r;
    }
    case Shfl::kSyncWarp: return 0;
  }
  if (!took_part(src))
    violation(*w,
              "%s at %s:%d: lane %u reads lane %u of warp %u, which did not take part (exited, "
              "or beyond the block's %u threads)",
              thread_str(*t).c_str(), file, line, lane, src, warp, w->nthreads);
  return ws.value[op & 1][src];
}

void *static_shared(const void *key, size_t bytes, size_t align, const char *name) {
  Worker *w = tls_worker;
  if (w == nullptr || w->current == nullptr) {
    std::fprintf(stderr, "gpusim: __shared__ %s used outside a kernel\n", name);
    std::abort();
  }
  for (const SharedAlloc &a : w->allocs) {
    if (a.key == key) return w->arena.data() + a.offset;
  }
  size_t static_total = bytes;
  for (const SharedAlloc &a : w->allocs) static_total += a.key != nullptr ? a.bytes : 0;
  if (static_total > kStaticSharedLimit)
    violation(*w, "static shared memory %zu bytes (with __shared__ %s) above the %zu-byte limit",
              static_total, name, kStaticSharedLimit);
  if (static_total + w->spec->dynamic_smem > kSharedLimitOptin)
    violation(*w, "static + dynamic shared memory %zu bytes above the %zu-byte limit",
              static_total + w->spec->dynamic_smem, kSharedLimitOptin);
  align = std::max<size_t>(align, 16);
  const size_t offset = (w->arena_used + align - 1) / align * align;
  w->arena_used = offset + bytes + kRedZone;
  unsigned char *p = w->arena.data() + offset;
  if (__asan_unpoison_memory_region != nullptr) __asan_unpoison_memory_region(p, bytes);
  fill_shared(p, bytes);
  shadow_reset(*w, offset, bytes);
  w->allocs.push_back({key, offset, bytes, name});
  return p;
}

void *dynamic_shared() {
  Worker *w = tls_worker;
  if (w == nullptr || w->current == nullptr) {
    std::fprintf(stderr, "gpusim: extern __shared__ used outside a kernel\n");
    std::abort();
  }
  return w->arena.data();
}

// For debuggers: `call (void)gpusim_where()` in gdb names the GPU thread a breakpoint stopped in.
extern "C" GPUSIM_API void gpusim_where() {
  const Worker *w = tls_worker;
  if (w == nullptr || w->current == nullptr) {
    std::fprintf(stderr, "gpusim: no GPU thread runs on this host thread\n");
    return;
  }
  const SimThread &t = *w->current;
  std::fprintf(stderr,
               "gpusim: kernel %s (launched at %s:%d), %s of %u, %s (linear id %u), after "
               "__syncthreads #%u and warp op #%llu\n",
               kernel_name(*w->spec).c_str(), w->spec->file, w->spec->line, block_str(*w).c_str(),
               w->spec->grid.x * w->spec->grid.y * w->spec->grid.z, thread_str(t).c_str(),
               t.linear, t.barriers, static_cast<unsigned long long>(t.warp_ops));
}

void execute(const LaunchSpec &spec) {
  static std::once_flag once;
  std::call_once(once, [] { Pool::install_overflow_handler(); });
  Pool::get().run(spec);
}

}  // namespace gpusim
