// te_lite activation handlers (pytorch/csrc/activation.cpp's ops): one forward and one backward
// over the core's parameterless activations, picked by name (gated ones take [..., 2H] = [a | b]
// and give [..., H] = act(a) * b), and clamped SwiGLU, which takes (limit, alpha). The forward's
// out_dtype is y's dtype; an FP8 y takes `scale` and fills amax / scale_inv.
#include <string>

#include <transformer_engine_lite/activation.h>

#include "handler.h"

namespace te_lite {
namespace {

using ActFwd = NVTEStatus (*)(const NVTETensor, NVTETensor, NVTEStream);
using ActBwd = NVTEStatus (*)(const NVTETensor, const NVTETensor, NVTETensor, NVTEStream);

struct Activation {
  const char *name;
  ActFwd fwd;
  ActBwd bwd;
  bool gated;
};

constexpr Activation kActivations[] = {
    {"gelu", nvte_gelu, nvte_dgelu, false},       {"qgelu", nvte_qgelu, nvte_dqgelu, false},
    {"relu", nvte_relu, nvte_drelu, false},       {"srelu", nvte_srelu, nvte_dsrelu, false},
    {"silu", nvte_silu, nvte_dsilu, false},       {"geglu", nvte_geglu, nvte_dgeglu, true},
    {"qgeglu", nvte_qgeglu, nvte_dqgeglu, true},  {"reglu", nvte_reglu, nvte_dreglu, true},
    {"sreglu", nvte_sreglu, nvte_dsreglu, true},  {"swiglu", nvte_swiglu, nvte_dswiglu, true},
    {"glu", nvte_glu, nvte_dglu, true},
};

ffi::Error find_activation(const char *op, std::string_view name, const Activation **out) {
  for (const Activation &a : kActivations) {
    if (name == a.name) {
      *out = &a;
      return ffi::Error::Success();
    }
  }
  std::string names;
  for (const Activation &a : kActivations) names += std::string(names.empty() ? "" : ", ") + a.name;
  TE_LITE_CHECK(false, op, ": argument 'activation': expected one of {", names, "}, got '", name,
                "'");
}

// x's shape with the last dim halved for gated activations (their output, and grad's shape).
ffi::Error out_shape(const char *op, bool gated, const char *name, const Buffer &x, Shape *shape) {
  TE_LITE_TRY(check_dtype(op, "x", x, kHighPrecision));
  *shape = shape_of(x);
  if (gated) {
    TE_LITE_TRY(check_min_ndim(op, "x", x, 1));
    TE_LITE_CHECK(dim(x, -1) % 2 == 0, op, ": argument 'x': expected an even last dim for gated ",
                  "activation '", name, "' ([..., 2H] = [a | b]), got shape ", shape_str(x));
    shape->back() /= 2;
  }
  return ffi::Error::Success();
}

// Forward of any activation: `run(in, out, stream)` calls the core.
template <typename Run>
ffi::Error run_fwd(const char *op, bool gated, const char *name, const Device &dev,
                   const Buffer &x, const Buffer &scale, const Buffer &y, const Buffer &amax,
                   const Buffer &scale_inv, Run &&run) {
  Shape shape;
  TE_LITE_TRY(out_shape(op, gated, name, x, &shape));
  const DataType out = y.element_type();
  TE_LITE_TRY(check_output_dtype(op, out, scale));
  TE_LITE_TRY(check_result(op, "y", y, out, shape));
  TE_LITE_TRY(check_fp8_side_results(op, amax, scale_inv, is_fp8(out)));
  TensorWrapper in(dev), o(dev);
  in.data(x);
  o.data(y);
  if (is_fp8(out)) o.scale(scale).amax(amax).scale_inv(scale_inv);
  return check_nvte(op, run(in.get(), o.get(), dev.stream));
}

// Backward of any activation: `run(grad, in, out, stream)` calls the core.
template <typename Run>
ffi::Error run_bwd(const char *op, bool gated, const char *name, const Device &dev,
                   const Buffer &grad, const Buffer &x, const Buffer &dx, Run &&run) {
  Shape shape;
  TE_LITE_TRY(out_shape(op, gated, name, x, &shape));
  TE_LITE_CHECK(grad.element_type() == x.element_type(), op, ": argument 'grad': expected dtype ",
                dtype_name(x.element_type()), " (that of x), got ",
                dtype_name(grad.element_type()));
  TE_LITE_CHECK(shape_of(grad) == shape, op, ": argument 'grad': expected shape ",
                shape_str(shape), gated ? " (x's with the last dim halved)" : " (x's)", ", got ",
                shape_str(grad));
  TE_LITE_TRY(check_result(op, "dx", dx, x.element_type(), shape_of(x)));
  TensorWrapper tg(dev), tx(dev), tdx(dev);
  tg.data(grad);
  tx.data(x);
  tdx.data(dx);
  return check_nvte(op, run(tg.get(), tx.get(), tdx.get(), dev.stream));
}

ffi::Error activation_fwd(const Device &dev, Buffer x, Buffer scale, Buffer y, Buffer amax,
                          Buffer scale_inv, std::string_view activation) {
  constexpr const char *kOp = "te_lite::activation_fwd";
  const Activation *act = nullptr;
  TE_LITE_TRY(find_activation(kOp, activation, &act));
  return run_fwd(kOp, act->gated, act->name, dev, x, scale, y, amax, scale_inv,
                 [&](NVTETensor in, NVTETensor o, NVTEStream s) { return act->fwd(in, o, s); });
}

ffi::Error activation_bwd(const Device &dev, Buffer grad, Buffer x, Buffer dx,
                          std::string_view activation) {
  constexpr const char *kOp = "te_lite::activation_bwd";
  const Activation *act = nullptr;
  TE_LITE_TRY(find_activation(kOp, activation, &act));
  return run_bwd(kOp, act->gated, act->name, dev, grad, x, dx,
                 [&](NVTETensor g, NVTETensor in, NVTETensor o, NVTEStream s) {
                   return act->bwd(g, in, o, s);
                 });
}

ffi::Error clamped_swiglu_fwd(const Device &dev, Buffer x, Buffer scale, Buffer y, Buffer amax,
                              Buffer scale_inv, double limit, double alpha,
                              double glu_linear_offset) {
  const float l = static_cast<float>(limit), a = static_cast<float>(alpha);
  const float off = static_cast<float>(glu_linear_offset);
  return run_fwd("te_lite::clamped_swiglu_fwd", true, "clamped_swiglu", dev, x, scale, y, amax,
                 scale_inv, [&](NVTETensor in, NVTETensor o, NVTEStream s) {
                   return nvte_clamped_swiglu_v2(in, o, l, a, off, s);
                 });
}

ffi::Error clamped_swiglu_bwd(const Device &dev, Buffer grad, Buffer x, Buffer dx, double limit,
                              double alpha, double glu_linear_offset) {
  const float l = static_cast<float>(limit), a = static_cast<float>(alpha);
  const float off = static_cast<float>(glu_linear_offset);
  return run_bwd("te_lite::clamped_swiglu_bwd", true, "clamped_swiglu", dev, grad, x, dx,
                 [&](NVTETensor g, NVTETensor in, NVTETensor o, NVTEStream s) {
                   return nvte_clamped_dswiglu_v2(g, in, o, l, a, off, s);
                 });
}

}  // namespace

TE_LITE_FFI_HANDLERS(activation_fwd, activation_fwd,
                     .Arg<Buffer>()                         // x: [..., d] (gated: [..., 2H])
                     .Arg<Buffer>()                         // scale: float32 [1] (FP8 y) or [0]
                     .Ret<Buffer>()                         // y: out_dtype, x's shape (gated: H)
                     .Ret<Buffer>()                         // amax: float32 [1] for FP8 y, else [0]
                     .Ret<Buffer>()                         // scale_inv: as amax
                     .Attr<std::string_view>("activation")  // gelu, qgelu, relu, ..., glu
);

TE_LITE_FFI_HANDLERS(activation_bwd, activation_bwd,
                     .Arg<Buffer>()                         // grad: y's shape, x's dtype
                     .Arg<Buffer>()                         // x
                     .Ret<Buffer>()                         // dx: x's shape and dtype
                     .Attr<std::string_view>("activation")
);

TE_LITE_FFI_HANDLERS(clamped_swiglu_fwd, clamped_swiglu_fwd,
                     .Arg<Buffer>()          // x: [..., 2H]
                     .Arg<Buffer>()          // scale: float32 [1] for FP8 y, else [0]
                     .Ret<Buffer>()          // y: [..., H], out_dtype
                     .Ret<Buffer>()          // amax: float32 [1] for FP8 y, else [0]
                     .Ret<Buffer>()          // scale_inv: as amax
                     .Attr<double>("limit")  // a <= limit, |b| <= limit (> 0)
                     .Attr<double>("alpha")  // a * sigmoid(alpha * a)
                     .Attr<double>("glu_linear_offset")  // (clamped b) + glu_linear_offset
);

TE_LITE_FFI_HANDLERS(clamped_swiglu_bwd, clamped_swiglu_bwd,
                     .Arg<Buffer>()          // grad: [..., H], x's dtype
                     .Arg<Buffer>()          // x: [..., 2H]
                     .Ret<Buffer>()          // dx: x's shape and dtype
                     .Attr<double>("limit")
                     .Attr<double>("alpha")
                     .Attr<double>("glu_linear_offset")
);

}  // namespace te_lite
