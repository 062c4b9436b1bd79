// Fuzzes fused attention: the backend selection (nvte_fused_attn_backend_reasons with any config and
// platform, nvte_get_fused_attn_backend; their answers must agree with each other and with the
// preference order), the forward and backward entry points (separate Q/K/V in all 15 layouts, the
// qkv- and kv-packed calls), and nvte_fused_attn_dropout_mask. Configs cover every layout, mask and
// bias type, GQA, windows, dropout, is_training, cu_seqlens contents (thd offsets, padding lengths,
// broken ones), bias shapes and ALiBi slopes, with the usual handle / pointer / dtype / shape /
// overlap / device mutations.
//
// Packed layouts through the separate-pointer API are views into one packed buffer: the harness
// allocates that buffer for the declared Q/K/V and only breaks the views in ways that cannot claim
// more memory than it holds (NULL handle or pointer, GPU tag, one pointer moved inside the buffer,
// one dtype changed); the library must reject any mislabelled view.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "transformer_engine_lite/fused_attn.h"

namespace {

using fz::Buf;
using fz::Ctx;
using fz::Input;

const char *kArchs[] = {nullptr, "", "gfx942", "gfx942:sramecc+:xnack-", "gfx90a", "gfx950",
                        "gfx1100", "sm_90", "sm_80", "sm_75", "sm_", "sm_x", "gfx9"};

void selection(Ctx &ctx) {
  Input &in = ctx.in();
  NVTEFusedAttnConfig c;
  std::memset(&c, 0, sizeof(c));
  c.device = static_cast<NVTEDevice>(in.u8() < 240 ? in.u8() % 2 : static_cast<int>(in.i64(0)));
  c.q_dtype = static_cast<NVTEDType>(in.u8() < 240 ? in.u8() % kNVTENumTypes : static_cast<int>(in.i64(0)));
  c.kv_dtype = in.flag() ? c.q_dtype : static_cast<NVTEDType>(in.u8() % (kNVTENumTypes + 1));
  c.qkv_layout = static_cast<NVTE_QKV_Layout>(in.u8() < 240 ? in.u8() % 15 : static_cast<int>(in.i64(0)));
  c.bias_type = static_cast<NVTE_Bias_Type>(in.u8() < 240 ? in.u8() % 4 : static_cast<int>(in.i64(0)));
  c.attn_mask_type = static_cast<NVTE_Mask_Type>(in.u8() < 240 ? in.u8() % 6 : static_cast<int>(in.i64(0)));
  c.dropout = in.u8() < 128 ? 0.0f : in.real(0.1f);
  c.num_attn_heads = in.size(in.range(1, 16));
  c.num_gqa_groups = in.size(in.range(1, 16));
  c.max_seqlen_q = in.size(in.range(0, 64));
  c.max_seqlen_kv = in.size(in.range(0, 64));
  c.head_dim_qk = in.size(in.range(1, 128) * 2);
  c.head_dim_v = in.flag() ? c.head_dim_qk : in.size(in.range(1, 128) * 2);
  c.window_size_left = in.i64(-1);
  c.window_size_right = in.i64(-1);
  NVTEFusedAttnPlatform pf;
  std::memset(&pf, 0, sizeof(pf));
  const bool with_pf = in.flag();
  pf.is_rocm = in.flag();
  pf.has_ck = in.flag();
  pf.has_aotriton = in.flag();
  pf.has_flash = in.flag();
  pf.gpu_arch = kArchs[in.u8() % (sizeof(kArchs) / sizeof(kArchs[0]))];
  const uint8_t nulls = in.u8() % 8;  // NULL config / selected / reasons
  NVTE_Fused_Attn_Backend sel = static_cast<NVTE_Fused_Attn_Backend>(-7);
  const char *reasons[NVTE_NUM_FUSED_ATTN_BACKENDS] = {};
  const NVTEStatus st = ctx.call("nvte_fused_attn_backend_reasons", [&] {
    return nvte_fused_attn_backend_reasons(nulls == 1 ? nullptr : &c, with_pf ? &pf : nullptr,
                                           nulls == 2 ? nullptr : &sel, nulls == 3 ? nullptr : reasons);
  });
  if (nulls == 1 && st == NVTE_SUCCESS) fz::fail("nvte_fused_attn_backend_reasons accepted a NULL config");
  if (st == NVTE_SUCCESS && nulls != 2 && nulls != 3) {
    // Preference ck > aotriton > flash > unfused: the selected one is the first with reason "".
    const NVTE_Fused_Attn_Backend pref[] = {NVTE_CK, NVTE_AOTriton, NVTE_Flash, NVTE_Unfused};
    NVTE_Fused_Attn_Backend first = NVTE_No_Backend;
    for (NVTE_Fused_Attn_Backend b : pref) {
      if (reasons[b] == nullptr) fz::fail("nvte_fused_attn_backend_reasons left a reason NULL");
      if (first == NVTE_No_Backend && reasons[b][0] == '\0') first = b;
    }
    if (sel != first) {
      fz::fail("nvte_fused_attn_backend_reasons selected " + std::to_string(static_cast<int>(sel)) +
               ", the first eligible backend is " + std::to_string(static_cast<int>(first)));
    }
    if (!with_pf) {  // this build's platform: the same answer as the selection call
      const NVTE_Fused_Attn_Backend got = nvte_get_fused_attn_backend(
          c.q_dtype, c.kv_dtype, c.qkv_layout, c.bias_type, c.attn_mask_type, c.dropout,
          c.num_attn_heads, c.num_gqa_groups, c.max_seqlen_q, c.max_seqlen_kv, c.head_dim_qk,
          c.head_dim_v, c.window_size_left, c.window_size_right, c.device);
      const NVTEStatus gst = nvte_get_last_status();
      Ctx::check_status("nvte_get_fused_attn_backend", gst);
      if (got != sel || (got == NVTE_No_Backend) != (gst != NVTE_SUCCESS)) {
        fz::fail("nvte_get_fused_attn_backend returned " + std::to_string(static_cast<int>(got)) +
                 " (status " + std::to_string(static_cast<int>(gst)) + "), the reasons call " +
                 std::to_string(static_cast<int>(sel)));
      }
    }
  }
  if (st != NVTE_SUCCESS && nulls != 1) {  // a malformed config: the selection call says so too
    const NVTE_Fused_Attn_Backend got = nvte_get_fused_attn_backend(
        c.q_dtype, c.kv_dtype, c.qkv_layout, c.bias_type, c.attn_mask_type, c.dropout,
        c.num_attn_heads, c.num_gqa_groups, c.max_seqlen_q, c.max_seqlen_kv, c.head_dim_qk,
        c.head_dim_v, c.window_size_left, c.window_size_right, c.device);
    Ctx::check_status("nvte_get_fused_attn_backend", nvte_get_last_status());
    if (got != NVTE_No_Backend || nvte_get_last_status() == NVTE_SUCCESS) {
      fz::fail("nvte_get_fused_attn_backend accepted a config the reasons call rejects");
    }
  }
}

// ---------------------------------------------------------------- calls
struct Cfg {
  int entry;  // 0 fwd, 1 bwd, 2 fwd_qkvpacked, 3 bwd_qkvpacked, 4 fwd_kvpacked, 5 bwd_kvpacked
  NVTE_QKV_Layout layout;
  NVTE_QKV_Format fmt;
  NVTE_QKV_Layout_Group grp;
  NVTEDType dtype;
  size_t b, s_q, s_kv, h, h_kv, d, d_v;
  size_t t_q, t_kv;  // thd tokens
  std::vector<int32_t> cu_q, cu_kv;
  NVTE_Mask_Type mask;
  NVTE_Bias_Type bias;
  int64_t left, right;
  float dropout, scale;
  bool training, deterministic;
  size_t max_q, max_kv;
};

std::vector<int32_t> offsets(Input &in, size_t b, size_t max_len, size_t *total) {
  std::vector<int32_t> cu = {0};
  for (size_t i = 0; i < b; ++i) cu.push_back(cu.back() + static_cast<int32_t>(in.range(0, max_len)));
  *total = static_cast<size_t>(cu.back()) + (in.u8() % 4 == 0 ? in.range(0, 2) : 0);
  return cu;
}

// Dense [b, s, h, d] / [s, b, h, d] / [t, h, d] for the call's format.
std::vector<size_t> dense(const Cfg &c, size_t s, size_t t, size_t h, size_t d) {
  if (c.fmt == NVTE_THD) return {t, h, d};
  if (c.fmt == NVTE_SBHD) return {s, c.b, h, d};
  return {c.b, s, h, d};
}
// The packed QKV ([.., 3, h, d] or [.., h, 3, d]) or KV ([.., 2, h_kv, d] or [.., h_kv, 2, d]).
std::vector<size_t> packed(const Cfg &c, bool qkv) {
  const size_t n = qkv ? 3 : 2, h = qkv ? c.h : c.h_kv, s = qkv ? c.s_q : c.s_kv,
               t = qkv ? c.t_q : c.t_kv;
  const bool hxd = c.grp == NVTE_H3D || c.grp == NVTE_HD_H2D;
  std::vector<size_t> lead = c.fmt == NVTE_THD ? std::vector<size_t>{t}
                             : c.fmt == NVTE_SBHD ? std::vector<size_t>{s, c.b}
                                                  : std::vector<size_t>{c.b, s};
  if (hxd) lead.insert(lead.end(), {h, n, c.d});
  else lead.insert(lead.end(), {n, h, c.d});
  return lead;
}

bool decode(Input &in, Cfg *c) {
  c->entry = in.u8() % 6;
  const uint8_t l = in.u8();
  c->layout = l < 250 ? static_cast<NVTE_QKV_Layout>(l % 15) : static_cast<NVTE_QKV_Layout>(static_cast<int>(in.i64(15)));
  if (c->entry >= 2) {  // the packed calls take their group's layouts (sometimes any)
    const int fmt = static_cast<int>(nvte_get_qkv_format(c->layout));
    const bool qkv = c->entry < 4;
    const int base = fmt == NVTE_SBHD ? 0 : fmt == NVTE_BSHD ? 5 : 10;
    if (in.u8() % 16 != 15) c->layout = static_cast<NVTE_QKV_Layout>(base + (qkv ? 0 : 2) + in.u8() % 2);
  }
  c->fmt = nvte_get_qkv_format(c->layout);
  c->grp = nvte_get_qkv_layout_group(c->layout);
  c->dtype = fz::pick_hp(in);
  c->b = in.range(0, 3);
  c->h_kv = in.range(1, 3);
  c->h = c->h_kv * in.range(1, 3);
  c->d = in.u8() % 32 == 31 ? (in.flag() ? 0 : 257) : in.range(1, 12);
  c->d_v = c->grp == NVTE_HD_HD_HD && in.flag() ? in.range(1, 12) : c->d;
  c->s_q = in.range(0, 10);
  c->s_kv = in.range(0, 10);
  const bool qkv_packed = c->grp == NVTE_3HD || c->grp == NVTE_H3D;
  if (qkv_packed && in.u8() % 16 != 0) {
    c->h = c->h_kv;
    c->s_kv = c->s_q;
  }
  c->mask = static_cast<NVTE_Mask_Type>(in.u8() < 250 ? in.u8() % 6 : static_cast<int>(in.i64(6)));
  c->bias = static_cast<NVTE_Bias_Type>(in.u8() < 250 ? in.u8() % 4 : static_cast<int>(in.i64(4)));
  const bool causal = c->mask != NVTE_NO_MASK && c->mask != NVTE_PADDING_MASK;
  c->left = in.u8() % 4 == 0 ? in.i64(-1) : -1;
  c->right = in.u8() % 4 == 0 ? in.i64(causal ? 0 : -1) : (causal ? 0 : -1);
  c->dropout = in.u8() % 4 == 3 ? in.real(0.25f) : 0.0f;
  c->scale = in.real(0.35f);
  c->training = !in.flag();
  c->deterministic = in.flag();
  c->t_q = c->t_kv = 0;
  if (c->fmt == NVTE_THD) {
    c->cu_q = offsets(in, c->b, c->s_q, &c->t_q);
    if (qkv_packed) {
      c->cu_kv = c->cu_q;
      c->t_kv = c->t_q;
    } else {
      c->cu_kv = offsets(in, c->b, c->s_kv, &c->t_kv);
    }
  } else {
    size_t unused;
    c->cu_q = offsets(in, c->b, c->s_q, &unused);
    c->cu_kv = qkv_packed ? c->cu_q : offsets(in, c->b, c->s_kv, &unused);
    if (in.u8() % 8 == 7) {  // padding lengths need not start at 0
      const int32_t shift = static_cast<int32_t>(in.range(0, 9)) - 4;
      for (int32_t &v : c->cu_q) v += shift;
    }
  }
  for (auto *cu : {&c->cu_q, &c->cu_kv}) {  // sometimes broken offsets
    if (in.u8() % 8 != 7 || cu->empty()) continue;
    (*cu)[in.u8() % cu->size()] = static_cast<int32_t>(in.i64(3));
  }
  if (in.u8() % 32 == 31 && c->fmt != NVTE_THD) {  // an empty batch of any size: s = 0, b huge
    c->b = fz::huge_dim(in) >> 3;
    c->s_q = c->s_kv = 0;
    c->cu_q.clear();
    c->cu_kv.clear();
  }
  c->max_q = in.u8() % 16 == 0 ? in.size(c->s_q) : c->s_q;
  c->max_kv = in.u8() % 16 == 0 ? in.size(c->s_kv) : c->s_kv;
  return fz::numel(dense(*c, c->s_q, c->t_q, c->h, std::max(c->d, c->d_v))) <= 2048 &&
         fz::numel(dense(*c, c->s_kv, c->t_kv, c->h, std::max(c->d, c->d_v))) <= 2048 &&
         c->b * c->h * c->s_q * c->s_kv <= 4096;
}

// Q, K, V handles for the separate-pointer calls. Packed layouts: views into one packed buffer.
struct QKV {
  NVTETensor q = nullptr, k = nullptr, v = nullptr;
};

NVTETensor view(Ctx &ctx, void *p, NVTEDType t, const std::vector<size_t> &shape) {
  Input &in = ctx.in();
  const uint8_t m = in.u8() % 16;
  if (m == 1) return nullptr;
  NVTETensor h = nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING);
  ctx.adopt(h);
  if (m == 2) nvte_set_tensor_device(h, kNVTEDeviceGPU);
  NVTEBasicTensor bt;
  std::memset(&bt, 0, sizeof(bt));
  bt.data_ptr = m == 3 ? nullptr : p;
  bt.dtype = t;
  bt.shape.ndim = shape.size();
  for (size_t i = 0; i < shape.size(); ++i) bt.shape.data[i] = shape[i];
  Ctx::expect_ok("nvte_set_tensor_param", nvte_set_tensor_param(&h, kNVTERowwiseData, &bt));
  return h;
}

