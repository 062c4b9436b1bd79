// C API of the MoE permutation (permutation.h): argument checks, device routing, CPU/GPU launch.
#include "transformer_engine_lite/permutation.h"

#include <vector>

#include "../util/api.h"
#include "permutation_cpu.h"
#ifdef NVTE_WITH_GPU
#include "permutation_gpu.h"
#endif

namespace nvte {
namespace {

using Shape = std::vector<size_t>;
using Named = std::pair<const Tensor *, const char *>;

constexpr std::initializer_list<DType> kHp = {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16};
constexpr std::initializer_list<DType> kData = {
    kNVTEFloat32,        kNVTEFloat16,        kNVTEBFloat16, kNVTEFloat8E4M3, kNVTEFloat8E5M2,
    kNVTEFloat8E4M3FNUZ, kNVTEFloat8E5M2FNUZ, kNVTEByte};

size_t dim(const char *arg, int v, int low) {
  NVTE_CHECK(v >= low, "argument '", arg, "': expected >= ", low, ", got ", v);
  return static_cast<size_t>(v);
}

// An optional tensor: null, or a handle with no data (the bindings' "absent"), is none.
const Tensor *optional(const NVTETensor h) {
  const Tensor *t = as_tensor_opt(h);
  return t != nullptr && !t->data.has_data() ? nullptr : t;
}

void check_row_id_map(const Tensor &m, const PermuteParams &p) {
  check_dtype(m.data, "row_id_map", {kNVTEInt32});
  check_shape(m.data, "row_id_map", Shape{p.tokens, row_id_map_width(p.experts)});
}

void check_apart(std::initializer_list<Named> ins, std::initializer_list<Named> outs) {
  for (auto o = outs.begin(); o != outs.end(); ++o) {
    if (o->first == nullptr) continue;
    for (const auto &i : ins) {
      if (i.first != nullptr) check_no_overlap(i.first->data, i.second, o->first->data, o->second);
    }
    for (auto o2 = o + 1; o2 != outs.end(); ++o2) {
      if (o2->first != nullptr) {
        check_no_overlap(o->first->data, o->second, o2->first->data, o2->second);
      }
    }
  }
}

void require_data(std::initializer_list<Named> ts) {
  for (const auto &t : ts) {
    if (t.first != nullptr) check_has_data(*t.first, t.second);
  }
}

const void *dptr(const Tensor *t) { return t != nullptr ? t->data.dptr : nullptr; }
void *dptr_mut(const Tensor *t) { return t != nullptr ? t->data.dptr : nullptr; }
DType probs_dtype(const Tensor *t) { return t != nullptr ? t->data.dtype : kNVTEFloat32; }

void make_row_id_map(const char *op, const NVTETensor rm_h, int num_tokens, int num_experts,
                     int num_out_tokens, NVTETensor map_h, NVTEStream stream) {
  const Tensor &rm = as_tensor(rm_h, "routing_map");
  const Tensor &map = as_tensor(map_h, "row_id_map");
  PermuteParams p;
  p.tokens = dim("num_tokens", num_tokens, 0);
  p.experts = dim("num_experts", num_experts, 1);
  p.out_rows = num_out_tokens < 0 ? INT64_MAX : num_out_tokens;
  check_dtype(rm.data, "routing_map", {kNVTEByte, kNVTEInt32, kNVTEInt64});
  check_shape(rm.data, "routing_map", Shape{p.tokens, p.experts});
  check_row_id_map(map, p);
  const bool gpu = use_gpu(check_same_device({{&rm, "routing_map"}, {&map, "row_id_map"}}), op);
  check_apart({{&rm, "routing_map"}}, {{&map, "row_id_map"}});
  if (p.tokens == 0) return;
  require_data({{&rm, "routing_map"}, {&map, "row_id_map"}});
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_make_row_id_map(p, rm.data.dtype, rm.data.dptr, map.data.ptr<int32_t>(), stream);
#endif
    return;
  }
  (void)stream;
  launch_make_row_id_map(p, rm.data.dtype, rm.data.dptr, map.data.ptr<int32_t>());
}

void permute(const char *op, const NVTETensor in_h, const NVTETensor map_h,
             const NVTETensor probs_h, int num_tokens, int num_experts, int num_out_tokens,
             int hidden_size, NVTETensor out_h, NVTETensor pprobs_h, NVTEStream stream) {
  const Tensor &in = as_tensor(in_h, "input");
  const Tensor &map = as_tensor(map_h, "row_id_map");
  const Tensor &out = as_tensor(out_h, "output");
  const Tensor *probs = optional(probs_h);
  const Tensor *pprobs = probs != nullptr ? &as_tensor(pprobs_h, "permuted_probs") : nullptr;
  PermuteParams p;
  p.tokens = dim("num_tokens", num_tokens, 0);
  p.experts = dim("num_experts", num_experts, 1);
  p.out_rows = static_cast<int64_t>(dim("num_out_tokens", num_out_tokens, 0));
  p.hidden = dim("hidden_size", hidden_size, 0);
  check_dtype(in.data, "input", kData);
  check_shape(in.data, "input", Shape{p.tokens, p.hidden});
  check_row_id_map(map, p);
  check_dtype(out.data, "output", {in.data.dtype});
  check_shape(out.data, "output", Shape{static_cast<size_t>(p.out_rows), p.hidden});
  if (probs != nullptr) {
    check_dtype(probs->data, "probs", kHp);
    check_shape(probs->data, "probs", Shape{p.tokens, p.experts});
    check_dtype(pprobs->data, "permuted_probs", {probs->data.dtype});
    check_shape(pprobs->data, "permuted_probs", Shape{static_cast<size_t>(p.out_rows)});
  }
  const bool gpu = use_gpu(check_same_device({{&in, "input"}, {&map, "row_id_map"},
                                              {probs, "probs"}, {&out, "output"},
                                              {pprobs, "permuted_probs"}}),
                           op);
  check_apart({{&in, "input"}, {&map, "row_id_map"}, {probs, "probs"}},
              {{&out, "output"}, {pprobs, "permuted_probs"}});
  if (p.tokens == 0 || p.out_rows == 0) return;
  require_data({{&in, "input"}, {&map, "row_id_map"}, {probs, "probs"}, {&out, "output"},
                {pprobs, "permuted_probs"}});
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_permute_with_mask_map(p, in.data.dtype, in.data.dptr, map.data.ptr<int32_t>(),
                                      probs_dtype(probs), dptr(probs), out.data.dptr,
                                      dptr_mut(pprobs), stream);
#endif
    return;
  }
  (void)stream;
  launch_permute_with_mask_map(p, in.data.dtype, in.data.dptr, map.data.ptr<int32_t>(),
                               probs_dtype(probs), dptr(probs), out.data.dptr, dptr_mut(pprobs));
}

