// Packed entry points of fused attention (QKV in one tensor, or KV in one tensor) and the dropout
// mask: they slice the packed tensors into Q/K/V views whose pointers and strides the layout
// describes, then run the same checks and kernels as nvte_fused_attn_fwd / _bwd.
#include <string>

#include "../util/api.h"
#include "fused_attn_cpu.h"
#include "fused_attn_entry.h"
#ifdef NVTE_WITH_GPU
#include "fused_attn_gpu.h"
#endif

using namespace nvte;

namespace {

void check_group(NVTE_QKV_Layout layout, bool qkv) {
  NVTE_CHECK(layout >= NVTE_SB3HD && layout <= NVTE_THD_THD_THD,
             "argument 'qkv_layout': expected an NVTE_QKV_Layout value (0..14), got ",
             static_cast<int>(layout));
  const NVTE_QKV_Layout_Group g = nvte_get_qkv_layout_group(layout);
  if (qkv)
    NVTE_CHECK(g == NVTE_3HD || g == NVTE_H3D, "argument 'qkv_layout': the qkvpacked calls take a "
               "3hd or h3d layout, got ", nvte_qkv_layout_name(layout));
  else
    NVTE_CHECK(g == NVTE_HD_2HD || g == NVTE_HD_H2D, "argument 'qkv_layout': the kvpacked calls "
               "take an hd_2hd or hd_h2d layout, got ", nvte_qkv_layout_name(layout));
}

struct QKVViews {
  Tensor q, k, v;
};

QKVViews split_qkv(const Tensor &qkv, NVTE_QKV_Layout layout) {
  check_has_data(qkv, "QKV");
  const NVTE_QKV_Layout_Group g = nvte_get_qkv_layout_group(layout);
  const bool thd = nvte_get_qkv_format(layout) == NVTE_THD;
  return {packed_view(qkv, "QKV", g, 0, thd), packed_view(qkv, "QKV", g, 1, thd),
          packed_view(qkv, "QKV", g, 2, thd)};
}

QKVViews split_kv(const Tensor &q, const Tensor &kv, NVTE_QKV_Layout layout) {
  check_has_data(kv, "KV");
  const NVTE_QKV_Layout_Group g = nvte_get_qkv_layout_group(layout);
  const bool thd = nvte_get_qkv_format(layout) == NVTE_THD;
  return {q, packed_view(kv, "KV", g, 0, thd), packed_view(kv, "KV", g, 1, thd)};
}

CallArgs args(const QKVViews &v, const Tensor &packed, const char *packed_name,
              const NVTETensor Bias, const NVTETensor cu_q, const NVTETensor cu_kv,
              const NVTETensor rng, size_t max_q, size_t max_kv, float scale, float dropout,
              NVTE_QKV_Layout layout, NVTE_Bias_Type bias_type, NVTE_Mask_Type mask, int64_t left,
              int64_t right) {
  return CallArgs{&v.q, &v.k, &v.v, as_tensor_opt(Bias), as_tensor_opt(cu_q), as_tensor_opt(cu_kv),
                  as_tensor_opt(rng), max_q, max_kv, scale, dropout, layout, bias_type, mask,
                  left, right, &packed, packed_name};
}

}  // namespace

NVTEStatus nvte_fused_attn_fwd_qkvpacked(
    const NVTETensor QKV, const NVTETensor Bias, NVTETensor O, NVTETensor softmax_lse,
    const NVTETensor cu_seqlens, const NVTETensor rng_state, size_t max_seqlen, bool is_training,
    float attn_scale, float dropout, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
    NVTE_Mask_Type attn_mask_type, int64_t window_size_left, int64_t window_size_right,
    NVTETensor workspace, NVTEStream stream) {
  return guarded("nvte_fused_attn_fwd_qkvpacked", [&] {
    check_group(qkv_layout, true);
    const Tensor &qkv = as_tensor(QKV, "QKV");
    const QKVViews v = split_qkv(qkv, qkv_layout);
    run_fwd(args(v, qkv, "QKV", Bias, cu_seqlens, cu_seqlens, rng_state, max_seqlen, max_seqlen,
                 attn_scale, dropout, qkv_layout, bias_type, attn_mask_type, window_size_left,
                 window_size_right),
            &as_tensor(O, "O"), softmax_lse ? &as_tensor_mut(softmax_lse, "softmax_lse") : nullptr,
            is_training, workspace, stream);
  });
}