QKV make_qkv(Ctx &ctx, const Cfg &c) {
  Input &in = ctx.in();
  QKV r;
  const size_t es = fz::dsize(c.dtype);
  const auto qs = dense(c, c.s_q, c.t_q, c.h, c.d), ks = dense(c, c.s_kv, c.t_kv, c.h_kv, c.d),
             vs = dense(c, c.s_kv, c.t_kv, c.h_kv, c.d_v);
  if (c.grp == NVTE_HD_HD_HD) {
    r.q = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, qs}});
    r.k = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, ks}});
    r.v = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, vs}});
    return r;
  }
  const bool qkv = c.grp == NVTE_3HD || c.grp == NVTE_H3D;
  const bool hxd = c.grp == NVTE_H3D || c.grp == NVTE_HD_H2D;
  const size_t bytes = fz::numel(packed(c, qkv)) * es;
  char *base = static_cast<char *>(ctx.arena().fresh(bytes));
  fz::Arena::fill(in, base, bytes, c.dtype);
  const size_t heads = qkv ? c.h : c.h_kv;
  const size_t step = (hxd ? c.d : heads * c.d) * es;  // bytes between the slices of one token
  std::vector<char *> ptr = {base, base + step, base + 2 * step};
  NVTEDType dt[3] = {c.dtype, c.dtype, c.dtype};
  const uint8_t g = in.u8() % 8;  // group mutation: move one pointer inside the buffer, or a dtype
  if (g == 1 && bytes > 0) {
    const size_t which = in.u8() % (qkv ? 3 : 2);
    const size_t room = bytes / es;
    ptr[which] = base + es * (in.u8() % room);
  } else if (g == 2) {
    dt[in.u8() % 3] = static_cast<NVTEDType>(in.u8() % kNVTENumTypes);
  }
  if (qkv) {
    r.q = view(ctx, ptr[0], dt[0], qs);
    r.k = view(ctx, ptr[1], dt[1], ks);
    r.v = view(ctx, ptr[2], dt[2], vs);
  } else {
    r.q = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, qs}});
    r.k = view(ctx, ptr[0], dt[0], ks);
    r.v = view(ctx, ptr[1], dt[1], vs);
  }
  return r;
}

