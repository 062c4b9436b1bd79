// Validation (everything before any byte is written), workspace queries and device routing of the
// norm C API; the kernels in norm_cpu.cpp see only checked params.
#include "norm_api.h"

#include <cmath>

#include "../cast/emit_cpu.h"
#include "../cast/output_spec.h"
#include "../util/tensor.h"
#include "norm_cpu.h"
#ifdef NVTE_WITH_GPU
#include "norm_gpu.h"
#endif

namespace nvte {

namespace {

constexpr std::initializer_list<DType> kHighPrecision = {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16};

// x / dz / dx: row-wise data in fp32, fp16 or bf16; x fixes [rows, hidden].
void check_activation(const Tensor &t, const char *arg) {
  check_has_data(t, arg);
  check_dtype(t.data, arg, kHighPrecision);
}

void check_input_x(const Tensor &x) {
  check_activation(x, "x");
  check_ndim_at_least(x.data, "x", 1);
  NVTE_CHECK(x.data.cols() > 0, "argument 'x': expected a hidden size (last dim) > 0, got ",
             shape_str(x.data.shape));
}

// gamma: [hidden], fp32 or x's dtype (TE's weight types).
void check_gamma(const Tensor &g, const Tensor &x) {
  check_has_data(g, "gamma");
  if (x.data.dtype == kNVTEFloat32) {
    check_dtype(g.data, "gamma", {kNVTEFloat32});
  } else {
    check_dtype(g.data, "gamma", {kNVTEFloat32, x.data.dtype});
  }
  check_shape(g.data, "gamma", {x.data.cols()});
}

// beta / dgamma / dbeta: like gamma, in gamma's dtype.
void check_like_gamma(const Tensor &t, const char *arg, const Tensor &g) {
  check_has_data(t, arg);
  NVTE_CHECK(t.data.dtype == g.data.dtype, "argument '", arg, "': expected gamma's dtype ",
             dtype_name(g.data.dtype), ", got ", dtype_name(t.data.dtype));
  check_shape(t.data, arg, g.data.shape);
}

// mu / rsigma: fp32 [rows].
void check_stats(const Tensor &t, const char *arg, const Tensor &x) {
  check_has_data(t, arg);
  check_dtype(t.data, arg, {kNVTEFloat32});
  check_shape(t.data, arg, {x.data.rows()});
}

// No output may share memory with an input or another output: rows are read and written in one
// pass, and a dtype change (bf16 x, fp32 z) would overwrite rows not yet read. Null entries are
// skipped.
using Named = std::pair<const SimpleTensor *, const char *>;
void check_outputs_disjoint(std::initializer_list<Named> inputs,
                            std::initializer_list<Named> outputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    if (o->first == nullptr) continue;
    for (const auto &[in, in_name] : inputs) {
      if (in != nullptr) check_no_overlap(*in, in_name, *o->first, o->second);
    }
    for (auto prev = outputs.begin(); prev != o; ++prev) {
      if (prev->first != nullptr) {
        check_no_overlap(*prev->first, prev->second, *o->first, o->second);
      }
    }
  }
}

// Routes on the common device of every tensor given (true: run on the GPU); the workspace only
// counts once it has memory (a query may pass a fresh handle whose device tag was never set).
bool route(const char *op, std::initializer_list<std::pair<const Tensor *, const char *>> ts) {
  return use_gpu(check_same_device(ts), op);
}

}  // namespace

void norm_fwd_api(NormKind kind, const char *op, const NVTETensor x_h, const NVTETensor gamma_h,
                  const NVTETensor beta_h, float epsilon, NVTETensor z_h, NVTETensor mu_h,
                  NVTETensor rsigma_h, NVTETensor workspace_h, bool zero_centered_gamma,
                  void *stream) {
  const bool ln = kind == NormKind::kLayerNorm;
  const Tensor &x = as_tensor(x_h, "x");
  const Tensor &gamma = as_tensor(gamma_h, "gamma");
  const Tensor *beta = ln ? &as_tensor(beta_h, "beta") : nullptr;
  const Tensor &z = as_tensor(z_h, "z");
  const Tensor *mu = ln ? &as_tensor(mu_h, "mu") : nullptr;
  const Tensor &rsigma = as_tensor(rsigma_h, "rsigma");
  Tensor &workspace = as_tensor_mut(workspace_h, "workspace");

  check_input_x(x);
  check_gamma(gamma, x);
  if (ln) check_like_gamma(*beta, "beta", gamma);
  // TE accepts any epsilon; a negative or non-finite one only turns rows into NaN: refused here.
  NVTE_CHECK(std::isfinite(epsilon) && epsilon >= 0.0f,
             "argument 'epsilon': expected a finite value >= 0, got ", epsilon);
  if (ln) check_stats(*mu, "mu", x);
  check_stats(rsigma, "rsigma", x);
  // z: any output dtype / scaling mode. Validation only: the CPU emitter reads the per-tensor
  // scale, which may be device memory, so it is built after routing.
  const OutputSpec z_spec = validate_output(z, "z", x.data.shape);
  check_outputs_disjoint(
      {{&x.data, "x"}, {&gamma.data, "gamma"}, {ln ? &beta->data : nullptr, "beta"}},
      {{&z.data, "z"}, {&z.columnwise_data, "z (column-wise)"}, {ln ? &mu->data : nullptr, "mu"},
       {&rsigma.data, "rsigma"}});
  const bool gpu = route(op, {{&x, "x"}, {&gamma, "gamma"}, {beta, "beta"}, {&z, "z"}, {mu, "mu"},
                              {&rsigma, "rsigma"},
                              {workspace.data.has_data() ? &workspace : nullptr, "workspace"}});

  if (!workspace.data.has_data()) {
    // Neither forward needs scratch (the GPU stages MXFP8 z in stream-ordered memory of its own);
    // TE's protocol still wants a non-empty buffer.
    workspace.data.shape = {1};
    workspace.data.dtype = kNVTEByte;
    return;
  }

  NormFwdParams p;
  p.kind = kind;
  p.rows = x.data.rows();
  p.hidden = x.data.cols();
  p.x = x.data.dptr;
  p.x_dtype = x.data.dtype;
  p.gamma = gamma.data.dptr;
  p.beta = ln ? beta->data.dptr : nullptr;
  p.w_dtype = gamma.data.dtype;
  p.epsilon = epsilon;
  p.zero_centered_gamma = zero_centered_gamma;
  p.mu = ln ? mu->data.ptr<float>() : nullptr;
  p.rsigma = rsigma.data.ptr<float>();
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_norm_fwd(p, z, z_spec, stream);
#endif
    return;
  }
  (void)stream;
  launch_norm_fwd(p, OutputEmitter(z, z_spec));
}