NVTEStatus nvte_fused_attn_bwd_qkvpacked(
    const NVTETensor QKV, const NVTETensor O, const NVTETensor dO, const NVTETensor softmax_lse,
    const NVTETensor Bias, NVTETensor dQKV, NVTETensor dBias, const NVTETensor cu_seqlens,
    const NVTETensor rng_state, size_t max_seqlen, float attn_scale, float dropout,
    NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type, NVTE_Mask_Type attn_mask_type,
    int64_t window_size_left, int64_t window_size_right, bool deterministic, NVTETensor workspace,
    NVTEStream stream) {
  return guarded("nvte_fused_attn_bwd_qkvpacked", [&] {
    check_group(qkv_layout, true);
    const Tensor &qkv = as_tensor(QKV, "QKV");
    Tensor &dqkv = as_tensor_mut(dQKV, "dQKV");
    check_has_data(dqkv, "dQKV");
    NVTE_CHECK(dqkv.data.dtype == qkv.data.dtype && dqkv.data.shape == qkv.data.shape,
               "argument 'dQKV': expected ", qkv.data.describe(), " (QKV's), got ",
               dqkv.data.describe());
    NVTE_CHECK(dqkv.device == qkv.device, "argument 'dQKV': expected QKV's device");
    check_no_overlap(qkv.data, "QKV", dqkv.data, "dQKV");
    const QKVViews v = split_qkv(qkv, qkv_layout);
    QKVViews g = split_qkv(dqkv, qkv_layout);
    const BwdTensors t{&as_tensor(O, "O"), &as_tensor(dO, "dO"), &as_tensor(softmax_lse, "softmax_lse"),
                       &g.q, &g.k, &g.v, dBias ? &as_tensor_mut(dBias, "dBias") : nullptr, true,
                       &dqkv, "dQKV"};
    run_bwd(args(v, qkv, "QKV", Bias, cu_seqlens, cu_seqlens, rng_state, max_seqlen, max_seqlen,
                 attn_scale, dropout, qkv_layout, bias_type, attn_mask_type, window_size_left,
                 window_size_right),
            t, deterministic, workspace, stream);
  });
}

NVTEStatus nvte_fused_attn_fwd_kvpacked(
    const NVTETensor Q, const NVTETensor KV, const NVTETensor Bias, NVTETensor O,
    NVTETensor softmax_lse, const NVTETensor cu_seqlens_q, const NVTETensor cu_seqlens_kv,
    const NVTETensor rng_state, size_t max_seqlen_q, size_t max_seqlen_kv, bool is_training,
    float attn_scale, float dropout, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
    NVTE_Mask_Type attn_mask_type, int64_t window_size_left, int64_t window_size_right,
    NVTETensor workspace, NVTEStream stream) {
  return guarded("nvte_fused_attn_fwd_kvpacked", [&] {
    check_group(qkv_layout, false);
    const Tensor &kv = as_tensor(KV, "KV");
    const QKVViews v = split_kv(as_tensor(Q, "Q"), kv, qkv_layout);
    run_fwd(args(v, kv, "KV", Bias, cu_seqlens_q, cu_seqlens_kv, rng_state, max_seqlen_q,
                 max_seqlen_kv, attn_scale, dropout, qkv_layout, bias_type, attn_mask_type, window_size_left,
                 window_size_right),
            &as_tensor(O, "O"), softmax_lse ? &as_tensor_mut(softmax_lse, "softmax_lse") : nullptr,
            is_training, workspace, stream);
  });
}

