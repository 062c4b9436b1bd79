// Problem description of the scaled softmax family and which logits of a row survive its variant's
// mask: shared by the CPU and GPU kernels, so both devices mask exactly the same positions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../platform/host_device.h"

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
  SoftmaxMask mask = SoftmaxMask::kNone;  // the variant's masking
  const uint8_t *mask_ptr = nullptr;  // kByte only
  size_t mask_batches = 1;            // kByte only: 1 (broadcast over the batch) or b
};

// Number of leading positions row r keeps under a causal variant (all of them otherwise).
NVTE_HOST_DEVICE size_t softmax_valid_prefix(const SoftmaxParams &p, size_t r) {
  const size_t i = r % p.sq;
  if (p.mask == SoftmaxMask::kUpperTriang) return i + 1 < p.cols ? i + 1 : p.cols;
  if (p.mask == SoftmaxMask::kAlignedCausal) {
    // keep j <= i + sk - sq, i.e. a prefix of i + sk - sq + 1 positions; computed as
    // (i + 1 + sk) - sq so nothing goes negative in unsigned arithmetic.
    const size_t end = i + 1 + p.cols;
    if (end <= p.sq) return 0;
    return end - p.sq < p.cols ? end - p.sq : p.cols;
  }
  return p.cols;
}

// The byte-mask row of softmax row r (nullptr when the variant has no byte mask): mask
// [mask_batches, 1, sq, sk] broadcast over heads, and over the batch when mask_batches == 1.
NVTE_HOST_DEVICE const uint8_t *softmax_mask_row(const SoftmaxParams &p, size_t r) {
  if (p.mask != SoftmaxMask::kByte) return nullptr;
  const size_t i = r % p.sq, batch = r / (p.sq * p.heads);
  const size_t mb = p.mask_batches == 1 ? 0 : batch;
  return p.mask_ptr + (mb * p.sq + i) * p.cols;
}

}  // namespace nvte
