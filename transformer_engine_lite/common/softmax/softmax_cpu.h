// CPU launchers of the fused scaled softmax family: one row kernel for all four variants, with the
// variant's mask given as a byte mask or a per-row valid prefix length.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../util/tensor.h"

namespace nvte {

// How the logits of one row are masked.
enum class SoftmaxMask {
  kNone,           // every position kept
  kByte,           // byte mask [mask_batches, 1, sq, sk], nonzero = masked: logit becomes -10000
  kUpperTriang,    // row i keeps j <= i (sq == sk); the rest gets probability exactly 0
  kAlignedCausal,  // row i keeps j <= i + (sk - sq) (bottom-right causal); the rest gets 0
};

// Problem description filled by the API entry; kernels see only this and raw pointers.
struct SoftmaxParams {
  size_t rows = 0;           // number of softmax rows: b * h * sq (or attn_batches * sq)
  size_t cols = 0;           // sk, the softmax length
  size_t sq = 1;             // rows per [sq, sk] matrix: row r is query position r % sq
  size_t heads = 1;          // h, maps a row to its batch for the byte mask: b = r / (sq * heads)
  float scale = 1.0f;        // scale_factor applied to the logits (fwd) or the gradient (bwd)
  SoftmaxMask mask = SoftmaxMask::kNone;
  const uint8_t *mask_ptr = nullptr;  // kByte only
  size_t mask_batches = 1;            // kByte only: 1 (broadcast over the batch) or b
};

// softmax_results = softmax(mask(scale * input)) row by row; input and output share a dtype
// (fp32/fp16/bf16) and may alias.
void launch_softmax_fwd(const SoftmaxParams &p, DType dtype, const void *input, void *output);

// output_grads = scale * y * (dy - sum(dy * y)) row by row, exactly 0 where the variant's causal
// mask dropped the position. Any of the three buffers may alias.
void launch_softmax_bwd(const SoftmaxParams &p, DType dtype, const void *incoming_grads,
                        const void *softmax_results, void *output_grads);

}  // namespace nvte
