// te_lite activation ops: one forward and one backward op over the ten core activations, picked by
// name (gated ones take [..., 2H] = [a | b] and give [..., H] = act(a) * b).
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

// x of a gated activation: last dim even (the two halves [a | b]).
void check_gated_input(const char *op, const Activation &act, const at::Tensor &x) {
  if (!act.gated) return;
  check_min_ndim(op, "x", x, 1);
  TORCH_CHECK(x.size(-1) % 2 == 0, op, ": argument 'x': expected an even last dim for gated ",
              "activation '", act.name, "' ([..., 2H] = [a | b]), got shape ", x.sizes());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> activation_fwd(
    const at::Tensor &x_, c10::string_view activation, std::optional<at::ScalarType> out_dtype,
    const std::optional<at::Tensor> &scale) {
  constexpr const char *kOp = "te_lite::activation_fwd";
  const Activation &act = find_activation(kOp, activation);
  check_dtype(kOp, "x", x_, kHighPrecision);
  check_gated_input(kOp, act, x_);
  const at::ScalarType out = output_dtype(kOp, x_, out_dtype, scale);
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  if (act.gated) shape.back() /= 2;
  at::Tensor y = at::empty(shape, x.options().dtype(out));
  at::Tensor amax = fp32_buffer(x, is_fp8(out)), scale_inv = fp32_buffer(x, is_fp8(out));
  TensorWrapper in, o;
  in.data(x);
  o.data(y);
  if (is_fp8(out)) o.scale(scale->contiguous()).amax(amax).scale_inv(scale_inv);
  check_nvte(act.fwd(in.get(), o.get(), ctx.stream()), kOp);
  return {y, amax, scale_inv};
}

at::Tensor activation_bwd(const at::Tensor &grad_, const at::Tensor &x_,
                          c10::string_view activation) {
  constexpr const char *kOp = "te_lite::activation_bwd";
  const Activation &act = find_activation(kOp, activation);
  check_dtype(kOp, "x", x_, kHighPrecision);
  check_gated_input(kOp, act, x_);
  TORCH_CHECK(grad_.scalar_type() == x_.scalar_type(), kOp, ": argument 'grad': expected dtype ",
              dtype_name(x_.scalar_type()), " (that of x), got ", dtype_name(grad_.scalar_type()));
  std::vector<int64_t> shape(x_.sizes().begin(), x_.sizes().end());
  if (act.gated) shape.back() /= 2;
  TORCH_CHECK(grad_.sizes() == at::IntArrayRef(shape), kOp, ": argument 'grad': expected shape ",
              at::IntArrayRef(shape), act.gated ? " (x's with the last dim halved)" : " (x's)",
              ", got ", grad_.sizes());
  check_same_device(kOp, x_, "x", grad_, "grad");
  const DeviceContext ctx(x_);
  const at::Tensor grad = grad_.contiguous(), x = x_.contiguous();
  at::Tensor dx = at::empty(x.sizes(), x.options());
  TensorWrapper tg, tx, tdx;
  tg.data(grad);
  tx.data(x);
  tdx.data(dx);
  check_nvte(act.bwd(tg.get(), tx.get(), tdx.get(), ctx.stream()), kOp);
  return dx;
}

void register_impls(torch::Library &m) {
  m.impl("activation_fwd", &activation_fwd);
  m.impl("activation_bwd", &activation_bwd);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
