// Float8BlockScaling (NVTE_BLOCK_SCALING_1D / _2D): the per-tile scale rule and the GEMM_READY scale
// layouts, shared by validation, the CPU kernel and the GPU kernels (block_quantize.cu). Plain fp32
// arithmetic and bit tests, so every device rounds the same way.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../platform/host_device.h"
#include "../recipe/scaling_math.h"

namespace nvte {

constexpr size_t kBlockScaleLen = 128;  // 1x128 tiles (1D) and 128x128 blocks (2D)

// Scale of one tile (TE's compute_scale_from_types): amax is floored at eps; a tile whose amax is
// 0, Inf or NaN gets scale 1; otherwise fp8_max / amax (IEEE fp32 division), an Inf quotient (tiny
// amax) replaced by `value_for_inf`, the input dtype's largest finite value, and with `pow2` the
// mantissa cleared (rounding down to a power of two; the quotient is always a normal float).
NVTE_HOST_DEVICE float block_scale_from_amax(float amax, float fp8_max, float eps, bool pow2,
                                             float value_for_inf) {
  amax = amax < eps ? eps : amax;
  if (!(amax > 0.0f) || is_inf_f32(amax)) return 1.0f;
  float scale = fp8_max / amax;
  if (is_inf_f32(scale)) scale = value_for_inf;
  if (pow2) scale = bits_float(float_bits(scale) & 0xFF800000u);
  return scale;
}

NVTE_HOST_DEVICE size_t block_ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
NVTE_HOST_DEVICE size_t block_round_up4(size_t a) { return (a + 3) / 4 * 4; }

// GEMM_READY scale_inv shapes for a [rows, cols] view (TE's Float8BlockQuantizer::get_scale_shape):
// 1D row-wise [ceil(cols/128), roundup(rows,4)], 1D column-wise [ceil(rows/128), roundup(cols,4)],
// 2D row-wise [ceil(rows/128), roundup(ceil(cols/128),4)], 2D column-wise the transposed grid.
struct BlockScaleShape {
  size_t d0, d1;
};
NVTE_HOST_DEVICE BlockScaleShape block_scale_shape(size_t rows, size_t cols, bool two_d,
                                                   bool columnwise) {
  const size_t n = kBlockScaleLen;
  if (two_d) {
    return columnwise ? BlockScaleShape{block_ceil_div(cols, n), block_round_up4(block_ceil_div(rows, n))}
                      : BlockScaleShape{block_ceil_div(rows, n), block_round_up4(block_ceil_div(cols, n))};
  }
  return columnwise ? BlockScaleShape{block_ceil_div(rows, n), block_round_up4(cols)}
                    : BlockScaleShape{block_ceil_div(cols, n), block_round_up4(rows)};
}

}  // namespace nvte
