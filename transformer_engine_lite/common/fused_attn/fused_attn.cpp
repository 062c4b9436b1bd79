// C API of fused attention (fused_attn.h): argument checks, layout -> strides, the flash backend's
// eligibility (backend_select.cpp's rules), device routing to the CPU or GPU flash kernel.
// Every check runs before any output is written.
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

bool is_padding(NVTE_Mask_Type m) {
  return m == NVTE_PADDING_MASK || m == NVTE_PADDING_CAUSAL_MASK ||
         m == NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
}
bool is_causal(NVTE_Mask_Type m) { return m != NVTE_NO_MASK && m != NVTE_PADDING_MASK; }

void check_enums(const CallArgs &c) {
  NVTE_CHECK(c.layout >= NVTE_SB3HD && c.layout <= NVTE_THD_THD_THD,
             "argument 'qkv_layout': expected an NVTE_QKV_Layout value (0..14), got ",
             static_cast<int>(c.layout));
  NVTE_CHECK(c.bias_type >= NVTE_NO_BIAS && c.bias_type <= NVTE_ALIBI,
             "argument 'bias_type': expected an NVTE_Bias_Type value (0..3), got ",
             static_cast<int>(c.bias_type));
  NVTE_CHECK(c.mask >= NVTE_NO_MASK && c.mask <= NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
             "argument 'attn_mask_type': expected an NVTE_Mask_Type value (0..5), got ",
             static_cast<int>(c.mask));
  NVTE_CHECK(std::isfinite(c.scale), "argument 'attn_scale': expected a finite value, got ",
             c.scale);
  NVTE_CHECK(c.dropout >= 0.0f && c.dropout < 1.0f,
             "argument 'dropout': expected a probability in [0, 1), got ", c.dropout);
  NVTE_CHECK(c.left >= -1, "argument 'window_size_left': expected -1 or >= 0, got ", c.left);
  NVTE_CHECK(c.right >= -1, "argument 'window_size_right': expected -1 or >= 0, got ", c.right);
  NVTE_CHECK(!is_causal(c.mask) || c.right <= 0,
             "argument 'window_size_right': causal masks need -1 or 0, got ", c.right, " with ",
             nvte_mask_type_name(c.mask));
}

// Strides of Q, K, V implied by the layout (elements), and the pointer distances a packed layout
// implies between Q, K and V (checked, so a mislabelled layout is an error, not garbage).
void layout_strides(NVTE_QKV_Layout layout, NVTE_QKV_Format fmt, int64_t b, int64_t s_q,
                    int64_t s_kv, int64_t h, int64_t h_kv, int64_t d_qk, int64_t d_v,
                    AttnStrides *q, AttnStrides *k, AttnStrides *v) {
  const NVTE_QKV_Layout_Group grp = nvte_get_qkv_layout_group(layout);
  // Per-token width of each buffer (elements) and head stride.
  int64_t q_tok = h * d_qk, k_tok = h_kv * d_qk, v_tok = h_kv * d_v;
  int64_t q_head = d_qk, k_head = d_qk, v_head = d_v;
  switch (grp) {
    case NVTE_3HD: q_tok = k_tok = v_tok = 3 * h * d_qk; break;
    case NVTE_H3D:
      q_tok = k_tok = v_tok = 3 * h * d_qk;
      q_head = k_head = v_head = 3 * d_qk;
      break;
    case NVTE_HD_2HD: k_tok = v_tok = 2 * h_kv * d_qk; break;
    case NVTE_HD_H2D:
      k_tok = v_tok = 2 * h_kv * d_qk;
      k_head = v_head = 2 * d_qk;
      break;
    default: break;
  }
  auto fill = [&](AttnStrides *st, int64_t tok_width, int64_t head, int64_t s) {
    st->head = head;
    if (fmt == NVTE_SBHD) {
      st->tok = b * tok_width;
      st->batch = tok_width;
    } else {
      st->tok = tok_width;
      st->batch = fmt == NVTE_BSHD ? s * tok_width : 0;
    }
  };
  fill(q, q_tok, q_head, s_q);
  fill(k, k_tok, k_head, s_kv);
  fill(v, v_tok, v_head, s_kv);
}

