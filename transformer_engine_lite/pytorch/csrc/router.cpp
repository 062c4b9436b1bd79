// te_lite fused MoE router ops (TE's tex names): fused_topk_with_score_function_fwd/bwd,
// fused_score_for_moe_aux_loss_fwd/bwd, fused_moe_aux_loss_fwd/bwd, over the nvte_fused_* calls of
// fused_router.h. Logits may have any leading dims (flattened into tokens); routing maps are bool.
#include <torch/library.h>

#include <transformer_engine_lite/fused_router.h>

#include "common.h"

namespace te_lite {
namespace {

inline constexpr at::ScalarType kCountTypes[] = {at::kShort, at::kInt, at::kLong, at::kFloat,
                                                 at::kBFloat16};

// Ints of the C API (num_tokens, num_experts): torch sizes past INT_MAX are refused here.
int as_int(const char *op, const char *what, int64_t v) {
  TORCH_CHECK(v >= 0 && v <= INT32_MAX, op, ": ", what, " = ", v, " does not fit the C API's int");
  return static_cast<int>(v);
}

// [tokens, experts] view of a contiguous tensor with at least one dim.
at::Tensor as_rows(const char *op, const char *arg, const at::Tensor &t) {
  check_min_ndim(op, arg, t, 1);
  const int64_t experts = t.size(-1);
  const int64_t tokens = experts == 0 ? 0 : t.numel() / experts;
  return t.contiguous().view({tokens, experts});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> topk_fwd(
    const at::Tensor &logits_, int64_t topk, bool use_pre_softmax, int64_t num_groups,
    int64_t group_topk, double scaling_factor, int64_t score_function,
    const std::optional<at::Tensor> &expert_bias_) {
  const char *op = "te_lite::fused_topk_with_score_function_fwd";
  check_dtype(op, "logits", logits_, kHighPrecision);
  if (expert_bias_.has_value()) {
    check_same_device(op, logits_, "logits", *expert_bias_, "expert_bias");
  }
  const DeviceContext ctx(logits_);
  const at::Tensor logits = as_rows(op, "logits", logits_);
  const std::optional<at::Tensor> bias =
      expert_bias_.has_value() ? std::optional<at::Tensor>(expert_bias_->contiguous())
                               : std::nullopt;
  at::Tensor probs = at::empty(logits.sizes(), logits.options());
  at::Tensor map = at::empty(logits.sizes(), logits.options().dtype(at::kBool));
  at::Tensor inter = at::empty(logits.sizes(), logits.options().dtype(at::kFloat));
  TensorWrapper tl, tp, tm, ti, tb;
  tl.data(logits);
  tp.data(probs);
  tm.data(map);
  ti.data(inter);
  if (bias.has_value()) tb.data(*bias);
  check_nvte(nvte_fused_topk_with_score_function_forward(
                 tl.get(), as_int(op, "tokens", logits.size(0)),
                 as_int(op, "experts", logits.size(1)), static_cast<int>(topk), use_pre_softmax,
                 static_cast<int>(num_groups), static_cast<int>(group_topk),
                 static_cast<float>(scaling_factor), static_cast<int>(score_function),
                 bias.has_value() ? tb.get() : nullptr, tp.get(), tm.get(), ti.get(), ctx.stream()),
             op);
  const auto shape = logits_.sizes();
  return {probs.view(shape), map.view(shape), inter.view(shape)};
}

at::Tensor topk_bwd(const at::Tensor &map_, const at::Tensor &inter_, const at::Tensor &grad_,
                    int64_t topk, bool use_pre_softmax, double scaling_factor,
                    int64_t score_function) {
  const char *op = "te_lite::fused_topk_with_score_function_bwd";
  check_dtype(op, "grad_probs", grad_, kHighPrecision);
  check_same_device(op, grad_, "grad_probs", map_, "routing_map");
  check_same_device(op, grad_, "grad_probs", inter_, "intermediate_output");
  const DeviceContext ctx(grad_);
  const at::Tensor grad = as_rows(op, "grad_probs", grad_);
  const at::Tensor map = as_rows(op, "routing_map", map_);
  const at::Tensor inter = as_rows(op, "intermediate_output", inter_);
  at::Tensor dx = at::empty(grad.sizes(), grad.options());
  TensorWrapper tm, ti, tg, td;
  tm.data(map);
  ti.data(inter);
  tg.data(grad);
  td.data(dx);
  check_nvte(nvte_fused_topk_with_score_function_backward(
                 tm.get(), ti.get(), tg.get(), as_int(op, "tokens", grad.size(0)),
                 as_int(op, "experts", grad.size(1)), static_cast<int>(topk), use_pre_softmax,
                 static_cast<float>(scaling_factor), static_cast<int>(score_function), td.get(),
                 ctx.stream()),
             op);
  return dx.view(grad_.sizes());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> score_fwd(const at::Tensor &logits_, int64_t topk,
                                                         int64_t score_function) {
  const char *op = "te_lite::fused_score_for_moe_aux_loss_fwd";
  check_dtype(op, "logits", logits_, kHighPrecision);
  const DeviceContext ctx(logits_);
  const at::Tensor logits = as_rows(op, "logits", logits_);
  at::Tensor scores = at::empty(logits.sizes(), logits.options().dtype(at::kFloat));
  at::Tensor map = at::empty(logits.sizes(), logits.options().dtype(at::kBool));
  at::Tensor inter = at::empty(logits.sizes(), logits.options().dtype(at::kFloat));
  TensorWrapper tl, ts, tm, ti;
  tl.data(logits);
  ts.data(scores);
  tm.data(map);
  ti.data(inter);
  check_nvte(nvte_fused_score_for_moe_aux_loss_forward(
                 tl.get(), as_int(op, "tokens", logits.size(0)),
                 as_int(op, "experts", logits.size(1)), static_cast<int>(topk),
                 static_cast<int>(score_function), ts.get(), tm.get(), ti.get(), ctx.stream()),
             op);
  const auto shape = logits_.sizes();
  return {scores.view(shape), map.view(shape), inter.view(shape)};
}

at::Tensor score_bwd(const at::Tensor &inter_, const at::Tensor &grad_, int64_t topk,
                     int64_t score_function, at::ScalarType logits_dtype) {
  const char *op = "te_lite::fused_score_for_moe_aux_loss_bwd";
  check_dtype(op, "grad_scores", grad_, {at::kFloat});
  check_dtype(op, "logits_dtype", logits_dtype, kHighPrecision);
  check_same_device(op, grad_, "grad_scores", inter_, "intermediate_output");
  const DeviceContext ctx(grad_);
  const at::Tensor grad = as_rows(op, "grad_scores", grad_);
  const at::Tensor inter = as_rows(op, "intermediate_output", inter_);
  at::Tensor dx = at::empty(grad.sizes(), grad.options().dtype(logits_dtype));
  TensorWrapper ti, tg, td;
  ti.data(inter);
  tg.data(grad);
  td.data(dx);
  check_nvte(nvte_fused_score_for_moe_aux_loss_backward(
                 ti.get(), tg.get(), as_int(op, "tokens", grad.size(0)),
                 as_int(op, "experts", grad.size(1)), static_cast<int>(topk),
                 static_cast<int>(score_function), td.get(), ctx.stream()),
             op);
  return dx.view(grad_.sizes());
}

std::tuple<at::Tensor, at::Tensor> aux_fwd(const at::Tensor &probs_, const at::Tensor &counts_,
                                           int64_t total_num_tokens, int64_t num_experts,
                                           int64_t topk, double coeff) {
  const char *op = "te_lite::fused_moe_aux_loss_fwd";
  check_dtype(op, "probs", probs_, kHighPrecision);
  check_dtype(op, "tokens_per_expert", counts_, kCountTypes);
  check_ndim(op, "probs", probs_, 2);
  check_same_device(op, probs_, "probs", counts_, "tokens_per_expert");
  TORCH_CHECK(total_num_tokens >= 1 && total_num_tokens <= INT32_MAX, op,
              ": argument 'total_num_tokens': expected 1 <= total_num_tokens <= 2^31 - 1, got ",
              total_num_tokens);
  const DeviceContext ctx(probs_);
  const at::Tensor probs = probs_.contiguous(), counts = counts_.contiguous();
  at::Tensor loss = at::empty({}, probs.options());
  at::Tensor cbuf = at::empty({1}, probs.options().dtype(at::kFloat));
  TensorWrapper tp, tc, tl, tb;
  tp.data(probs);
  tc.data(counts);
  tl.data(loss);
  tb.data(cbuf);
  check_nvte(nvte_fused_moe_aux_loss_forward(
                 tp.get(), tc.get(), static_cast<int>(total_num_tokens),
                 static_cast<int>(num_experts), as_int(op, "num_rows", probs.size(0)),
                 as_int(op, "num_cols", probs.size(1)), static_cast<int>(topk),
                 static_cast<float>(coeff), tl.get(), tb.get(), ctx.stream()),
             op);
  return {loss, cbuf};
}

at::Tensor aux_bwd(const at::Tensor &cbuf_, const at::Tensor &counts_, const at::Tensor &grad_,
                   int64_t num_rows, int64_t num_cols) {
  const char *op = "te_lite::fused_moe_aux_loss_bwd";
  check_dtype(op, "grad_aux_loss", grad_, kHighPrecision);
  check_fp32_scalar(op, "Const_buf", cbuf_);
  check_same_device(op, grad_, "grad_aux_loss", cbuf_, "Const_buf");
  check_same_device(op, grad_, "grad_aux_loss", counts_, "tokens_per_expert");
  const DeviceContext ctx(grad_);
  const at::Tensor cbuf = cbuf_.contiguous(), counts = counts_.contiguous(),
                   grad = grad_.contiguous();
  at::Tensor dprobs = at::empty({num_rows, num_cols}, grad.options());
  TensorWrapper tb, tc, tg, td;
  tb.data(cbuf);
  tc.data(counts);
  tg.data(grad);
  td.data(dprobs);
  check_nvte(nvte_fused_moe_aux_loss_backward(tb.get(), tc.get(), as_int(op, "num_rows", num_rows),
                                              as_int(op, "num_cols", num_cols), tg.get(),
                                              td.get(), ctx.stream()),
             op);
  return dprobs;
}

void register_impls(torch::Library &m) {
  m.impl("fused_topk_with_score_function_fwd", &topk_fwd);
  m.impl("fused_topk_with_score_function_bwd", &topk_bwd);
  m.impl("fused_score_for_moe_aux_loss_fwd", &score_fwd);
  m.impl("fused_score_for_moe_aux_loss_bwd", &score_bwd);
  m.impl("fused_moe_aux_loss_fwd", &aux_fwd);
  m.impl("fused_moe_aux_loss_bwd", &aux_bwd);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
