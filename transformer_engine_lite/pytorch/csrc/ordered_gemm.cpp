// te_lite::ordered_bmm: the core's nvte_ordered_batched_gemm (gemm.h), the fp32 batched GEMM whose
// every output is an fmaf chain over K in index order from +0, the same bits on the CPU and on
// CUDA/HIP. FP8 attention's emulation (pytorch/attention/dot_product_attention/fp8_attention.py)
// runs its six GEMMs through it. Autograd (its backward is this op again) and the fake kernel are
// registered in Python (te_lite_ops.py).
#include <torch/library.h>

#include <vector>

#include <transformer_engine_lite/gemm.h>

#include "common.h"

namespace te_lite {
namespace {

// a [..., m, K] (transa: [..., K, m]) . b [..., K, n] (transb: [..., n, K]) -> fp32 [..., m, n];
// the leading dims of a and b are equal and form the batch.
at::Tensor ordered_bmm(const at::Tensor &a, const at::Tensor &b, bool transa, bool transb) {
  constexpr const char *kOp = "te_lite::ordered_bmm";
  check_dtype(kOp, "a", a, {at::kFloat});
  check_dtype(kOp, "b", b, {at::kFloat});
  check_min_ndim(kOp, "a", a, 2);
  check_min_ndim(kOp, "b", b, 2);
  check_same_device(kOp, a, "a", b, "b");
  const int64_t nd = a.dim();
  TORCH_CHECK(b.dim() == nd && a.sizes().slice(0, nd - 2) == b.sizes().slice(0, nd - 2), kOp,
              ": arguments 'a' and 'b': expected the same leading (batch) dims, got shapes ",
              a.sizes(), " and ", b.sizes());
  const int64_t m = transa ? a.size(nd - 1) : a.size(nd - 2);
  const int64_t ka = transa ? a.size(nd - 2) : a.size(nd - 1);
  const int64_t kb = transb ? b.size(nd - 1) : b.size(nd - 2);
  const int64_t n = transb ? b.size(nd - 2) : b.size(nd - 1);
  TORCH_CHECK(ka == kb, kOp, ": arguments 'a' and 'b': expected the same K (transa ", transa,
              ", transb ", transb, "), got shapes ", a.sizes(), " and ", b.sizes());
  std::vector<int64_t> out_shape(a.sizes().begin(), a.sizes().end() - 2);
  int64_t batch = 1;
  for (int64_t s : out_shape) batch *= s;
  out_shape.push_back(m);
  out_shape.push_back(n);
  const DeviceContext ctx(a);
  const at::Tensor a3 = a.contiguous().reshape({batch, a.size(nd - 2), a.size(nd - 1)});
  const at::Tensor b3 = b.contiguous().reshape({batch, b.size(nd - 2), b.size(nd - 1)});
  at::Tensor y = at::empty({batch, m, n}, a.options().dtype(at::kFloat));
  TensorWrapper ta, tb, td;
  ta.data(a3);
  tb.data(b3);
  td.data(y);
  check_nvte(nvte_ordered_batched_gemm(ta.get(), tb.get(), td.get(), transa, transb,
                                       ctx.stream()),
             kOp);
  return y.reshape(out_shape);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { m.impl("ordered_bmm", &te_lite::ordered_bmm); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { m.impl("ordered_bmm", &te_lite::ordered_bmm); }
#endif