// Expected distance (elements) from `base` to `other` in a packed group, or -1 if independent.
void check_packed_pointers(NVTE_QKV_Layout_Group grp, const CallArgs &c, int64_t h, int64_t h_kv,
                           int64_t d) {
  const size_t es = dtype_size(c.q->data.dtype);
  auto expect = [&](const Tensor *base, const char *bn, const Tensor *t, const char *tn,
                    int64_t dist) {
    // Empty views address no element: frameworks give them any pointer (torch: the storage's),
    // so a batch of 0 packs nothing to check.
    if (base->data.numel() == 0 || t->data.numel() == 0) return;
    const char *want = static_cast<const char *>(base->data.dptr) + dist * static_cast<int64_t>(es);
    NVTE_CHECK(t->data.dptr == want, "argument '", tn, "': layout ", nvte_qkv_layout_name(c.layout),
               " packs it ", dist, " elements after '", bn, "', got a pointer ",
               (static_cast<const char *>(t->data.dptr) - static_cast<const char *>(base->data.dptr)) /
                   static_cast<int64_t>(es),
               " elements away");
  };
  switch (grp) {
    case NVTE_3HD: expect(c.q, "Q", c.k, "K", h * d); expect(c.q, "Q", c.v, "V", 2 * h * d); break;
    case NVTE_H3D: expect(c.q, "Q", c.k, "K", d); expect(c.q, "Q", c.v, "V", 2 * d); break;
    case NVTE_HD_2HD: expect(c.k, "K", c.v, "V", h_kv * d); break;
    case NVTE_HD_H2D: expect(c.k, "K", c.v, "V", d); break;
    default: break;
  }
}

// The kernels address elements with int64 offsets built from a tensor's dims (token, batch and head
// strides, up to 3x for packed layouts): the product of its dims, a 0 counted as 1 (an empty tensor
// may declare any other dims), must leave that room.
void check_offsets_fit(const SimpleTensor &t, const char *arg) {
  constexpr size_t kLimit = static_cast<size_t>(INT64_MAX) / 4;
  size_t prod = 1;
  for (size_t d : t.shape) {
    const size_t f = d == 0 ? 1 : d;
    NVTE_CHECK(prod <= kLimit / f, "argument '", arg, "': expected dims whose product (0 counted as 1) ",
               "is at most ", kLimit, " (the kernels' 64-bit element offsets), got ", shape_str(t.shape));
    prod *= f;
  }
}

// Reads and validates cu_seqlens (host memory) against the token count / padded length.
void check_cu_seqlens(const Tensor &cu, const char *arg, int64_t b, bool thd, int64_t tokens,
                      int64_t max_len) {
  check_has_data(cu, arg);
  check_dtype(cu.data, arg, {kNVTEInt32});
  check_shape(cu.data, arg, {static_cast<size_t>(b + 1)});
  if (cu.device != kNVTEDeviceCPU) return;  // device memory: the kernels trust it (as TE's do)
  const int32_t *v = cu.data.ptr<const int32_t>();
  NVTE_CHECK(!thd || v[0] == 0, "argument '", arg, "': expected ", arg, "[0] == 0, got ", v[0]);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t len = static_cast<int64_t>(v[i + 1]) - v[i];
    NVTE_CHECK(len >= 0, "argument '", arg, "': expected non-decreasing offsets, got ", arg, "[",
               i, "] = ", v[i], " > ", arg, "[", i + 1, "] = ", v[i + 1]);
    NVTE_CHECK(len <= max_len, "argument '", arg, "': sequence ", i, " has ", len,
               " tokens, more than the maximum ", max_len);
  }
  NVTE_CHECK(!thd || v[b] <= tokens, "argument '", arg, "': the last offset ", v[b],
             " exceeds the ", tokens, " tokens of the tensor");
}

