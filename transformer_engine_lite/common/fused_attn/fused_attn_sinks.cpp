// Attention sinks (TE's NVTE_Softmax_Type): the *_softmax entry points, the validation of the
// softmax flavour and its offset tensors, and the CPU gradient of a learnable offset.
//
// Forward: the flash kernels start each row's online softmax from the sink (running max = sink,
// running sum = exp(0) = 1) instead of (-inf, 0), so the saved LSE includes the sink's mass.
// Backward: given that LSE, the recomputed probabilities already carry the sink's share, so dQ, dK
// and dV are the vanilla formulas unchanged. The offset's gradient: with p_sink = exp(a - lse) and
// O = sum_j p_j v_j, d lse / d a = p_sink and d p_j / d a = -p_j p_sink, so
//   d loss / d a_h = -sum_{batch, rows} p_sink * rowsum(dO * O)
// (dropout included: O is the dropped output). It needs only O, dO and the LSE, so it is one cheap
// pass over them here (O(b h s d)), apart from the tiled kernels, accumulated in fp64 in a fixed order.
#include <cmath>
#include <vector>

#include "../util/api.h"
#include "../util/dtype_dispatch.h"
#include "../util/half.h"
#include "../util/parallel.h"
#include "fused_attn_cpu.h"
#include "fused_attn_entry.h"

namespace nvte {
namespace {

constexpr const char *kSoftmaxNames[] = {"vanilla", "off-by-one", "learnable"};
constexpr long long kNumSoftmax = sizeof(kSoftmaxNames) / sizeof(kSoftmaxNames[0]);

// An offset tensor of h fp32 elements: [h] or TE's [1, h, 1, 1].
void check_offset(const Tensor &t, const char *arg, int64_t h, NVTEDevice device) {
  check_has_data(t, arg);
  check_dtype(t.data, arg, {kNVTEFloat32});
  const auto &s = t.data.shape;
  const size_t hh = static_cast<size_t>(h);
  const bool ok = (s.size() == 1 && s[0] == hh) ||
                  (s.size() == 4 && s[0] == 1 && s[1] == hh && s[2] == 1 && s[3] == 1);
  NVTE_CHECK(ok, "argument '", arg, "': expected shape [", h, "] or [1, ", h, ", 1, 1] (one fp32 "
             "value per attention head), got ", shape_str(s));
  NVTE_CHECK(t.device == device, "argument '", arg, "': expected the inputs' device");
}

}  // namespace

void set_softmax(const CallArgs &c, const Tensor *d_offset, NVTEDevice device, AttnParams *p) {
  const long long st = static_cast<long long>(c.softmax_type);
  NVTE_CHECK(st >= 0 && st < kNumSoftmax, "argument 'softmax_type': expected one of vanilla (0), "
             "off-by-one (1), learnable (2), got ", st);
  p->softmax_type = c.softmax_type;
  const bool learnable = c.softmax_type == NVTE_LEARNABLE_SOFTMAX;
  const bool want_grad = d_offset != nullptr && d_offset->data.has_data();
  NVTE_CHECK(!want_grad || learnable, "argument 'dSoftmaxOffset': only the learnable softmax has "
             "an offset gradient, got softmax_type ", kSoftmaxNames[st]);
  if (learnable) {
    NVTE_CHECK(c.softmax_offset != nullptr, "argument 'SoftmaxOffset': required for softmax_type "
               "learnable (fp32, one value per head)");
    check_offset(*c.softmax_offset, "SoftmaxOffset", p->h, device);
    p->softmax_offset = c.softmax_offset->data.ptr<const float>();
    if (want_grad) {
      check_offset(*d_offset, "dSoftmaxOffset", p->h, device);
      check_no_overlap(c.softmax_offset->data, "SoftmaxOffset", d_offset->data, "dSoftmaxOffset");
      p->d_softmax_offset = d_offset->data.ptr<float>();
    }
  }
}

void softmax_offset_grad_cpu(const AttnParams &p) {
  dispatch_dtype<TypeList<float, fp16, bf16>>(p.dtype, "O", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T *O = static_cast<const T *>(p.o), *dO = static_cast<const T *>(p.d_o);
    // One task per head; each sums its (batch, row) terms in order: deterministic.
    parallel_for(static_cast<size_t>(p.h), 1, [&](size_t begin, size_t end) {
      for (size_t hs = begin; hs < end; ++hs) {
        const int64_t hd = static_cast<int64_t>(hs);
        const double a = static_cast<double>(p.sink(hd));
        double acc = 0.0;
        for (int64_t bi = 0; bi < p.b; ++bi) {
          for (int64_t i = 0; i < p.len_q(bi); ++i) {
            const float lse = p.lse[(bi * p.h + hd) * p.s_q + i];
            if (!std::isfinite(lse)) continue;  // no sink mass (cannot happen with a sink)
            const T *o = O + p.token_q(p.so_, bi, i) + hd * p.so_.head;
            const T *g = dO + p.token_q(p.sdo_, bi, i) + hd * p.sdo_.head;
            double delta = 0.0;
            for (int64_t d = 0; d < p.d_v; ++d)
              delta += static_cast<double>(to_float(o[d])) * static_cast<double>(to_float(g[d]));
            acc -= std::exp(a - static_cast<double>(lse)) * delta;
          }
        }
        p.d_softmax_offset[hd] = static_cast<float>(acc);
      }
    });
  });
}

}  // namespace nvte

