// Host side of the GPU runtime: error checks that turn runtime failures into nvte::Error, device
// presence, and launch checking. Only GPU launchers include it.
#pragma once

#include <cuda_runtime.h>

#include "../util/error.h"

namespace nvte {

// Raises NVTE_ERROR_INTERNAL naming the failed call and the runtime's message.
#define NVTE_CHECK_CUDA(call)                                                               \
  do {                                                                                      \
    const cudaError_t _e = (call);                                                          \
    if (_e != cudaSuccess) {                                                                \
      ::nvte::detail::throw_error(NVTE_ERROR_INTERNAL, __FILE__, __LINE__, #call,           \
                                  ::nvte::detail::concat("GPU runtime error: ",             \
                                                         cudaGetErrorString(_e)));          \
    }                                                                                       \
  } while (0)

// Every kernel launch is followed by this: launch-configuration errors surface at the call.
#define NVTE_CHECK_LAUNCH() NVTE_CHECK_CUDA(cudaGetLastError())

// A GPU op on a host without a usable device is a clear NVTE_ERROR_UNSUPPORTED, not a crash.
inline void require_gpu_device(const char *op) {
  (void)op;  // guarded() already prefixes the message with the op name
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) (void)cudaGetLastError();  // clear the sticky error for later calls
  NVTE_CHECK_SUPPORTED(e == cudaSuccess && count > 0,
                       "tensors are on the GPU, but no GPU device is usable here (expected at "
                       "least one device, got ",
                       count, "; runtime says: ", cudaGetErrorString(e), ")");
}

inline cudaStream_t as_stream(void *s) { return static_cast<cudaStream_t>(s); }

}  // namespace nvte
