// C API of fused attention (fused_attn.h): the entry points, output checks, device routing to the
// CPU or GPU flash kernel (or the AOTriton images). The argument checks and kernel parameters are
// fused_attn_params.cpp's make_params; every check runs before any output is written.
#include "transformer_engine_lite/fused_attn.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../util/api.h"
#include "backend_select.h"
#include "fused_attn_entry.h"
#include "fused_attn_cpu.h"
#ifdef NVTE_WITH_GPU
#include "fused_attn_gpu.h"
#endif
#ifdef NVTE_WITH_AOTRITON
#include <cstdio>

#include "../fused_attn_rocm/fused_attn_aotriton.h"
#include "../util/env.h"
#include "../util/gpu_device.h"
#endif

namespace nvte {
namespace {

// Dense output in the call's format: O / dQ / dK / dV have the token/head structure of a dense
// [b, s, h, d] (bshd), [s, b, h, d] (sbhd) or [t, h, d] (thd) tensor.
AttnStrides dense_strides(NVTE_QKV_Format fmt, int64_t b, int64_t s, int64_t h, int64_t d) {
  AttnStrides st;
  st.head = d;
  if (fmt == NVTE_SBHD) {
    st.tok = b * h * d;
    st.batch = h * d;
  } else {
    st.tok = h * d;
    st.batch = fmt == NVTE_BSHD ? s * h * d : 0;
  }
  return st;
}

void check_output(const Tensor *t, const char *arg, const Tensor &like, size_t d, DType dtype,
                  NVTEDevice device) {
  NVTE_CHECK(t != nullptr, "argument '", arg, "': must not be NULL");
  check_has_data(*t, arg);
  NVTE_CHECK(t->data.dtype == dtype, "argument '", arg, "': expected dtype ", dtype_name(dtype),
             ", got ", dtype_name(t->data.dtype));
  std::vector<size_t> want = like.data.shape;
  want.back() = d;
  check_shape(t->data, arg, want);
  NVTE_CHECK(t->device == device, "argument '", arg, "': expected the inputs' device");
}

// The buffers the kernels read besides Q, K, V (and O, dO, softmax_lse backward): cu_seqlens (token
// offsets: an output written over them would send the kernel out of bounds), Bias or the ALiBi
// slopes, rng_state. No output may share memory with them.
std::vector<std::pair<const SimpleTensor *, const char *>> side_inputs(const CallArgs &c,
                                                                       const AttnParams &p) {
  std::vector<std::pair<const SimpleTensor *, const char *>> r;
  if (p.cu_q) r.push_back({&c.cu_q->data, "cu_seqlens_q"});
  if (p.cu_kv) r.push_back({&c.cu_kv->data, "cu_seqlens_kv"});
  if (p.bias || p.alibi_slopes) r.push_back({&c.bias->data, "Bias"});
  if (p.dropout > 0.0f && c.rng != nullptr) r.push_back({&c.rng->data, "rng_state"});
  if (p.softmax_offset != nullptr) r.push_back({&c.softmax_offset->data, "SoftmaxOffset"});
  return r;
}

void check_lse(const Tensor *t, const AttnParams &p, NVTEDevice device) {
  NVTE_CHECK(t != nullptr, "argument 'softmax_lse': required (is_training / backward)");
  check_has_data(*t, "softmax_lse");
  check_dtype(t->data, "softmax_lse", {kNVTEFloat32});
  check_shape(t->data, "softmax_lse",
              {static_cast<size_t>(p.b), static_cast<size_t>(p.h), static_cast<size_t>(p.s_q)});
  NVTE_CHECK(t->device == device, "argument 'softmax_lse': expected the inputs' device");
}

#ifdef NVTE_WITH_AOTRITON
// Whether a GPU call runs on the AOTriton kernels: the selection (env switches + rules) picks
// aotriton for this config on this device, and the call's own data fit the kernels (a host
// rng_state with dropout does not). Otherwise the flash kernel runs it, with a log line saying why.
bool use_aotriton(const NVTEFusedAttnConfig &cfg, const AttnParams &p, int *device,
                  std::string *arch) {
  const NVTEFusedAttnPlatform pf = this_platform(kNVTEDeviceGPU);
  if (select_backend(cfg, pf).backend != NVTE_AOTriton) return false;
  *arch = gpu_device_arch(device);
  const std::string why = aotriton::unsupported_reason(p, *arch);
  if (!why.empty() && env_is_one("NVTE_LOG_AOTRITON_CONFIG")) {
    std::fprintf(stderr, "[aotriton] not used for this call (flash runs it): %s\n", why.c_str());
  }
  return why.empty();
}
#endif

}  // namespace

// GPU backward workspace, TE's protocol: a handle without data is a size query (its shape becomes
// [bytes], dtype byte) and the call computes nothing. Returns false for a query. (The CPU kernels
// need none: cpu_workspace below answers the query with [0] and the call computes.)
bool gpu_workspace(NVTETensor workspace, size_t bytes, void **ptr) {
  *ptr = nullptr;
  if (bytes == 0) return true;
  NVTE_CHECK(workspace != nullptr, "argument 'workspace': the GPU backward needs ", bytes,
             " bytes of device workspace; pass a handle without data to query the size");
  Tensor &w = as_tensor_mut(workspace, "workspace");
  if (!w.data.has_data()) {
    w.data.shape = {bytes};
    w.data.dtype = kNVTEByte;
    return false;
  }
  NVTE_CHECK(w.data.numel() * dtype_size(w.data.dtype) >= bytes, "argument 'workspace': expected at "
             "least ", bytes, " bytes, got ", w.data.describe());
  *ptr = w.data.dptr;
  return true;
}

// The CPU kernels (and the GPU forward) need no workspace: a handle without data answers TE's size query with [0].
void cpu_workspace(NVTETensor workspace) {
  if (workspace == nullptr) return;
  Tensor &w = as_tensor_mut(workspace, "workspace");
  if (!w.data.has_data()) {
    w.data.shape = {0};
    w.data.dtype = kNVTEByte;
  }
}

void run_fwd(const CallArgs &c, const Tensor *o, Tensor *lse, bool is_training,
             NVTETensor workspace, NVTEStream stream) {
  NVTEDevice device;
  NVTEFusedAttnConfig cfg;
  AttnParams p = make_params(c, &device, &cfg);
  set_softmax(c, nullptr, device, &p);
  check_output(o, "O", *c.q, static_cast<size_t>(p.d_v), p.dtype, device);
  std::vector<std::pair<const Tensor *, const char *>> inputs = {
      {c.q, "Q"}, {c.k, "K"}, {c.v, "V"}};
  if (c.packed != nullptr) inputs.push_back({c.packed, c.packed_name});
  for (auto [t, n] : inputs) check_no_overlap(t->data, n, o->data, "O");
  const auto side = side_inputs(c, p);
  for (const auto &[t, n] : side) check_no_overlap(*t, n, o->data, "O");
  if (is_training) {
    check_lse(lse, p, device);
    check_no_overlap(o->data, "O", lse->data, "softmax_lse");
    p.lse = lse->data.ptr<float>();
  } else if (lse != nullptr && lse->data.has_data()) {
    check_lse(lse, p, device);
    check_no_overlap(o->data, "O", lse->data, "softmax_lse");
    p.lse = lse->data.ptr<float>();
  }
  if (p.lse != nullptr) {  // written too: disjoint from every input
    for (auto [t, n] : inputs) check_no_overlap(t->data, n, lse->data, "softmax_lse");
    for (const auto &[t, n] : side) check_no_overlap(*t, n, lse->data, "softmax_lse");
  }
  p.o = o->data.dptr;
  p.so_ = dense_strides(p.format, p.b, p.s_q, p.h, p.d_v);
  log_attn_call("nvte_fused_attn_fwd", static_cast<size_t>(p.b), cfg);
  cpu_workspace(workspace);  // the forward needs no workspace on any device
  // Nothing to write (no batch or no queries): the other dims of the empty tensors may be anything
  // (b = 2^40 with s = 0), and the kernels would still loop over them.
  if (o->data.numel() == 0 && (p.lse == nullptr || lse->data.numel() == 0)) {
    (void)use_gpu(device, "nvte_fused_attn_fwd");  // a GPU tag this build cannot run is refused
    return;
  }
  if (use_gpu(device, "nvte_fused_attn_fwd")) {
#ifdef NVTE_WITH_AOTRITON
    int dev = 0;
    std::string arch;
    if (!p.has_sink() && use_aotriton(cfg, p, &dev, &arch)) {  // AOTriton has no sinks
      aotriton::run_fwd(p, dev, arch, stream);
      return;
    }
#endif
#ifdef NVTE_WITH_GPU
    gpu::launch_flash_attn_fwd(p, stream);
#endif
    return;
  }
  (void)stream;
  flash_attn_fwd_cpu(p);
}


void run_bwd(const CallArgs &c, const BwdTensors &t, bool deterministic, NVTETensor workspace,
             NVTEStream stream) {
  NVTEDevice device;
  NVTEFusedAttnConfig cfg;
  AttnParams p = make_params(c, &device, &cfg);
  set_softmax(c, t.d_softmax_offset, device, &p);
  check_output(t.o, "O", *c.q, static_cast<size_t>(p.d_v), p.dtype, device);
  check_output(t.d_o, "dO", *c.q, static_cast<size_t>(p.d_v), p.dtype, device);
  check_lse(t.lse, p, device);
  if (!t.packed_grads) {
    check_output(t.dq, "dQ", *c.q, static_cast<size_t>(p.d_qk), p.dtype, device);
    check_output(t.dk, "dK", *c.k, static_cast<size_t>(p.d_qk), p.dtype, device);
    check_output(t.dv, "dV", *c.v, static_cast<size_t>(p.d_v), p.dtype, device);
    check_no_overlap(t.dq->data, "dQ", t.dk->data, "dK");
    check_no_overlap(t.dq->data, "dQ", t.dv->data, "dV");
    check_no_overlap(t.dk->data, "dK", t.dv->data, "dV");
  }
  const bool want_dbias = t.dbias != nullptr && t.dbias->data.has_data();
  NVTE_CHECK(!want_dbias || c.bias_type == NVTE_POST_SCALE_BIAS,
             "argument 'dBias': only post_scale_bias has a bias gradient, got bias_type ",
             nvte_bias_type_name(c.bias_type));
  if (want_dbias) {
    NVTE_CHECK(t.dbias->data.dtype == p.dtype && t.dbias->data.shape == c.bias->data.shape,
               "argument 'dBias': expected ", c.bias->data.describe(), " (Bias's), got ",
               t.dbias->data.describe());
    NVTE_CHECK(t.dbias->device == device, "argument 'dBias': expected the inputs' device");
  }
  // Every buffer written (packed gradients: the whole packed buffer, not only the views' dense
  // extents) is disjoint from every buffer read.
  std::vector<std::pair<const Tensor *, const char *>> inputs = {
      {c.q, "Q"}, {c.k, "K"}, {c.v, "V"}, {t.o, "O"}, {t.d_o, "dO"}, {t.lse, "softmax_lse"}};
  if (c.packed != nullptr) inputs.push_back({c.packed, c.packed_name});
  for (auto [g, gn] : {std::pair{(const Tensor *)t.dq, "dQ"}, {t.dk, "dK"}, {t.dv, "dV"},
                       {want_dbias ? t.dbias : nullptr, "dBias"},
                       {t.packed_grad, t.packed_grad_name},
                       {p.d_softmax_offset ? t.d_softmax_offset : nullptr, "dSoftmaxOffset"}}) {
    if (g == nullptr) continue;
    for (auto [in, n] : inputs) check_no_overlap(in->data, n, g->data, gn);
    for (const auto &[in, n] : side_inputs(c, p)) check_no_overlap(*in, n, g->data, gn);
  }
  if (t.packed_grad != nullptr && want_dbias) {
    check_no_overlap(t.packed_grad->data, t.packed_grad_name, t.dbias->data, "dBias");
  }
  p.o = t.o->data.dptr;
  p.so_ = dense_strides(p.format, p.b, p.s_q, p.h, p.d_v);
  p.d_o = t.d_o->data.dptr;
  p.sdo_ = p.so_;
  p.lse = t.lse->data.ptr<float>();
  p.dq = t.dq->data.dptr;
  p.dk = t.dk->data.dptr;
  p.dv = t.dv->data.dptr;
  if (t.packed_grads) {  // written into the packed buffer with the inputs' strides
    p.sdq_ = p.sq_;
    p.sdk_ = p.sk_;
    p.sdv_ = p.sv_;
  } else {
    p.sdq_ = dense_strides(p.format, p.b, p.s_q, p.h, p.d_qk);
    p.sdk_ = dense_strides(p.format, p.b, p.s_kv, p.h_kv, p.d_qk);
    p.sdv_ = dense_strides(p.format, p.b, p.s_kv, p.h_kv, p.d_v);
  }
  p.dbias = want_dbias ? t.dbias->data.dptr : nullptr;
  log_attn_call("nvte_fused_attn_bwd", static_cast<size_t>(p.b), cfg);
  if (t.dq->data.numel() == 0 && t.dk->data.numel() == 0 && t.dv->data.numel() == 0 &&
      (p.dbias == nullptr || t.dbias->data.numel() == 0)) {  // nothing to write: as the forward
    (void)use_gpu(device, "nvte_fused_attn_bwd");
    cpu_workspace(workspace);
    if (p.d_softmax_offset != nullptr) {  // no query rows: the offset's gradient is 0
#ifdef NVTE_WITH_GPU
      if (device == kNVTEDeviceGPU) {
        gpu::zero_softmax_offset_grad(p, stream);
        return;
      }
#endif
      softmax_offset_grad_cpu(p);
    }
    return;
  }
  if (use_gpu(device, "nvte_fused_attn_bwd")) {
#ifdef NVTE_WITH_AOTRITON
    int dev = 0;
    std::string arch;
    if (!p.has_sink() && use_aotriton(cfg, p, &dev, &arch)) {
      void *delta = nullptr;
      if (!gpu_workspace(workspace, aotriton::bwd_workspace_bytes(p), &delta)) return;
      aotriton::run_bwd(p, dev, arch, delta, stream);
      return;
    }
#endif
#ifdef NVTE_WITH_GPU
    void *ws = nullptr;
    if (!gpu_workspace(workspace, gpu::flash_attn_bwd_workspace_bytes(p), &ws)) return;
    gpu::launch_flash_attn_bwd(p, deterministic, ws, stream);
#endif
    return;
  }
  (void)stream, (void)deterministic;  // the CPU backward is always deterministic
  cpu_workspace(workspace);
  flash_attn_bwd_cpu(p);
  if (p.d_softmax_offset != nullptr) softmax_offset_grad_cpu(p);
}

// A view of one slice of a packed tensor: Q/K/V of [.., 3, h, d] / [.., h, 3, d] (or KV of 2).
Tensor packed_view(const Tensor &packed, const char *arg, NVTE_QKV_Layout_Group grp, int which,
                   bool thd) {
  const auto &s = packed.data.shape;
  const size_t nd = thd ? 4 : 5;
  check_ndim(packed.data, arg, nd);
  check_offsets_fit(packed.data, arg);
  const bool hxd = grp == NVTE_H3D || grp == NVTE_HD_H2D;  // [.., h, n, d] vs [.., n, h, d]
  const size_t n = (grp == NVTE_3HD || grp == NVTE_H3D) ? 3 : 2;
  const size_t ndim_n = hxd ? nd - 2 : nd - 3;
  NVTE_CHECK(s[ndim_n] == n, "argument '", arg, "': expected ", n, " at dim ", ndim_n,
             " for this layout, got shape ", shape_str(s));
  Tensor v = packed;
  v.data.shape.erase(v.data.shape.begin() + ndim_n);
  const size_t h = hxd ? s[nd - 3] : s[nd - 2], d = s[nd - 1];
  const size_t step = hxd ? d : h * d;
  v.data.dptr = static_cast<char *>(packed.data.dptr) + which * step * dtype_size(packed.data.dtype);
  return v;
}

}  // namespace nvte

