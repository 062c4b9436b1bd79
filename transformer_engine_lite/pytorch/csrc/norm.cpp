// te_lite normalization ops: LayerNorm and RMSNorm forward (optionally FP8 output) and backward.
// The core's workspace protocol (query, allocate, call) is handled here; callers never see it.
#include <torch/library.h>

#include <transformer_engine_lite/normalization.h>

#include "common.h"

namespace te_lite {
namespace {

// x [..., hidden] in fp32/fp16/bf16; gamma (and beta) [hidden] on x's device.
void check_norm_args(const char *op, const at::Tensor &x, const at::Tensor &gamma,
                     const at::Tensor *beta) {
  check_dtype(op, "x", x, kHighPrecision);
  check_min_ndim(op, "x", x, 1);
  const int64_t hidden = x.size(-1);
  for (const auto &[t, arg] : {std::pair{&gamma, "gamma"}, std::pair{beta, "beta"}}) {
    if (t == nullptr) continue;
    check_dtype(op, arg, *t, kHighPrecision);
    TORCH_CHECK(t->dim() == 1 && t->size(0) == hidden, op, ": argument '", arg,
                "': expected shape [", hidden, "] (the last dim of x ", x.sizes(), "), got ",
                t->sizes());
    check_same_device(op, x, "x", *t, arg);
  }
}

// Runs `call(workspace)` twice: a size query with an empty workspace, then with the buffer.
template <typename Call>
void with_workspace(const char *op, const at::Tensor &like, Call &&call) {
  TensorWrapper query;
  check_nvte(call(query), op);
  const at::Tensor buffer = allocate_workspace(query, like);
  TensorWrapper workspace;
  workspace.data(buffer);
  check_nvte(call(workspace), op);
}

// z (x's shape, out dtype) with its FP8 side buffers when `out` is FP8.
struct NormOutput {
  at::Tensor z, amax, scale_inv;
  TensorWrapper wrapper;
  NormOutput(const at::Tensor &x, at::ScalarType out, const std::optional<at::Tensor> &scale)
      : z(at::empty(x.sizes(), x.options().dtype(out))),
        amax(fp32_buffer(x, is_fp8(out))),
        scale_inv(fp32_buffer(x, is_fp8(out))) {
    wrapper.data(z);
    if (is_fp8(out)) wrapper.scale(scale->contiguous()).amax(amax).scale_inv(scale_inv);
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> layernorm_fwd(
    const at::Tensor &x_, const at::Tensor &gamma_, const at::Tensor &beta_, double eps,
    bool zero_centered_gamma, std::optional<at::ScalarType> out_dtype,
    const std::optional<at::Tensor> &scale) {
  constexpr const char *kOp = "te_lite::layernorm_fwd";
  check_norm_args(kOp, x_, gamma_, &beta_);
  const at::ScalarType out = output_dtype(kOp, x_, out_dtype, scale);
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous(), gamma = gamma_.contiguous(), beta = beta_.contiguous();
  const int64_t rows = x.numel() / x.size(-1);
  NormOutput z(x, out, scale);
  at::Tensor mu = at::empty({rows}, x.options().dtype(at::kFloat));
  at::Tensor rsigma = at::empty({rows}, x.options().dtype(at::kFloat));
  TensorWrapper tx, tg, tb, tmu, trs;
  tx.data(x);
  tg.data(gamma);
  tb.data(beta);
  tmu.data(mu);
  trs.data(rsigma);
  with_workspace(kOp, x, [&](const TensorWrapper &ws) {
    return nvte_layernorm_fwd(tx.get(), tg.get(), tb.get(), static_cast<float>(eps),
                              z.wrapper.get(), tmu.get(), trs.get(), ws.get(), ctx.sm_count(),
                              zero_centered_gamma, ctx.stream());
  });
  return {z.z, mu, rsigma, z.amax, z.scale_inv};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layernorm_bwd(
    const at::Tensor &dz_, const at::Tensor &x_, const at::Tensor &mu_,
    const at::Tensor &rsigma_, const at::Tensor &gamma_, bool zero_centered_gamma) {
  constexpr const char *kOp = "te_lite::layernorm_bwd";
  check_norm_args(kOp, x_, gamma_, nullptr);
  check_dtype(kOp, "dz", dz_, kHighPrecision);
  TORCH_CHECK(dz_.sizes() == x_.sizes(), kOp, ": argument 'dz': expected the shape of x ",
              x_.sizes(), ", got ", dz_.sizes());
  for (const auto &[t, arg] :
       {std::pair{&dz_, "dz"}, std::pair{&mu_, "mu"}, std::pair{&rsigma_, "rsigma"}}) {
    check_same_device(kOp, x_, "x", *t, arg);
  }
  const DeviceContext ctx(x_);
  const at::Tensor dz = dz_.contiguous(), x = x_.contiguous(), mu = mu_.contiguous(),
                   rsigma = rsigma_.contiguous(), gamma = gamma_.contiguous();
  at::Tensor dx = at::empty(x.sizes(), x.options());
  at::Tensor dgamma = at::empty(gamma.sizes(), gamma.options());
  at::Tensor dbeta = at::empty(gamma.sizes(), gamma.options());
  TensorWrapper tdz, tx, tmu, trs, tg, tdx, tdg, tdb;
  tdz.data(dz);
  tx.data(x);
  tmu.data(mu);
  trs.data(rsigma);
  tg.data(gamma);
  tdx.data(dx);
  tdg.data(dgamma);
  tdb.data(dbeta);
  with_workspace(kOp, x, [&](const TensorWrapper &ws) {
    return nvte_layernorm_bwd(tdz.get(), tx.get(), tmu.get(), trs.get(), tg.get(), tdx.get(),
                              tdg.get(), tdb.get(), ws.get(), ctx.sm_count(), zero_centered_gamma,
                              ctx.stream());
  });
  return {dx, dgamma, dbeta};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rmsnorm_fwd(
    const at::Tensor &x_, const at::Tensor &gamma_, double eps, bool zero_centered_gamma,
    std::optional<at::ScalarType> out_dtype, const std::optional<at::Tensor> &scale) {
  constexpr const char *kOp = "te_lite::rmsnorm_fwd";
  check_norm_args(kOp, x_, gamma_, nullptr);
  const at::ScalarType out = output_dtype(kOp, x_, out_dtype, scale);
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous(), gamma = gamma_.contiguous();
  const int64_t rows = x.numel() / x.size(-1);
  NormOutput z(x, out, scale);
  at::Tensor rsigma = at::empty({rows}, x.options().dtype(at::kFloat));
  TensorWrapper tx, tg, trs;
  tx.data(x);
  tg.data(gamma);
  trs.data(rsigma);
  with_workspace(kOp, x, [&](const TensorWrapper &ws) {
    return nvte_rmsnorm_fwd(tx.get(), tg.get(), static_cast<float>(eps), z.wrapper.get(),
                            trs.get(), ws.get(), ctx.sm_count(), zero_centered_gamma, ctx.stream());
  });
  return {z.z, rsigma, z.amax, z.scale_inv};
}

// rmsnorm_bwd, and rmsnorm_bwd_add when add_ is given (dx += add inside the kernel).
std::tuple<at::Tensor, at::Tensor> rmsnorm_bwd_impl(const char *kOp, const at::Tensor &dz_,
                                                    const at::Tensor &x_, const at::Tensor *add_,
                                                    const at::Tensor &rsigma_,
                                                    const at::Tensor &gamma_,
                                                    bool zero_centered_gamma) {
  check_norm_args(kOp, x_, gamma_, nullptr);
  if (add_ != nullptr) {
    check_dtype(kOp, "add", *add_, kHighPrecision);
    TORCH_CHECK(add_->sizes() == x_.sizes(), kOp, ": argument 'add': expected the shape of x ",
                x_.sizes(), ", got ", add_->sizes());
    check_same_device(kOp, x_, "x", *add_, "add");
  }
  check_dtype(kOp, "dz", dz_, kHighPrecision);
  TORCH_CHECK(dz_.sizes() == x_.sizes(), kOp, ": argument 'dz': expected the shape of x ",
              x_.sizes(), ", got ", dz_.sizes());
  check_same_device(kOp, x_, "x", dz_, "dz");
  check_same_device(kOp, x_, "x", rsigma_, "rsigma");
  const DeviceContext ctx(x_);
  const at::Tensor dz = dz_.contiguous(), x = x_.contiguous(), rsigma = rsigma_.contiguous(),
                   gamma = gamma_.contiguous();
  at::Tensor dx = at::empty(x.sizes(), x.options());
  at::Tensor dgamma = at::empty(gamma.sizes(), gamma.options());
  TensorWrapper tdz, tx, trs, tg, tdx, tdg;
  tdz.data(dz);
  tx.data(x);
  trs.data(rsigma);
  tg.data(gamma);
  tdx.data(dx);
  tdg.data(dgamma);
  at::Tensor add;  // the contiguous copy stays alive during the call
  TensorWrapper tadd;
  if (add_ != nullptr) {
    add = add_->contiguous();
    tadd.data(add);
  }
  with_workspace(kOp, x, [&](const TensorWrapper &ws) {
    if (add_ != nullptr) {
      return nvte_rmsnorm_bwd_add(tdz.get(), tx.get(), tadd.get(), trs.get(), tg.get(), tdx.get(),
                                  tdg.get(), ws.get(), ctx.sm_count(), zero_centered_gamma,
                                  ctx.stream());
    }
    return nvte_rmsnorm_bwd(tdz.get(), tx.get(), trs.get(), tg.get(), tdx.get(), tdg.get(),
                            ws.get(), ctx.sm_count(), zero_centered_gamma, ctx.stream());
  });
  return {dx, dgamma};
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_bwd(const at::Tensor &dz, const at::Tensor &x,
                                               const at::Tensor &rsigma, const at::Tensor &gamma,
                                               bool zero_centered_gamma) {
  return rmsnorm_bwd_impl("te_lite::rmsnorm_bwd", dz, x, nullptr, rsigma, gamma,
                          zero_centered_gamma);
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_bwd_add(const at::Tensor &dz, const at::Tensor &x,
                                                   const at::Tensor &add, const at::Tensor &rsigma,
                                                   const at::Tensor &gamma,
                                                   bool zero_centered_gamma) {
  return rmsnorm_bwd_impl("te_lite::rmsnorm_bwd_add", dz, x, &add, rsigma, gamma,
                          zero_centered_gamma);
}

void register_impls(torch::Library &m) {
  m.impl("layernorm_fwd", &layernorm_fwd);
  m.impl("layernorm_bwd", &layernorm_bwd);
  m.impl("rmsnorm_fwd", &rmsnorm_fwd);
  m.impl("rmsnorm_bwd", &rmsnorm_bwd);
  m.impl("rmsnorm_bwd_add", &rmsnorm_bwd_add);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
