// C API of the MoE permutation with an index map (permutation.h, nvte_*_index_map): argument
// checks, device routing, CPU/GPU launch.
#include <vector>

#include "../util/api.h"
#include "transformer_engine_lite/permutation.h"
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

const Tensor *optional(const NVTETensor h) {
  const Tensor *t = as_tensor_opt(h);
  return t != nullptr && !t->data.has_data() ? nullptr : t;
}

// tokens, topk and the route count tokens * topk (row ids are int32).
IndexPermuteParams index_params(int num_tokens, int topk, int hidden_size) {
  IndexPermuteParams p;
  p.tokens = dim("num_tokens", num_tokens, 0);
  p.topk = dim("topK", topk, 1);
  p.hidden = dim("hidden_size", hidden_size, 0);
  NVTE_CHECK(p.tokens * p.topk <= static_cast<size_t>(INT32_MAX), "num_tokens * topK = ",
             p.tokens * p.topk, " routes: expected at most ", INT32_MAX, " (int32 row ids)");
  return p;
}

void check_map(const Tensor &m, const IndexPermuteParams &p) {
  check_dtype(m.data, "row_id_map", {kNVTEInt32});
  check_shape(m.data, "row_id_map", Shape{p.tokens * p.topk});
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

void make_map(const char *op, const NVTETensor idx_h, int num_tokens, int topk,
              int num_out_tokens, NVTETensor ws_h, NVTETensor map_h, NVTEStream stream) {
  const Tensor &idx = as_tensor(idx_h, "indices");
  const Tensor &ws = as_tensor(ws_h, "workspace");
  const Tensor &map = as_tensor(map_h, "row_id_map");
  IndexPermuteParams p = index_params(num_tokens, topk, 0);
  p.out_rows = num_out_tokens < 0 ? INT64_MAX : num_out_tokens;
  check_dtype(idx.data, "indices", {kNVTEInt32});
  check_shape(idx.data, "indices", Shape{p.tokens, p.topk});
  check_dtype(ws.data, "workspace", {kNVTEInt32});
  check_shape(ws.data, "workspace", Shape{p.tokens * p.topk});
  check_map(map, p);
  const bool gpu = use_gpu(
      check_same_device({{&idx, "indices"}, {&ws, "workspace"}, {&map, "row_id_map"}}), op);
  check_apart({{&idx, "indices"}}, {{&ws, "workspace"}, {&map, "row_id_map"}});
  if (p.tokens == 0) return;
  require_data({{&idx, "indices"}, {&ws, "workspace"}, {&map, "row_id_map"}});
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_index_make_row_id_map(p, idx.data.ptr<int32_t>(), ws.data.ptr<int32_t>(),
                                      map.data.ptr<int32_t>(), stream);
#endif
    return;
  }
  (void)stream;
  launch_index_make_row_id_map(p, idx.data.ptr<int32_t>(), ws.data.ptr<int32_t>(),
                               map.data.ptr<int32_t>());
}

void permute(const char *op, const NVTETensor in_h, const NVTETensor map_h, int num_tokens,
             int topk, int num_out_tokens, int hidden_size, NVTETensor out_h, NVTEStream stream) {
  const Tensor &in = as_tensor(in_h, "input");
  const Tensor &map = as_tensor(map_h, "row_id_map");
  const Tensor &out = as_tensor(out_h, "output");
  IndexPermuteParams p = index_params(num_tokens, topk, hidden_size);
  p.out_rows = static_cast<int64_t>(dim("num_out_tokens", num_out_tokens, 0));
  check_dtype(in.data, "input", kData);
  check_shape(in.data, "input", Shape{p.tokens, p.hidden});
  check_map(map, p);
  check_dtype(out.data, "output", {in.data.dtype});
  check_shape(out.data, "output", Shape{static_cast<size_t>(p.out_rows), p.hidden});
  const bool gpu = use_gpu(
      check_same_device({{&in, "input"}, {&map, "row_id_map"}, {&out, "output"}}), op);
  check_apart({{&in, "input"}, {&map, "row_id_map"}}, {{&out, "output"}});
  if (p.tokens == 0 || p.out_rows == 0 || p.hidden == 0) return;
  require_data({{&in, "input"}, {&map, "row_id_map"}, {&out, "output"}});
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_permute_with_index_map(p, in.data.dtype, in.data.dptr, map.data.ptr<int32_t>(),
                                       out.data.dptr, stream);
#endif
    return;
  }
  (void)stream;
  launch_permute_with_index_map(p, in.data.dtype, in.data.dptr, map.data.ptr<int32_t>(),
                                out.data.dptr);
}