void unpermute(const char *op, const NVTETensor in_h, const NVTETensor map_h,
               const NVTETensor mprobs_h, const NVTETensor pprobs_h, int num_tokens,
               int num_experts, int hidden_size, NVTETensor out_h, NVTETensor uprobs_h,
               NVTEStream stream) {
  const Tensor &in = as_tensor(in_h, "input");
  const Tensor &map = as_tensor(map_h, "row_id_map");
  const Tensor &out = as_tensor(out_h, "output");
  const Tensor *mprobs = optional(mprobs_h);
  const Tensor *pprobs = optional(pprobs_h);
  const Tensor *uprobs = pprobs != nullptr ? &as_tensor(uprobs_h, "unpermuted_probs") : nullptr;
  PermuteParams p;
  p.tokens = dim("num_tokens", num_tokens, 0);
  p.experts = dim("num_experts", num_experts, 1);
  p.hidden = dim("hidden_size", hidden_size, 0);
  check_dtype(in.data, "input", kHp);
  check_ndim(in.data, "input", 2);
  p.in_rows = in.data.shape[0];
  check_shape(in.data, "input", Shape{p.in_rows, p.hidden});
  check_row_id_map(map, p);
  check_dtype(out.data, "output", {in.data.dtype});
  check_shape(out.data, "output", Shape{p.tokens, p.hidden});
  if (mprobs != nullptr) {
    check_dtype(mprobs->data, "merging_probs", kHp);
    check_shape(mprobs->data, "merging_probs", Shape{p.tokens, p.experts});
  }
  if (pprobs != nullptr) {
    check_dtype(pprobs->data, "permuted_probs",
                mprobs != nullptr ? std::initializer_list<DType>{mprobs->data.dtype} : kHp);
    check_shape(pprobs->data, "permuted_probs", Shape{p.in_rows});
    check_dtype(uprobs->data, "unpermuted_probs", {pprobs->data.dtype});
    check_shape(uprobs->data, "unpermuted_probs", Shape{p.tokens, p.experts});
  }
  const Tensor *probs_any = mprobs != nullptr ? mprobs : pprobs;
  const bool gpu = use_gpu(check_same_device({{&in, "input"}, {&map, "row_id_map"},
                                              {mprobs, "merging_probs"},
                                              {pprobs, "permuted_probs"}, {&out, "output"},
                                              {uprobs, "unpermuted_probs"}}),
                           op);
  check_apart({{&in, "input"}, {&map, "row_id_map"}, {mprobs, "merging_probs"},
               {pprobs, "permuted_probs"}},
              {{&out, "output"}, {uprobs, "unpermuted_probs"}});
  if (p.tokens == 0) return;
  require_data({{&map, "row_id_map"}, {mprobs, "merging_probs"}, {&out, "output"},
                {uprobs, "unpermuted_probs"}});
  if (p.in_rows > 0) require_data({{&in, "input"}, {pprobs, "permuted_probs"}});
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_unpermute_with_mask_map(p, in.data.dtype, in.data.dptr, map.data.ptr<int32_t>(),
                                        probs_dtype(probs_any), dptr(mprobs), dptr(pprobs),
                                        out.data.dptr, dptr_mut(uprobs), stream);
#endif
    return;
  }
  (void)stream;
  launch_unpermute_with_mask_map(p, in.data.dtype, in.data.dptr, map.data.ptr<int32_t>(),
                                 probs_dtype(probs_any), dptr(mprobs), dptr(pprobs),
                                 out.data.dptr, dptr_mut(uprobs));
}

