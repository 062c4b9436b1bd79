// The CPU floating-point environment a core call runs in: IEEE denormals (no flush-to-zero, no
// denormals-are-zero). Callers differ: PyTorch threads keep IEEE denormals, XLA's CPU threads set
// FTZ/DAZ. The core's OpenMP workers keep the mode of the thread that created them, so a call from
// an FTZ thread mixed both modes within one kernel (nondeterministic results, and amax of a
// denormal input read as 0). Front ends that call the core from such threads wrap each call in
// IeeeDenormalsScope, so every thread computes as the PyTorch path does.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#endif

namespace nvte {
namespace platform {

class IeeeDenormalsScope {
 public:
#if defined(__x86_64__) || defined(_M_X64)
  // MXCSR bit 15: flush to zero (FTZ); bit 6: denormals are zero (DAZ).
  static constexpr unsigned kFtzDaz = (1u << 15) | (1u << 6);
  IeeeDenormalsScope() : saved_(_mm_getcsr()) {
    if (saved_ & kFtzDaz) _mm_setcsr(saved_ & ~kFtzDaz);
  }
  ~IeeeDenormalsScope() {
    if (saved_ & kFtzDaz) _mm_setcsr(saved_);
  }

 private:
  unsigned saved_;
#else
  IeeeDenormalsScope() = default;
#endif
  IeeeDenormalsScope(const IeeeDenormalsScope &) = delete;
  IeeeDenormalsScope &operator=(const IeeeDenormalsScope &) = delete;
};

}  // namespace platform
}  // namespace nvte