using namespace nvte;

NVTEStatus nvte_fused_attn_fwd(const NVTETensor Q, const NVTETensor K, const NVTETensor V,
                               const NVTETensor Bias, NVTETensor O, NVTETensor softmax_lse,
                               const NVTETensor cu_seqlens_q, const NVTETensor cu_seqlens_kv,
                               const NVTETensor rng_state, size_t max_seqlen_q,
                               size_t max_seqlen_kv, bool is_training, float attn_scale,
                               float dropout, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
                               NVTE_Mask_Type attn_mask_type, int64_t window_size_left,
                               int64_t window_size_right, NVTETensor workspace, NVTEStream stream) {
  return guarded("nvte_fused_attn_fwd", [&] {
    const CallArgs c{&as_tensor(Q, "Q"), &as_tensor(K, "K"), &as_tensor(V, "V"),
                     as_tensor_opt(Bias), as_tensor_opt(cu_seqlens_q), as_tensor_opt(cu_seqlens_kv),
                     as_tensor_opt(rng_state), max_seqlen_q, max_seqlen_kv, attn_scale, dropout,
                     qkv_layout, bias_type, attn_mask_type, window_size_left, window_size_right};
    run_fwd(c, &as_tensor(O, "O"), softmax_lse ? &as_tensor_mut(softmax_lse, "softmax_lse") : nullptr,
            is_training, workspace, stream);
  });
}