void unpermute(const char *op, const NVTETensor in_h, const NVTETensor map_h,
               const NVTETensor probs_h, int num_tokens, int topk, int hidden_size,
               NVTETensor out_h, NVTEStream stream) {
  const Tensor &in = as_tensor(in_h, "input");
  const Tensor &map = as_tensor(map_h, "row_id_map");
  const Tensor &out = as_tensor(out_h, "output");
  const Tensor *probs = optional(probs_h);
  IndexPermuteParams p = index_params(num_tokens, topk, hidden_size);
  check_dtype(in.data, "input", kHp);
  NVTE_CHECK(in.data.shape.size() == 2 && in.data.shape[1] == p.hidden,
             "argument 'input': expected [rows, ", p.hidden, "], got ", shape_str(in.data.shape));
  p.in_rows = in.data.shape[0];
  check_map(map, p);
  if (probs != nullptr) {
    check_dtype(probs->data, "probs", {kNVTEFloat32});
    check_shape(probs->data, "probs", Shape{p.tokens, p.topk});
  }
  check_dtype(out.data, "output", {in.data.dtype});
  check_shape(out.data, "output", Shape{p.tokens, p.hidden});
  const bool gpu = use_gpu(check_same_device({{&in, "input"}, {&map, "row_id_map"},
                                              {probs, "probs"}, {&out, "output"}}),
                           op);
  check_apart({{&in, "input"}, {&map, "row_id_map"}, {probs, "probs"}}, {{&out, "output"}});
  if (p.tokens == 0 || p.hidden == 0) return;
  require_data({{&in, "input"}, {&map, "row_id_map"}, {probs, "probs"}, {&out, "output"}});
  const float *pr = probs != nullptr ? probs->data.ptr<float>() : nullptr;
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_unpermute_with_index_map(p, in.data.dtype, in.data.dptr, map.data.ptr<int32_t>(),
                                         pr, out.data.dptr, stream);
#endif
    return;
  }
  (void)stream;
  launch_unpermute_with_index_map(p, in.data.dtype, in.data.dptr, map.data.ptr<int32_t>(), pr,
                                  out.data.dptr);
}

