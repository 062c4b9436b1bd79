// C API of the GEMM family (gemm.h): every argument check, device routing, then the CPU or GPU
// launch.
#include "transformer_engine_lite/gemm.h"

#include <cmath>
#include <string>

#include "../cast/emit_cpu.h"
#include "../cast/output_spec.h"
#include "../util/api.h"
#include "gemm_cpu.h"
#ifdef NVTE_WITH_GPU
#include "gemm_gpu.h"
#endif

namespace nvte {
namespace {

const char *yes_no(bool b) { return b ? "true" : "false"; }

// Optional tensors (bias, pre_gelu_out) are "empty" when the handle is NULL or has no row-wise data,
// as in TE, which tests the data pointer.
const Tensor *non_empty(const NVTETensor t) {
  const Tensor *p = as_tensor_opt(t);
  return p != nullptr && p->data.has_data() ? p : nullptr;
}

void check_operand(const Tensor &t, const char *arg) {
  check_has_data(t, arg);
  check_ndim_at_least(t.data, arg, 2);
  check_dtype(t.data, arg,
              {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16, kNVTEFloat8E4M3, kNVTEFloat8E5M2,
               kNVTEFloat8E4M3FNUZ, kNVTEFloat8E5M2FNUZ});
  if (is_fp8(t.data.dtype)) {
    NVTE_CHECK_SUPPORTED(t.scaling_mode == NVTE_DELAYED_TENSOR_SCALING, "argument '", arg,
                         "': the CPU GEMM takes per-tensor scaled FP8 operands (scaling mode "
                         "NVTE_DELAYED_TENSOR_SCALING), got scaling mode ",
                         static_cast<int>(t.scaling_mode),
                         t.scaling_mode == NVTE_MXFP8_1D_SCALING ? " (MXFP8)" : "");
    check_fp32_scalar(t.scale_inv, arg, "scale_inv");
  }
}

// Supported operand pairs: the same high-precision dtype, or any two FP8 formats (both are widened to
// bf16 exactly, so E4M3 x E5M2 works as TE's HYBRID backward GEMMs need).
void check_dtype_pair(DType a, DType b) {
  const bool ok = a == b || (is_fp8(a) && is_fp8(b));
  NVTE_CHECK_SUPPORTED(ok, "arguments 'A' and 'B': expected the same dtype, or two FP8 dtypes, got A ",
                       dtype_name(a), " and B ", dtype_name(b),
                       " (mixed high-precision operands are not supported)");
}

void check_hp_dtype(const SimpleTensor &t, const char *arg) {
  check_dtype(t, arg, {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
}

// Both entry points: nvte_cublas_gemm is alpha = 1, beta = accumulate ? 1 : 0. `scaled` names the
// caller in messages (its argument is 'beta', nvte_cublas_gemm's 'accumulate').
NVTEStatus gemm_entry(const char *api, bool scaled, const NVTETensor A, const NVTETensor B,
                      NVTETensor D, const NVTETensor bias, NVTETensor pre_gelu_out, bool transa,
                      bool transb, bool grad, NVTETensor workspace, float alpha, float beta,
                      int math_sm_count, NVTEStream stream) {
  return guarded(api, [&] {
    NVTE_CHECK(std::isfinite(alpha), "argument 'alpha': expected a finite scale, got ", alpha);
    NVTE_CHECK(std::isfinite(beta), "argument 'beta': expected a finite scale, got ", beta);
    const bool accumulate = beta != 0.0f;  // D is read only then (beta = 0: cuBLAS does not read C)
    const Tensor &a = as_tensor(A, "A");
    const Tensor &b = as_tensor(B, "B");
    const Tensor &d = as_tensor(D, "D");
    const Tensor *bias_t = non_empty(bias);
    const Tensor *pre_t = non_empty(pre_gelu_out);
    const Tensor *ws_t = as_tensor_opt(workspace);

    // ---- operands and shapes (column-major view: m = rows of op(A), see gemm.h)
    check_operand(a, "A");
    check_operand(b, "B");
    check_dtype_pair(a.data.dtype, b.data.dtype);
    const size_t m = transa ? a.data.rows() : a.data.cols();
    const size_t k = transa ? a.data.cols() : a.data.rows();
    const size_t n = transb ? b.data.cols() : b.data.rows();
    const size_t kb = transb ? b.data.rows() : b.data.cols();
    NVTE_CHECK(kb == k, "argument 'B': expected op(B) of shape [n, k] with k = ", k, " (A ",
               a.data.describe(), ", transa=", yes_no(transa), " gives op(A) [k, m] = [", k, ", ",
               m, "]), got B ", b.data.describe(), " with transb=", yes_no(transb),
               ", i.e. op(B) [", n, ", ", kb, "]");

    // ---- output
    check_has_data(d, "D");
    check_ndim_at_least(d.data, "D", 2);
    check_dtype(d.data, "D",
                {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16, kNVTEFloat8E4M3, kNVTEFloat8E5M2,
                 kNVTEFloat8E4M3FNUZ, kNVTEFloat8E5M2FNUZ});
    NVTE_CHECK(d.data.rows() == n && d.data.cols() == m, "argument 'D': expected shape [n, m] = [",
               n, ", ", m, "] (leading dims may be split), got ", shape_str(d.data.shape));
    NVTE_CHECK_SUPPORTED(d.scaling_mode == NVTE_DELAYED_TENSOR_SCALING,
                         "argument 'D': the CPU GEMM writes per-tensor scaled outputs (scaling mode "
                         "NVTE_DELAYED_TENSOR_SCALING), got scaling mode ",
                         static_cast<int>(d.scaling_mode));
    if (scaled) {
      NVTE_CHECK_SUPPORTED(!(accumulate && is_fp8(d.data.dtype)),
                           "argument 'beta': accumulating into an FP8 output is not supported "
                           "(expected beta = 0 with an FP8 D, or D of dtype float32, float16 or "
                           "bfloat16; got beta = ", beta, " and D of dtype ",
                           dtype_name(d.data.dtype), ")");
    } else {
      NVTE_CHECK_SUPPORTED(!(accumulate && is_fp8(d.data.dtype)),
                           "argument 'accumulate': accumulating into an FP8 output is not "
                           "supported (expected D of dtype float32, float16 or bfloat16 with "
                           "accumulate=true, got ", dtype_name(d.data.dtype), ")");
    }

    // ---- epilogue tensors
    if (pre_t != nullptr) {
      check_hp_dtype(pre_t->data, "pre_gelu_out");
      NVTE_CHECK(pre_t->data.ndim() >= 2 && pre_t->data.rows() == n && pre_t->data.cols() == m,
                 "argument 'pre_gelu_out': expected shape [n, m] = [", n, ", ", m,
                 "] (the shape of D), got ", shape_str(pre_t->data.shape));
    }
    if (bias_t != nullptr) {
      check_hp_dtype(bias_t->data, "bias");
      // Forward and dGELU bias: one value per column of D ([m]); bias gradient of op(B): [n].
      const bool grad_of_b = grad && pre_t == nullptr;
      const size_t len = grad_of_b ? n : m;
      NVTE_CHECK(bias_t->data.shape == std::vector<size_t>{len}, "argument 'bias': expected shape [",
                 len, "] (", grad_of_b ? "n: bias gradient of op(B)" : "m: one value per column of D",
                 "), got ", shape_str(bias_t->data.shape));
    }
    // Outputs must not share memory with anything else the GEMM reads or writes: oneDNN and the
    // epilogue read inputs while writing outputs.
    check_no_overlap(a.data, "A", d.data, "D");
    check_no_overlap(b.data, "B", d.data, "D");
    if (pre_t != nullptr) {
      check_no_overlap(d.data, "D", pre_t->data, "pre_gelu_out");
      if (!grad) {
        check_no_overlap(a.data, "A", pre_t->data, "pre_gelu_out");
        check_no_overlap(b.data, "B", pre_t->data, "pre_gelu_out");
      }
    }
    if (bias_t != nullptr) {
      check_no_overlap(d.data, "D", bias_t->data, "bias");
      if (pre_t != nullptr) check_no_overlap(pre_t->data, "pre_gelu_out", bias_t->data, "bias");
      if (grad) {
        check_no_overlap(a.data, "A", bias_t->data, "bias");
        check_no_overlap(b.data, "B", bias_t->data, "bias");
      }
    }

    // ---- device routing, before any scale is dereferenced on the host
    const NVTEDevice device = check_same_device({{&a, "A"},
                                                 {&b, "B"},
                                                 {&d, "D"},
                                                 {bias_t, "bias"},
                                                 {pre_t, "pre_gelu_out"},
                                                 {ws_t, "workspace"}});
    const bool gpu = use_gpu(device, api);
    // FP8 D: scale, amax, scale_inv, transposed copy; validation reads no tensor memory.
    const OutputSpec d_spec = validate_output(d, "D", d.data.shape);
    if (gpu) {
#ifdef NVTE_WITH_GPU
      gpu::GemmArgs g;
      g.A = &a;
      g.B = &b;
      g.D = &d;
      g.bias = bias_t;
      g.pre_gelu_out = pre_t;
      g.workspace = ws_t != nullptr && ws_t->data.has_data() ? ws_t : nullptr;
      g.m = m;
      g.n = n;
      g.k = k;
      g.transa = transa;
      g.transb = transb;
      g.grad = grad;
      g.accumulate = accumulate;
      g.alpha = alpha;
      g.beta = beta;
      g.math_sm_count = math_sm_count;
      gpu::launch_gemm(g, d_spec, stream);
#endif
      return;
    }
    // CPU: oneDNN manages its own scratch and threads.
    (void)math_sm_count;
    (void)stream;
    const OutputEmitter em(d, d_spec);
#ifndef NVTE_WITH_ONEDNN
    NVTE_CHECK_SUPPORTED(false, api, ": this build has no CPU GEMM backend (expected a "
                                "build with oneDNN: configure with NVTE_WITH_ONEDNN=ON and install "
                                "onednn-cpu-gomp + onednn-devel-cpu-gomp, got NVTE_WITH_ONEDNN=OFF)");
#endif

    gemm::GemmParams p;
    p.A = &a;
    p.B = &b;
    p.D = &d;
    p.bias = bias_t;
    p.pre_gelu_out = pre_t;
    p.m = m;
    p.n = n;
    p.k = k;
    p.transa = transa;
    p.transb = transb;
    p.accumulate = accumulate;
    p.alpha = alpha;
    p.beta = beta;
    p.scale_inv_a = is_fp8(a.data.dtype) ? *a.scale_inv.ptr<const float>() : 1.0f;
    p.scale_inv_b = is_fp8(b.data.dtype) ? *b.scale_inv.ptr<const float>() : 1.0f;
    if (grad) {
      gemm::launch_gemm_bwd(p, em);
    } else {
      gemm::launch_gemm_fwd(p, em);
    }
  });
}

}  // namespace
}  // namespace nvte

// Accumulation is always FP32 (ARCHITECTURE.md §5), on every device: use_split_accumulator has
// nothing to select.
NVTEStatus nvte_cublas_gemm(const NVTETensor A, const NVTETensor B, NVTETensor D,
                            const NVTETensor bias, NVTETensor pre_gelu_out, bool transa,
                            bool transb, bool grad, NVTETensor workspace, bool accumulate,
                            bool use_split_accumulator, int math_sm_count, NVTEStream stream) {
  (void)use_split_accumulator;
  return nvte::gemm_entry("nvte_cublas_gemm", false, A, B, D, bias, pre_gelu_out, transa, transb,
                          grad, workspace, 1.0f, accumulate ? 1.0f : 0.0f, math_sm_count, stream);
}

NVTEStatus nvte_cublas_gemm_scaled(const NVTETensor A, const NVTETensor B, NVTETensor D,
                                   const NVTETensor bias, NVTETensor pre_gelu_out, bool transa,
                                   bool transb, bool grad, NVTETensor workspace, float alpha,
                                   float beta, bool use_split_accumulator, int math_sm_count,
                                   NVTEStream stream) {
  (void)use_split_accumulator;
  return nvte::gemm_entry("nvte_cublas_gemm_scaled", true, A, B, D, bias, pre_gelu_out, transa,
                          transb, grad, workspace, alpha, beta, math_sm_count, stream);
}