struct Extras {
  NVTETensor bias = nullptr, dbias = nullptr, cu_q = nullptr, cu_kv = nullptr, rng = nullptr,
             ws = nullptr;
};

// Bias, cu_seqlens, rng_state and workspace, created after the outputs so they may land inside them.
Extras make_extras(Ctx &ctx, const Cfg &c, bool bwd) {
  Input &in = ctx.in();
  Extras e;
  if (c.bias == NVTE_POST_SCALE_BIAS || in.u8() % 16 == 15) {
    const std::vector<size_t> bs = {in.flag() ? 1 : c.b, in.flag() ? 1 : c.h, c.s_q, c.s_kv};
    e.bias = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, bs}});
    if (bwd && in.u8() % 4 != 0) {
      e.dbias = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, bs}});
    }
  } else if (c.bias == NVTE_ALIBI && in.flag()) {
    const bool per_batch = in.flag() && fz::numel({c.b, c.h}) <= fz::kMaxElems;
    const std::vector<size_t> bs = per_batch ? std::vector<size_t>{c.b, c.h} : std::vector<size_t>{c.h};
    e.bias = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEFloat32, bs}});
  }
  const bool padding = c.mask == NVTE_PADDING_MASK || c.mask == NVTE_PADDING_CAUSAL_MASK ||
                       c.mask == NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
  if (c.fmt == NVTE_THD || padding || in.u8() % 8 == 7) {
    e.cu_q = ctx.int32_tensor(c.cu_q);
    e.cu_kv = in.u8() % 16 == 15 ? e.cu_q : ctx.int32_tensor(c.cu_kv);
  }
  if (c.dropout > 0.0f || in.u8() % 8 == 7) {
    e.rng = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEInt64, {2}}});
  }
  const uint8_t w = in.u8() % 4;
  if (w == 1) e.ws = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {});
  if (w == 2) e.ws = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEByte, {16}}});
  return e;
}