void unpermute_bwd(const char *op, const NVTETensor grad_h, const NVTETensor map_h,
                   const NVTETensor fwd_h, const NVTETensor probs_h, int num_tokens, int topk,
                   int hidden_size, NVTETensor in_grad_h, NVTETensor probs_grad_h,
                   NVTEStream stream) {
  const Tensor &grad = as_tensor(grad_h, "grad");
  const Tensor &map = as_tensor(map_h, "row_id_map");
  const Tensor &fwd = as_tensor(fwd_h, "fwd_input");
  const Tensor &probs = as_tensor(probs_h, "probs");
  const Tensor &in_grad = as_tensor(in_grad_h, "fwd_input_grad");
  const Tensor &probs_grad = as_tensor(probs_grad_h, "probs_grad");
  IndexPermuteParams p = index_params(num_tokens, topk, hidden_size);
  check_dtype(grad.data, "grad", kHp);
  check_shape(grad.data, "grad", Shape{p.tokens, p.hidden});
  check_map(map, p);
  check_dtype(fwd.data, "fwd_input", {grad.data.dtype});
  NVTE_CHECK(fwd.data.shape.size() == 2 && fwd.data.shape[1] == p.hidden,
             "argument 'fwd_input': expected [rows, ", p.hidden, "], got ",
             shape_str(fwd.data.shape));
  p.in_rows = fwd.data.shape[0];
  check_dtype(probs.data, "probs", {kNVTEFloat32});
  check_shape(probs.data, "probs", Shape{p.tokens, p.topk});
  check_dtype(in_grad.data, "fwd_input_grad", {grad.data.dtype});
  check_shape(in_grad.data, "fwd_input_grad", Shape{p.in_rows, p.hidden});
  check_dtype(probs_grad.data, "probs_grad", {kNVTEFloat32});
  check_shape(probs_grad.data, "probs_grad", Shape{p.tokens, p.topk});
  const bool gpu = use_gpu(
      check_same_device({{&grad, "grad"}, {&map, "row_id_map"}, {&fwd, "fwd_input"},
                         {&probs, "probs"}, {&in_grad, "fwd_input_grad"},
                         {&probs_grad, "probs_grad"}}),
      op);
  check_apart({{&grad, "grad"}, {&map, "row_id_map"}, {&fwd, "fwd_input"}, {&probs, "probs"}},
              {{&in_grad, "fwd_input_grad"}, {&probs_grad, "probs_grad"}});
  if (p.tokens == 0) return;
  require_data({{&grad, "grad"}, {&map, "row_id_map"}, {&fwd, "fwd_input"}, {&probs, "probs"},
                {&in_grad, "fwd_input_grad"}, {&probs_grad, "probs_grad"}});
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_unpermute_with_index_map_bwd(p, grad.data.dtype, grad.data.dptr,
                                             map.data.ptr<int32_t>(), fwd.data.dptr,
                                             probs.data.ptr<float>(), in_grad.data.dptr,
                                             probs_grad.data.ptr<float>(), stream);
#endif
    return;
  }
  (void)stream;
  launch_unpermute_with_index_map_bwd(p, grad.data.dtype, grad.data.dptr, map.data.ptr<int32_t>(),
                                      fwd.data.dptr, probs.data.ptr<float>(), in_grad.data.dptr,
                                      probs_grad.data.ptr<float>());
}

}  // namespace
}  // namespace nvte

NVTEStatus nvte_permute_index_make_row_id_map(const NVTETensor indices, int num_tokens, int topK,
                                              int num_out_tokens, NVTETensor workspace,
                                              NVTETensor row_id_map, NVTEStream stream) {
  const char *op = "nvte_permute_index_make_row_id_map";
  return nvte::guarded(op, [&] {
    nvte::make_map(op, indices, num_tokens, topK, num_out_tokens, workspace, row_id_map, stream);
  });
}

NVTEStatus nvte_permute_with_index_map(const NVTETensor input, const NVTETensor row_id_map,
                                       int num_tokens, int topK, int num_out_tokens,
                                       int hidden_size, NVTETensor output, NVTEStream stream) {
  const char *op = "nvte_permute_with_index_map";
  return nvte::guarded(op, [&] {
    nvte::permute(op, input, row_id_map, num_tokens, topK, num_out_tokens, hidden_size, output,
                  stream);
  });
}

NVTEStatus nvte_unpermute_with_index_map(const NVTETensor input, const NVTETensor row_id_map,
                                         const NVTETensor probs, int num_tokens, int topK,
                                         int hidden_size, NVTETensor output, NVTEStream stream) {
  const char *op = "nvte_unpermute_with_index_map";
  return nvte::guarded(op, [&] {
    nvte::unpermute(op, input, row_id_map, probs, num_tokens, topK, hidden_size, output, stream);
  });
}

NVTEStatus nvte_unpermute_with_index_map_bwd(const NVTETensor grad, const NVTETensor row_id_map,
                                             const NVTETensor fwd_input, const NVTETensor probs,
                                             int num_tokens, int topK, int hidden_size,
                                             NVTETensor fwd_input_grad, NVTETensor probs_grad,
                                             NVTEStream stream) {
  const char *op = "nvte_unpermute_with_index_map_bwd";
  return nvte::guarded(op, [&] {
    nvte::unpermute_bwd(op, grad, row_id_map, fwd_input, probs, num_tokens, topK, hidden_size,
                        fwd_input_grad, probs_grad, stream);
  });
}
