// Validated description of an output that may be FP8 (per-tensor or MXFP8), shared by the CPU emitter
// and the GPU launchers: validation reads no tensor memory, so it is safe for device pointers.
#pragma once

#include <cstddef>
#include <vector>

#include "../util/tensor.h"

namespace nvte {

struct OutputSpec {
  static constexpr size_t kBlock = 32;  // MXFP8 block length
  size_t rows = 0, cols = 0;            // 2-D view of the result: leading dims flattened into rows
  DType dtype = kNVTEFloat32;           // element type of the written data
  bool fp8 = false;                     // FP8 data (per-tensor scale unless mx)
  bool mx = false;                      // MXFP8 1x32 scaling with E8M0 scales
  bool rowwise = false;                 // row-wise data is written
  bool colwise = false;                 // column-wise data is written (transposed copy or MXFP8 columns)
};

// Checks `out` against a result of row-wise shape `shape`; raises an error naming `arg` if its buffers
// do not fit (missing data, dtype, shapes, scale/amax/scale_inv buffers, MXFP8 scale layouts).
OutputSpec validate_output(const Tensor &out, const char *arg, const std::vector<size_t> &shape);

}  // namespace nvte
