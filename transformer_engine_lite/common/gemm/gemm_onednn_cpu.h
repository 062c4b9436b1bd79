// One oneDNN matmul, dst[M, N] = s_src * s_wei * src[M, K] @ wei[K, N] (+ bias[N]) (+ dst), with a
// small thread-safe cache of primitives keyed by everything that shapes the kernel (not by values).
#pragma once

#include <cstdint>
#include <memory>

#include "../util/tensor.h"

namespace nvte {
namespace gemm {

// What a oneDNN matmul primitive is built for. Strides are in elements ({rows, cols}): a plain
// row-major [R, C] matrix has {C, 1}, a transposed view of a row-major [C, R] matrix has {1, C}, so
// transposes cost no copies of our own (oneDNN packs operands inside its kernel anyway).
struct MatmulDesc {
  int64_t M = 0, K = 0, N = 0;
  int64_t src_stride[2] = {0, 0};
  int64_t wei_stride[2] = {0, 0};
  DType src_dtype = kNVTEFloat32, wei_dtype = kNVTEFloat32, dst_dtype = kNVTEFloat32;
  // Runtime fp32 scalar scales (FP8 scale_inv): values are passed per call, so delayed scaling,
  // which changes them every step, never rebuilds a primitive.
  bool src_scale = false, wei_scale = false;
  // dst row r += bias (binary add post-op broadcast over rows), applied after the scales.
  bool bias = false;
  DType bias_dtype = kNVTEFloat32;
  // dst += sum_scale * previous dst (sum post-op), applied last. The scale is a creation-time
  // constant of oneDNN's sum post-op, so it is part of the cache key (beta: usually 1).
  bool accumulate = false;
  float sum_scale = 1.0f;
};

struct MatmulArgs {
  const void *src = nullptr, *wei = nullptr, *bias = nullptr;
  void *dst = nullptr;
  float src_scale = 1.0f, wei_scale = 1.0f;
};

// Opaque compiled primitive.
struct MatmulPrimitive;

// Cached primitive for `desc`, or nullptr when oneDNN has no implementation for it (e.g. f16 on a CPU
// without AVX512-FP16): the caller then falls back to another formulation. Throws only on real errors.
std::shared_ptr<const MatmulPrimitive> get_matmul(const MatmulDesc &desc);

// Name of the oneDNN implementation (e.g. "brg:avx512_core_bf16"), for benchmarks and logs.
const char *matmul_impl_name(const MatmulPrimitive &prim);

// The ISA oneDNN dispatches to ("avx2", "avx512_core_amx", ...) after NVTE_CPU_ISA's cap (applied
// when ONEDNN_MAX_CPU_ISA is unset); "none" without oneDNN.
const char *onednn_isa_name();

// Runs a primitive on the calling thread's stream and waits for it.
void run_matmul(const MatmulPrimitive &prim, const MatmulArgs &args);

}  // namespace gemm
}  // namespace nvte