void unpermute_bwd(const char *op, const NVTETensor grad_h, const NVTETensor map_h,
                   const NVTETensor fwd_in_h, const NVTETensor mprobs_h, int num_tokens,
                   int num_experts, int hidden_size, NVTETensor dx_h, NVTETensor dprobs_h,
                   NVTEStream stream) {
  const Tensor &grad = as_tensor(grad_h, "fwd_output_grad");
  const Tensor &map = as_tensor(map_h, "row_id_map");
  const Tensor &fwd_in = as_tensor(fwd_in_h, "fwd_input");
  const Tensor &mprobs = as_tensor(mprobs_h, "merging_probs");
  const Tensor &dx = as_tensor(dx_h, "fwd_input_grad");
  const Tensor &dprobs = as_tensor(dprobs_h, "merging_probs_grad");
  PermuteParams p;
  p.tokens = dim("num_tokens", num_tokens, 0);
  p.experts = dim("num_experts", num_experts, 1);
  p.hidden = dim("hidden_size", hidden_size, 0);
  check_dtype(grad.data, "fwd_output_grad", kHp);
  check_shape(grad.data, "fwd_output_grad", Shape{p.tokens, p.hidden});
  check_row_id_map(map, p);
  check_dtype(fwd_in.data, "fwd_input", {grad.data.dtype});
  check_ndim(fwd_in.data, "fwd_input", 2);
  p.in_rows = fwd_in.data.shape[0];
  check_shape(fwd_in.data, "fwd_input", Shape{p.in_rows, p.hidden});
  check_dtype(mprobs.data, "merging_probs", kHp);
  check_shape(mprobs.data, "merging_probs", Shape{p.tokens, p.experts});
  check_dtype(dx.data, "fwd_input_grad", {grad.data.dtype});
  check_shape(dx.data, "fwd_input_grad", Shape{p.in_rows, p.hidden});
  check_dtype(dprobs.data, "merging_probs_grad", {mprobs.data.dtype});
  check_shape(dprobs.data, "merging_probs_grad", Shape{p.tokens, p.experts});
  const bool gpu = use_gpu(
      check_same_device({{&grad, "fwd_output_grad"}, {&map, "row_id_map"},
                         {&fwd_in, "fwd_input"}, {&mprobs, "merging_probs"},
                         {&dx, "fwd_input_grad"}, {&dprobs, "merging_probs_grad"}}),
      op);
  check_apart({{&grad, "fwd_output_grad"}, {&map, "row_id_map"}, {&fwd_in, "fwd_input"},
               {&mprobs, "merging_probs"}},
              {{&dx, "fwd_input_grad"}, {&dprobs, "merging_probs_grad"}});
  if (p.tokens == 0) return;
  require_data({{&grad, "fwd_output_grad"}, {&map, "row_id_map"}, {&mprobs, "merging_probs"},
                {&dprobs, "merging_probs_grad"}});
  if (p.in_rows > 0) require_data({{&fwd_in, "fwd_input"}, {&dx, "fwd_input_grad"}});
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_unpermute_bwd_with_merging_probs(p, grad.data.dtype, grad.data.dptr,
                                                 map.data.ptr<int32_t>(), fwd_in.data.dptr,
                                                 mprobs.data.dtype, mprobs.data.dptr,
                                                 dx.data.dptr, dprobs.data.dptr, stream);
#endif
    return;
  }
  (void)stream;
  launch_unpermute_bwd_with_merging_probs(p, grad.data.dtype, grad.data.dptr,
                                          map.data.ptr<int32_t>(), fwd_in.data.dptr,
                                          mprobs.data.dtype, mprobs.data.dptr, dx.data.dptr,
                                          dprobs.data.dptr);
}

