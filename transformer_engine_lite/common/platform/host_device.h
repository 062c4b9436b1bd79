// Portability macros shared by CPU and GPU code: host+device qualifiers and CPU multi-versioning.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define NVTE_HOST_DEVICE __host__ __device__ __forceinline__
#define NVTE_DEVICE_CODE 1
#else
#define NVTE_HOST_DEVICE inline
#endif

// CPU multi-versioning (NVTE_CPU_KERNEL / NVTE_CPU_DISPATCH) lives in cpu_isa.h.
#include "cpu_isa.h"
