// te_lite activation ops: one forward and one backward op over the core's parameterless
// activations, picked by name (gated ones take [..., 2H] = [a | b] and give [..., H] = act(a) * b),
// and clamped SwiGLU, which takes (limit, alpha).
#include <torch/library.h>

#include <string>

#include <transformer_engine_lite/activation.h>

#include "common.h"

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

const Activation &find_activation(const char *op, c10::string_view name) {
  for (const Activation &a : kActivations) {
    if (name == a.name) return a;
  }
  std::string names;
  for (const Activation &a : kActivations) names += std::string(names.empty() ? "" : ", ") + a.name;
  TORCH_CHECK(false, op, ": argument 'activation': expected one of {", names, "}, got '",
              std::string(name), "'");
}

// Forward of any activation: `run(in, out, stream)` calls the core.
template <typename Run>
std::tuple<at::Tensor, at::Tensor, at::Tensor> run_fwd(const char *op, bool gated,
                                                       const char *name, const at::Tensor &x_,
                                                       std::optional<at::ScalarType> out_dtype,
                                                       const std::optional<at::Tensor> &scale,
                                                       Run &&run) {
  check_dtype(op, "x", x_, kHighPrecision);
  if (gated) {
    check_min_ndim(op, "x", x_, 1);
    TORCH_CHECK(x_.size(-1) % 2 == 0, op, ": argument 'x': expected an even last dim for gated ",
                "activation '", name, "' ([..., 2H] = [a | b]), got shape ", x_.sizes());
  }
  const at::ScalarType out = output_dtype(op, x_, out_dtype, scale);
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  if (gated) shape.back() /= 2;
  at::Tensor y = at::empty(shape, x.options().dtype(out));
  at::Tensor amax = fp32_buffer(x, is_fp8(out)), scale_inv = fp32_buffer(x, is_fp8(out));
  TensorWrapper in, o;
  in.data(x);
  o.data(y);
  if (is_fp8(out)) o.scale(scale->contiguous()).amax(amax).scale_inv(scale_inv);
  check_nvte(run(in.get(), o.get(), ctx.stream()), op);
  return {y, amax, scale_inv};
}

// Backward of any activation: `run(grad, in, out, stream)` calls the core.
template <typename Run>
at::Tensor run_bwd(const char *op, bool gated, const char *name, const at::Tensor &grad_,
                   const at::Tensor &x_, Run &&run) {
  check_dtype(op, "x", x_, kHighPrecision);
  if (gated) {
    check_min_ndim(op, "x", x_, 1);
    TORCH_CHECK(x_.size(-1) % 2 == 0, op, ": argument 'x': expected an even last dim for gated ",
                "activation '", name, "' ([..., 2H] = [a | b]), got shape ", x_.sizes());
  }
  TORCH_CHECK(grad_.scalar_type() == x_.scalar_type(), op, ": argument 'grad': expected dtype ",
              dtype_name(x_.scalar_type()), " (that of x), got ", dtype_name(grad_.scalar_type()));
  std::vector<int64_t> shape(x_.sizes().begin(), x_.sizes().end());
  if (gated) shape.back() /= 2;
  TORCH_CHECK(grad_.sizes() == at::IntArrayRef(shape), op, ": argument 'grad': expected shape ",
              at::IntArrayRef(shape), gated ? " (x's with the last dim halved)" : " (x's)",
              ", got ", grad_.sizes());
  check_same_device(op, x_, "x", grad_, "grad");
  const DeviceContext ctx(x_);
  const at::Tensor grad = grad_.contiguous(), x = x_.contiguous();
  at::Tensor dx = at::empty(x.sizes(), x.options());
  TensorWrapper tg, tx, tdx;
  tg.data(grad);
  tx.data(x);
  tdx.data(dx);
  check_nvte(run(tg.get(), tx.get(), tdx.get(), ctx.stream()), op);
  return dx;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> activation_fwd(
    const at::Tensor &x, c10::string_view activation, std::optional<at::ScalarType> out_dtype,
    const std::optional<at::Tensor> &scale) {
  constexpr const char *kOp = "te_lite::activation_fwd";
  const Activation &act = find_activation(kOp, activation);
  return run_fwd(kOp, act.gated, act.name, x, out_dtype, scale,
                 [&](NVTETensor in, NVTETensor o, NVTEStream s) { return act.fwd(in, o, s); });
}

at::Tensor activation_bwd(const at::Tensor &grad, const at::Tensor &x,
                          c10::string_view activation) {
  constexpr const char *kOp = "te_lite::activation_bwd";
  const Activation &act = find_activation(kOp, activation);
  return run_bwd(kOp, act.gated, act.name, grad, x,
                 [&](NVTETensor g, NVTETensor in, NVTETensor o, NVTEStream s) {
                   return act.bwd(g, in, o, s);
                 });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> clamped_swiglu_fwd(
    const at::Tensor &x, double limit, double alpha, std::optional<at::ScalarType> out_dtype,
    const std::optional<at::Tensor> &scale, double glu_linear_offset) {
  const float l = static_cast<float>(limit), a = static_cast<float>(alpha);
  const float off = static_cast<float>(glu_linear_offset);
  return run_fwd("te_lite::clamped_swiglu_fwd", true, "clamped_swiglu", x, out_dtype, scale,
                 [&](NVTETensor in, NVTETensor o, NVTEStream s) {
                   return nvte_clamped_swiglu_v2(in, o, l, a, off, s);
                 });
}

at::Tensor clamped_swiglu_bwd(const at::Tensor &grad, const at::Tensor &x, double limit,
                              double alpha, double glu_linear_offset) {
  const float l = static_cast<float>(limit), a = static_cast<float>(alpha);
  const float off = static_cast<float>(glu_linear_offset);
  return run_bwd("te_lite::clamped_swiglu_bwd", true, "clamped_swiglu", grad, x,
                 [&](NVTETensor g, NVTETensor in, NVTETensor o, NVTEStream s) {
                   return nvte_clamped_dswiglu_v2(g, in, o, l, a, off, s);
                 });
}

void register_impls(torch::Library &m) {
  m.impl("activation_fwd", &activation_fwd);
  m.impl("activation_bwd", &activation_bwd);
  m.impl("clamped_swiglu_fwd", &clamped_swiglu_fwd);
  m.impl("clamped_swiglu_bwd", &clamped_swiglu_bwd);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