using namespace nvte;

const char *nvte_softmax_type_name(NVTE_Softmax_Type softmax_type) {
  const long long s = static_cast<long long>(softmax_type);
  return s >= 0 && s < kNumSoftmax ? kSoftmaxNames[s] : "unknown";
}

NVTEStatus nvte_fused_attn_fwd_softmax(
    const NVTETensor Q, const NVTETensor K, const NVTETensor V, const NVTETensor Bias,
    const NVTETensor SoftmaxOffset, NVTETensor O, NVTETensor softmax_lse,
    const NVTETensor cu_seqlens_q, const NVTETensor cu_seqlens_kv, const NVTETensor rng_state,
    size_t max_seqlen_q, size_t max_seqlen_kv, bool is_training, float attn_scale, float dropout,
    NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type, NVTE_Mask_Type attn_mask_type,
    NVTE_Softmax_Type softmax_type, int64_t window_size_left, int64_t window_size_right,
    NVTETensor workspace, NVTEStream stream) {
  return guarded("nvte_fused_attn_fwd_softmax", [&] {
    CallArgs c{&as_tensor(Q, "Q"), &as_tensor(K, "K"), &as_tensor(V, "V"),
               as_tensor_opt(Bias), as_tensor_opt(cu_seqlens_q), as_tensor_opt(cu_seqlens_kv),
               as_tensor_opt(rng_state), max_seqlen_q, max_seqlen_kv, attn_scale, dropout,
               qkv_layout, bias_type, attn_mask_type, window_size_left, window_size_right};
    c.softmax_type = softmax_type;
    c.softmax_offset = as_tensor_opt(SoftmaxOffset);
    run_fwd(c, &as_tensor(O, "O"), softmax_lse ? &as_tensor_mut(softmax_lse, "softmax_lse") : nullptr,
            is_training, workspace, stream);
  });
}

NVTEStatus nvte_fused_attn_bwd_softmax(
    const NVTETensor Q, const NVTETensor K, const NVTETensor V, const NVTETensor O,
    const NVTETensor dO, const NVTETensor softmax_lse, const NVTETensor Bias,
    const NVTETensor SoftmaxOffset, NVTETensor dQ, NVTETensor dK, NVTETensor dV, NVTETensor dBias,
    NVTETensor dSoftmaxOffset, const NVTETensor cu_seqlens_q, const NVTETensor cu_seqlens_kv,
    const NVTETensor rng_state, size_t max_seqlen_q, size_t max_seqlen_kv, float attn_scale,
    float dropout, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
    NVTE_Mask_Type attn_mask_type, NVTE_Softmax_Type softmax_type, int64_t window_size_left,
    int64_t window_size_right, bool deterministic, NVTETensor workspace, NVTEStream stream) {
  return guarded("nvte_fused_attn_bwd_softmax", [&] {
    CallArgs c{&as_tensor(Q, "Q"), &as_tensor(K, "K"), &as_tensor(V, "V"),
               as_tensor_opt(Bias), as_tensor_opt(cu_seqlens_q), as_tensor_opt(cu_seqlens_kv),
               as_tensor_opt(rng_state), max_seqlen_q, max_seqlen_kv, attn_scale, dropout,
               qkv_layout, bias_type, attn_mask_type, window_size_left, window_size_right};
    c.softmax_type = softmax_type;
    c.softmax_offset = as_tensor_opt(SoftmaxOffset);
    BwdTensors t{&as_tensor(O, "O"), &as_tensor(dO, "dO"), &as_tensor(softmax_lse, "softmax_lse"),
                 &as_tensor_mut(dQ, "dQ"), &as_tensor_mut(dK, "dK"), &as_tensor_mut(dV, "dV"),
                 dBias ? &as_tensor_mut(dBias, "dBias") : nullptr, false};
    t.d_softmax_offset = dSoftmaxOffset ? &as_tensor_mut(dSoftmaxOffset, "dSoftmaxOffset") : nullptr;
    run_bwd(c, t, deterministic, workspace, stream);
  });
}
