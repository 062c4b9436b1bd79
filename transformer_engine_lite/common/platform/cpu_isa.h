// CPU instruction-set levels and the dispatch of hot loops to per-level clones.
//
// Hot CPU loops are compiled once per level (x86-64-v4 = AVX-512, x86-64-v3 = AVX2, baseline) and the
// clone is picked per call from cpu_isa_level(): the CPU's own level, capped by NVTE_CPU_ISA. GCC's
// target_clones would pick at load time from CPUID alone, which no test can lower; this dispatch lets
// CI run every level's code on one machine (as ONEDNN_MAX_CPU_ISA does for oneDNN).
//
// Usage: mark the kernel `NVTE_CPU_KERNEL` (always inlined) and call it through the dispatcher:
//   NVTE_CPU_KERNEL void add_row(float *acc, const float *v, size_t n) { ... }
//   NVTE_CPU_DISPATCH(add_row(acc, v, n));           // or: x = NVTE_CPU_DISPATCH(sum_row(v, n));
// The expression is wrapped in an always-inline lambda and instantiated in three functions compiled
// for the three targets; inlining puts the loop inside each, so each is vectorized for its ISA.
#pragma once

namespace nvte {

// Ordered: a level includes every lower one. Names are oneDNN's (ONEDNN_MAX_CPU_ISA), lower case.
enum class CpuIsa : int {
  kBaseline = 0,        // x86-64 (SSE2; "sse41" in oneDNN's list)
  kAvx2 = 1,            // x86-64-v3: AVX2, FMA, F16C
  kAvx512Core = 2,      // x86-64-v4: AVX-512 F/BW/DQ/VL/CD
  kAvx512CoreBf16 = 3,  // + AVX512_BF16 (vdpbf16ps: the bf16 tile kernels)
  kAvx512CoreFp16 = 4,  // + AVX512_FP16
  kAvx512CoreAmx = 5,   // + AMX tiles (bf16)
};

// The level this CPU offers (CPUID).
CpuIsa cpu_isa_detected();
// The level the project's kernels use: min(detected, NVTE_CPU_ISA). Read once per process, at the
// first call (like ONEDNN_MAX_CPU_ISA); an unknown value is reported on stderr once and ignored.
CpuIsa cpu_isa_level();
// "avx2", "avx512_core_bf16", ... ; "baseline" for kBaseline.
const char *cpu_isa_name(CpuIsa isa);
// The clone a level runs: "x86-64-v4", "x86-64-v3" or "baseline".
const char *cpu_clone_name(CpuIsa isa);

}  // namespace nvte

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(NVTE_NO_CPU_CLONES) && \
    !defined(__CUDACC__) && !defined(__HIPCC__)

#define NVTE_CPU_KERNEL __attribute__((always_inline)) inline

namespace nvte {
namespace cpu_dispatch {
template <class F>
__attribute__((target("arch=x86-64-v4"))) auto run_v4(F &f) {
  return f();
}
template <class F>
__attribute__((target("arch=x86-64-v3"))) auto run_v3(F &f) {
  return f();
}
template <class F>
auto run_v1(F &f) {
  return f();
}
template <class F>
inline auto run(F f) {
  const CpuIsa isa = cpu_isa_level();
  if (isa >= CpuIsa::kAvx512Core) return run_v4(f);
  if (isa >= CpuIsa::kAvx2) return run_v3(f);
  return run_v1(f);
}
}  // namespace cpu_dispatch
}  // namespace nvte

#define NVTE_CPU_DISPATCH(...) \
  ::nvte::cpu_dispatch::run([&]() __attribute__((always_inline)) { return __VA_ARGS__; })

#else  // other compilers / architectures: one plain version

#define NVTE_CPU_KERNEL inline
#define NVTE_CPU_DISPATCH(...) (__VA_ARGS__)

#endif