// CPU data only: sizes >= 0 summing to num_tokens, sorted_index a permutation of the chunks.
void check_chunks(const PermuteParams &p, const int64_t *sizes, const int64_t *index) {
  int64_t total = 0;
  std::vector<char> seen(static_cast<size_t>(p.splits), 0);
  for (int64_t c = 0; c < p.splits; ++c) {
    NVTE_CHECK(sizes[c] >= 0, "argument 'split_sizes': expected sizes >= 0, got ", sizes[c],
               " at ", c);
    total += sizes[c];
    const int64_t j = index[c];
    NVTE_CHECK(j >= 0 && j < p.splits && !seen[static_cast<size_t>(j)],
               "argument 'sorted_index': expected a permutation of 0..", p.splits - 1, ", got ", j,
               " at ", c);
    seen[static_cast<size_t>(j)] = 1;
  }
  NVTE_CHECK(total == static_cast<int64_t>(p.tokens), "argument 'split_sizes': expected sizes "
             "summing to num_tokens (", p.tokens, "), got ", total);
}

void chunk_sort_map(const char *op, const NVTETensor sizes_h, const NVTETensor index_h,
                    int num_tokens, int num_splits, NVTETensor map_h, NVTEStream stream) {
  const Tensor &sizes = as_tensor(sizes_h, "split_sizes");
  const Tensor &index = as_tensor(index_h, "sorted_index");
  const Tensor &map = as_tensor(map_h, "row_id_map");
  PermuteParams p;
  p.tokens = dim("num_tokens", num_tokens, 0);
  p.splits = static_cast<int64_t>(dim("num_splits", num_splits, 0));
  check_dtype(sizes.data, "split_sizes", {kNVTEInt64});
  check_shape(sizes.data, "split_sizes", Shape{static_cast<size_t>(p.splits)});
  check_dtype(index.data, "sorted_index", {kNVTEInt64});
  check_shape(index.data, "sorted_index", Shape{static_cast<size_t>(p.splits)});
  check_dtype(map.data, "row_id_map", {kNVTEInt32});
  check_shape(map.data, "row_id_map", Shape{p.tokens});
  const bool gpu = use_gpu(check_same_device({{&sizes, "split_sizes"}, {&index, "sorted_index"},
                                              {&map, "row_id_map"}}),
                           op);
  check_apart({{&sizes, "split_sizes"}, {&index, "sorted_index"}}, {{&map, "row_id_map"}});
  if (p.splits > 0) require_data({{&sizes, "split_sizes"}, {&index, "sorted_index"}});
  if (gpu) {
    if (p.tokens == 0) return;
    require_data({{&map, "row_id_map"}});
#ifdef NVTE_WITH_GPU
    gpu::launch_make_chunk_sort_map(p, sizes.data.ptr<int64_t>(), index.data.ptr<int64_t>(),
                                    map.data.ptr<int32_t>(), stream);
#endif
    return;
  }
  (void)stream;
  check_chunks(p, sizes.data.ptr<int64_t>(), index.data.ptr<int64_t>());
  if (p.tokens == 0) return;
  require_data({{&map, "row_id_map"}});
  launch_make_chunk_sort_map(p, sizes.data.ptr<int64_t>(), index.data.ptr<int64_t>(),
                             map.data.ptr<int32_t>());
}

