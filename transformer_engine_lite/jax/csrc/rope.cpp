// te_lite fused RoPE handlers (pytorch/csrc/rope.cpp's ops): fused_rope_fwd (rotate the first d2
// features of every head by the angles of the token's position) and fused_rope_bwd (its
// transpose), over nvte_fused_rope_forward / nvte_fused_rope_backward.
#include <transformer_engine_lite/fused_rope.h>

#include "handler.h"

namespace te_lite {
namespace {

ffi::Error parse_format(const char *op, std::string_view f, NVTE_QKV_Format *out) {
  if (f == "sbhd") {
    *out = NVTE_SBHD;
  } else if (f == "bshd") {
    *out = NVTE_BSHD;
  } else {
    TE_LITE_CHECK(f == "thd", op,
                  ": argument 'tensor_format': expected 'sbhd', 'bshd' or 'thd', got '", f, "'");
    *out = NVTE_THD;
  }
  return ffi::Error::Success();
}

// t: [s, b, h, d] / [b, s, h, d] / [t, h, d] in fp32/fp16/bf16; freqs: fp32 [s_max, 1, 1, d2];
// cu_seqlens: int32 [b + 1], thd only ([0] = None). Shapes and offsets are checked by the core.
ffi::Error fused_rope(const char *op, bool backward, const Device &dev, const Buffer &t,
                      const Buffer &freqs, const Buffer &cu_seqlens, const Buffer &out,
                      std::string_view tensor_format, bool interleaved) {
  const char *t_arg = backward ? "grad" : "t";
  NVTE_QKV_Format format = NVTE_SBHD;
  TE_LITE_TRY(parse_format(op, tensor_format, &format));
  TE_LITE_TRY(check_dtype(op, t_arg, t, kHighPrecision));
  TE_LITE_TRY(check_dtype(op, "freqs", freqs, {DataType::F32}));
  if (present(cu_seqlens)) TE_LITE_TRY(check_dtype(op, "cu_seqlens", cu_seqlens, {DataType::S32}));
  TE_LITE_TRY(check_result(op, "out", out, t.element_type(), shape_of(t)));
  TensorWrapper tt(dev), tf(dev), tout(dev);
  tt.data(t);
  tf.data(freqs);
  tout.data(out);
  // None is a null handle: the core says "expected none" for sbhd/bshd and "got none" for thd.
  TensorWrapper tcu = optional_tensor(dev, cu_seqlens);
  const NVTETensor cu = present(cu_seqlens) ? tcu.get() : nullptr;
  const NVTEStatus status =
      backward ? nvte_fused_rope_backward(tt.get(), cu, tf.get(), /*start_positions=*/nullptr,
                                          tout.get(), format, interleaved, /*cp_size=*/1,
                                          /*cp_rank=*/0, dev.stream)
               : nvte_fused_rope_forward(tt.get(), cu, tf.get(), /*start_positions=*/nullptr,
                                         tout.get(), format, interleaved, /*cp_size=*/1,
                                         /*cp_rank=*/0, dev.stream);
  return check_nvte(op, status);
}

ffi::Error fused_rope_fwd(const Device &dev, Buffer t, Buffer freqs, Buffer cu_seqlens, Buffer out,
                          std::string_view tensor_format, bool interleaved) {
  return fused_rope("te_lite::fused_rope_fwd", false, dev, t, freqs, cu_seqlens, out,
                    tensor_format, interleaved);
}

ffi::Error fused_rope_bwd(const Device &dev, Buffer grad, Buffer freqs, Buffer cu_seqlens,
                          Buffer out, std::string_view tensor_format, bool interleaved) {
  return fused_rope("te_lite::fused_rope_bwd", true, dev, grad, freqs, cu_seqlens, out,
                    tensor_format, interleaved);
}

}  // namespace

TE_LITE_FFI_HANDLERS(fused_rope_fwd, fused_rope_fwd,
                     .Arg<Buffer>()                            // t: sbhd / bshd / thd layout
                     .Arg<Buffer>()                            // freqs: float32 [s_max, 1, 1, d2]
                     .Arg<Buffer>()                            // cu_seqlens: int32 [b + 1] or [0]
                     .Ret<Buffer>()                            // out: t's shape and dtype
                     .Attr<std::string_view>("tensor_format")  // "sbhd", "bshd" or "thd"
                     .Attr<bool>("interleaved")                // rotate adjacent pairs
);

TE_LITE_FFI_HANDLERS(fused_rope_bwd, fused_rope_bwd,
                     .Arg<Buffer>()                            // grad: the forward output's grad
                     .Arg<Buffer>()                            // freqs: float32 [s_max, 1, 1, d2]
                     .Arg<Buffer>()                            // cu_seqlens: int32 [b + 1] or [0]
                     .Ret<Buffer>()                            // out: grad's shape and dtype
                     .Attr<std::string_view>("tensor_format")
                     .Attr<bool>("interleaved")
);

}  // namespace te_lite
