// te_lite fused softmax handlers (pytorch/csrc/softmax.cpp's ops): four variants, each a forward
// y = softmax(scale * x [masked]) and a backward dx = scale * y * (dy - sum(dy * y)).
#include <transformer_engine_lite/softmax.h>

#include "handler.h"

namespace te_lite {
namespace {

using SoftmaxFwd = NVTEStatus (*)(const NVTETensor, NVTETensor, float, NVTEStream);
using SoftmaxBwd = NVTEStatus (*)(const NVTETensor, const NVTETensor, NVTETensor, float,
                                  NVTEStream);

// x of `n` dims ([b, h, sq, sk], or [attn_batches, sq, sq] for upper_triang) in fp32/fp16/bf16.
ffi::Error check_input(const char *op, const Buffer &x, int64_t n) {
  TE_LITE_TRY(check_dtype(op, "x", x, kHighPrecision));
  return check_ndim(op, "x", x, n);
}

ffi::Error softmax_fwd(const char *op, SoftmaxFwd fn, const Device &dev, const Buffer &x,
                       const Buffer &y, double scale, int64_t n) {
  TE_LITE_TRY(check_input(op, x, n));
  TE_LITE_TRY(check_result(op, "y", y, x.element_type(), shape_of(x)));
  TensorWrapper tx(dev), ty(dev);
  tx.data(x);
  ty.data(y);
  return check_nvte(op, fn(tx.get(), ty.get(), static_cast<float>(scale), dev.stream));
}

ffi::Error softmax_bwd(const char *op, SoftmaxBwd fn, const Device &dev, const Buffer &dy,
                       const Buffer &y, const Buffer &dx, double scale, int64_t n) {
  TE_LITE_TRY(check_dtype(op, "y", y, kHighPrecision));
  TE_LITE_TRY(check_ndim(op, "y", y, n));
  TE_LITE_CHECK(dy.element_type() == y.element_type() && shape_of(dy) == shape_of(y), op,
                ": argument 'dy': expected dtype ", dtype_name(y.element_type()), " and shape ",
                shape_str(y), " (those of y), got ", dtype_name(dy.element_type()), " and ",
                shape_str(dy));
  TE_LITE_TRY(check_result(op, "dx", dx, y.element_type(), shape_of(y)));
  TensorWrapper tdy(dev), ty(dev), tdx(dev);
  tdy.data(dy);
  ty.data(y);
  tdx.data(dx);
  return check_nvte(op, fn(tdy.get(), ty.get(), tdx.get(), static_cast<float>(scale), dev.stream));
}

ffi::Error scaled_softmax_fwd(const Device &dev, Buffer x, Buffer y, double scale) {
  return softmax_fwd("te_lite::scaled_softmax_fwd", nvte_scaled_softmax_forward, dev, x, y, scale,
                     4);
}
ffi::Error scaled_softmax_bwd(const Device &dev, Buffer dy, Buffer y, Buffer dx, double scale) {
  return softmax_bwd("te_lite::scaled_softmax_bwd", nvte_scaled_softmax_backward, dev, dy, y, dx,
                     scale, 4);
}

// mask: bool or uint8 [b or 1, 1, sq, sk]; nonzero = masked.
ffi::Error scaled_masked_softmax_fwd(const Device &dev, Buffer x, Buffer mask, Buffer y,
                                     double scale) {
  constexpr const char *kOp = "te_lite::scaled_masked_softmax_fwd";
  TE_LITE_TRY(check_input(kOp, x, 4));
  TE_LITE_TRY(check_dtype(kOp, "mask", mask, {DataType::PRED, DataType::U8}));
  TE_LITE_TRY(check_ndim(kOp, "mask", mask, 4));
  TE_LITE_CHECK((dim(mask, 0) == 1 || dim(mask, 0) == dim(x, 0)) && dim(mask, 1) == 1 &&
                    dim(mask, 2) == dim(x, 2) && dim(mask, 3) == dim(x, 3),
                kOp, ": argument 'mask': expected shape [", dim(x, 0), " or 1, 1, ", dim(x, 2),
                ", ", dim(x, 3), "] (broadcast over heads of x ", shape_str(x), "), got ",
                shape_str(mask));
  TE_LITE_TRY(check_result(kOp, "y", y, x.element_type(), shape_of(x)));
  TensorWrapper tx(dev), tm(dev), ty(dev);
  tx.data(x);
  tm.data(mask);
  ty.data(y);
  return check_nvte(kOp, nvte_scaled_masked_softmax_forward(tx.get(), tm.get(), ty.get(),
                                                            static_cast<float>(scale), dev.stream));
}
ffi::Error scaled_masked_softmax_bwd(const Device &dev, Buffer dy, Buffer y, Buffer dx,
                                     double scale) {
  return softmax_bwd("te_lite::scaled_masked_softmax_bwd", nvte_scaled_masked_softmax_backward,
                     dev, dy, y, dx, scale, 4);
}

ffi::Error scaled_upper_triang_masked_softmax_fwd(const Device &dev, Buffer x, Buffer y,
                                                  double scale) {
  return softmax_fwd("te_lite::scaled_upper_triang_masked_softmax_fwd",
                     nvte_scaled_upper_triang_masked_softmax_forward, dev, x, y, scale, 3);
}
ffi::Error scaled_upper_triang_masked_softmax_bwd(const Device &dev, Buffer dy, Buffer y,
                                                  Buffer dx, double scale) {
  return softmax_bwd("te_lite::scaled_upper_triang_masked_softmax_bwd",
                     nvte_scaled_upper_triang_masked_softmax_backward, dev, dy, y, dx, scale, 3);
}

ffi::Error scaled_aligned_causal_masked_softmax_fwd(const Device &dev, Buffer x, Buffer y,
                                                    double scale) {
  return softmax_fwd("te_lite::scaled_aligned_causal_masked_softmax_fwd",
                     nvte_scaled_aligned_causal_masked_softmax_forward, dev, x, y, scale, 4);
}
ffi::Error scaled_aligned_causal_masked_softmax_bwd(const Device &dev, Buffer dy, Buffer y,
                                                    Buffer dx, double scale) {
  return softmax_bwd("te_lite::scaled_aligned_causal_masked_softmax_bwd",
                     nvte_scaled_aligned_causal_masked_softmax_backward, dev, dy, y, dx, scale, 4);
}

}  // namespace

// Every forward: x -> y (x's shape and dtype); every backward: (dy, y) -> dx (y's shape and dtype).
#define TE_LITE_SOFTMAX_FWD_BINDING                                        \
  .Arg<Buffer>() /* x */                                                   \
      .Ret<Buffer>() /* y */                                               \
      .Attr<double>("scale") /* multiplies x before the softmax */
#define TE_LITE_SOFTMAX_BWD_BINDING                                        \
  .Arg<Buffer>() /* dy */                                                  \
      .Arg<Buffer>() /* y: the forward's output */                         \
      .Ret<Buffer>() /* dx */                                              \
      .Attr<double>("scale") /* the forward's scale */

TE_LITE_FFI_HANDLERS(scaled_softmax_fwd, scaled_softmax_fwd, TE_LITE_SOFTMAX_FWD_BINDING);
TE_LITE_FFI_HANDLERS(scaled_softmax_bwd, scaled_softmax_bwd, TE_LITE_SOFTMAX_BWD_BINDING);

TE_LITE_FFI_HANDLERS(scaled_masked_softmax_fwd, scaled_masked_softmax_fwd,
                     .Arg<Buffer>()          // x: [b, h, sq, sk]
                     .Arg<Buffer>()          // mask: bool / uint8 [b or 1, 1, sq, sk], 1 = masked
                     .Ret<Buffer>()          // y: x's shape and dtype
                     .Attr<double>("scale")  // multiplies x before the softmax
);
TE_LITE_FFI_HANDLERS(scaled_masked_softmax_bwd, scaled_masked_softmax_bwd,
                     TE_LITE_SOFTMAX_BWD_BINDING);

TE_LITE_FFI_HANDLERS(scaled_upper_triang_masked_softmax_fwd,
                     scaled_upper_triang_masked_softmax_fwd, TE_LITE_SOFTMAX_FWD_BINDING);
TE_LITE_FFI_HANDLERS(scaled_upper_triang_masked_softmax_bwd,
                     scaled_upper_triang_masked_softmax_bwd, TE_LITE_SOFTMAX_BWD_BINDING);

TE_LITE_FFI_HANDLERS(scaled_aligned_causal_masked_softmax_fwd,
                     scaled_aligned_causal_masked_softmax_fwd, TE_LITE_SOFTMAX_FWD_BINDING);
TE_LITE_FFI_HANDLERS(scaled_aligned_causal_masked_softmax_bwd,
                     scaled_aligned_causal_masked_softmax_bwd, TE_LITE_SOFTMAX_BWD_BINDING);

}  // namespace te_lite
