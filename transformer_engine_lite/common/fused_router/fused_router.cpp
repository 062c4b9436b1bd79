// C API of the fused MoE router (fused_router.h): argument checks, device routing, CPU/GPU launch.
#include "transformer_engine_lite/fused_router.h"

#include <cmath>
#include <vector>

#include "../util/api.h"
#include "fused_router_cpu.h"
#ifdef NVTE_WITH_GPU
#include "fused_router_gpu.h"
#endif

namespace nvte {
namespace {

using Shape = std::vector<size_t>;

// num_tokens / num_experts / topk against each other; returns the params they fix.
RouterParams router_dims(int num_tokens, int num_experts, int topk) {
  NVTE_CHECK(num_tokens >= 0, "argument 'num_tokens': expected >= 0, got ", num_tokens);
  NVTE_CHECK(num_experts >= 1, "argument 'num_experts': expected >= 1, got ", num_experts);
  NVTE_CHECK(topk >= 1 && topk <= num_experts, "argument 'topk': expected 1 <= topk <= ",
             num_experts, " (num_experts), got ", topk);
  RouterParams p;
  p.tokens = static_cast<size_t>(num_tokens);
  p.experts = static_cast<size_t>(num_experts);
  p.topk = topk;
  return p;
}

ScoreFunction score_function_of(int score_function) {
  NVTE_CHECK(score_function >= 0 && score_function <= 2,
             "argument 'score_function': expected 0 (sigmoid), 1 (softmax) or 2 (sqrtsoftplus), "
             "got ", score_function);
  return static_cast<ScoreFunction>(score_function);
}

void check_scaling_factor(float scaling_factor) {
  NVTE_CHECK(std::isfinite(scaling_factor), "argument 'scaling_factor': expected a finite value, "
             "got ", scaling_factor);
}

// A [tokens, experts] matrix of one of `dtypes`.
void check_matrix(const Tensor &t, const char *arg, std::initializer_list<DType> dtypes,
                  const RouterParams &p) {
  check_dtype(t.data, arg, dtypes);
  check_shape(t.data, arg, Shape{p.tokens, p.experts});
}

void check_outputs_apart(std::initializer_list<std::pair<const Tensor *, const char *>> ins,
                         std::initializer_list<std::pair<const Tensor *, const char *>> outs) {
  for (auto o = outs.begin(); o != outs.end(); ++o) {
    for (const auto &i : ins) check_no_overlap(i.first->data, i.second, o->first->data, o->second);
    for (auto o2 = o + 1; o2 != outs.end(); ++o2) {
      check_no_overlap(o->first->data, o->second, o2->first->data, o2->second);
    }
  }
}

constexpr std::initializer_list<DType> kHp = {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16};

void topk_fwd(const char *op, const NVTETensor logits_h, int num_tokens, int num_experts, int topk,
              int use_pre_softmax, int num_groups, int group_topk, float scaling_factor,
              int score_function, const NVTETensor bias_h, NVTETensor probs_h, NVTETensor map_h,
              NVTETensor inter_h, NVTEStream stream) {
  const Tensor &logits = as_tensor(logits_h, "logits");
  const Tensor &probs = as_tensor(probs_h, "probs");
  const Tensor &map = as_tensor(map_h, "routing_map");
  const Tensor &inter = as_tensor(inter_h, "intermediate_output");
  const Tensor *bias = as_tensor_opt(bias_h);
  if (bias != nullptr && !bias->data.has_data() && bias->data.numel() != 0) bias = nullptr;
  RouterParams p = router_dims(num_tokens, num_experts, topk);
  p.score = score_function_of(score_function);
  p.pre_softmax = use_pre_softmax != 0 && p.score == ScoreFunction::kSoftmax;
  check_scaling_factor(scaling_factor);
  p.scaling_factor = scaling_factor;
  if (num_groups > 0 || group_topk > 0) {
    NVTE_CHECK(num_groups > 0 && group_topk > 0, "arguments 'num_groups' and 'group_topk': "
               "expected both > 0 (group-limited top-k) or both <= 0, got ", num_groups, " and ",
               group_topk);
    NVTE_CHECK(num_experts % num_groups == 0, "argument 'num_groups': expected a divisor of the ",
               num_experts, " experts, got ", num_groups);
    NVTE_CHECK(group_topk <= num_groups, "argument 'group_topk': expected <= num_groups (",
               num_groups, "), got ", group_topk);
    NVTE_CHECK(topk % group_topk == 0 && topk / group_topk <= num_experts / num_groups,
               "argument 'topk': expected a multiple of group_topk (", group_topk,
               ") of at most group_topk * group size (", group_topk * (num_experts / num_groups),
               "), got ", topk);
    p.num_groups = num_groups;
    p.group_topk = group_topk;
  }
  check_matrix(logits, "logits", kHp, p);
  check_matrix(probs, "probs", {logits.data.dtype}, p);
  check_matrix(map, "routing_map", {kNVTEByte}, p);
  check_matrix(inter, "intermediate_output", {kNVTEFloat32}, p);
  if (bias != nullptr) {
    NVTE_CHECK(p.score != ScoreFunction::kSoftmax, "argument 'expert_bias': expected none with "
               "score_function 1 (softmax; a bias only applies to sigmoid and sqrtsoftplus), got ",
               bias->data.describe());
    check_dtype(bias->data, "expert_bias", {kNVTEFloat32});
    check_shape(bias->data, "expert_bias", Shape{p.experts});
  }
  const NVTEDevice device = check_same_device({{&logits, "logits"}, {bias, "expert_bias"},
                                               {&probs, "probs"}, {&map, "routing_map"},
                                               {&inter, "intermediate_output"}});
  const bool gpu = use_gpu(device, op);
  const Tensor none;
  const Tensor &b = bias != nullptr ? *bias : none;
  check_outputs_apart({{&logits, "logits"}, {&b, "expert_bias"}},
                      {{&probs, "probs"}, {&map, "routing_map"}, {&inter, "intermediate_output"}});
  if (p.tokens == 0) return;
  for (const auto &t : {std::make_pair(&logits, "logits"), std::make_pair(&probs, "probs"),
                        std::make_pair(&map, "routing_map"),
                        std::make_pair(&inter, "intermediate_output")}) {
    check_has_data(*t.first, t.second);
  }
  if (bias != nullptr) {
    check_has_data(*bias, "expert_bias");
    p.expert_bias = bias->data.ptr<const float>();
  }
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_router_topk_fwd(p, logits.data.dtype, logits.data.dptr, probs.data.dptr,
                                map.data.ptr<uint8_t>(), inter.data.ptr<float>(), stream);
#endif
    return;
  }
  (void)stream;
  launch_router_topk_fwd(p, logits.data.dtype, logits.data.dptr, probs.data.dptr,
                         map.data.ptr<uint8_t>(), inter.data.ptr<float>());
}

void topk_bwd(const char *op, const NVTETensor map_h, const NVTETensor inter_h,
              const NVTETensor grad_h, int num_tokens, int num_experts, int topk,
              int use_pre_softmax, float scaling_factor, int score_function, NVTETensor dx_h,
              NVTEStream stream) {
  const Tensor &map = as_tensor(map_h, "routing_map");
  const Tensor &inter = as_tensor(inter_h, "intermediate_output");
  const Tensor &grad = as_tensor(grad_h, "grad_probs");
  const Tensor &dx = as_tensor(dx_h, "grad_logits");
  RouterParams p = router_dims(num_tokens, num_experts, topk);
  p.score = score_function_of(score_function);
  p.pre_softmax = use_pre_softmax != 0 && p.score == ScoreFunction::kSoftmax;
  check_scaling_factor(scaling_factor);
  p.scaling_factor = scaling_factor;
  check_matrix(map, "routing_map", {kNVTEByte}, p);
  check_matrix(inter, "intermediate_output", {kNVTEFloat32}, p);
  check_matrix(grad, "grad_probs", kHp, p);
  check_matrix(dx, "grad_logits", {grad.data.dtype}, p);
  const NVTEDevice device =
      check_same_device({{&map, "routing_map"}, {&inter, "intermediate_output"},
                         {&grad, "grad_probs"}, {&dx, "grad_logits"}});
  const bool gpu = use_gpu(device, op);
  check_outputs_apart({{&map, "routing_map"}, {&inter, "intermediate_output"},
                       {&grad, "grad_probs"}}, {{&dx, "grad_logits"}});
  if (p.tokens == 0) return;
  check_has_data(map, "routing_map");
  check_has_data(inter, "intermediate_output");
  check_has_data(grad, "grad_probs");
  check_has_data(dx, "grad_logits");
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_router_topk_bwd(p, grad.data.dtype, map.data.ptr<const uint8_t>(),
                                inter.data.ptr<const float>(), grad.data.dptr, dx.data.dptr,
                                stream);
#endif
    return;
  }
  (void)stream;
  launch_router_topk_bwd(p, grad.data.dtype, map.data.ptr<const uint8_t>(),
                         inter.data.ptr<const float>(), grad.data.dptr, dx.data.dptr);
}

