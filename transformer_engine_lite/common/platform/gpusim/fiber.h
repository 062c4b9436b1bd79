// Fibers for gpusim's GPU threads: a stack per fiber (mmap, with an inaccessible guard page below
// it, so an overflow faults instead of corrupting a neighbour) and a context switch that saves only
// what the x86-64 System V ABI says a call preserves (rbx, rbp, r12-r15, MXCSR, the x87 control
// word): ~5 ns a switch, against ~300 ns for swapcontext (which makes a signal-mask system call).
// Other architectures use ucontext. ASan is told about every switch (the stack in use).
#pragma once

#include <cstddef>

namespace gpusim {

class Fiber {
 public:
  // A fiber that runs entry() (which must never return) the first time it is resumed.
  Fiber(size_t stack_bytes, void (*entry)());
  ~Fiber();
  Fiber(const Fiber &) = delete;
  Fiber &operator=(const Fiber &) = delete;

  // From the host thread's own context into this fiber; returns when the fiber calls suspend().
  void resume();
  // From inside this fiber back to the context that resumed it.
  void suspend();

  // The guard page's range (for the stack-overflow report).
  const char *guard_begin() const { return map_; }
  const char *guard_end() const { return map_ + guard_; }  // = the stack's lowest byte
  size_t stack_bytes() const { return map_bytes_ - guard_; }

 private:
  char *map_ = nullptr;  // guard page, then the stack
  size_t map_bytes_ = 0, guard_ = 0;
  void *sp_ = nullptr;         // the fiber's saved stack pointer (x86-64)
  void *return_sp_ = nullptr;  // the resumer's saved stack pointer
  void *uctx_ = nullptr;       // ucontext fallback
  void *return_uctx_ = nullptr;
  void *asan_fake_stack_ = nullptr;
  const void *return_stack_bottom_ = nullptr;
  size_t return_stack_size_ = 0;
  friend void fiber_started(Fiber *);
};

// Called first thing by every fiber's entry(), with the fiber that is starting.
void fiber_started(Fiber *f);

}  // namespace gpusim