void sort_chunks(const char *op, const NVTETensor in_h, const NVTETensor map_h,
                 const NVTETensor probs_h, int num_tokens, int hidden_size, int is_forward,
                 NVTETensor out_h, NVTETensor pprobs_h, NVTEStream stream) {
  const Tensor &in = as_tensor(in_h, "input");
  const Tensor &map = as_tensor(map_h, "row_id_map");
  const Tensor &out = as_tensor(out_h, "output");
  const Tensor *probs = optional(probs_h);
  const Tensor *pprobs = probs != nullptr ? &as_tensor(pprobs_h, "permuted_probs") : nullptr;
  PermuteParams p;
  p.tokens = dim("num_tokens", num_tokens, 0);
  p.hidden = dim("hidden_size", hidden_size, 0);
  check_dtype(in.data, "input", kData);
  check_shape(in.data, "input", Shape{p.tokens, p.hidden});
  check_dtype(map.data, "row_id_map", {kNVTEInt32});
  check_shape(map.data, "row_id_map", Shape{p.tokens});
  check_dtype(out.data, "output", {in.data.dtype});
  check_shape(out.data, "output", Shape{p.tokens, p.hidden});
  if (probs != nullptr) {
    check_dtype(probs->data, "probs", kHp);
    check_shape(probs->data, "probs", Shape{p.tokens});
    check_dtype(pprobs->data, "permuted_probs", {probs->data.dtype});
    check_shape(pprobs->data, "permuted_probs", Shape{p.tokens});
  }
  const bool gpu = use_gpu(check_same_device({{&in, "input"}, {&map, "row_id_map"},
                                              {probs, "probs"}, {&out, "output"},
                                              {pprobs, "permuted_probs"}}),
                           op);
  check_apart({{&in, "input"}, {&map, "row_id_map"}, {probs, "probs"}},
              {{&out, "output"}, {pprobs, "permuted_probs"}});
  if (p.tokens == 0) return;
  require_data({{&in, "input"}, {&map, "row_id_map"}, {probs, "probs"}, {&out, "output"},
                {pprobs, "permuted_probs"}});
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_sort_chunks_by_map(p, in.data.dtype, in.data.dptr, map.data.ptr<int32_t>(),
                                   probs_dtype(probs), dptr(probs), is_forward != 0,
                                   out.data.dptr, dptr_mut(pprobs), stream);
#endif
    return;
  }
  (void)stream;
  launch_sort_chunks_by_map(p, in.data.dtype, in.data.dptr, map.data.ptr<int32_t>(),
                            probs_dtype(probs), dptr(probs), is_forward != 0, out.data.dptr,
                            dptr_mut(pprobs));
}

}  // namespace
}  // namespace nvte