void score_fwd(const char *op, const NVTETensor logits_h, int num_tokens, int num_experts,
               int topk, int score_function, NVTETensor scores_h, NVTETensor map_h,
               NVTETensor inter_h, NVTEStream stream) {
  const Tensor &logits = as_tensor(logits_h, "logits");
  const Tensor &scores = as_tensor(scores_h, "scores");
  const Tensor &map = as_tensor(map_h, "routing_map");
  const Tensor &inter = as_tensor(inter_h, "intermediate_output");
  RouterParams p = router_dims(num_tokens, num_experts, topk);
  p.score = score_function_of(score_function);
  check_matrix(logits, "logits", kHp, p);
  check_matrix(scores, "scores", {kNVTEFloat32}, p);
  check_matrix(map, "routing_map", {kNVTEByte}, p);
  check_matrix(inter, "intermediate_output", {kNVTEFloat32}, p);
  const NVTEDevice device =
      check_same_device({{&logits, "logits"}, {&scores, "scores"}, {&map, "routing_map"},
                         {&inter, "intermediate_output"}});
  const bool gpu = use_gpu(device, op);
  check_outputs_apart({{&logits, "logits"}}, {{&scores, "scores"}, {&map, "routing_map"},
                                              {&inter, "intermediate_output"}});
  if (p.tokens == 0) return;
  check_has_data(logits, "logits");
  check_has_data(scores, "scores");
  check_has_data(map, "routing_map");
  check_has_data(inter, "intermediate_output");
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_router_score_fwd(p, logits.data.dtype, logits.data.dptr, scores.data.ptr<float>(),
                                 map.data.ptr<uint8_t>(), inter.data.ptr<float>(), stream);
#endif
    return;
  }
  (void)stream;
  launch_router_score_fwd(p, logits.data.dtype, logits.data.dptr, scores.data.ptr<float>(),
                          map.data.ptr<uint8_t>(), inter.data.ptr<float>());
}

