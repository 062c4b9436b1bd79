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
// Kernels written on explicit vectors (GCC vector extensions) take the clone's native width instead:
//   NVTE_CPU_DISPATCH_LANES(L, kernel<decltype(L)::value>(args));
// passes L = std::integral_constant<int, 16 / 8 / 4> (fp32 lanes of a zmm / ymm / xmm register) to
// the v4 / v3 / baseline clone. A vector wider than the clone's registers is split by GCC through
// the stack (a 16-lane vector in AVX2 code ran 4x slower than two 8-lane ones).
#pragma once

#include <type_traits>

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

// The fastest exact way to multiply bf16 (and FP8, which is exact in bf16) matrices on a CPU. All
// three accumulate in fp32 and are exact per product; they differ in speed only (and in the fp32
// summation order). Measured with torch's and our oneDNN matmuls (benchmarks/README.md, "CPU
// levels"):
//  - kBf16Tiles: AMX bf16 tiles (oneDNN), several times any other path.
//  - kBf16Dot: AVX-512 BF16 dot products (vdpbf16ps). AMD Zen 4 issues them at its FMA rate, so
//    they do twice the flops of fp32 FMAs: bf16 matmul 407 GFLOP/s vs fp32 150-205 on 2 cores.
//  - kF32: operands widened once to fp32 (O(n^2)), fp32 FMAs (O(n^3)). Intel cores without AMX
//    issue vdpbf16ps at half their FMA rate (bf16 164 GFLOP/s vs fp32 288 on 2 Sapphire Rapids
//    cores with AMX off), and CPUs without AVX-512 BF16 have no bf16 arithmetic at all.
enum class MatmulPath : int { kF32 = 0, kBf16Dot = 1, kBf16Tiles = 2 };
// The rule, as a pure function of the level in use and the vendor (tests/cpp/test_cpu_isa.cpp).
inline MatmulPath matmul_path_for(CpuIsa level, bool amd) {
  if (level >= CpuIsa::kAvx512CoreAmx) return MatmulPath::kBf16Tiles;
  if (level >= CpuIsa::kAvx512CoreBf16 && amd) return MatmulPath::kBf16Dot;
  return MatmulPath::kF32;
}
// Whether the CPU is AMD's (CPUID vendor).
bool cpu_is_amd();
// The rule for this CPU at cpu_isa_level(), which the GEMM follows (NVTE_CPU_GEMM_COMPUTE overrides
// it per call). The flash-attention tiles follow the same rule for bf16 inputs: bf16 operands on
// kBf16Tiles (AMX) and kBf16Dot, fp32 tiles on kF32 (flash_fwd_cpu.cpp use_bf16_compute).
MatmulPath cpu_matmul_path();
// "f32", "bf16_dot", "bf16_tiles".
const char *matmul_path_name(MatmulPath path);

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
template <class F>
__attribute__((target("arch=x86-64-v4"))) auto lanes_v4(F &f) {
  return f(std::integral_constant<int, 16>{});
}
template <class F>
__attribute__((target("arch=x86-64-v3"))) auto lanes_v3(F &f) {
  return f(std::integral_constant<int, 8>{});
}
template <class F>
auto lanes_v1(F &f) {
  return f(std::integral_constant<int, 4>{});
}
template <class F>
inline auto run_lanes(F f) {
  const CpuIsa isa = cpu_isa_level();
  if (isa >= CpuIsa::kAvx512Core) return lanes_v4(f);
  if (isa >= CpuIsa::kAvx2) return lanes_v3(f);
  return lanes_v1(f);
}
}  // namespace cpu_dispatch
}  // namespace nvte

#define NVTE_CPU_DISPATCH(...) \
  ::nvte::cpu_dispatch::run([&]() __attribute__((always_inline)) { return __VA_ARGS__; })
#define NVTE_CPU_DISPATCH_LANES(L, ...)                                    \
  ::nvte::cpu_dispatch::run_lanes([&](auto L) __attribute__((always_inline)) { \
    return __VA_ARGS__;                                                    \
  })

#else  // other compilers / architectures: one plain version

#define NVTE_CPU_KERNEL inline
#define NVTE_CPU_DISPATCH(...) (__VA_ARGS__)
// One generic build: 4 lanes (16-byte vectors: SSE2, NEON).
#define NVTE_CPU_DISPATCH_LANES(L, ...) \
  ([&](auto L) { return __VA_ARGS__; }(std::integral_constant<int, 4>{}))

#endif
