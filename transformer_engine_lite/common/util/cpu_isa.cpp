// CPU level detection and the NVTE_CPU_ISA cap (platform/cpu_isa.h).
#include "../platform/cpu_isa.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace nvte {

namespace {

struct IsaName {
  const char *name;
  CpuIsa isa;
};
// Accepted values of NVTE_CPU_ISA (case-insensitive); "native"/"all" mean no cap.
constexpr IsaName kNames[] = {
    {"baseline", CpuIsa::kBaseline},           {"sse41", CpuIsa::kBaseline},
    {"avx2", CpuIsa::kAvx2},                   {"avx512_core", CpuIsa::kAvx512Core},
    {"avx512_core_bf16", CpuIsa::kAvx512CoreBf16}, {"avx512_core_fp16", CpuIsa::kAvx512CoreFp16},
    {"avx512_core_amx", CpuIsa::kAvx512CoreAmx},
};

// Linux hands out the AMX tile data state (8 KiB per thread) only to a process that asks
// (arch_prctl ARCH_REQ_XCOMP_PERM, kernel 5.16+); a tile instruction before that faults. The
// permission is per process and idempotent, so asking here, where the level is decided, covers the
// tile kernels of every thread; where it is refused the level stops below AMX.
[[maybe_unused]] bool amx_permitted() {
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuIsa detect() {
#if defined(__x86_64__) && defined(__clang__)
  // clang (15: the fuzzing build, ci/fuzz.sh) knows neither the x86-64-vN names nor avx512fp16 /
  // amx-*: the levels are composed from their features and stop at avx512_core_bf16. clang builds
  // have no loop clones or tile kernels, so this only caps oneDNN's level.
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
      !__builtin_cpu_supports("bmi2")) {
    return CpuIsa::kBaseline;
  }
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq") ||
      !__builtin_cpu_supports("avx512cd")) {
    return CpuIsa::kAvx2;
  }
  if (!__builtin_cpu_supports("avx512bf16")) return CpuIsa::kAvx512Core;
  return CpuIsa::kAvx512CoreBf16;
#elif defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("x86-64-v3")) return CpuIsa::kBaseline;
  if (!__builtin_cpu_supports("x86-64-v4")) return CpuIsa::kAvx2;
  if (!__builtin_cpu_supports("avx512bf16")) return CpuIsa::kAvx512Core;
  if (!__builtin_cpu_supports("avx512fp16")) return CpuIsa::kAvx512CoreBf16;
  if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16") ||
      !amx_permitted()) {
    return CpuIsa::kAvx512CoreFp16;
  }
  return CpuIsa::kAvx512CoreAmx;
#else
  return CpuIsa::kBaseline;
#endif
}

// The cap from NVTE_CPU_ISA; the detected level when unset, "native"/"all", or unknown (reported).
// Called inside kernels (OpenMP regions included), so it never throws; the Python loader rejects an
// unknown value with an exception at import (common/config.py).
CpuIsa read_cap(CpuIsa detected) {
  const char *v = std::getenv("NVTE_CPU_ISA");
  if (v == nullptr || *v == '\0') return detected;
  std::string s(v);
  for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "native" || s == "all") return detected;
  for (const IsaName &n : kNames) {
    if (s == n.name) return n.isa;
  }
  std::fprintf(stderr,
               "transformer_engine_lite: NVTE_CPU_ISA: expected baseline, avx2, avx512_core, "
               "avx512_core_bf16, avx512_core_fp16, avx512_core_amx or native, got '%s'; "
               "ignoring it\n",
               v);
  return detected;
}

}  // namespace

CpuIsa cpu_isa_detected() {
  static const CpuIsa isa = detect();
  return isa;
}

CpuIsa cpu_isa_level() {
  static const CpuIsa isa = [] {
    const CpuIsa detected = cpu_isa_detected();
    const CpuIsa cap = read_cap(detected);
    return cap < detected ? cap : detected;
  }();
  return isa;
}

const char *cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline: return "baseline";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512Core: return "avx512_core";
    case CpuIsa::kAvx512CoreBf16: return "avx512_core_bf16";
    case CpuIsa::kAvx512CoreFp16: return "avx512_core_fp16";
    case CpuIsa::kAvx512CoreAmx: return "avx512_core_amx";
  }
  return "unknown";
}

bool cpu_is_amd() {
  static const bool amd = [] {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_is("amd") != 0;
#else
    return false;
#endif
  }();
  return amd;
}

MatmulPath cpu_matmul_path() {
  static const MatmulPath path = matmul_path_for(cpu_isa_level(), cpu_is_amd());
  return path;
}

const char *matmul_path_name(MatmulPath path) {
  switch (path) {
    case MatmulPath::kF32: return "f32";
    case MatmulPath::kBf16Dot: return "bf16_dot";
    case MatmulPath::kBf16Tiles: return "bf16_tiles";
  }
  return "unknown";
}

const char *cpu_clone_name(CpuIsa isa) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(NVTE_NO_CPU_CLONES) && \
    !defined(__CUDACC__) && !defined(__HIPCC__)
  if (isa >= CpuIsa::kAvx512Core) return "x86-64-v4";
  if (isa >= CpuIsa::kAvx2) return "x86-64-v3";
#else
  (void)isa;
#endif
  return "baseline";
}

}  // namespace nvte
