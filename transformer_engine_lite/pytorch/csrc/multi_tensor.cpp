// te_lite multi-tensor ops (TE's tex names): multi_tensor_scale, multi_tensor_l2norm,
// multi_tensor_unscale_l2norm, multi_tensor_adam (+ _param_remainder, _fp8, _capturable,
// _capturable_master), multi_tensor_sgd, multi_tensor_compute_scale_and_scale_inv, over the
// nvte_multi_tensor_* calls of multi_tensor.h. TE's list of lists is passed as one Tensor[] per
// list (an empty list = absent); tensors are updated in place and must be contiguous.
#include <torch/library.h>

#include <transformer_engine_lite/multi_tensor.h>

#include "common.h"

namespace te_lite {
namespace {

// NVTETensor handles of the lists (kept alive with their wrappers) for tensor_lists.
class Lists {
 public:
  Lists(const char *op, std::initializer_list<std::pair<const char *, const at::TensorList>> lists,
        const at::Tensor &noop)
      : wrappers_(lists.size()), handles_(lists.size()) {
    for (const auto &[name, list] : lists) {
      TORCH_CHECK(list.size() == lists.begin()->second.size(), op, ": argument '", name,
                  "': expected ", lists.begin()->second.size(), " tensors (as '",
                  lists.begin()->first, "'), got ", list.size());
    }
    size_t i = 0;
    for (const auto &[name, list] : lists) {
      wrappers_[i].reserve(list.size());
      for (size_t j = 0; j < list.size(); ++j) {
        const at::Tensor &t = list[j];
        TORCH_CHECK(t.is_contiguous(), op, ": argument '", name, "[", j,
                    "]': expected a contiguous tensor, got strides ", t.strides());
        check_same_device(op, noop, "noop_flag", t, name);
        wrappers_[i].emplace_back();
        wrappers_[i].back().data(t);
        handles_[i].push_back(wrappers_[i].back().get());
      }
      ++i;
    }
    for (auto &h : handles_) ptrs_.push_back(h.data());
  }
  NVTETensor **get() { return ptrs_.data(); }
  size_t lists() const { return handles_.size(); }
  size_t per_list() const { return handles_.empty() ? 0 : handles_[0].size(); }