// Validates a call and fills the problem description shared by forward and backward.
AttnParams make_params(const CallArgs &c, NVTEDevice *device_out, NVTEFusedAttnConfig *cfg_out) {
  check_enums(c);
  for (auto [t, n] : {std::pair{c.q, "Q"}, {c.k, "K"}, {c.v, "V"}}) {
    check_has_data(*t, n);
    check_dtype(t->data, n, {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
  }
  NVTE_CHECK(c.k->data.dtype == c.q->data.dtype && c.v->data.dtype == c.q->data.dtype,
             "arguments 'Q', 'K', 'V': expected one dtype, got ", dtype_name(c.q->data.dtype), ", ",
             dtype_name(c.k->data.dtype), ", ", dtype_name(c.v->data.dtype));
  const NVTE_QKV_Format fmt = nvte_get_qkv_format(c.layout);
  const bool thd = fmt == NVTE_THD;
  const size_t nd = thd ? 3 : 4;
  check_ndim(c.q->data, "Q", nd);
  check_ndim(c.k->data, "K", nd);
  check_ndim(c.v->data, "V", nd);
  check_offsets_fit(c.q->data, "Q");
  check_offsets_fit(c.k->data, "K");
  check_offsets_fit(c.v->data, "V");
  const auto &qs = c.q->data.shape, &ks = c.k->data.shape, &vs = c.v->data.shape;
  AttnParams p;
  p.format = fmt;
  p.dtype = c.q->data.dtype;
  p.h = static_cast<int64_t>(qs[nd - 2]);
  p.d_qk = static_cast<int64_t>(qs[nd - 1]);
  p.h_kv = static_cast<int64_t>(ks[nd - 2]);
  p.d_v = static_cast<int64_t>(vs[nd - 1]);
  NVTE_CHECK(ks[nd - 1] == qs[nd - 1], "argument 'K': expected head dim ", p.d_qk,
             " (Q's), got ", ks[nd - 1]);
  NVTE_CHECK(vs[nd - 2] == ks[nd - 2], "argument 'V': expected ", p.h_kv, " heads (K's), got ",
             vs[nd - 2]);
  NVTE_CHECK(p.h > 0 && p.h_kv > 0 && p.d_qk > 0 && p.d_v > 0,
             "arguments 'Q', 'K', 'V': expected non-zero heads and head dims, got Q ",
             shape_str(qs), ", K ", shape_str(ks), ", V ", shape_str(vs));
  NVTE_CHECK(p.h % p.h_kv == 0, "argument 'K': GQA needs Q's heads (", p.h,
             ") to be a multiple of K's (", p.h_kv, ")");
  if (thd) {
    NVTE_CHECK(c.cu_q != nullptr && c.cu_kv != nullptr,
               "arguments 'cu_seqlens_q', 'cu_seqlens_kv': required by the thd format");
    NVTE_CHECK(c.cu_q->data.ndim() == 1 && c.cu_q->data.shape[0] >= 1,
               "argument 'cu_seqlens_q': expected int32 [b + 1], got ", c.cu_q->data.describe());
    p.b = static_cast<int64_t>(c.cu_q->data.shape[0]) - 1;
    p.s_q = static_cast<int64_t>(c.max_q);
    p.s_kv = static_cast<int64_t>(c.max_kv);
    NVTE_CHECK(vs[0] == ks[0], "argument 'V': expected ", ks[0], " tokens (K's), got ", vs[0]);
  } else {
    const size_t bdim = fmt == NVTE_BSHD ? 0 : 1, sdim = fmt == NVTE_BSHD ? 1 : 0;
    p.b = static_cast<int64_t>(qs[bdim]);
    p.s_q = static_cast<int64_t>(qs[sdim]);
    p.s_kv = static_cast<int64_t>(ks[sdim]);
    NVTE_CHECK(ks[bdim] == qs[bdim] && vs[bdim] == qs[bdim], "arguments 'K', 'V': expected batch ",
               p.b, " (Q's), got ", ks[bdim], " and ", vs[bdim]);
    NVTE_CHECK(vs[sdim] == ks[sdim], "argument 'V': expected ", p.s_kv,
               " tokens per sequence (K's), got ", vs[sdim]);
    NVTE_CHECK(c.max_q == static_cast<size_t>(p.s_q) && c.max_kv == static_cast<size_t>(p.s_kv),
               "arguments 'max_seqlen_q', 'max_seqlen_kv': expected the sequence dims of Q and K (",
               p.s_q, ", ", p.s_kv, ") for ", fmt == NVTE_BSHD ? "bshd" : "sbhd", ", got ", c.max_q,
               ", ", c.max_kv);
  }
  const NVTE_QKV_Layout_Group grp = nvte_get_qkv_layout_group(c.layout);
  if (grp != NVTE_HD_HD_HD) {
    NVTE_CHECK(p.d_qk == p.d_v, "layout ", nvte_qkv_layout_name(c.layout),
               " packs K and V: expected equal head dims, got ", p.d_qk, " and ", p.d_v);
    if (grp == NVTE_3HD || grp == NVTE_H3D) {
      NVTE_CHECK(p.h == p.h_kv && (thd || p.s_q == p.s_kv), "layout ",
                 nvte_qkv_layout_name(c.layout),
                 " packs Q, K and V: expected equal heads and sequence lengths, got h=", p.h,
                 " h_kv=", p.h_kv, " s_q=", p.s_q, " s_kv=", p.s_kv);
      NVTE_CHECK(!thd || qs[0] == ks[0], "layout ", nvte_qkv_layout_name(c.layout),
                 " packs Q, K and V: expected equal token counts, got ", qs[0], " and ", ks[0]);
    }
    check_packed_pointers(grp, c, p.h, p.h_kv, p.d_qk);
  }
  layout_strides(c.layout, fmt, p.b, p.s_q, p.s_kv, p.h, p.h_kv, p.d_qk, p.d_v, &p.sq_, &p.sk_,
                 &p.sv_);
  p.q = c.q->data.dptr;
  p.k = c.k->data.dptr;
  p.v = c.v->data.dptr;

  // Sequence lengths.
  if (thd || is_padding(c.mask)) {
    NVTE_CHECK(c.cu_q != nullptr && c.cu_kv != nullptr, "arguments 'cu_seqlens_q', "
               "'cu_seqlens_kv': required by the ", nvte_mask_type_name(c.mask), " mask");
    check_cu_seqlens(*c.cu_q, "cu_seqlens_q", p.b, thd, thd ? static_cast<int64_t>(qs[0]) : 0,
                     p.s_q);
    check_cu_seqlens(*c.cu_kv, "cu_seqlens_kv", p.b, thd, thd ? static_cast<int64_t>(ks[0]) : 0,
                     p.s_kv);
    p.cu_q = c.cu_q->data.ptr<const int32_t>();
    p.cu_kv = c.cu_kv->data.ptr<const int32_t>();
  }

  // Mask and window.
  p.bottom_right = !(c.mask == NVTE_CAUSAL_MASK || c.mask == NVTE_PADDING_CAUSAL_MASK);
  p.win_left = c.left;
  p.win_right = is_causal(c.mask) ? 0 : c.right;

  // Bias.
  p.bias_type = c.bias_type;
  const bool bias_data = c.bias != nullptr && c.bias->data.has_data();
  if (c.bias_type == NVTE_POST_SCALE_BIAS) {
    NVTE_CHECK(bias_data, "argument 'Bias': required by post_scale_bias");
    const auto &bs = c.bias->data.shape;
    NVTE_CHECK(c.bias->data.dtype == p.dtype, "argument 'Bias': expected Q's dtype ",
               dtype_name(p.dtype), ", got ", dtype_name(c.bias->data.dtype));
    NVTE_CHECK(bs.size() == 4 && (bs[0] == 1 || bs[0] == static_cast<size_t>(p.b)) &&
                   (bs[1] == 1 || bs[1] == static_cast<size_t>(p.h)) &&
                   bs[2] == static_cast<size_t>(p.s_q) && bs[3] == static_cast<size_t>(p.s_kv),
               "argument 'Bias': expected [1 or ", p.b, ", 1 or ", p.h, ", ", p.s_q, ", ", p.s_kv,
               "], got ", shape_str(bs));
    p.bias = c.bias->data.dptr;
    p.bias_b = static_cast<int64_t>(bs[0]);
    p.bias_h = static_cast<int64_t>(bs[1]);
  } else if (c.bias_type == NVTE_ALIBI) {
    if (bias_data) {
      const auto &bs = c.bias->data.shape;
      check_dtype(c.bias->data, "Bias", {kNVTEFloat32});
      NVTE_CHECK((bs.size() == 1 && bs[0] == static_cast<size_t>(p.h)) ||
                     (bs.size() == 2 && bs[0] == static_cast<size_t>(p.b) &&
                      bs[1] == static_cast<size_t>(p.h)),
                 "argument 'Bias' (ALiBi slopes): expected fp32 [", p.h, "] or [", p.b, ", ", p.h,
                 "], got ", c.bias->data.describe());
      p.alibi_slopes = c.bias->data.ptr<const float>();
      p.slopes_stride_b = bs.size() == 2 ? p.h : 0;
    }
  } else {
    NVTE_CHECK(!bias_data || c.bias_type == NVTE_PRE_SCALE_BIAS,
               "argument 'Bias': given, but bias_type is no_bias");
  }
  p.scale = c.scale;

  // Dropout.
  p.dropout = c.dropout;
  if (c.dropout > 0.0f) {
    NVTE_CHECK(c.rng != nullptr && c.rng->data.has_data(),
               "argument 'rng_state': required when dropout > 0");
    check_dtype(c.rng->data, "rng_state", {kNVTEInt64});
    check_shape(c.rng->data, "rng_state", {2});
    read_rng_state(*c.rng, &p);
    p.dropout_thresh = dropout_threshold(c.dropout);
  }

  NVTE_CHECK(p.rng_state == nullptr || c.q->device == kNVTEDeviceGPU,
             "argument 'rng_state': device memory, but the other tensors are on the CPU");
  const NVTEDevice device = check_same_device({{c.q, "Q"}, {c.k, "K"}, {c.v, "V"},
                                               {bias_data ? c.bias : nullptr, "Bias"},
                                               {p.cu_q ? c.cu_q : nullptr, "cu_seqlens_q"},
                                               {p.cu_kv ? c.cu_kv : nullptr, "cu_seqlens_kv"}});
  // The flash kernel's own rules (the same ones the selection applies).
  NVTEFusedAttnConfig cfg{device, p.dtype, p.dtype, c.layout, c.bias_type, c.mask, c.dropout,
                          static_cast<size_t>(p.h), static_cast<size_t>(p.h_kv), c.max_q, c.max_kv,
                          static_cast<size_t>(p.d_qk), static_cast<size_t>(p.d_v), c.left, c.right};
  const std::string why = rule_reason(NVTE_Flash, cfg, this_platform(device));
  NVTE_CHECK_SUPPORTED(why.empty(), "the flash backend cannot run this config: ", why);
  *device_out = device;
  *cfg_out = cfg;
  return p;
}

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
