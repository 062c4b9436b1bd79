// The CPU kernels' NaN bytes on the GPU. The CPU dequantize kernels are plain fp32 products, and
// an x86 product (SSE / AVX, what the CPU build runs) gives a NaN by rules of its own: a NaN
// operand comes out quieted with its own sign and payload (the first operand's when both are),
// and an invalid product (0 x Inf) gives the "default NaN" 0xFFC00000, negative. A GPU gives
// 0x7FFFFFFF in every case. Dequantize kernels that promise the CPU's bytes multiply through this.
#pragma once

#include <cstdint>

#include "../util/fp8.h"

namespace nvte {
namespace gpu {

__device__ __forceinline__ float x86_mul(float a, float b) {
  if (a != a) return bits_float(float_bits(a) | 0x00400000u);
  if (b != b) return bits_float(float_bits(b) | 0x00400000u);
  const float r = a * b;
  return r != r ? bits_float(0xFFC00000u) : r;
}

}  // namespace gpu
}  // namespace nvte