NVTEStatus nvte_fused_attn_bwd(const NVTETensor Q, const NVTETensor K, const NVTETensor V,
                               const NVTETensor O, const NVTETensor dO, const NVTETensor softmax_lse,
                               const NVTETensor Bias, NVTETensor dQ, NVTETensor dK, NVTETensor dV,
                               NVTETensor dBias, const NVTETensor cu_seqlens_q,
                               const NVTETensor cu_seqlens_kv, const NVTETensor rng_state,
                               size_t max_seqlen_q, size_t max_seqlen_kv, float attn_scale,
                               float dropout, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
                               NVTE_Mask_Type attn_mask_type, int64_t window_size_left,
                               int64_t window_size_right, bool deterministic, NVTETensor workspace,
                               NVTEStream stream) {
  return guarded("nvte_fused_attn_bwd", [&] {
    const CallArgs c{&as_tensor(Q, "Q"), &as_tensor(K, "K"), &as_tensor(V, "V"),
                     as_tensor_opt(Bias), as_tensor_opt(cu_seqlens_q), as_tensor_opt(cu_seqlens_kv),
                     as_tensor_opt(rng_state), max_seqlen_q, max_seqlen_kv, attn_scale, dropout,
                     qkv_layout, bias_type, attn_mask_type, window_size_left, window_size_right};
    const BwdTensors t{&as_tensor(O, "O"), &as_tensor(dO, "dO"), &as_tensor(softmax_lse, "softmax_lse"),
                       &as_tensor_mut(dQ, "dQ"), &as_tensor_mut(dK, "dK"), &as_tensor_mut(dV, "dV"),
                       dBias ? &as_tensor_mut(dBias, "dBias") : nullptr, false};
    run_bwd(c, t, deterministic, workspace, stream);
  });
}
