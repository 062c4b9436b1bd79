// C API of the scaled softmax family (softmax.h): argument checks, device routing, CPU/GPU launch.
#include "transformer_engine_lite/softmax.h"

#include <cmath>

#include "../util/api.h"
#include "softmax_cpu.h"
#ifdef NVTE_WITH_GPU
#include "softmax_gpu.h"
#endif

namespace nvte {
namespace {

// Upper-triangular softmax takes [attn_batches, sq, sq]; every other variant [b, h, sq, sk].
void check_layout(const SimpleTensor &t, const char *arg, SoftmaxMask kind) {
  if (kind == SoftmaxMask::kUpperTriang) {
    check_ndim(t, arg, 3);
    NVTE_CHECK(t.shape[1] == t.shape[2], "argument '", arg,
               "': expected [attn_batches, sq, sq] (square in the last two dims), got ",
               shape_str(t.shape));
  } else {
    check_ndim(t, arg, 4);
  }
}

SoftmaxParams make_params(const SimpleTensor &t, SoftmaxMask kind, float scale) {
  SoftmaxParams p;
  p.rows = t.rows();
  p.cols = t.cols();
  p.sq = t.shape[t.ndim() - 2];
  p.heads = kind == SoftmaxMask::kUpperTriang ? 1 : t.shape[1];
  p.scale = scale;
  p.mask = kind;
  return p;
}

void check_scale(float scale) {
  NVTE_CHECK(std::isfinite(scale), "argument 'scale_factor': expected a finite value, got ", scale);
}

void check_same_dtype(const SimpleTensor &ref, const char *ref_name, const SimpleTensor &t,
                      const char *arg) {
  NVTE_CHECK(t.dtype == ref.dtype, "argument '", arg, "': expected the dtype of '", ref_name, "' (",
             dtype_name(ref.dtype), "), got ", dtype_name(t.dtype));
}

// Rows are processed in parallel, each loaded whole before it is stored: an output may be the very
// buffer of an input (same pointer; shape and dtype are checked equal), but not partly overlap it.
void check_alias_or_disjoint(const SimpleTensor &in, const char *arg_in, const SimpleTensor &out,
                             const char *arg_out) {
  if (in.dptr != out.dptr) check_no_overlap(in, arg_in, out, arg_out);
}

NVTEStatus softmax_fwd(const char *op, SoftmaxMask kind, const NVTETensor input,
                       const NVTETensor mask, NVTETensor softmax_results, float scale,
                       NVTEStream stream) {
  return guarded(op, [&] {
    const Tensor &in = as_tensor(input, "input");
    const Tensor &out = as_tensor(softmax_results, "softmax_results");
    const Tensor *m = kind == SoftmaxMask::kByte ? &as_tensor(mask, "mask") : nullptr;
    check_has_data(in, "input");
    check_has_data(out, "softmax_results");
    check_dtype(in.data, "input", {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
    check_layout(in.data, "input", kind);
    check_same_dtype(in.data, "input", out.data, "softmax_results");
    check_same_shape(in.data, "input", out.data, "softmax_results");
    check_scale(scale);
    SoftmaxParams p = make_params(in.data, kind, scale);
    if (m != nullptr) {
      check_has_data(*m, "mask");
      check_dtype(m->data, "mask", {kNVTEByte});
      const std::vector<size_t> &s = in.data.shape, &ms = m->data.shape;
      NVTE_CHECK(ms.size() == 4 && (ms[0] == s[0] || ms[0] == 1) && ms[1] == 1 && ms[2] == s[2] &&
                     ms[3] == s[3],
                 "argument 'mask': expected shape [", s[0], " or 1, 1, ", s[2], ", ", s[3],
                 "] (input ", shape_str(s), " broadcast over heads), got ", shape_str(ms));
      p.mask_ptr = m->data.ptr<const uint8_t>();
      p.mask_batches = ms[0];
    }
    check_alias_or_disjoint(in.data, "input", out.data, "softmax_results");
    if (m != nullptr) check_no_overlap(m->data, "mask", out.data, "softmax_results");
    const NVTEDevice device =
        check_same_device({{&in, "input"}, {m, "mask"}, {&out, "softmax_results"}});
    const bool gpu = use_gpu(device, op);
    if (in.data.numel() == 0) return;  // the other dims of an empty tensor may be anything
    if (gpu) {
#ifdef NVTE_WITH_GPU
      gpu::launch_softmax_fwd(p, in.data.dtype, in.data.dptr, out.data.dptr, stream);
#endif
      return;
    }
    (void)stream;
    launch_softmax_fwd(p, in.data.dtype, in.data.dptr, out.data.dptr);
  });
}

NVTEStatus softmax_bwd(const char *op, SoftmaxMask kind, const NVTETensor incoming_grads,
                       const NVTETensor softmax_results, NVTETensor output_grads, float scale,
                       NVTEStream stream) {
  return guarded(op, [&] {
    const Tensor &dy = as_tensor(incoming_grads, "incoming_grads");
    const Tensor &y = as_tensor(softmax_results, "softmax_results");
    const Tensor &dx = as_tensor(output_grads, "output_grads");
    check_has_data(dy, "incoming_grads");
    check_has_data(y, "softmax_results");
    check_has_data(dx, "output_grads");
    check_dtype(dy.data, "incoming_grads", {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
    check_layout(dy.data, "incoming_grads", kind);
    check_same_dtype(dy.data, "incoming_grads", y.data, "softmax_results");
    check_same_shape(dy.data, "incoming_grads", y.data, "softmax_results");
    check_same_dtype(dy.data, "incoming_grads", dx.data, "output_grads");
    check_same_shape(dy.data, "incoming_grads", dx.data, "output_grads");
    check_scale(scale);
    check_alias_or_disjoint(dy.data, "incoming_grads", dx.data, "output_grads");
    check_alias_or_disjoint(y.data, "softmax_results", dx.data, "output_grads");
    const NVTEDevice device = check_same_device(
        {{&dy, "incoming_grads"}, {&y, "softmax_results"}, {&dx, "output_grads"}});
    const bool gpu = use_gpu(device, op);
    // The byte mask is not needed backward: y is 0 at masked positions, so the formula gives 0.
    const SoftmaxMask bwd_kind = kind == SoftmaxMask::kByte ? SoftmaxMask::kNone : kind;
    const SoftmaxParams p = make_params(dy.data, bwd_kind, scale);
    if (dy.data.numel() == 0) return;  // the other dims of an empty tensor may be anything
    if (gpu) {
#ifdef NVTE_WITH_GPU
      gpu::launch_softmax_bwd(p, dy.data.dtype, dy.data.dptr, y.data.dptr, dx.data.dptr, stream);
#endif
      return;
    }
    (void)stream;
    launch_softmax_bwd(p, dy.data.dtype, dy.data.dptr, y.data.dptr, dx.data.dptr);
  });
}

}  // namespace
}  // namespace nvte

using nvte::SoftmaxMask;
using nvte::softmax_bwd;
using nvte::softmax_fwd;

NVTEStatus nvte_scaled_softmax_forward(const NVTETensor input, NVTETensor softmax_results,
                                       float scale_factor, NVTEStream stream) {
  return softmax_fwd("nvte_scaled_softmax_forward", SoftmaxMask::kNone, input, nullptr,
                     softmax_results, scale_factor, stream);
}
NVTEStatus nvte_scaled_softmax_backward(const NVTETensor incoming_grads,
                                        const NVTETensor softmax_results, NVTETensor output_grads,
                                        float scale_factor, NVTEStream stream) {
  return softmax_bwd("nvte_scaled_softmax_backward", SoftmaxMask::kNone, incoming_grads,
                     softmax_results, output_grads, scale_factor, stream);
}

NVTEStatus nvte_scaled_masked_softmax_forward(const NVTETensor input, const NVTETensor mask,
                                              NVTETensor softmax_results, float scale_factor,
                                              NVTEStream stream) {
  return softmax_fwd("nvte_scaled_masked_softmax_forward", SoftmaxMask::kByte, input, mask,
                     softmax_results, scale_factor, stream);
}
NVTEStatus nvte_scaled_masked_softmax_backward(const NVTETensor incoming_grads,
                                               const NVTETensor softmax_results,
                                               NVTETensor output_grads, float scale_factor,
                                               NVTEStream stream) {
  return softmax_bwd("nvte_scaled_masked_softmax_backward", SoftmaxMask::kByte, incoming_grads,
                     softmax_results, output_grads, scale_factor, stream);
}

NVTEStatus nvte_scaled_upper_triang_masked_softmax_forward(const NVTETensor input,
                                                           NVTETensor softmax_results,
                                                           float scale_factor, NVTEStream stream) {
  return softmax_fwd("nvte_scaled_upper_triang_masked_softmax_forward", SoftmaxMask::kUpperTriang,
                     input, nullptr, softmax_results, scale_factor, stream);
}
NVTEStatus nvte_scaled_upper_triang_masked_softmax_backward(const NVTETensor incoming_grads,
                                                            const NVTETensor softmax_results,
                                                            NVTETensor output_grads,
                                                            float scale_factor, NVTEStream stream) {
  return softmax_bwd("nvte_scaled_upper_triang_masked_softmax_backward",
                     SoftmaxMask::kUpperTriang, incoming_grads, softmax_results, output_grads,
                     scale_factor, stream);
}

NVTEStatus nvte_scaled_aligned_causal_masked_softmax_forward(const NVTETensor input,
                                                             NVTETensor softmax_results,
                                                             float scale_factor,
                                                             NVTEStream stream) {
  return softmax_fwd("nvte_scaled_aligned_causal_masked_softmax_forward",
                     SoftmaxMask::kAlignedCausal, input, nullptr, softmax_results, scale_factor,
                     stream);
}
NVTEStatus nvte_scaled_aligned_causal_masked_softmax_backward(const NVTETensor incoming_grads,
                                                              const NVTETensor softmax_results,
                                                              NVTETensor output_grads,
                                                              float scale_factor,
                                                              NVTEStream stream) {
  return softmax_bwd("nvte_scaled_aligned_causal_masked_softmax_backward",
                     SoftmaxMask::kAlignedCausal, incoming_grads, softmax_results, output_grads,
                     scale_factor, stream);
}
