// te_lite MoE permutation ops with an index map (TE's map_type="index"): moe_index_make_row_id_map,
// moe_permute_with_index_map, moe_unpermute_with_index_map (+ _bwd), over the nvte_*_index_map
// calls of permutation.h. Permuted outputs start as zeros (rows past the routes stay 0).
#include <torch/library.h>

#include <transformer_engine_lite/permutation.h>

#include "common.h"

namespace te_lite {
namespace {

inline constexpr at::ScalarType kPermuteData[] = {
    at::kFloat, at::kHalf, at::kBFloat16, at::ScalarType::Float8_e4m3fn,
    at::ScalarType::Float8_e5m2, at::ScalarType::Float8_e4m3fnuz,
    at::ScalarType::Float8_e5m2fnuz, at::kByte};
inline constexpr at::ScalarType kInt32[] = {at::kInt};
inline constexpr at::ScalarType kFloat32[] = {at::kFloat};

int as_int(const char *op, const char *what, int64_t v) {
  TORCH_CHECK(v >= 0 && v <= INT32_MAX, op, ": ", what, " = ", v, " does not fit the C API's int");
  return static_cast<int>(v);
}

// topK from row_id_map [topK * num_tokens].
int64_t topk_of(const char *op, const at::Tensor &map, int64_t num_tokens) {
  check_ndim(op, "row_id_map", map, 1);
  TORCH_CHECK(num_tokens > 0 && map.size(0) % num_tokens == 0 && map.size(0) > 0, op,
              ": row_id_map: expected [topK * ", num_tokens, "] entries, got ", map.size(0));
  return map.size(0) / num_tokens;
}

at::Tensor make_map(const at::Tensor &indices_, int64_t num_out_tokens) {
  const char *op = "te_lite::moe_index_make_row_id_map";
  check_dtype(op, "indices", indices_, kInt32);
  check_ndim(op, "indices", indices_, 2);
  const DeviceContext ctx(indices_);
  const at::Tensor idx = indices_.contiguous();
  at::Tensor map = at::empty({idx.numel()}, idx.options());
  at::Tensor ws = at::empty({idx.numel()}, idx.options());
  TensorWrapper ti, tw, tm;
  ti.data(idx);
  tw.data(ws);
  tm.data(map);
  check_nvte(nvte_permute_index_make_row_id_map(
                 ti.get(), as_int(op, "num_tokens", idx.size(0)),
                 as_int(op, "topK", idx.size(1)),
                 num_out_tokens < 0 ? -1 : as_int(op, "num_out_tokens", num_out_tokens), tw.get(),
                 tm.get(), ctx.stream()),
             op);
  return map;
}

at::Tensor permute(const at::Tensor &inp_, const at::Tensor &map_, int64_t num_out_tokens) {
  const char *op = "te_lite::moe_permute_with_index_map";
  check_dtype(op, "inp", inp_, kPermuteData);
  check_ndim(op, "inp", inp_, 2);
  check_dtype(op, "row_id_map", map_, kInt32);
  check_same_device(op, inp_, "inp", map_, "row_id_map");
  const int64_t topk = topk_of(op, map_, inp_.size(0));
  const DeviceContext ctx(inp_);
  const at::Tensor inp = inp_.contiguous(), map = map_.contiguous();
  at::Tensor out = at::empty({num_out_tokens, inp.size(1)}, inp.options()).zero_();
  TensorWrapper ti, tm, to;
  ti.data(inp);
  tm.data(map);
  to.data(out);
  check_nvte(nvte_permute_with_index_map(
                 ti.get(), tm.get(), as_int(op, "num_tokens", inp.size(0)),
                 as_int(op, "topK", topk), as_int(op, "num_out_tokens", num_out_tokens),
                 as_int(op, "hidden_size", inp.size(1)), to.get(), ctx.stream()),
             op);
  return out;
}

at::Tensor unpermute(const at::Tensor &inp_, const at::Tensor &map_,
                     const std::optional<at::Tensor> &probs_, int64_t num_tokens) {
  const char *op = "te_lite::moe_unpermute_with_index_map";
  check_dtype(op, "inp", inp_, kHighPrecision);
  check_ndim(op, "inp", inp_, 2);
  check_dtype(op, "row_id_map", map_, kInt32);
  check_same_device(op, inp_, "inp", map_, "row_id_map");
  if (probs_.has_value()) {
    check_dtype(op, "probs", *probs_, kFloat32);
    check_same_device(op, inp_, "inp", *probs_, "probs");
  }
  const int64_t topk = topk_of(op, map_, num_tokens);
  const DeviceContext ctx(inp_);
  const at::Tensor inp = inp_.contiguous(), map = map_.contiguous();
  const std::optional<at::Tensor> probs =
      probs_.has_value() ? std::optional<at::Tensor>(probs_->contiguous()) : std::nullopt;
  at::Tensor out = at::empty({num_tokens, inp.size(1)}, inp.options());
  TensorWrapper ti, tm, to;
  ti.data(inp);
  tm.data(map);
  to.data(out);
  TensorWrapper tp = optional_tensor(probs);
  check_nvte(nvte_unpermute_with_index_map(ti.get(), tm.get(), tp.get(),
                                           as_int(op, "num_tokens", num_tokens),
                                           as_int(op, "topK", topk),
                                           as_int(op, "hidden_size", inp.size(1)), to.get(),
                                           ctx.stream()),
             op);
  return out;
}

std::tuple<at::Tensor, at::Tensor> unpermute_bwd(const at::Tensor &grad_, const at::Tensor &map_,
                                                 const at::Tensor &fwd_input_,
                                                 const at::Tensor &probs_) {
  const char *op = "te_lite::moe_unpermute_with_index_map_bwd";
  check_dtype(op, "grad", grad_, kHighPrecision);
  check_ndim(op, "grad", grad_, 2);
  check_ndim(op, "fwd_input", fwd_input_, 2);
  check_dtype(op, "row_id_map", map_, kInt32);
  check_dtype(op, "probs", probs_, kFloat32);
  check_same_device(op, grad_, "grad", map_, "row_id_map");
  check_same_device(op, grad_, "grad", fwd_input_, "fwd_input");
  check_same_device(op, grad_, "grad", probs_, "probs");
  const int64_t topk = topk_of(op, map_, grad_.size(0));
  const DeviceContext ctx(grad_);
  const at::Tensor grad = grad_.contiguous(), map = map_.contiguous(),
                   fwd_input = fwd_input_.contiguous(), probs = probs_.contiguous();
  at::Tensor dx = at::empty(fwd_input.sizes(), grad.options()).zero_();
  at::Tensor dprobs = at::empty(probs.sizes(), probs.options());
  TensorWrapper tg, tm, tf, tp, td, tdp;
  tg.data(grad);
  tm.data(map);
  tf.data(fwd_input);
  tp.data(probs);
  td.data(dx);
  tdp.data(dprobs);
  check_nvte(nvte_unpermute_with_index_map_bwd(
                 tg.get(), tm.get(), tf.get(), tp.get(), as_int(op, "num_tokens", grad.size(0)),
                 as_int(op, "topK", topk), as_int(op, "hidden_size", grad.size(1)), td.get(),
                 tdp.get(), ctx.stream()),
             op);
  return {dx, dprobs};
}

void register_impls(torch::Library &m) {
  m.impl("moe_index_make_row_id_map", &make_map);
  m.impl("moe_permute_with_index_map", &permute);
  m.impl("moe_unpermute_with_index_map", &unpermute);
  m.impl("moe_unpermute_with_index_map_bwd", &unpermute_bwd);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