void score_bwd(const char *op, const NVTETensor inter_h, const NVTETensor grad_h, int num_tokens,
               int num_experts, int topk, int score_function, NVTETensor dx_h, NVTEStream stream) {
  const Tensor &inter = as_tensor(inter_h, "intermediate_output");
  const Tensor &grad = as_tensor(grad_h, "grad_scores");
  const Tensor &dx = as_tensor(dx_h, "grad_logits");
  RouterParams p = router_dims(num_tokens, num_experts, topk);
  p.score = score_function_of(score_function);
  check_matrix(inter, "intermediate_output", {kNVTEFloat32}, p);
  check_matrix(grad, "grad_scores", {kNVTEFloat32}, p);
  check_matrix(dx, "grad_logits", kHp, p);
  const NVTEDevice device = check_same_device(
      {{&inter, "intermediate_output"}, {&grad, "grad_scores"}, {&dx, "grad_logits"}});
  const bool gpu = use_gpu(device, op);
  check_outputs_apart({{&inter, "intermediate_output"}, {&grad, "grad_scores"}},
                      {{&dx, "grad_logits"}});
  if (p.tokens == 0) return;
  check_has_data(inter, "intermediate_output");
  check_has_data(grad, "grad_scores");
  check_has_data(dx, "grad_logits");
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_router_score_bwd(p, dx.data.dtype, inter.data.ptr<const float>(),
                                 grad.data.ptr<const float>(), dx.data.dptr, stream);
#endif
    return;
  }
  (void)stream;
  launch_router_score_bwd(p, dx.data.dtype, inter.data.ptr<const float>(),
                          grad.data.ptr<const float>(), dx.data.dptr);
}

// num_rows / num_cols against probs-like `t` and tokens_per_expert.
void check_aux_dims(int num_rows, int num_cols, const Tensor &t, const char *arg,
                    const Tensor &counts) {
  NVTE_CHECK(num_rows >= 0, "argument 'num_rows': expected >= 0, got ", num_rows);
  NVTE_CHECK(num_cols >= 1, "argument 'num_cols': expected >= 1, got ", num_cols);
  const size_t rows = static_cast<size_t>(num_rows), cols = static_cast<size_t>(num_cols);
  check_dtype(t.data, arg, kHp);
  check_shape(t.data, arg, Shape{rows, cols});
  check_dtype(counts.data, "tokens_per_expert",
              {kNVTEInt16, kNVTEInt32, kNVTEInt64, kNVTEFloat32, kNVTEBFloat16});
  check_shape(counts.data, "tokens_per_expert", Shape{cols});
}

