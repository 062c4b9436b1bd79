// te_lite normalization handlers (pytorch/csrc/norm.cpp's ops): LayerNorm and RMSNorm forward
// (optionally FP8 output: z's dtype, with `scale`) and backward. The core's workspace protocol
// (query, allocate, call) is handled here (common.h with_workspace); callers never see it.
#include <transformer_engine_lite/normalization.h>

#include "handler.h"

namespace te_lite {
namespace {

// x [..., hidden] in fp32/fp16/bf16; gamma (and beta) [hidden].
ffi::Error check_norm_args(const char *op, const Buffer &x, const Buffer &gamma,
                           const Buffer *beta) {
  TE_LITE_TRY(check_dtype(op, "x", x, kHighPrecision));
  TE_LITE_TRY(check_min_ndim(op, "x", x, 1));
  const int64_t hidden = dim(x, -1);
  for (const auto &[t, arg] : {std::pair{&gamma, "gamma"}, std::pair{beta, "beta"}}) {
    if (t == nullptr) continue;
    TE_LITE_TRY(check_dtype(op, arg, *t, kHighPrecision));
    TE_LITE_CHECK(ndim(*t) == 1 && dim(*t, 0) == hidden, op, ": argument '", arg,
                  "': expected shape [", hidden, "] (the last dim of x ", shape_str(x), "), got ",
                  shape_str(*t));
  }
  return ffi::Error::Success();
}

// dz: x's dtype family and shape.
ffi::Error check_dz(const char *op, const Buffer &dz, const Buffer &x) {
  TE_LITE_TRY(check_dtype(op, "dz", dz, kHighPrecision));
  TE_LITE_CHECK(shape_of(dz) == shape_of(x), op, ": argument 'dz': expected the shape of x ",
                shape_str(x), ", got ", shape_str(dz));
  return ffi::Error::Success();
}

// z (x's shape; its dtype is out_dtype) and its FP8 side results, checked and wrapped.
ffi::Error wrap_z(const char *op, const Buffer &x, const Buffer &scale, const Buffer &z,
                  const Buffer &amax, const Buffer &scale_inv, TensorWrapper &wrapper) {
  const DataType out = z.element_type();
  TE_LITE_TRY(check_output_dtype(op, out, scale));
  TE_LITE_TRY(check_result(op, "z", z, out, shape_of(x)));
  TE_LITE_TRY(check_fp8_side_results(op, amax, scale_inv, is_fp8(out)));
  wrapper.data(z);
  if (is_fp8(out)) wrapper.scale(scale).amax(amax).scale_inv(scale_inv);
  return ffi::Error::Success();
}

int64_t rows_of(const Buffer &x) { return dim(x, -1) == 0 ? 0 : numel(x) / dim(x, -1); }

// Statistics (mu, rsigma): float32 shaped like x's leading dims, or flat [rows].
ffi::Error check_stats(const char *op, const char *name, const Buffer &s, const Buffer &x,
                       bool result) {
  Shape lead = shape_of(x);
  lead.pop_back();
  const Shape got = shape_of(s);
  TE_LITE_CHECK(s.element_type() == DataType::F32 && (got == lead || got == Shape{rows_of(x)}),
                op, ": ", result ? "result" : "argument", " '", name, "': expected float32 of shape ",
                shape_str(lead), " (x's leading dims) or [", rows_of(x), "], got ",
                dtype_name(s.element_type()), " of shape ", shape_str(got));
  return ffi::Error::Success();
}

ffi::Error layernorm_fwd(const Device &dev, Buffer x, Buffer gamma, Buffer beta, Buffer scale,
                         Buffer z, Buffer mu, Buffer rsigma, Buffer amax, Buffer scale_inv,
                         double eps, bool zero_centered_gamma) {
  constexpr const char *kOp = "te_lite::layernorm_fwd";
  TE_LITE_TRY(check_norm_args(kOp, x, gamma, &beta));
  TensorWrapper tz(dev);
  TE_LITE_TRY(wrap_z(kOp, x, scale, z, amax, scale_inv, tz));
  TE_LITE_TRY(check_stats(kOp, "mu", mu, x, true));
  TE_LITE_TRY(check_stats(kOp, "rsigma", rsigma, x, true));
  TensorWrapper tx(dev), tg(dev), tb(dev), tmu(dev), trs(dev);
  tx.data(x);
  tg.data(gamma);
  tb.data(beta);
  tmu.data_flat(mu);
  trs.data_flat(rsigma);
  // multiprocessorCount 0: a launch hint of TE's kernels that the core ignores.
  return with_workspace(kOp, dev, [&](NVTETensor ws) {
    return nvte_layernorm_fwd(tx.get(), tg.get(), tb.get(), static_cast<float>(eps), tz.get(),
                              tmu.get(), trs.get(), ws, 0, zero_centered_gamma, dev.stream);
  });
}

ffi::Error layernorm_bwd(const Device &dev, Buffer dz, Buffer x, Buffer mu, Buffer rsigma,
                         Buffer gamma, Buffer dx, Buffer dgamma, Buffer dbeta,
                         bool zero_centered_gamma) {
  constexpr const char *kOp = "te_lite::layernorm_bwd";
  TE_LITE_TRY(check_norm_args(kOp, x, gamma, nullptr));
  TE_LITE_TRY(check_dz(kOp, dz, x));
  TE_LITE_TRY(check_stats(kOp, "mu", mu, x, false));
  TE_LITE_TRY(check_stats(kOp, "rsigma", rsigma, x, false));
  TE_LITE_TRY(check_result(kOp, "dx", dx, x.element_type(), shape_of(x)));
  TE_LITE_TRY(check_result(kOp, "dgamma", dgamma, gamma.element_type(), shape_of(gamma)));
  TE_LITE_TRY(check_result(kOp, "dbeta", dbeta, gamma.element_type(), shape_of(gamma)));
  TensorWrapper tdz(dev), tx(dev), tmu(dev), trs(dev), tg(dev), tdx(dev), tdg(dev), tdb(dev);
  tdz.data(dz);
  tx.data(x);
  tmu.data_flat(mu);
  trs.data_flat(rsigma);
  tg.data(gamma);
  tdx.data(dx);
  tdg.data(dgamma);
  tdb.data(dbeta);
  return with_workspace(kOp, dev, [&](NVTETensor ws) {
    return nvte_layernorm_bwd(tdz.get(), tx.get(), tmu.get(), trs.get(), tg.get(), tdx.get(),
                              tdg.get(), tdb.get(), ws, 0, zero_centered_gamma, dev.stream);
  });
}

ffi::Error rmsnorm_fwd(const Device &dev, Buffer x, Buffer gamma, Buffer scale, Buffer z,
                       Buffer rsigma, Buffer amax, Buffer scale_inv, double eps,
                       bool zero_centered_gamma) {
  constexpr const char *kOp = "te_lite::rmsnorm_fwd";
  TE_LITE_TRY(check_norm_args(kOp, x, gamma, nullptr));
  TensorWrapper tz(dev);
  TE_LITE_TRY(wrap_z(kOp, x, scale, z, amax, scale_inv, tz));
  TE_LITE_TRY(check_stats(kOp, "rsigma", rsigma, x, true));
  TensorWrapper tx(dev), tg(dev), trs(dev);
  tx.data(x);
  tg.data(gamma);
  trs.data_flat(rsigma);
  return with_workspace(kOp, dev, [&](NVTETensor ws) {
    return nvte_rmsnorm_fwd(tx.get(), tg.get(), static_cast<float>(eps), tz.get(), trs.get(), ws,
                            0, zero_centered_gamma, dev.stream);
  });
}

ffi::Error rmsnorm_bwd(const Device &dev, Buffer dz, Buffer x, Buffer rsigma, Buffer gamma,
                       Buffer dx, Buffer dgamma, bool zero_centered_gamma) {
  constexpr const char *kOp = "te_lite::rmsnorm_bwd";
  TE_LITE_TRY(check_norm_args(kOp, x, gamma, nullptr));
  TE_LITE_TRY(check_dz(kOp, dz, x));
  TE_LITE_TRY(check_stats(kOp, "rsigma", rsigma, x, false));
  TE_LITE_TRY(check_result(kOp, "dx", dx, x.element_type(), shape_of(x)));
  TE_LITE_TRY(check_result(kOp, "dgamma", dgamma, gamma.element_type(), shape_of(gamma)));
  TensorWrapper tdz(dev), tx(dev), trs(dev), tg(dev), tdx(dev), tdg(dev);
  tdz.data(dz);
  tx.data(x);
  trs.data_flat(rsigma);
  tg.data(gamma);
  tdx.data(dx);
  tdg.data(dgamma);
  return with_workspace(kOp, dev, [&](NVTETensor ws) {
    return nvte_rmsnorm_bwd(tdz.get(), tx.get(), trs.get(), tg.get(), tdx.get(), tdg.get(), ws, 0,
                            zero_centered_gamma, dev.stream);
  });
}

}  // namespace

TE_LITE_FFI_HANDLERS(layernorm_fwd, layernorm_fwd,
                     .Arg<Buffer>()                      // x: [..., hidden], high precision
                     .Arg<Buffer>()                      // gamma: [hidden]
                     .Arg<Buffer>()                      // beta: [hidden], gamma's dtype
                     .Arg<Buffer>()                      // scale: float32 [1] for FP8 z, else [0]
                     .Ret<Buffer>()                      // z: x's shape, out_dtype
                     .Ret<Buffer>()                      // mu: float32 [rows]
                     .Ret<Buffer>()                      // rsigma: float32 [rows]
                     .Ret<Buffer>()                      // amax: float32 [1] for FP8 z, else [0]
                     .Ret<Buffer>()                      // scale_inv: as amax
                     .Attr<double>("eps")                // variance epsilon
                     .Attr<bool>("zero_centered_gamma")  // the weight applied is 1 + gamma
);

TE_LITE_FFI_HANDLERS(layernorm_bwd, layernorm_bwd,
                     .Arg<Buffer>()                      // dz: x's shape, high precision
                     .Arg<Buffer>()                      // x
                     .Arg<Buffer>()                      // mu: float32 [rows]
                     .Arg<Buffer>()                      // rsigma: float32 [rows]
                     .Arg<Buffer>()                      // gamma: [hidden]
                     .Ret<Buffer>()                      // dx: x's shape and dtype
                     .Ret<Buffer>()                      // dgamma: gamma's shape and dtype
                     .Ret<Buffer>()                      // dbeta: gamma's shape and dtype
                     .Attr<bool>("zero_centered_gamma")
);

TE_LITE_FFI_HANDLERS(rmsnorm_fwd, rmsnorm_fwd,
                     .Arg<Buffer>()                      // x: [..., hidden], high precision
                     .Arg<Buffer>()                      // gamma: [hidden]
                     .Arg<Buffer>()                      // scale: float32 [1] for FP8 z, else [0]
                     .Ret<Buffer>()                      // z: x's shape, out_dtype
                     .Ret<Buffer>()                      // rsigma: float32 [rows]
                     .Ret<Buffer>()                      // amax: float32 [1] for FP8 z, else [0]
                     .Ret<Buffer>()                      // scale_inv: as amax
                     .Attr<double>("eps")
                     .Attr<bool>("zero_centered_gamma")
);

TE_LITE_FFI_HANDLERS(rmsnorm_bwd, rmsnorm_bwd,
                     .Arg<Buffer>()                      // dz: x's shape, high precision
                     .Arg<Buffer>()                      // x
                     .Arg<Buffer>()                      // rsigma: float32 [rows]
                     .Arg<Buffer>()                      // gamma: [hidden]
                     .Ret<Buffer>()                      // dx: x's shape and dtype
                     .Ret<Buffer>()                      // dgamma: gamma's shape and dtype
                     .Attr<bool>("zero_centered_gamma")
);

}  // namespace te_lite