NVTEStatus nvte_fused_attn_bwd_kvpacked(
    const NVTETensor Q, const NVTETensor KV, const NVTETensor O, const NVTETensor dO,
    const NVTETensor softmax_lse, const NVTETensor Bias, NVTETensor dQ, NVTETensor dKV,
    NVTETensor dBias, const NVTETensor cu_seqlens_q, const NVTETensor cu_seqlens_kv,
    const NVTETensor rng_state, size_t max_seqlen_q, size_t max_seqlen_kv, float attn_scale,
    float dropout, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
    NVTE_Mask_Type attn_mask_type, int64_t window_size_left, int64_t window_size_right,
    bool deterministic, NVTETensor workspace, NVTEStream stream) {
  return guarded("nvte_fused_attn_bwd_kvpacked", [&] {
    check_group(qkv_layout, false);
    const Tensor &q = as_tensor(Q, "Q"), &kv = as_tensor(KV, "KV");
    Tensor &dq = as_tensor_mut(dQ, "dQ"), &dkv = as_tensor_mut(dKV, "dKV");
    check_has_data(dq, "dQ");
    check_has_data(dkv, "dKV");
    NVTE_CHECK(dkv.data.dtype == kv.data.dtype && dkv.data.shape == kv.data.shape,
               "argument 'dKV': expected ", kv.data.describe(), " (KV's), got ", dkv.data.describe());
    NVTE_CHECK(dq.data.dtype == q.data.dtype && dq.data.shape == q.data.shape,
               "argument 'dQ': expected ", q.data.describe(), " (Q's), got ", dq.data.describe());
    NVTE_CHECK(dkv.device == kv.device && dq.device == q.device,
               "arguments 'dQ', 'dKV': expected the inputs' device");
    check_no_overlap(dq.data, "dQ", dkv.data, "dKV");
    const QKVViews v = split_kv(q, kv, qkv_layout);
    QKVViews g = split_kv(dq, dkv, qkv_layout);
    // dQ is dense; dK and dV are views of dKV: written with KV's (packed) strides.
    const BwdTensors t{&as_tensor(O, "O"), &as_tensor(dO, "dO"), &as_tensor(softmax_lse, "softmax_lse"),
                       &g.q, &g.k, &g.v, dBias ? &as_tensor_mut(dBias, "dBias") : nullptr, true,
                       &dkv, "dKV"};
    run_bwd(args(v, kv, "KV", Bias, cu_seqlens_q, cu_seqlens_kv, rng_state, max_seqlen_q,
                 max_seqlen_kv, attn_scale, dropout, qkv_layout, bias_type, attn_mask_type, window_size_left,
                 window_size_right),
            t, deterministic, workspace, stream);
  });
}

NVTEStatus nvte_fused_attn_dropout_mask(const NVTETensor rng_state, float dropout, NVTETensor mask,
                                        NVTEStream stream) {
  return guarded("nvte_fused_attn_dropout_mask", [&] {
    const Tensor &rng = as_tensor(rng_state, "rng_state");
    const Tensor &m = as_tensor(mask, "mask");
    check_has_data(rng, "rng_state");
    check_dtype(rng.data, "rng_state", {kNVTEInt64});
    check_shape(rng.data, "rng_state", {2});
    NVTE_CHECK(dropout >= 0.0f && dropout < 1.0f,
               "argument 'dropout': expected a probability in [0, 1), got ", dropout);
    check_has_data(m, "mask");
    check_dtype(m.data, "mask", {kNVTEByte});
    check_ndim(m.data, "mask", 4);
    AttnParams p;
    p.b = static_cast<int64_t>(m.data.shape[0]);
    p.h = static_cast<int64_t>(m.data.shape[1]);
    p.s_q = static_cast<int64_t>(m.data.shape[2]);
    p.s_kv = static_cast<int64_t>(m.data.shape[3]);
    read_rng_state(rng, &p);
    NVTE_CHECK(p.rng_state == nullptr || m.device == kNVTEDeviceGPU,
               "argument 'rng_state': device memory, but 'mask' is on the CPU");
    p.dropout = dropout;
    p.dropout_thresh = dropout_threshold(dropout);
    const bool gpu = use_gpu(m.device, "nvte_fused_attn_dropout_mask");
    // An empty mask has nothing to write, whatever its other dims (an empty tensor may declare any
    // size there): the kernels would still loop over b * h * s_q rows of nothing.
    if (m.data.numel() == 0) return;
    if (gpu) {
#ifdef NVTE_WITH_GPU
      gpu::launch_dropout_mask(p, m.data.ptr<uint8_t>(), stream);
#endif
      return;
    }
    (void)stream;
    dropout_mask_cpu(p, m.data.ptr<uint8_t>());
  });
}
