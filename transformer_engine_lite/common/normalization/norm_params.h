// Problem descriptions of LayerNorm / RMSNorm shared by the CPU and GPU launchers: plain structs of
// sizes and raw pointers, validated by norm_api.cpp before any launcher sees them.
#pragma once

#include <cstddef>

#include "../util/tensor.h"

namespace nvte {

enum class NormKind { kLayerNorm, kRMSNorm };

// Forward: z = (x - mu) * rsigma * w + beta (LayerNorm) or x * rsigma * w (RMSNorm), w = gamma or
// 1 + gamma (zero-centered). Rows are independent, so results do not depend on the thread count.
struct NormFwdParams {
  NormKind kind = NormKind::kLayerNorm;
  size_t rows = 0;            // product of x's leading dims
  size_t hidden = 0;          // x's last dim (> 0)
  const void *x = nullptr;    // [rows, hidden] in x_dtype
  DType x_dtype = kNVTEFloat32;
  const void *gamma = nullptr;  // [hidden] in w_dtype
  const void *beta = nullptr;   // [hidden] in w_dtype; null for RMSNorm
  DType w_dtype = kNVTEFloat32;
  float epsilon = 0.0f;
  bool zero_centered_gamma = false;
  float *mu = nullptr;      // [rows] out; null for RMSNorm
  float *rsigma = nullptr;  // [rows] out
};

// Backward (TE's formulas, xhat = (x - mu) * rsigma or x * rsigma, dy = dz * w):
//   dx = rsigma * (dy - mean(dy) - xhat * mean(dy * xhat))   (RMSNorm: no mean(dy) term)
//   dgamma = sum_rows dz * xhat,  dbeta = sum_rows dz.
// Row chunk c (a fixed split of the rows, see norm_bwd_chunks) writes its fp32 partial sums into
// workspace row c; the chunks are then summed in order, so dgamma/dbeta do not depend on threads.
struct NormBwdParams {
  NormKind kind = NormKind::kLayerNorm;
  size_t rows = 0;
  size_t hidden = 0;
  const void *dz = nullptr;  // [rows, hidden] in dz_dtype
  DType dz_dtype = kNVTEFloat32;
  const void *x = nullptr;  // [rows, hidden] in x_dtype
  DType x_dtype = kNVTEFloat32;
  const float *mu = nullptr;  // [rows]; null for RMSNorm
  const float *rsigma = nullptr;  // [rows]
  const void *gamma = nullptr;    // [hidden] in w_dtype
  DType w_dtype = kNVTEFloat32;
  bool zero_centered_gamma = false;
  void *dx = nullptr;  // [rows, hidden] out in dx_dtype
  DType dx_dtype = kNVTEFloat32;
  const void *add = nullptr;  // [rows, hidden] in add_dtype, added to dx in fp32; may be null
  DType add_dtype = kNVTEFloat32;
  void *dgamma = nullptr;  // [hidden] out in w_dtype
  void *dbeta = nullptr;   // [hidden] out in w_dtype; null for RMSNorm
  float *workspace = nullptr;  // fp32 [chunks, partials_per_chunk(kind, hidden)]
  size_t chunks = 1;
};

// Number of row chunks of the backward's dgamma/dbeta reduction: a function of `rows` only (never
// of the thread count), fixed when the workspace is queried.
size_t norm_bwd_chunks(size_t rows);
// fp32 partial sums one chunk holds: dgamma (and dbeta for LayerNorm).
size_t norm_bwd_partials_per_chunk(NormKind kind, size_t hidden);

}  // namespace nvte
