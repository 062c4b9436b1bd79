// te_lite fused RoPE ops: fused_rope_fwd (rotate the first d2 features of every head by the angles
// of the token's position) and fused_rope_bwd (its transpose), over nvte_fused_rope_forward /
// nvte_fused_rope_backward.
#include <torch/library.h>

#include <transformer_engine_lite/fused_rope.h>

#include "common.h"

namespace te_lite {
namespace {

NVTE_QKV_Format parse_format(const char *op, c10::string_view f) {
  if (f == "sbhd") return NVTE_SBHD;
  if (f == "bshd") return NVTE_BSHD;
  TORCH_CHECK(f == "thd", op, ": argument 'tensor_format': expected 'sbhd', 'bshd' or 'thd', got '",
              std::string(f), "'");
  return NVTE_THD;
}

// t: [s, b, h, d] / [b, s, h, d] / [t, h, d] in fp32/fp16/bf16; freqs: fp32 [s_max, 1, 1, d2];
// cu_seqlens: int32 [b + 1], thd only. Shapes and offsets are checked by the core.
at::Tensor fused_rope(const char *op, bool backward, const at::Tensor &t_,
                      const at::Tensor &freqs_, c10::string_view tensor_format, bool interleaved,
                      const std::optional<at::Tensor> &cu_seqlens_) {
  const char *t_arg = backward ? "grad" : "t";
  const NVTE_QKV_Format format = parse_format(op, tensor_format);
  check_dtype(op, t_arg, t_, kHighPrecision);
  check_dtype(op, "freqs", freqs_, {at::kFloat});
  check_same_device(op, t_, t_arg, freqs_, "freqs");
  if (cu_seqlens_.has_value()) {
    check_dtype(op, "cu_seqlens", *cu_seqlens_, {at::kInt});
    check_same_device(op, t_, t_arg, *cu_seqlens_, "cu_seqlens");
  }
  const DeviceContext ctx(t_);
  const at::Tensor t = t_.contiguous(), freqs = freqs_.contiguous();
  const std::optional<at::Tensor> cu_seqlens =
      cu_seqlens_.has_value() ? std::optional<at::Tensor>(cu_seqlens_->contiguous()) : std::nullopt;
  at::Tensor out = at::empty(t.sizes(), t.options());
  TensorWrapper tt, tf, tout;
  tt.data(t);
  tf.data(freqs);
  tout.data(out);
  // Passed as given (an empty tensor has no data pointer, and the core treats a handle without
  // data as absent): the core says "expected none" for sbhd/bshd and "got none" for thd.
  TensorWrapper tcu = optional_tensor(cu_seqlens);
  const NVTETensor cu = cu_seqlens.has_value() ? tcu.get() : nullptr;
  const NVTEStatus status =
      backward ? nvte_fused_rope_backward(tt.get(), cu, tf.get(), tout.get(), format, interleaved,
                                          ctx.stream())
               : nvte_fused_rope_forward(tt.get(), cu, tf.get(), tout.get(), format, interleaved,
                                         ctx.stream());
  check_nvte(status, op);
  return out;
}

at::Tensor fused_rope_fwd(const at::Tensor &t, const at::Tensor &freqs,
                          c10::string_view tensor_format, bool interleaved,
                          const std::optional<at::Tensor> &cu_seqlens) {
  return fused_rope("te_lite::fused_rope_fwd", false, t, freqs, tensor_format, interleaved,
                    cu_seqlens);
}

at::Tensor fused_rope_bwd(const at::Tensor &grad, const at::Tensor &freqs,
                          c10::string_view tensor_format, bool interleaved,
                          const std::optional<at::Tensor> &cu_seqlens) {
  return fused_rope("te_lite::fused_rope_bwd", true, grad, freqs, tensor_format, interleaved,
                    cu_seqlens);
}

void register_impls(torch::Library &m) {
  m.impl("fused_rope_fwd", &fused_rope_fwd);
  m.impl("fused_rope_bwd", &fused_rope_bwd);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
