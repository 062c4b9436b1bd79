// Float8BlockScaling quantize / dequantize: argument checks (device-independent) and the CPU kernels.
#pragma once

#include <vector>

#include "../util/tensor.h"

namespace nvte {

struct BlockSpec {
  size_t rows = 0, cols = 0;  // 2-D view of the input: leading dims flattened into rows
  bool two_d = false;         // 128x128 blocks (NVTE_BLOCK_SCALING_2D) vs 1x128 tiles
  bool rowwise = false, colwise = false;
  DType dtype = kNVTEFloat8E4M3;
};

bool is_block_scaling(NVTEScalingMode m);
// Checks a block-scaled quantize output against an input of shape `shape` (names `arg`).
BlockSpec validate_block_output(const Tensor &out, const char *arg,
                                const std::vector<size_t> &shape);
// Checks a block-scaled dequantize input; returns its spec (rows/cols of the copy it will read).
BlockSpec validate_block_input(const Tensor &in, const char *arg);
void launch_block_quantize(const Tensor &in, const Tensor &out, const BlockSpec &spec,
                           const QuantizationConfig &cfg);
// Largest finite value of the input dtype: the scale of a tile whose fp8_max / amax overflows fp32.
float block_value_for_inf(DType input);
void launch_block_dequantize(const Tensor &in, const BlockSpec &spec, const SimpleTensor &out);

}  // namespace nvte
