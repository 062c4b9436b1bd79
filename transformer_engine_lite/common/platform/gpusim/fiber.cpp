// Fiber stacks and context switches (see fiber.h). The only assembly of the harness.
#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// ASan's fiber interface, bound when the process has ASan's runtime (weak: the same runtime
// library serves plain and ASan builds).
extern "C" {
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size)
    __attribute__((weak));
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
                                     size_t *size_old) __attribute__((weak));
}

namespace gpusim {
namespace {

[[noreturn]] void die(const char *what) {
  std::fprintf(stderr, "gpusim: %s\n", what);
  std::abort();
}

#if defined(__x86_64__)
extern "C" void gpusim_switch_context(void **save_sp, void *load_sp);
// save_sp <- the caller's stack pointer after pushing the callee-saved state; then the same state
// popped from load_sp's stack and `ret` into wherever that context left off.
asm(R"(
  .text
  .p2align 4
  .globl gpusim_switch_context
  .hidden gpusim_switch_context
  .type gpusim_switch_context,@function
gpusim_switch_context:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gpusim_switch_context, .-gpusim_switch_context
)");
#endif

}  // namespace

Fiber::Fiber(size_t stack_bytes, void (*entry)()) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  guard_ = page;
  map_bytes_ = guard_ + (stack_bytes + page - 1) / page * page;
  void *m = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) die("mmap of a fiber stack failed");
  map_ = static_cast<char *>(m);
  if (mprotect(map_, guard_, PROT_NONE) != 0) die("mprotect of a fiber guard page failed");
  char *top = map_ + map_bytes_;
#if defined(__x86_64__)
  // The frame gpusim_switch_context pops: MXCSR + x87 control word, r15..rbp, return address.
  // sp = top - 72 leaves rsp = top - 8 after the `ret`, the alignment a called function expects.
  uint64_t *sp = reinterpret_cast<uint64_t *>(top - 72);
  uint32_t csr[2] = {0, 0};
  asm volatile("stmxcsr %0" : "=m"(csr[0]));
  asm volatile("fnstcw %0" : "=m"(csr[1]));
  std::memcpy(&sp[0], csr, 8);
  for (int i = 1; i <= 6; ++i) sp[i] = 0;
  sp[7] = reinterpret_cast<uint64_t>(entry);
  sp[8] = 0;  // entry() never returns
  sp_ = sp;
#else
  ucontext_t *uc = new ucontext_t;
  ucontext_t *ret = new ucontext_t;
  if (getcontext(uc) != 0) die("getcontext failed");
  uc->uc_stack.ss_sp = map_ + guard_;
  uc->uc_stack.ss_size = map_bytes_ - guard_;
  uc->uc_link = nullptr;
  makecontext(uc, entry, 0);
  uctx_ = uc;
  return_uctx_ = ret;
#endif
}

Fiber::~Fiber() {
#if !defined(__x86_64__)
  delete static_cast<ucontext_t *>(uctx_);
  delete static_cast<ucontext_t *>(return_uctx_);
#endif
  if (map_ != nullptr) munmap(map_, map_bytes_);
}

void Fiber::resume() {
  void *fake = nullptr;
  if (__sanitizer_start_switch_fiber != nullptr)
    __sanitizer_start_switch_fiber(&fake, map_ + guard_, map_bytes_ - guard_);
#if defined(__x86_64__)
  gpusim_switch_context(&return_sp_, sp_);
#else
  swapcontext(static_cast<ucontext_t *>(return_uctx_), static_cast<ucontext_t *>(uctx_));
#endif
  if (__sanitizer_finish_switch_fiber != nullptr)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
}

void Fiber::suspend() {
  if (__sanitizer_start_switch_fiber != nullptr)
    __sanitizer_start_switch_fiber(&asan_fake_stack_, return_stack_bottom_, return_stack_size_);
#if defined(__x86_64__)
  gpusim_switch_context(&sp_, return_sp_);
#else
  swapcontext(static_cast<ucontext_t *>(uctx_), static_cast<ucontext_t *>(return_uctx_));
#endif
  if (__sanitizer_finish_switch_fiber != nullptr)
    __sanitizer_finish_switch_fiber(asan_fake_stack_, &return_stack_bottom_, &return_stack_size_);
}

void fiber_started(Fiber *f) {
  if (__sanitizer_finish_switch_fiber != nullptr)
    __sanitizer_finish_switch_fiber(nullptr, &f->return_stack_bottom_, &f->return_stack_size_);
}

}  // namespace gpusim
