// te_lite MoE permutation ops (TE's permutation kernels): moe_make_row_id_map,
// moe_permute_with_mask_map, moe_unpermute_with_mask_map (+ _bwd_with_merging_probs),
// moe_make_chunk_sort_map, moe_sort_chunks_by_map, over the nvte_* calls of permutation.h.
// Permuted outputs start as zeros, so rows no route writes (num_out_tokens above the routes) are 0.
// FP8 data travels as uint8 bytes or a torch float8 dtype; absent probs give empty tensors.
#include <torch/library.h>

#include <transformer_engine_lite/permutation.h>

#include "common.h"

namespace te_lite {
namespace {

inline constexpr at::ScalarType kPermuteData[] = {
    at::kFloat, at::kHalf, at::kBFloat16, at::ScalarType::Float8_e4m3fn,
    at::ScalarType::Float8_e5m2, at::ScalarType::Float8_e4m3fnuz,
    at::ScalarType::Float8_e5m2fnuz, at::kByte};
inline constexpr at::ScalarType kMaskTypes[] = {at::kBool, at::kByte, at::kInt, at::kLong};

int as_int(const char *op, const char *what, int64_t v) {
  TORCH_CHECK(v >= 0 && v <= INT32_MAX, op, ": ", what, " = ", v, " does not fit the C API's int");
  return static_cast<int>(v);
}

int64_t experts_of(const char *op, const at::Tensor &row_id_map) {
  check_ndim(op, "row_id_map", row_id_map, 2);
  TORCH_CHECK(row_id_map.size(1) >= 3 && row_id_map.size(1) % 2 == 1, op,
              ": row_id_map: expected [num_tokens, 2 * num_experts + 1], got shape ",
              row_id_map.sizes());
  return (row_id_map.size(1) - 1) / 2;
}

at::Tensor make_row_id_map(const at::Tensor &routing_map_, int64_t num_out_tokens) {
  const char *op = "te_lite::moe_make_row_id_map";
  check_dtype(op, "routing_map", routing_map_, kMaskTypes);
  check_ndim(op, "routing_map", routing_map_, 2);
  const DeviceContext ctx(routing_map_);
  const at::Tensor rm = routing_map_.contiguous();
  at::Tensor map = at::empty({rm.size(0), 2 * rm.size(1) + 1}, rm.options().dtype(at::kInt));
  TensorWrapper tr, tm;
  tr.data(rm);
  tm.data(map);
  check_nvte(nvte_permute_make_row_id_map(
                 tr.get(), as_int(op, "num_tokens", rm.size(0)),
                 as_int(op, "num_experts", rm.size(1)),
                 num_out_tokens < 0 ? -1 : as_int(op, "num_out_tokens", num_out_tokens), tm.get(),
                 ctx.stream()),
             op);
  return map;
}

std::tuple<at::Tensor, at::Tensor> permute(const at::Tensor &inp_, const at::Tensor &map_,
                                           const std::optional<at::Tensor> &probs_,
                                           int64_t num_out_tokens) {
  const char *op = "te_lite::moe_permute_with_mask_map";
  check_dtype(op, "inp", inp_, kPermuteData);
  check_ndim(op, "inp", inp_, 2);
  check_same_device(op, inp_, "inp", map_, "row_id_map");
  if (probs_.has_value()) check_same_device(op, inp_, "inp", *probs_, "probs");
  const int64_t experts = experts_of(op, map_);
  const DeviceContext ctx(inp_);
  const at::Tensor inp = inp_.contiguous(), map = map_.contiguous();
  const std::optional<at::Tensor> probs =
      probs_.has_value() ? std::optional<at::Tensor>(probs_->contiguous()) : std::nullopt;
  at::Tensor out = at::empty({num_out_tokens, inp.size(1)}, inp.options()).zero_();
  at::Tensor pprobs = probs.has_value() ? at::empty({num_out_tokens}, probs->options()).zero_()
                                        : at::empty({0}, inp.options().dtype(at::kFloat));
  TensorWrapper ti, tm, to, tpp;
  ti.data(inp);
  tm.data(map);
  to.data(out);
  if (probs.has_value()) tpp.data(pprobs);
  TensorWrapper tp = optional_tensor(probs);
  check_nvte(nvte_permute_with_mask_map(
                 ti.get(), tm.get(), tp.get(), as_int(op, "num_tokens", inp.size(0)),
                 as_int(op, "num_experts", experts), as_int(op, "num_out_tokens", num_out_tokens),
                 as_int(op, "hidden_size", inp.size(1)), to.get(), tpp.get(), ctx.stream()),
             op);
  return {out, pprobs};
}

std::tuple<at::Tensor, at::Tensor> unpermute(const at::Tensor &inp_, const at::Tensor &map_,
                                             const std::optional<at::Tensor> &merging_,
                                             const std::optional<at::Tensor> &pprobs_,
                                             int64_t num_tokens) {
  const char *op = "te_lite::moe_unpermute_with_mask_map";
  check_dtype(op, "inp", inp_, kHighPrecision);
  check_ndim(op, "inp", inp_, 2);
  check_same_device(op, inp_, "inp", map_, "row_id_map");
  if (merging_.has_value()) check_same_device(op, inp_, "inp", *merging_, "merging_probs");
  if (pprobs_.has_value()) check_same_device(op, inp_, "inp", *pprobs_, "permuted_probs");
  const int64_t experts = experts_of(op, map_);
  const DeviceContext ctx(inp_);
  const at::Tensor inp = inp_.contiguous(), map = map_.contiguous();
  auto contig = [](const std::optional<at::Tensor> &t) {
    return t.has_value() ? std::optional<at::Tensor>(t->contiguous()) : std::nullopt;
  };
  const std::optional<at::Tensor> merging = contig(merging_), pprobs = contig(pprobs_);
  at::Tensor out = at::empty({num_tokens, inp.size(1)}, inp.options());
  at::Tensor uprobs = pprobs.has_value() ? at::empty({num_tokens, experts}, pprobs->options())
                                         : at::empty({0}, inp.options().dtype(at::kFloat));
  TensorWrapper ti, tm, to, tu;
  ti.data(inp);
  tm.data(map);
  to.data(out);
  if (pprobs.has_value()) tu.data(uprobs);
  TensorWrapper tmp = optional_tensor(merging), tpp = optional_tensor(pprobs);
  check_nvte(nvte_unpermute_with_mask_map(
                 ti.get(), tm.get(), tmp.get(), tpp.get(), as_int(op, "num_tokens", num_tokens),
                 as_int(op, "num_experts", experts), as_int(op, "hidden_size", inp.size(1)),
                 to.get(), tu.get(), ctx.stream()),
             op);
  return {out, uprobs};
}

std::tuple<at::Tensor, at::Tensor> unpermute_bwd(const at::Tensor &grad_, const at::Tensor &map_,
                                                 const at::Tensor &fwd_input_,
                                                 const at::Tensor &merging_) {
  const char *op = "te_lite::moe_unpermute_with_mask_map_bwd_with_merging_probs";
  check_dtype(op, "fwd_output_grad", grad_, kHighPrecision);
  check_ndim(op, "fwd_output_grad", grad_, 2);
  check_ndim(op, "fwd_input", fwd_input_, 2);
  check_same_device(op, grad_, "fwd_output_grad", map_, "row_id_map");
  check_same_device(op, grad_, "fwd_output_grad", fwd_input_, "fwd_input");
  check_same_device(op, grad_, "fwd_output_grad", merging_, "merging_probs");
  const int64_t experts = experts_of(op, map_);
  const DeviceContext ctx(grad_);
  const at::Tensor grad = grad_.contiguous(), map = map_.contiguous(),
                   fwd_input = fwd_input_.contiguous(), merging = merging_.contiguous();
  at::Tensor dx = at::empty(fwd_input.sizes(), grad.options()).zero_();
  at::Tensor dprobs = at::empty(merging.sizes(), merging.options());
  TensorWrapper tg, tm, tf, tp, td, tdp;
  tg.data(grad);
  tm.data(map);
  tf.data(fwd_input);
  tp.data(merging);
  td.data(dx);
  tdp.data(dprobs);
  check_nvte(nvte_unpermute_with_mask_map_bwd_with_merging_probs(
                 tg.get(), tm.get(), tf.get(), tp.get(), as_int(op, "num_tokens", grad.size(0)),
                 as_int(op, "num_experts", experts), as_int(op, "hidden_size", grad.size(1)),
                 td.get(), tdp.get(), ctx.stream()),
             op);
  return {dx, dprobs};
}

at::Tensor make_chunk_sort_map(const at::Tensor &split_sizes_, const at::Tensor &sorted_index_,
                               int64_t num_tokens) {
  const char *op = "te_lite::moe_make_chunk_sort_map";
  const at::ScalarType ints[] = {at::kInt, at::kLong};
  check_dtype(op, "split_sizes", split_sizes_, ints);
  check_dtype(op, "sorted_index", sorted_index_, ints);
  check_ndim(op, "split_sizes", split_sizes_, 1);
  check_same_device(op, split_sizes_, "split_sizes", sorted_index_, "sorted_index");
  const DeviceContext ctx(split_sizes_);
  const at::Tensor sizes = split_sizes_.to(at::kLong).contiguous(),
                   index = sorted_index_.to(at::kLong).contiguous();
  at::Tensor map = at::empty({num_tokens}, sizes.options().dtype(at::kInt));
  TensorWrapper ts, tx, tm;
  ts.data(sizes);
  tx.data(index);
  tm.data(map);
  check_nvte(nvte_make_chunk_sort_map(ts.get(), tx.get(), as_int(op, "num_tokens", num_tokens),
                                      as_int(op, "num_splits", sizes.size(0)), tm.get(),
                                      ctx.stream()),
             op);
  return map;
}

std::tuple<at::Tensor, at::Tensor> sort_chunks(const at::Tensor &inp_, const at::Tensor &map_,
                                               const std::optional<at::Tensor> &probs_,
                                               bool is_forward) {
  const char *op = "te_lite::moe_sort_chunks_by_map";
  check_dtype(op, "inp", inp_, kPermuteData);
  check_ndim(op, "inp", inp_, 2);
  check_same_device(op, inp_, "inp", map_, "row_id_map");
  if (probs_.has_value()) check_same_device(op, inp_, "inp", *probs_, "probs");
  const DeviceContext ctx(inp_);
  const at::Tensor inp = inp_.contiguous(), map = map_.contiguous();
  const std::optional<at::Tensor> probs =
      probs_.has_value() ? std::optional<at::Tensor>(probs_->contiguous()) : std::nullopt;
  at::Tensor out = at::empty(inp.sizes(), inp.options());
  at::Tensor pprobs = probs.has_value() ? at::empty(probs->sizes(), probs->options())
                                        : at::empty({0}, inp.options().dtype(at::kFloat));
  TensorWrapper ti, tm, to, tpp;
  ti.data(inp);
  tm.data(map);
  to.data(out);
  if (probs.has_value()) tpp.data(pprobs);
  TensorWrapper tp = optional_tensor(probs);
  check_nvte(nvte_sort_chunks_by_map(ti.get(), tm.get(), tp.get(),
                                     as_int(op, "num_tokens", inp.size(0)),
                                     as_int(op, "hidden_size", inp.size(1)), is_forward ? 1 : 0,
                                     to.get(), tpp.get(), ctx.stream()),
             op);
  return {out, pprobs};
}

void register_impls(torch::Library &m) {
  m.impl("moe_make_row_id_map", &make_row_id_map);
  m.impl("moe_permute_with_mask_map", &permute);
  m.impl("moe_unpermute_with_mask_map", &unpermute);
  m.impl("moe_unpermute_with_mask_map_bwd_with_merging_probs", &unpermute_bwd);
  m.impl("moe_make_chunk_sort_map", &make_chunk_sort_map);
  m.impl("moe_sort_chunks_by_map", &sort_chunks);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
