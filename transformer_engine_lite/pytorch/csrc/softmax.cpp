// te_lite fused softmax ops (unfused-attention building blocks): four variants, each a forward
// y = softmax(scale * x [masked]) and a backward dx = scale * y * (dy - sum(dy * y)).
#include <torch/library.h>

#include <transformer_engine_lite/softmax.h>

#include "common.h"

namespace te_lite {
namespace {

using SoftmaxFwd = NVTEStatus (*)(const NVTETensor, NVTETensor, float, NVTEStream);
using SoftmaxBwd = NVTEStatus (*)(const NVTETensor, const NVTETensor, NVTETensor, float,
                                  NVTEStream);

// x of `ndim` dims ([b, h, sq, sk], or [attn_batches, sq, sq] for upper_triang) in fp32/fp16/bf16.
void check_input(const char *op, const at::Tensor &x, int64_t ndim) {
  check_dtype(op, "x", x, kHighPrecision);
  check_ndim(op, "x", x, ndim);
}

at::Tensor softmax_fwd(const char *op, SoftmaxFwd fn, const at::Tensor &x_, double scale,
                       int64_t ndim) {
  check_input(op, x_, ndim);
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  TensorWrapper tx, ty;
  tx.data(x);
  ty.data(y);
  check_nvte(fn(tx.get(), ty.get(), static_cast<float>(scale), ctx.stream()), op);
  return y;
}

at::Tensor softmax_bwd(const char *op, SoftmaxBwd fn, const at::Tensor &dy_, const at::Tensor &y_,
                       double scale, int64_t ndim) {
  check_dtype(op, "y", y_, kHighPrecision);
  check_ndim(op, "y", y_, ndim);
  TORCH_CHECK(dy_.scalar_type() == y_.scalar_type() && dy_.sizes() == y_.sizes(), op,
              ": argument 'dy': expected dtype ", dtype_name(y_.scalar_type()), " and shape ",
              y_.sizes(), " (those of y), got ", dtype_name(dy_.scalar_type()), " and ",
              dy_.sizes());
  check_same_device(op, y_, "y", dy_, "dy");
  const DeviceContext ctx(y_);
  const at::Tensor dy = dy_.contiguous(), y = y_.contiguous();
  at::Tensor dx = at::empty(y.sizes(), y.options());
  TensorWrapper tdy, ty, tdx;
  tdy.data(dy);
  ty.data(y);
  tdx.data(dx);
  check_nvte(fn(tdy.get(), ty.get(), tdx.get(), static_cast<float>(scale), ctx.stream()), op);
  return dx;
}

at::Tensor scaled_softmax_fwd(const at::Tensor &x, double scale) {
  return softmax_fwd("te_lite::scaled_softmax_fwd", nvte_scaled_softmax_forward, x, scale, 4);
}
at::Tensor scaled_softmax_bwd(const at::Tensor &dy, const at::Tensor &y, double scale) {
  return softmax_bwd("te_lite::scaled_softmax_bwd", nvte_scaled_softmax_backward, dy, y, scale, 4);
}

// mask: bool or uint8 [b or 1, 1, sq, sk]; nonzero = masked.
at::Tensor scaled_masked_softmax_fwd(const at::Tensor &x_, const at::Tensor &mask_, double scale) {
  constexpr const char *kOp = "te_lite::scaled_masked_softmax_fwd";
  check_input(kOp, x_, 4);
  check_dtype(kOp, "mask", mask_, {at::kBool, at::kByte});
  check_ndim(kOp, "mask", mask_, 4);
  TORCH_CHECK((mask_.size(0) == 1 || mask_.size(0) == x_.size(0)) && mask_.size(1) == 1 &&
                  mask_.size(2) == x_.size(2) && mask_.size(3) == x_.size(3),
              kOp, ": argument 'mask': expected shape [", x_.size(0), " or 1, 1, ", x_.size(2),
              ", ", x_.size(3), "] (broadcast over heads of x ", x_.sizes(), "), got ",
              mask_.sizes());
  check_same_device(kOp, x_, "x", mask_, "mask");
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous(), mask = mask_.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  TensorWrapper tx, tm, ty;
  tx.data(x);
  tm.data(mask);
  ty.data(y);
  check_nvte(nvte_scaled_masked_softmax_forward(tx.get(), tm.get(), ty.get(),
                                                static_cast<float>(scale), ctx.stream()),
             kOp);
  return y;
}
at::Tensor scaled_masked_softmax_bwd(const at::Tensor &dy, const at::Tensor &y, double scale) {
  return softmax_bwd("te_lite::scaled_masked_softmax_bwd", nvte_scaled_masked_softmax_backward, dy,
                     y, scale, 4);
}

at::Tensor scaled_upper_triang_masked_softmax_fwd(const at::Tensor &x, double scale) {
  return softmax_fwd("te_lite::scaled_upper_triang_masked_softmax_fwd",
                     nvte_scaled_upper_triang_masked_softmax_forward, x, scale, 3);
}
at::Tensor scaled_upper_triang_masked_softmax_bwd(const at::Tensor &dy, const at::Tensor &y,
                                                  double scale) {
  return softmax_bwd("te_lite::scaled_upper_triang_masked_softmax_bwd",
                     nvte_scaled_upper_triang_masked_softmax_backward, dy, y, scale, 3);
}

at::Tensor scaled_aligned_causal_masked_softmax_fwd(const at::Tensor &x, double scale) {
  return softmax_fwd("te_lite::scaled_aligned_causal_masked_softmax_fwd",
                     nvte_scaled_aligned_causal_masked_softmax_forward, x, scale, 4);
}
at::Tensor scaled_aligned_causal_masked_softmax_bwd(const at::Tensor &dy, const at::Tensor &y,
                                                    double scale) {
  return softmax_bwd("te_lite::scaled_aligned_causal_masked_softmax_bwd",
                     nvte_scaled_aligned_causal_masked_softmax_backward, dy, y, scale, 4);
}

void register_impls(torch::Library &m) {
  m.impl("scaled_softmax_fwd", &scaled_softmax_fwd);
  m.impl("scaled_softmax_bwd", &scaled_softmax_bwd);
  m.impl("scaled_masked_softmax_fwd", &scaled_masked_softmax_fwd);
  m.impl("scaled_masked_softmax_bwd", &scaled_masked_softmax_bwd);
  m.impl("scaled_upper_triang_masked_softmax_fwd", &scaled_upper_triang_masked_softmax_fwd);
  m.impl("scaled_upper_triang_masked_softmax_bwd", &scaled_upper_triang_masked_softmax_bwd);
  m.impl("scaled_aligned_causal_masked_softmax_fwd", &scaled_aligned_causal_masked_softmax_fwd);
  m.impl("scaled_aligned_causal_masked_softmax_bwd", &scaled_aligned_causal_masked_softmax_bwd);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