void norm_bwd_api(NormKind kind, const char *op, const NVTETensor dz_h, const NVTETensor x_h,
                  const NVTETensor mu_h, const NVTETensor rsigma_h, const NVTETensor gamma_h,
                  NVTETensor dx_h, NVTETensor dgamma_h, NVTETensor dbeta_h,
                  NVTETensor workspace_h, bool zero_centered_gamma, void *stream,
                  const NVTETensor add_h) {
  const bool ln = kind == NormKind::kLayerNorm;
  const Tensor &dz = as_tensor(dz_h, "dz");
  const Tensor &x = as_tensor(x_h, "x");
  const Tensor *mu = ln ? &as_tensor(mu_h, "mu") : nullptr;
  const Tensor &rsigma = as_tensor(rsigma_h, "rsigma");
  const Tensor &gamma = as_tensor(gamma_h, "gamma");
  const Tensor &dx = as_tensor(dx_h, "dx");
  const Tensor &dgamma = as_tensor(dgamma_h, "dgamma");
  const Tensor *dbeta = ln ? &as_tensor(dbeta_h, "dbeta") : nullptr;
  Tensor &workspace = as_tensor_mut(workspace_h, "workspace");
  const Tensor *add = add_h != nullptr ? &as_tensor(add_h, "add") : nullptr;

  check_input_x(x);
  check_activation(dz, "dz");
  check_same_shape(x.data, "x", dz.data, "dz");
  if (add != nullptr) {
    check_activation(*add, "add");
    check_same_shape(x.data, "x", add->data, "add");
  }
  if (ln) check_stats(*mu, "mu", x);
  check_stats(rsigma, "rsigma", x);
  check_gamma(gamma, x);
  check_activation(dx, "dx");
  check_same_shape(x.data, "x", dx.data, "dx");
  check_like_gamma(dgamma, "dgamma", gamma);
  if (ln) check_like_gamma(*dbeta, "dbeta", gamma);
  check_outputs_disjoint({{&dz.data, "dz"}, {&x.data, "x"}, {ln ? &mu->data : nullptr, "mu"},
                          {&rsigma.data, "rsigma"}, {&gamma.data, "gamma"},
                          {add != nullptr ? &add->data : nullptr, "add"}},
                         {{&dx.data, "dx"}, {&dgamma.data, "dgamma"},
                          {ln ? &dbeta->data : nullptr, "dbeta"}, {&workspace.data, "workspace"}});
  const bool gpu =
      route(op, {{&dz, "dz"}, {&x, "x"}, {mu, "mu"}, {&rsigma, "rsigma"}, {&gamma, "gamma"},
                 {add, "add"}, {&dx, "dx"}, {&dgamma, "dgamma"}, {dbeta, "dbeta"},
                 {workspace.data.has_data() ? &workspace : nullptr, "workspace"}});

  const size_t rows = x.data.rows(), hidden = x.data.cols();
  const size_t chunks = norm_bwd_chunks(rows);
  const std::vector<size_t> ws_shape = {chunks, norm_bwd_partials_per_chunk(kind, hidden)};
  if (!workspace.data.has_data()) {
    workspace.data.shape = ws_shape;
    workspace.data.dtype = kNVTEFloat32;
    return;
  }
  // The shape fixes the reduction order, so only the queried one is accepted.
  check_dtype(workspace.data, "workspace", {kNVTEFloat32});
  NVTE_CHECK(workspace.data.shape == ws_shape, "argument 'workspace': expected the queried shape ",
             shape_str(ws_shape), ", got ", shape_str(workspace.data.shape));

  NormBwdParams p;
  p.kind = kind;
  p.rows = rows;
  p.hidden = hidden;
  p.dz = dz.data.dptr;
  p.dz_dtype = dz.data.dtype;
  p.x = x.data.dptr;
  p.x_dtype = x.data.dtype;
  p.mu = ln ? mu->data.ptr<const float>() : nullptr;
  p.rsigma = rsigma.data.ptr<const float>();
  p.gamma = gamma.data.dptr;
  p.w_dtype = gamma.data.dtype;
  p.zero_centered_gamma = zero_centered_gamma;
  p.dx = dx.data.dptr;
  p.dx_dtype = dx.data.dtype;
  if (add != nullptr) {
    p.add = add->data.dptr;
    p.add_dtype = add->data.dtype;
  }
  p.dgamma = dgamma.data.dptr;
  p.dbeta = ln ? dbeta->data.dptr : nullptr;
  p.workspace = workspace.data.ptr<float>();
  p.chunks = chunks;
  if (gpu) {
#ifdef NVTE_WITH_GPU
    gpu::launch_norm_bwd(p, stream);
#endif
    return;
  }
  (void)stream;
  launch_norm_bwd(p);
}

}  // namespace nvte
