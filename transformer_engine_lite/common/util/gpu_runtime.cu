// GPU-build glue for util/tensor.cpp: device presence check used by use_gpu().
#include <mutex>
#include <string>

#include "../platform/runtime.h"
#include "gpu_device.h"

namespace nvte {

void gpu_require_device(const char *op) { require_gpu_device(op); }

}  // namespace nvte

namespace nvte {

const char *gpu_device_arch(int *device) {
  constexpr int kMaxDevices = 64;
  static std::string names[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    if (device != nullptr) *device = 0;
    return "";
  }
  if (device != nullptr) *device = dev;
  std::call_once(once[dev], [dev] {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
#ifdef NVTE_WITH_ROCM
    names[dev] = prop.gcnArchName;
#else
    names[dev] = "sm_" + std::to_string(prop.major * 10 + prop.minor);
#endif
  });
  return names[dev].c_str();
}

}  // namespace nvte