void attention(Ctx &ctx) {
  Input &in = ctx.in();
  Cfg c;
  if (!decode(in, &c)) return;
  const auto qs = dense(c, c.s_q, c.t_q, c.h, c.d), os = dense(c, c.s_q, c.t_q, c.h, c.d_v),
             ks = dense(c, c.s_kv, c.t_kv, c.h_kv, c.d), vs = dense(c, c.s_kv, c.t_kv, c.h_kv, c.d_v);
  const std::vector<size_t> lse_shape = {c.b, c.h, c.s_q};
  const bool bwd = c.entry % 2 == 1;
  if (c.entry <= 1) {  // separate Q, K, V
    const QKV x = make_qkv(ctx, c);
    NVTETensor o = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, os}});
    NVTETensor lse = c.training || bwd || in.u8() % 4 == 0
                         ? ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEFloat32, lse_shape}})
                         : nullptr;
    if (!bwd) {
      const Extras e = make_extras(ctx, c, false);
      ctx.call("nvte_fused_attn_fwd", [&] {
        return nvte_fused_attn_fwd(x.q, x.k, x.v, e.bias, o, lse, e.cu_q, e.cu_kv, e.rng, c.max_q,
                                   c.max_kv, c.training, c.scale, c.dropout, c.layout, c.bias,
                                   c.mask, c.left, c.right, e.ws, nullptr);
      });
      return;
    }
    NVTETensor d_o = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, os}});
    NVTETensor dq = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, qs}});
    NVTETensor dk = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, ks}});
    NVTETensor dv = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, vs}});
    const Extras e = make_extras(ctx, c, true);
    ctx.call("nvte_fused_attn_bwd", [&] {
      return nvte_fused_attn_bwd(x.q, x.k, x.v, o, d_o, lse, e.bias, dq, dk, dv, e.dbias, e.cu_q,
                                 e.cu_kv, e.rng, c.max_q, c.max_kv, c.scale, c.dropout, c.layout,
                                 c.bias, c.mask, c.left, c.right, c.deterministic, e.ws, nullptr);
    });
    return;
  }
  const bool qkv = c.entry <= 3;
  NVTETensor q = nullptr, packed_t;
  if (qkv) {
    packed_t = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, packed(c, true)}});
  } else {
    q = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, qs}});
    packed_t = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, packed(c, false)}});
  }
  NVTETensor o = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, os}});
  NVTETensor lse = c.training || bwd || in.u8() % 4 == 0
                       ? ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEFloat32, lse_shape}})
                       : nullptr;
  if (!bwd) {
    const Extras e = make_extras(ctx, c, false);
    if (qkv) {
      ctx.call("nvte_fused_attn_fwd_qkvpacked", [&] {
        return nvte_fused_attn_fwd_qkvpacked(packed_t, e.bias, o, lse, e.cu_q, e.rng, c.max_q,
                                             c.training, c.scale, c.dropout, c.layout, c.bias,
                                             c.mask, c.left, c.right, e.ws, nullptr);
      });
    } else {
      ctx.call("nvte_fused_attn_fwd_kvpacked", [&] {
        return nvte_fused_attn_fwd_kvpacked(q, packed_t, e.bias, o, lse, e.cu_q, e.cu_kv, e.rng,
                                            c.max_q, c.max_kv, c.training, c.scale, c.dropout,
                                            c.layout, c.bias, c.mask, c.left, c.right, e.ws, nullptr);
      });
    }
    return;
  }
  NVTETensor d_o = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, os}});
  NVTETensor dq = qkv ? nullptr : ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, c.dtype, qs}});
  NVTETensor dpacked = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING,
                                  {Buf{kNVTERowwiseData, c.dtype, packed(c, qkv)}});
  const Extras e = make_extras(ctx, c, true);
  if (qkv) {
    ctx.call("nvte_fused_attn_bwd_qkvpacked", [&] {
      return nvte_fused_attn_bwd_qkvpacked(packed_t, o, d_o, lse, e.bias, dpacked, e.dbias, e.cu_q,
                                           e.rng, c.max_q, c.scale, c.dropout, c.layout, c.bias,
                                           c.mask, c.left, c.right, c.deterministic, e.ws, nullptr);
    });
  } else {
    ctx.call("nvte_fused_attn_bwd_kvpacked", [&] {
      return nvte_fused_attn_bwd_kvpacked(q, packed_t, o, d_o, lse, e.bias, dq, dpacked, e.dbias,
                                          e.cu_q, e.cu_kv, e.rng, c.max_q, c.max_kv, c.scale,
                                          c.dropout, c.layout, c.bias, c.mask, c.left, c.right,
                                          c.deterministic, e.ws, nullptr);
    });
  }
}

void dropout_mask(Ctx &ctx) {
  Input &in = ctx.in();
  NVTETensor rng = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEInt64, {2}}});
  const float p = in.u8() < 200 ? static_cast<float>(in.range(0, 9)) / 10.0f : in.real(0.5f);
  const std::vector<size_t> ms = {in.range(0, 3), in.range(0, 3), in.range(0, 16), in.range(0, 16)};
  NVTETensor mask = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEByte, ms}});
  ctx.call("nvte_fused_attn_dropout_mask", [&] { return nvte_fused_attn_dropout_mask(rng, p, mask, nullptr); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Input in(data, size);
  Ctx ctx(in);
  const uint8_t what = in.u8() % 8;
  if (what == 6) {
    selection(ctx);
  } else if (what == 7) {
    dropout_mask(ctx);
  } else {
    attention(ctx);
  }
  return 0;
}
