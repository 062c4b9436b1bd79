// nvte_nvfp4_block_gemm's operands and its GPU launcher (nvfp4_gemm.cu); the API entry and the CPU
// kernel are in nvfp4_gemm_cpu.cpp. Plain C++: no runtime headers, streams as void*.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nvte {

// One operand, validated by the entry: [rows, K] E2M1 codes packed two per byte (row stride K / 2
// bytes, element 2i in the low nibble) and its E4M3 scale grid (row stride lds bytes, at least
// ceil(K / 16) of them used). Host or device pointers, as the tensors' device.
struct Nvfp4GemmOperand {
  const uint8_t *data;
  const uint8_t *scale;
  size_t rows, lds;
};

namespace gpu {
// D [b.rows, a.rows] fp32 = the blocked sum of gemm.h on `stream` (K = k, even); the CPU's bits.
void launch_nvfp4_block_gemm(const Nvfp4GemmOperand &b, const Nvfp4GemmOperand &a, size_t k,
                             float *d, void *stream);
}  // namespace gpu

}  // namespace nvte
