// GPU-build glue for util/tensor.cpp: device presence check used by use_gpu().
#include "../platform/runtime.h"

namespace nvte {

void gpu_require_device(const char *op) { require_gpu_device(op); }

}  // namespace nvte
