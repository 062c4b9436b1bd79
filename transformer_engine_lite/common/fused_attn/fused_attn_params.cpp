// fused_attn.h's argument checks and the AttnParams they yield (fused_attn.cpp's entry points
// call make_params first): enums, layout -> strides, packed views, cu_seqlens, dtypes, shapes,
// devices, and the flash kernel's own rules. Every check runs before any output is written.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../util/api.h"
#include "backend_select.h"
#include "fused_attn_entry.h"

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace nvte
