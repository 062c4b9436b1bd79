// The registry libte_lite_jax.so exports: a plain C table of (target name, CPU handler, GPU
// handler), read with ctypes by transformer_engine_lite/jax, which wraps each pointer with
// jax.ffi.pycapsule and registers it per platform. No pybind and no Python C API, so one binary
// serves every CPython and jaxlib that share the XLA FFI C ABI (api_version 4, typed FFI).
//
// Handler semantics (arguments, results, attributes) are documented beside each
// TE_LITE_FFI_HANDLERS in the family files; they mirror torch.ops.te_lite one to one.
#include <cstddef>

#include <xla/ffi/api/c_api.h>

// One line per op: target "te_lite_<op>_ffi", symbols te_lite_<op>_ffi_cpu / _gpu.
#define TE_LITE_JAX_OPS(X)                    \
  /* cast.cpp */                              \
  X(quantize)                                 \
  X(quantize_mxfp8)                           \
  X(dequantize)                               \
  X(dequantize_mxfp8)                         \
  X(compute_amax)                             \
  X(transpose)                                \
  X(cast_transpose)                           \
  /* nvfp4.cpp */                             \
  X(quantize_nvfp4)                           \
  X(dequantize_nvfp4)                         \
  X(nvfp4_block_gemm)                         \
  /* recipe.cpp */                            \
  X(compute_scale_from_amax)                  \
  X(delayed_scaling_update)                   \
  /* norm.cpp */                              \
  X(layernorm_fwd)                            \
  X(layernorm_bwd)                            \
  X(rmsnorm_fwd)                              \
  X(rmsnorm_bwd)                              \
  /* activation.cpp */                        \
  X(activation_fwd)                           \
  X(activation_bwd)                           \
  X(clamped_swiglu_fwd)                       \
  X(clamped_swiglu_bwd)                       \
  /* gemm.cpp */                              \
  X(gemm)                                     \
  /* softmax.cpp */                           \
  X(scaled_softmax_fwd)                       \
  X(scaled_softmax_bwd)                       \
  X(scaled_masked_softmax_fwd)                \
  X(scaled_masked_softmax_bwd)                \
  X(scaled_upper_triang_masked_softmax_fwd)   \
  X(scaled_upper_triang_masked_softmax_bwd)   \
  X(scaled_aligned_causal_masked_softmax_fwd) \
  X(scaled_aligned_causal_masked_softmax_bwd) \
  /* rope.cpp */                              \
  X(fused_rope_fwd)                           \
  X(fused_rope_bwd)                           \
  /* attention.cpp */                         \
  X(fused_attn_fwd)                           \
  X(fused_attn_bwd)                           \
  X(fused_attn_dropout_mask)

#define TE_LITE_DECLARE(op)                                             \
  extern "C" XLA_FFI_Error *te_lite_##op##_ffi_cpu(XLA_FFI_CallFrame *); \
  extern "C" XLA_FFI_Error *te_lite_##op##_ffi_gpu(XLA_FFI_CallFrame *);
TE_LITE_JAX_OPS(TE_LITE_DECLARE)
#undef TE_LITE_DECLARE

extern "C" {

// `cpu` / `gpu`: XLA_FFI_Handler pointers (api_version 4). `gpu` may be NULL for an op without a
// GPU handler (none so far); whether the core can run GPU handlers is its build's business
// (nvte_get_build_info): the caller registers them only for a GPU build.
typedef struct {
  const char *name;
  void *cpu;
  void *gpu;
} TeLiteJaxHandler;

__attribute__((visibility("default"))) const TeLiteJaxHandler *te_lite_jax_handlers(size_t *count) {
#define TE_LITE_ENTRY(op)                                                         \
  {"te_lite_" #op "_ffi", reinterpret_cast<void *>(&te_lite_##op##_ffi_cpu),       \
   reinterpret_cast<void *>(&te_lite_##op##_ffi_gpu)},
  static const TeLiteJaxHandler kHandlers[] = {TE_LITE_JAX_OPS(TE_LITE_ENTRY)};
#undef TE_LITE_ENTRY
  if (count != nullptr) *count = sizeof(kHandlers) / sizeof(kHandlers[0]);
  return kHandlers;
}

}  // extern "C"
