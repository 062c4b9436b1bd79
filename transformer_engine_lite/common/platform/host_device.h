// Portability macros shared by CPU and GPU code: host+device qualifiers and CPU multi-versioning.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define NVTE_HOST_DEVICE __host__ __device__ __forceinline__
#define NVTE_DEVICE_CODE 1
#else
#define NVTE_HOST_DEVICE inline
#endif

// Hot CPU loops are compiled several times and the best clone is chosen at load time (ifunc), so the
// default build stays portable (no -march=native) yet uses AVX-512 / AVX2 where the CPU has them.
#if !defined(NVTE_DEVICE_CODE) && defined(__x86_64__) && defined(__GNUC__) && \
    !defined(__clang__) && !defined(NVTE_NO_CPU_CLONES)
#define NVTE_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NVTE_CPU_CLONES
#endif