void aux_fwd(const char *op, const NVTETensor probs_h, const NVTETensor counts_h,
             int total_num_tokens, int num_experts, int num_rows, int num_cols, int topk,
             float coeff, NVTETensor loss_h, NVTETensor cbuf_h, NVTEStream stream) {
  const Tensor &probs = as_tensor(probs_h, "probs");
  const Tensor &counts = as_tensor(counts_h, "tokens_per_expert");
  const Tensor &loss = as_tensor(loss_h, "aux_loss");
  const Tensor &cbuf = as_tensor(cbuf_h, "Const_buf");
  NVTE_CHECK(total_num_tokens >= 1, "argument 'total_num_tokens': expected >= 1, got ",
             total_num_tokens);
  NVTE_CHECK(num_experts >= 1, "argument 'num_experts': expected >= 1, got ", num_experts);
  NVTE_CHECK(topk >= 1, "argument 'topk': expected >= 1, got ", topk);
  NVTE_CHECK(std::isfinite(coeff), "argument 'coeff': expected a finite value, got ", coeff);
  check_aux_dims(num_rows, num_cols, probs, "probs", counts);
  NVTE_CHECK(num_cols % num_experts == 0, "argument 'num_cols': expected a multiple of "
             "num_experts (", num_experts, "), got ", num_cols);
  check_dtype(loss.data, "aux_loss", {probs.data.dtype});
  NVTE_CHECK(loss.data.numel() == 1, "argument 'aux_loss': expected one element, got ",
             loss.data.describe());
  check_fp32_scalar(cbuf.data, "Const_buf", "the coefficient buffer");
  const NVTEDevice device =
      check_same_device({{&probs, "probs"}, {&counts, "tokens_per_expert"},
                         {&loss, "aux_loss"}, {&cbuf, "Const_buf"}});
  const bool gpu = use_gpu(device, op);
  check_outputs_apart({{&probs, "probs"}, {&counts, "tokens_per_expert"}},
                      {{&loss, "aux_loss"}, {&cbuf, "Const_buf"}});
  check_has_data(loss, "aux_loss");
  const size_t rows = static_cast<size_t>(num_rows), cols = static_cast<size_t>(num_cols);
  if (rows > 0) check_has_data(probs, "probs");
  check_has_data(counts, "tokens_per_expert");
  // In double, then rounded once: total_num_tokens^2 overflows int past 46341 tokens.
  const double t = static_cast<double>(total_num_tokens);
  const float c = static_cast<float>(static_cast<double>(num_experts) * coeff / topk / t / t);
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_moe_aux_loss_fwd(rows, cols, c, probs.data.dtype, probs.data.dptr,
                                 counts.data.dtype, counts.data.dptr, loss.data.dptr,
                                 cbuf.data.ptr<float>(), stream);
#endif
    return;
  }
  (void)stream;
  launch_moe_aux_loss_fwd(rows, cols, c, probs.data.dtype, probs.data.dptr, counts.data.dtype,
                          counts.data.dptr, loss.data.dptr);
  *cbuf.data.ptr<float>() = c;
}

void aux_bwd(const char *op, const NVTETensor cbuf_h, const NVTETensor counts_h, int num_rows,
             int num_cols, const NVTETensor grad_h, NVTETensor dprobs_h, NVTEStream stream) {
  const Tensor &cbuf = as_tensor(cbuf_h, "Const_buf");
  const Tensor &counts = as_tensor(counts_h, "tokens_per_expert");
  const Tensor &grad = as_tensor(grad_h, "grad_aux_loss");
  const Tensor &dprobs = as_tensor(dprobs_h, "grad_probs");
  check_fp32_scalar(cbuf.data, "Const_buf", "the coefficient buffer");
  check_aux_dims(num_rows, num_cols, dprobs, "grad_probs", counts);
  check_dtype(grad.data, "grad_aux_loss", {dprobs.data.dtype});
  NVTE_CHECK(grad.data.numel() == 1, "argument 'grad_aux_loss': expected one element, got ",
             grad.data.describe());
  const NVTEDevice device =
      check_same_device({{&cbuf, "Const_buf"}, {&counts, "tokens_per_expert"},
                         {&grad, "grad_aux_loss"}, {&dprobs, "grad_probs"}});
  const bool gpu = use_gpu(device, op);
  check_outputs_apart({{&cbuf, "Const_buf"}, {&counts, "tokens_per_expert"},
                       {&grad, "grad_aux_loss"}}, {{&dprobs, "grad_probs"}});
  const size_t rows = static_cast<size_t>(num_rows), cols = static_cast<size_t>(num_cols);
  if (rows == 0) return;
  check_has_data(counts, "tokens_per_expert");
  check_has_data(grad, "grad_aux_loss");
  check_has_data(dprobs, "grad_probs");
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_moe_aux_loss_bwd(rows, cols, cbuf.data.ptr<const float>(), counts.data.dtype,
                                 counts.data.dptr, dprobs.data.dtype, grad.data.dptr,
                                 dprobs.data.dptr, stream);
#endif
    return;
  }
  (void)stream;
  launch_moe_aux_loss_bwd(rows, cols, *cbuf.data.ptr<const float>(), counts.data.dtype,
                          counts.data.dptr, dprobs.data.dtype, grad.data.dptr, dprobs.data.dptr);
}

}  // namespace
}  // namespace nvte

