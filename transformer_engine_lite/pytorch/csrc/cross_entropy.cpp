// te_lite cross entropy ops over cross_entropy.h: cross_entropy_row_stats, cross_entropy_fwd,
// cross_entropy_bwd. Logits may have any leading dims (flattened into rows, one per target).
#include <torch/library.h>

#include <transformer_engine_lite/cross_entropy.h>

#include "common.h"

namespace te_lite {
namespace {

constexpr int64_t kNumStats = 4;  // cross_entropy.h: {max, sum exp, target logit, sum}

// [rows, V] view of logits ([..., V], at least 1-D) and the flat targets, one per row.
std::pair<at::Tensor, at::Tensor> as_rows(const char *op, const at::Tensor &logits,
                                          const at::Tensor &target) {
  check_dtype(op, "logits", logits, kHighPrecision);
  check_min_ndim(op, "logits", logits, 1);
  check_dtype(op, "target", target, {at::kInt, at::kLong});
  check_same_device(op, logits, "logits", target, "target");
  const int64_t vocab = logits.size(-1);
  TORCH_CHECK(vocab >= 1, op, ": argument 'logits': expected a vocab dim (the last) >= 1, got ",
              logits.sizes());
  const int64_t rows = logits.numel() / vocab;
  TORCH_CHECK(target.numel() == rows, op, ": argument 'target': expected ", rows,
              " elements (one per row of logits ", logits.sizes(), "), got ", target.sizes());
  return {logits.contiguous().view({rows, vocab}), target.contiguous().view({rows})};
}

int as_int(const char *op, const char *arg, int64_t v) {
  TORCH_CHECK(v >= INT32_MIN && v <= INT32_MAX, op, ": argument '", arg, "': ", v,
              " does not fit the C API's int");
  return static_cast<int>(v);
}

at::Tensor row_stats(const at::Tensor &logits_, const at::Tensor &target_, int64_t rank,
                     int64_t world_size, int64_t ignore_idx) {
  const char *op = "te_lite::cross_entropy_row_stats";
  const auto [logits, target] = as_rows(op, logits_, target_);
  const DeviceContext ctx(logits);
  at::Tensor stats = at::empty({logits.size(0), kNumStats}, logits.options().dtype(at::kFloat));
  TensorWrapper tl, tt, ts;
  tl.data(logits);
  tt.data(target);
  ts.data(stats);
  check_nvte(nvte_cross_entropy_row_stats(tl.get(), tt.get(), as_int(op, "rank", rank),
                                          as_int(op, "world_size", world_size), ignore_idx,
                                          ts.get(), ctx.stream()),
             op);
  return stats;
}

std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor &logits_, const at::Tensor &target_,
                                           const at::Tensor &stats_, int64_t rank,
                                           int64_t ignore_idx, double label_smoothing,
                                           bool reduce_loss) {
  const char *op = "te_lite::cross_entropy_fwd";
  const auto [logits, target] = as_rows(op, logits_, target_);
  check_dtype(op, "stats", stats_, {at::kFloat});
  check_same_device(op, logits, "logits", stats_, "stats");
  const DeviceContext ctx(logits);
  // stats: [rows, 4] (one rank) or [world_size, rows, 4] (gathered).
  const at::Tensor stats = stats_.dim() == 2 ? stats_.contiguous().unsqueeze(0)
                                             : stats_.contiguous();
  at::Tensor loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  at::Tensor grad = at::empty(logits.sizes(), logits.options());
  TensorWrapper tl, tt, ts, tlo, tg;
  tl.data(logits);
  tt.data(target);
  ts.data(stats);
  tlo.data(loss);
  tg.data(grad);
  check_nvte(nvte_cross_entropy_forward(tl.get(), tt.get(), ts.get(), as_int(op, "rank", rank),
                                        ignore_idx, static_cast<float>(label_smoothing),
                                        reduce_loss, tlo.get(), tg.get(), ctx.stream()),
             op);
  return {loss.view(target_.sizes()), grad.view(logits_.sizes())};
}

at::Tensor backward(const at::Tensor &grad_, const at::Tensor &grad_output_) {
  const char *op = "te_lite::cross_entropy_bwd";
  check_dtype(op, "grad", grad_, kHighPrecision);
  check_min_ndim(op, "grad", grad_, 1);
  check_dtype(op, "grad_output", grad_output_, {at::kFloat});
  check_same_device(op, grad_, "grad", grad_output_, "grad_output");
  const DeviceContext ctx(grad_);
  const int64_t vocab = grad_.size(-1);
  const int64_t rows = vocab == 0 ? 0 : grad_.numel() / vocab;
  const at::Tensor grad = grad_.contiguous().view({rows, vocab});
  const at::Tensor go = grad_output_.contiguous().view({-1});
  at::Tensor dx = at::empty(grad.sizes(), grad.options());
  TensorWrapper tg, tgo, td;
  tg.data(grad);
  tgo.data(go);
  td.data(dx);
  check_nvte(nvte_cross_entropy_backward(tg.get(), tgo.get(), td.get(), ctx.stream()), op);
  return dx.view(grad_.sizes());
}

void register_impls(torch::Library &m) {
  m.impl("cross_entropy_row_stats", &row_stats);
  m.impl("cross_entropy_fwd", &forward);
  m.impl("cross_entropy_bwd", &backward);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
