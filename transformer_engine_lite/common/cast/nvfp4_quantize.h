// NVFP4 quantize / dequantize (NVTE_NVFP4_1D_SCALING): argument checks and the CPU kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "../util/tensor.h"

namespace nvte {

struct Nvfp4Spec {
  size_t rows = 0, cols = 0;  // 2-D view of the logical (unpacked) tensor
  bool rowwise = false, colwise = false;
  bool two_d = false;          // 16x16 blocks (TE's nvfp4_2d_quantization, for weights)
  bool rht = false;            // random Hadamard transform before the column-wise copy
  uint32_t rht_sign_mask = 0;  // bit i set: sign i of the RHT is -1
  bool stochastic = false;     // stochastic rounding (gradients)
  uint64_t seed = 0, offset = 0;
  // GPU outputs may keep the RNG state in device memory (as TE's CUDA rng_state tensors): the
  // kernel reads seed and offset there, and seed / offset above are unused.
  const int64_t *rng_device = nullptr;
  bool row_scaled = false;     // one amax (and S_enc) per row of each copy
  int e4m3_max = 448;          // E4M3 bound of S_enc (256 only with 4over6)
  uint8_t four_over_six = 0;   // NVTENVFP44Over6Mode
  bool fast_err = false;       // 4over6 errors in the E4M3-scaled domain
  // The output's amaxes are given (kNVTEQuantizationConfigNVFP4AmaxGiven): read, not computed.
  bool amax_given = false;
};

// Checks an NVFP4 quantize output for an input of (logical) shape `shape` and the options in
// `cfg`; returns the spec the kernel runs.
Nvfp4Spec validate_nvfp4_output(const Tensor &out, const char *arg,
                                const std::vector<size_t> &shape, const QuantizationConfig &cfg);
// Checks an NVFP4 dequantize input against an output of `out_shape`; returns its spec (the copy
// it reads: row-wise when present).
Nvfp4Spec validate_nvfp4_input(const Tensor &in, const char *arg,
                               const std::vector<size_t> &out_shape);
void launch_nvfp4_quantize(const Tensor &in, const Tensor &out, const Nvfp4Spec &spec);
void launch_nvfp4_dequantize(const Tensor &in, const Nvfp4Spec &spec, const SimpleTensor &out);

// Scale grid of the row-wise copy of a [rows, cols] view (TE's NVFP4Quantizer::get_scale_shape):
// [roundup(rows, 128), roundup(ceil(cols / 16), 4)]; the column-wise one swaps rows and cols.
std::vector<size_t> nvfp4_scale_shape(size_t rows, size_t cols, bool columnwise);

}  // namespace nvte