NVTEStatus nvte_fused_topk_with_score_function_forward(
    const NVTETensor logits, int num_tokens, int num_experts, int topk, int use_pre_softmax,
    int num_groups, int group_topk, float scaling_factor, int score_function,
    const NVTETensor expert_bias, NVTETensor probs, NVTETensor routing_map,
    NVTETensor intermediate_output, NVTEStream stream) {
  const char *op = "nvte_fused_topk_with_score_function_forward";
  return nvte::guarded(op, [&] {
    nvte::topk_fwd(op, logits, num_tokens, num_experts, topk, use_pre_softmax, num_groups,
                   group_topk, scaling_factor, score_function, expert_bias, probs, routing_map,
                   intermediate_output, stream);
  });
}

NVTEStatus nvte_fused_topk_with_score_function_backward(
    const NVTETensor routing_map, const NVTETensor intermediate_output,
    const NVTETensor grad_probs, int num_tokens, int num_experts, int topk, int use_pre_softmax,
    float scaling_factor, int score_function, NVTETensor grad_logits, NVTEStream stream) {
  const char *op = "nvte_fused_topk_with_score_function_backward";
  return nvte::guarded(op, [&] {
    nvte::topk_bwd(op, routing_map, intermediate_output, grad_probs, num_tokens, num_experts,
                   topk, use_pre_softmax, scaling_factor, score_function, grad_logits, stream);
  });
}

NVTEStatus nvte_fused_score_for_moe_aux_loss_forward(
    const NVTETensor logits, int num_tokens, int num_experts, int topk, int score_function,
    NVTETensor scores, NVTETensor routing_map, NVTETensor intermediate_output, NVTEStream stream) {
  const char *op = "nvte_fused_score_for_moe_aux_loss_forward";
  return nvte::guarded(op, [&] {
    nvte::score_fwd(op, logits, num_tokens, num_experts, topk, score_function, scores,
                    routing_map, intermediate_output, stream);
  });
}

NVTEStatus nvte_fused_score_for_moe_aux_loss_backward(
    const NVTETensor intermediate_output, const NVTETensor grad_scores, int num_tokens,
    int num_experts, int topk, int score_function, NVTETensor grad_logits, NVTEStream stream) {
  const char *op = "nvte_fused_score_for_moe_aux_loss_backward";
  return nvte::guarded(op, [&] {
    nvte::score_bwd(op, intermediate_output, grad_scores, num_tokens, num_experts, topk,
                    score_function, grad_logits, stream);
  });
}

NVTEStatus nvte_fused_moe_aux_loss_forward(const NVTETensor probs,
                                           const NVTETensor tokens_per_expert,
                                           int total_num_tokens, int num_experts, int num_rows,
                                           int num_cols, int topk, float coeff,
                                           NVTETensor aux_loss, NVTETensor Const_buf,
                                           NVTEStream stream) {
  const char *op = "nvte_fused_moe_aux_loss_forward";
  return nvte::guarded(op, [&] {
    nvte::aux_fwd(op, probs, tokens_per_expert, total_num_tokens, num_experts, num_rows, num_cols,
                  topk, coeff, aux_loss, Const_buf, stream);
  });
}

NVTEStatus nvte_fused_moe_aux_loss_backward(const NVTETensor Const_buf,
                                            const NVTETensor tokens_per_expert, int num_rows,
                                            int num_cols, const NVTETensor grad_aux_loss,
                                            NVTETensor grad_probs, NVTEStream stream) {
  const char *op = "nvte_fused_moe_aux_loss_backward";
  return nvte::guarded(op, [&] {
    nvte::aux_bwd(op, Const_buf, tokens_per_expert, num_rows, num_cols, grad_aux_loss,
                  grad_probs, stream);
  });
}
