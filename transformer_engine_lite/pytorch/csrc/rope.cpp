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
// cu_seqlens: int32 [b + 1], thd only; start_positions: int32 [b]; cp_size / cp_rank: TE's
// context-parallel split. Shapes and offsets are checked by the core.
at::Tensor fused_rope(const char *op, bool backward, const at::Tensor &t_,
                      const at::Tensor &freqs_, c10::string_view tensor_format, bool interleaved,
                      const std::optional<at::Tensor> &cu_seqlens_,
                      const std::optional<at::Tensor> &start_positions_, int64_t cp_size,
                      int64_t cp_rank) {
  const char *t_arg = backward ? "grad" : "t";
  const NVTE_QKV_Format format = parse_format(op, tensor_format);
  check_dtype(op, t_arg, t_, kHighPrecision);
  check_dtype(op, "freqs", freqs_, {at::kFloat});
  check_same_device(op, t_, t_arg, freqs_, "freqs");
  if (cu_seqlens_.has_value()) {
    check_dtype(op, "cu_seqlens", *cu_seqlens_, {at::kInt});
    check_same_device(op, t_, t_arg, *cu_seqlens_, "cu_seqlens");
  }
  if (start_positions_.has_value()) {
    check_dtype(op, "start_positions", *start_positions_, {at::kInt});
    check_same_device(op, t_, t_arg, *start_positions_, "start_positions");
  }
  // The core takes C ints: out-of-range values must not wrap into valid ones.
  TORCH_CHECK(cp_size >= 1 && cp_size <= INT32_MAX, op, ": argument 'cp_size': expected >= 1, got ",
              cp_size);
  TORCH_CHECK(cp_rank >= 0 && cp_rank < cp_size, op, ": argument 'cp_rank': expected 0 <= cp_rank "
              "< cp_size (", cp_size, "), got ", cp_rank);
  const DeviceContext ctx(t_);
  const at::Tensor t = t_.contiguous(), freqs = freqs_.contiguous();
  const std::optional<at::Tensor> cu_seqlens =
      cu_seqlens_.has_value() ? std::optional<at::Tensor>(cu_seqlens_->contiguous()) : std::nullopt;
  const std::optional<at::Tensor> starts =
      start_positions_.has_value() ? std::optional<at::Tensor>(start_positions_->contiguous())
                                   : std::nullopt;
  at::Tensor out = at::empty(t.sizes(), t.options());
  TensorWrapper tt, tf, tout;
  tt.data(t);
  tf.data(freqs);
  tout.data(out);
  // Passed as given (an empty tensor has no data pointer, and the core treats a handle without
  // data as absent): the core says "expected none" for sbhd/bshd and "got none" for thd.
  TensorWrapper tcu = optional_tensor(cu_seqlens);
  const NVTETensor cu = cu_seqlens.has_value() ? tcu.get() : nullptr;
  TensorWrapper tstarts = optional_tensor(starts);
  const NVTETensor sp = starts.has_value() ? tstarts.get() : nullptr;
  const int cps = static_cast<int>(cp_size), cpr = static_cast<int>(cp_rank);
  const NVTEStatus status =
      backward ? nvte_fused_rope_backward(tt.get(), cu, tf.get(), sp, tout.get(), format,
                                          interleaved, cps, cpr, ctx.stream())
               : nvte_fused_rope_forward(tt.get(), cu, tf.get(), sp, tout.get(), format,
                                         interleaved, cps, cpr, ctx.stream());
  check_nvte(status, op);
  return out;
}

at::Tensor fused_rope_fwd(const at::Tensor &t, const at::Tensor &freqs,
                          c10::string_view tensor_format, bool interleaved,
                          const std::optional<at::Tensor> &cu_seqlens,
                          const std::optional<at::Tensor> &start_positions, int64_t cp_size,
                          int64_t cp_rank) {
  return fused_rope("te_lite::fused_rope_fwd", false, t, freqs, tensor_format, interleaved,
                    cu_seqlens, start_positions, cp_size, cp_rank);
}

at::Tensor fused_rope_bwd(const at::Tensor &grad, const at::Tensor &freqs,
                          c10::string_view tensor_format, bool interleaved,
                          const std::optional<at::Tensor> &cu_seqlens,
                          const std::optional<at::Tensor> &start_positions, int64_t cp_size,
                          int64_t cp_rank) {
  return fused_rope("te_lite::fused_rope_bwd", true, grad, freqs, tensor_format, interleaved,
                    cu_seqlens, start_positions, cp_size, cp_rank);
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