NVTEStatus nvte_permute_make_row_id_map(const NVTETensor routing_map, int num_tokens,
                                        int num_experts, int num_out_tokens,
                                        NVTETensor row_id_map, NVTEStream stream) {
  const char *op = "nvte_permute_make_row_id_map";
  return nvte::guarded(op, [&] {
    nvte::make_row_id_map(op, routing_map, num_tokens, num_experts, num_out_tokens, row_id_map,
                          stream);
  });
}

NVTEStatus nvte_permute_with_mask_map(const NVTETensor input, const NVTETensor row_id_map,
                                      const NVTETensor probs, int num_tokens, int num_experts,
                                      int num_out_tokens, int hidden_size, NVTETensor output,
                                      NVTETensor permuted_probs, NVTEStream stream) {
  const char *op = "nvte_permute_with_mask_map";
  return nvte::guarded(op, [&] {
    nvte::permute(op, input, row_id_map, probs, num_tokens, num_experts, num_out_tokens,
                  hidden_size, output, permuted_probs, stream);
  });
}

NVTEStatus nvte_unpermute_with_mask_map(const NVTETensor input, const NVTETensor row_id_map,
                                        const NVTETensor merging_probs,
                                        const NVTETensor permuted_probs, int num_tokens,
                                        int num_experts, int hidden_size, NVTETensor output,
                                        NVTETensor unpermuted_probs, NVTEStream stream) {
  const char *op = "nvte_unpermute_with_mask_map";
  return nvte::guarded(op, [&] {
    nvte::unpermute(op, input, row_id_map, merging_probs, permuted_probs, num_tokens, num_experts,
                    hidden_size, output, unpermuted_probs, stream);
  });
}

NVTEStatus nvte_unpermute_with_mask_map_bwd_with_merging_probs(
    const NVTETensor fwd_output_grad, const NVTETensor row_id_map, const NVTETensor fwd_input,
    const NVTETensor merging_probs, int num_tokens, int num_experts, int hidden_size,
    NVTETensor fwd_input_grad, NVTETensor merging_probs_grad, NVTEStream stream) {
  const char *op = "nvte_unpermute_with_mask_map_bwd_with_merging_probs";
  return nvte::guarded(op, [&] {
    nvte::unpermute_bwd(op, fwd_output_grad, row_id_map, fwd_input, merging_probs, num_tokens,
                        num_experts, hidden_size, fwd_input_grad, merging_probs_grad, stream);
  });
}

NVTEStatus nvte_make_chunk_sort_map(const NVTETensor split_sizes, const NVTETensor sorted_index,
                                    int num_tokens, int num_splits, NVTETensor row_id_map,
                                    NVTEStream stream) {
  const char *op = "nvte_make_chunk_sort_map";
  return nvte::guarded(op, [&] {
    nvte::chunk_sort_map(op, split_sizes, sorted_index, num_tokens, num_splits, row_id_map,
                         stream);
  });
}

NVTEStatus nvte_sort_chunks_by_map(const NVTETensor input, const NVTETensor row_id_map,
                                   const NVTETensor probs, int num_tokens, int hidden_size,
                                   int is_forward, NVTETensor output, NVTETensor permuted_probs,
                                   NVTEStream stream) {
  const char *op = "nvte_sort_chunks_by_map";
  return nvte::guarded(op, [&] {
    nvte::sort_chunks(op, input, row_id_map, probs, num_tokens, hidden_size, is_forward, output,
                      permuted_probs, stream);
  });
}