 private:
  std::vector<std::vector<TensorWrapper>> wrappers_;
  std::vector<std::vector<NVTETensor>> handles_;
  std::vector<NVTETensor *> ptrs_;
};

NVTETensor wrap(TensorWrapper &w, const at::Tensor &t) { return w.data(t.contiguous()).get(); }

int as_chunk(const char *op, int64_t chunk_size) {
  TORCH_CHECK(chunk_size > 0 && chunk_size <= INT32_MAX, op,
              ": argument 'chunk_size': expected in [1, 2^31), got ", chunk_size);
  return static_cast<int>(chunk_size);
}

void scale(int64_t chunk_size, const at::Tensor &noop, at::TensorList in, at::TensorList out,
           double s) {
  const char *op = "te_lite::multi_tensor_scale";
  const DeviceContext ctx(noop);
  Lists l(op, {{"inputs", in}, {"outputs", out}}, noop);
  TensorWrapper tn;
  check_nvte(nvte_multi_tensor_scale_cuda(as_chunk(op, chunk_size), wrap(tn, noop), l.get(),
                                          l.lists(), l.per_list(), static_cast<float>(s),
                                          ctx.stream()),
             op);
}

std::tuple<at::Tensor, at::Tensor> l2norm_impl(const char *op, int64_t chunk_size,
                                               const at::Tensor &noop, at::TensorList xs,
                                               const std::optional<at::Tensor> &inv_scale,
                                               bool per_tensor) {
  const DeviceContext ctx(noop);
  Lists l(op, {{"tensors", xs}}, noop);
  const int chunk = as_chunk(op, chunk_size);
  int64_t max_chunks = 1;
  for (const at::Tensor &t : xs) max_chunks = std::max(max_chunks, (t.numel() + chunk - 1) / chunk);
  const auto f32 = noop.options().dtype(at::kFloat);
  const int64_t n = static_cast<int64_t>(xs.size());
  at::Tensor output = at::empty({1}, f32), partials = at::empty({n * max_chunks}, f32);
  at::Tensor ret = at::empty({1}, f32), ret_per = at::empty({per_tensor ? n : 0}, f32);
  TensorWrapper tn, to, tp, tr, trp, ti;
  const NVTEStatus st =
      inv_scale.has_value()
          ? nvte_multi_tensor_unscale_l2norm_cuda(
                chunk, wrap(tn, noop), l.get(), l.lists(), l.per_list(), wrap(to, output),
                wrap(tp, partials), wrap(tr, ret), wrap(trp, ret_per), wrap(ti, *inv_scale),
                per_tensor, static_cast<int>(max_chunks), ctx.stream())
          : nvte_multi_tensor_l2norm_cuda(chunk, wrap(tn, noop), l.get(), l.lists(), l.per_list(),
                                          wrap(to, output), wrap(tp, partials), wrap(tr, ret),
                                          wrap(trp, ret_per), per_tensor,
                                          static_cast<int>(max_chunks), ctx.stream());
  check_nvte(st, op);
  return {ret, ret_per};
}

std::tuple<at::Tensor, at::Tensor> l2norm(int64_t chunk_size, const at::Tensor &noop,
                                          at::TensorList xs, bool per_tensor) {
  return l2norm_impl("te_lite::multi_tensor_l2norm", chunk_size, noop, xs, std::nullopt,
                     per_tensor);
}

std::tuple<at::Tensor, at::Tensor> unscale_l2norm(int64_t chunk_size, const at::Tensor &noop,
                                                  at::TensorList xs, const at::Tensor &inv_scale,
                                                  bool per_tensor) {
  const char *op = "te_lite::multi_tensor_unscale_l2norm";
  check_fp32_scalar(op, "inv_scale", inv_scale);
  check_same_device(op, noop, "noop_flag", inv_scale, "inv_scale");
  return l2norm_impl(op, chunk_size, noop, xs, inv_scale, per_tensor);
}

void adam(int64_t chunk_size, const at::Tensor &noop, at::TensorList g, at::TensorList p,
          at::TensorList m, at::TensorList v, at::TensorList master, double lr, double beta1,
          double beta2, double eps, int64_t step, int64_t mode, int64_t bias_correction,
          double weight_decay) {
  const char *op = "te_lite::multi_tensor_adam";
  const DeviceContext ctx(noop);
  const bool with_master = !master.empty();
  Lists l = with_master ? Lists(op, {{"grads", g}, {"params", p}, {"exp_avgs", m},
                                     {"exp_avg_sqs", v}, {"master_params", master}}, noop)
                        : Lists(op, {{"grads", g}, {"params", p}, {"exp_avgs", m},
                                     {"exp_avg_sqs", v}}, noop);
  TensorWrapper tn;
  check_nvte(nvte_multi_tensor_adam_cuda(as_chunk(op, chunk_size), wrap(tn, noop), l.get(),
                                         l.lists(), l.per_list(), float(lr), float(beta1),
                                         float(beta2), float(eps), int(step), int(mode),
                                         int(bias_correction), float(weight_decay), ctx.stream()),
             op);
}

void adam_param_remainder(int64_t chunk_size, const at::Tensor &noop, at::TensorList g,
                          at::TensorList p, at::TensorList m, at::TensorList v,
                          at::TensorList remainders, double lr, double beta1, double beta2,
                          double eps, int64_t step, int64_t mode, int64_t bias_correction,
                          double weight_decay) {
  const char *op = "te_lite::multi_tensor_adam_param_remainder";
  const DeviceContext ctx(noop);
  Lists l(op, {{"grads", g}, {"params", p}, {"exp_avgs", m}, {"exp_avg_sqs", v},
               {"param_remainders", remainders}}, noop);
  TensorWrapper tn;
  check_nvte(nvte_multi_tensor_adam_param_remainder_cuda(
                 as_chunk(op, chunk_size), wrap(tn, noop), l.get(), l.lists(), l.per_list(),
                 float(lr), float(beta1), float(beta2), float(eps), int(step), int(mode),
                 int(bias_correction), float(weight_decay), ctx.stream()),
             op);
}

void adam_fp8(int64_t chunk_size, const at::Tensor &noop, at::TensorList g, at::TensorList p,
              at::TensorList m, at::TensorList v, at::TensorList master, at::TensorList scales,
              at::TensorList amaxes, at::TensorList scale_invs, double lr, double beta1,
              double beta2, double eps, int64_t step, int64_t mode, int64_t bias_correction,
              double weight_decay, at::ScalarType fp8_dtype) {
  const char *op = "te_lite::multi_tensor_adam_fp8";
  check_dtype(op, "fp8_dtype", fp8_dtype, kFP8);
  const DeviceContext ctx(noop);
  Lists l(op, {{"grads", g}, {"params", p}, {"exp_avgs", m}, {"exp_avg_sqs", v},
               {"master_params", master}, {"scales", scales}, {"amaxes", amaxes},
               {"scale_invs", scale_invs}}, noop);
  TensorWrapper tn;
  check_nvte(nvte_multi_tensor_adam_fp8_cuda(
                 as_chunk(op, chunk_size), wrap(tn, noop), l.get(), l.lists(), l.per_list(),
                 float(lr), float(beta1), float(beta2), float(eps), int(step), int(mode),
                 int(bias_correction), float(weight_decay), *nvte_dtype_of(fp8_dtype),
                 ctx.stream()),
             op);
}

void adam_capturable(int64_t chunk_size, const at::Tensor &noop, at::TensorList g,
                     at::TensorList p, at::TensorList m, at::TensorList v, at::TensorList master,
                     const at::Tensor &lr, double beta1, double beta2, double eps,
                     const at::Tensor &step, int64_t mode, int64_t bias_correction,
                     double weight_decay, const at::Tensor &inv_scale) {
  const char *op = "te_lite::multi_tensor_adam_capturable";
  const DeviceContext ctx(noop);
  const bool with_master = !master.empty();
  Lists l = with_master ? Lists(op, {{"grads", g}, {"params", p}, {"exp_avgs", m},
                                     {"exp_avg_sqs", v}, {"master_params", master}}, noop)
                        : Lists(op, {{"grads", g}, {"params", p}, {"exp_avgs", m},
                                     {"exp_avg_sqs", v}}, noop);
  TensorWrapper tn, tl, ts, ti;
  auto fn = with_master ? nvte_multi_tensor_adam_capturable_master_cuda
                        : nvte_multi_tensor_adam_capturable_cuda;
  check_nvte(fn(as_chunk(op, chunk_size), wrap(tn, noop), l.get(), l.lists(), l.per_list(),
                wrap(tl, lr), float(beta1), float(beta2), float(eps), wrap(ts, step), int(mode),
                int(bias_correction), float(weight_decay), wrap(ti, inv_scale), ctx.stream()),
             op);
}

void sgd(int64_t chunk_size, const at::Tensor &noop, at::TensorList g, at::TensorList w,
         at::TensorList mom, at::TensorList model_weights, double wd, double momentum,
         double dampening, double lr, bool nesterov, bool first_run, bool wd_after_momentum,
         double scale) {
  const char *op = "te_lite::multi_tensor_sgd";
  const DeviceContext ctx(noop);
  Lists l = model_weights.empty()
                ? Lists(op, {{"grads", g}, {"weights", w}, {"momentum_buffers", mom}}, noop)
                : Lists(op, {{"grads", g}, {"weights", w}, {"momentum_buffers", mom},
                             {"model_weights", model_weights}}, noop);
  TensorWrapper tn;
  check_nvte(nvte_multi_tensor_sgd_cuda(as_chunk(op, chunk_size), wrap(tn, noop), l.get(),
                                        l.lists(), l.per_list(), float(wd), float(momentum),
                                        float(dampening), float(lr), nesterov, first_run,
                                        wd_after_momentum, float(scale), ctx.stream()),
             op);
}

void compute_scale(int64_t chunk_size, const at::Tensor &noop, at::TensorList amaxes,
                   at::TensorList scales, at::TensorList scale_invs, double max_fp8,
                   bool force_pow_2_scales, double epsilon) {
  const char *op = "te_lite::multi_tensor_compute_scale_and_scale_inv";
  const DeviceContext ctx(noop);
  Lists l(op, {{"amaxes", amaxes}, {"scales", scales}, {"scale_invs", scale_invs}}, noop);
  TensorWrapper tn;
  check_nvte(nvte_multi_tensor_compute_scale_and_scale_inv_cuda(
                 as_chunk(op, chunk_size), wrap(tn, noop), l.get(), l.lists(), l.per_list(),
                 float(max_fp8), force_pow_2_scales, float(epsilon), ctx.stream()),
             op);
}

void register_impls(torch::Library &m) {
  m.impl("multi_tensor_scale", &scale);
  m.impl("multi_tensor_l2norm", &l2norm);
  m.impl("multi_tensor_unscale_l2norm", &unscale_l2norm);
  m.impl("multi_tensor_adam", &adam);
  m.impl("multi_tensor_adam_param_remainder", &adam_param_remainder);
  m.impl("multi_tensor_adam_fp8", &adam_fp8);
  m.impl("multi_tensor_adam_capturable", &adam_capturable);
  m.impl("multi_tensor_sgd", &sgd);
  m.impl("multi_tensor_compute_scale_and_scale_inv", &compute_scale);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
