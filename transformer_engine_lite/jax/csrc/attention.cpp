// te_lite fused attention handlers (pytorch/csrc/attention.cpp's ops): the flash backend's
// forward / backward (nvte_fused_attn_fwd / bwd) and its dropout keep mask. Differences from the
// torch ops, forced by XLA (no views, results allocated by the caller):
//  - packed layouts take the packed buffer (TE-JAX's convention): 3hd / h3d groups (bs3hd, ...):
//    q = QKV [b, s, 3, h, d] / [b, s, h, 3, d] (sbhd, thd alike), k and v empty; hd_2hd / hd_h2d
//    groups (bshd_bs2hd, ...): q dense, k = KV [b, s, 2, h_kv, d] / [b, s, h_kv, 2, d], v empty.
//    The core gets the views torch passes (slices of the packed buffer), and out / dq / dk / dv
//    have the views' shapes, as in torch;
//  - rng_state: int64 [2] = {seed, offset}, or the same bytes as int32 / uint32 [4] (jax has no
//    int64 arrays without jax_enable_x64);
//  - thd: O / dQ / dK / dV are zero-filled on the CPU (torch's at::zeros: tokens past
//    cu_seqlens[b] belong to no sequence and the kernels leave them alone). The GPU handler cannot
//    memset without CUDA headers: there those tokens are left unwritten (the caller masks them).
#include <cstring>

#include <transformer_engine_lite/fused_attn.h>

#include "handler.h"

namespace te_lite {
namespace {

// ------------------------------------------------------------------------------------ enums
// Names come from the core (nvte_*_name), so the accepted strings are exactly the C API's.
template <typename Enum>
ffi::Error parse_enum(const char *op, const char *arg, std::string_view name, int count,
                      const char *(*name_of)(Enum), Enum *out) {
  std::string valid;
  for (int i = 0; i < count; ++i) {
    const char *n = name_of(static_cast<Enum>(i));
    if (name == n) {
      *out = static_cast<Enum>(i);
      return ffi::Error::Success();
    }
    valid += (i ? ", " : "");
    valid += n;
  }
  TE_LITE_CHECK(false, op, ": argument '", arg, "': expected one of {", valid, "}, got '", name,
                "'");
}

// ------------------------------------------------------------------------------------ layouts
// One call's Q, K, V as the core takes them: the shapes of torch's views and handles over each
// view's first element (the core derives the strides from the layout).
struct QKV {
  Shape q, k, v;
  DataType q_type, k_type, v_type;
  TensorWrapper tq, tk, tv;
  explicit QKV(const Device &dev) : tq(dev), tk(dev), tv(dev) {}
};

// A handle over `buf` at element `offset`, described as `shape` (a slice of a packed buffer). An
// empty buffer gets the never-read address (plus the offset, so the core's pointer checks hold).
void set_view(TensorWrapper &w, const Buffer &buf, const Shape &shape, int64_t offset) {
  NVTEBasicTensor bt{};
  bt.dtype = *nvte_dtype_of(buf.element_type());  // checked high precision by the caller
  char *base = static_cast<char *>(numel(buf) == 0 ? empty_tensor_address() : buf.untyped_data());
  bt.data_ptr = base + offset * static_cast<int64_t>(nvte_dtype_size(bt.dtype));
  bt.shape.ndim = shape.size();
  for (size_t i = 0; i < shape.size(); ++i) bt.shape.data[i] = static_cast<size_t>(shape[i]);
  w.set(kNVTERowwiseData, bt);
}

ffi::Error layout_views(const char *op, NVTE_QKV_Layout layout, const Buffer &q, const Buffer &k,
                        const Buffer &v, QKV *r) {
  const NVTE_QKV_Format fmt = nvte_get_qkv_format(layout);
  const NVTE_QKV_Layout_Group grp = nvte_get_qkv_layout_group(layout);
  const char *name = nvte_qkv_layout_name(layout);
  const int64_t nd = fmt == NVTE_THD ? 3 : 4;
  const char *lead = fmt == NVTE_THD ? "t" : fmt == NVTE_BSHD ? "b, s" : "s, b";
  // A dense (view-shaped) argument, wrapped as is.
  auto dense = [&](const Buffer &t, const char *arg, Shape *view, TensorWrapper *w) {
    TE_LITE_TRY(check_dtype(op, arg, t, kHighPrecision));
    TE_LITE_CHECK(ndim(t) == nd, op, ": argument '", arg, "': layout ", name, " expects a ", nd,
                  "-D tensor ([", lead, ", h, d]), got shape ", shape_str(t));
    *view = shape_of(t);
    w->data(t);
    return ffi::Error::Success();
  };
  // A packed buffer of n slices: [.., n, h, d] or (hxd) [.., h, n, d]; *view: one slice's shape.
  auto packed = [&](const Buffer &t, const char *arg, int64_t n, bool hxd, Shape *view) {
    TE_LITE_TRY(check_dtype(op, arg, t, kHighPrecision));
    const int64_t at = hxd ? nd - 1 : nd - 2;
    TE_LITE_CHECK(ndim(t) == nd + 1 && dim(t, at) == n, op, ": argument '", arg, "': layout ",
                  name, " expects the packed ", nd + 1, "-D buffer [", lead, ", ",
                  hxd ? "h, " : "", n, hxd ? "" : ", h", ", d], got shape ", shape_str(t));
    *view = shape_of(t);
    view->erase(view->begin() + at);
    return ffi::Error::Success();
  };
  // An argument the layout packs into another one.
  auto unused = [&](const Buffer &t, const char *arg, const char *into) {
    TE_LITE_CHECK(numel(t) == 0, op, ": argument '", arg, "': layout ", name, " packs it into '",
                  into, "': expected an empty array (0 elements), got shape ", shape_str(t));
    return ffi::Error::Success();
  };
  r->q_type = r->k_type = r->v_type = q.element_type();
  switch (grp) {
    case NVTE_3HD:
    case NVTE_H3D: {
      const bool hxd = grp == NVTE_H3D;
      TE_LITE_TRY(packed(q, "q", 3, hxd, &r->q));
      TE_LITE_TRY(unused(k, "k", "q"));
      TE_LITE_TRY(unused(v, "v", "q"));
      r->k = r->v = r->q;
      const int64_t step = hxd ? r->q[nd - 1] : r->q[nd - 2] * r->q[nd - 1];
      set_view(r->tq, q, r->q, 0);
      set_view(r->tk, q, r->k, step);
      set_view(r->tv, q, r->v, 2 * step);
      break;
    }
    case NVTE_HD_2HD:
    case NVTE_HD_H2D: {
      const bool hxd = grp == NVTE_HD_H2D;
      TE_LITE_TRY(dense(q, "q", &r->q, &r->tq));
      TE_LITE_TRY(packed(k, "k", 2, hxd, &r->k));
      TE_LITE_TRY(unused(v, "v", "k"));
      r->v = r->k;
      r->k_type = r->v_type = k.element_type();
      const int64_t step = hxd ? r->k[nd - 1] : r->k[nd - 2] * r->k[nd - 1];
      set_view(r->tk, k, r->k, 0);
      set_view(r->tv, k, r->v, step);
      break;
    }
    default:
      TE_LITE_TRY(dense(q, "q", &r->q, &r->tq));
      TE_LITE_TRY(dense(k, "k", &r->k, &r->tk));
      TE_LITE_TRY(dense(v, "v", &r->v, &r->tv));
      r->k_type = k.element_type();
      r->v_type = v.element_type();
      break;
  }
  return ffi::Error::Success();
}

// Batch size of a call: from Q's batch dim, or cu_seqlens_q's length for thd.
ffi::Error batch_of(const char *op, NVTE_QKV_Format fmt, const Shape &q, const Buffer &cu_q,
                    int64_t *b) {
  if (fmt != NVTE_THD) {
    *b = fmt == NVTE_BSHD ? q[0] : q[1];
    return ffi::Error::Success();
  }
  TE_LITE_CHECK(present(cu_q) && ndim(cu_q) == 1, op,
                ": argument 'cu_seqlens_q': expected int32 [b + 1] for the thd format, got ",
                present(cu_q) ? shape_str(cu_q) : std::string("None"));
  *b = dim(cu_q, 0) - 1;
  return ffi::Error::Success();
}

// rng_state as int64 [2]: as given, or the same bytes given as int32 / uint32 [4].
bool is_rng_words(const Buffer &rng) {
  const DataType t = rng.element_type();
  return (t == DataType::S32 || t == DataType::U32) && shape_of(rng) == Shape{4};
}
void set_rng(TensorWrapper &w, const Buffer &rng) {
  if (!is_rng_words(rng)) {
    w.data(rng);
    return;
  }
  NVTEBasicTensor bt{rng.untyped_data(), kNVTEInt64, {}};
  bt.shape.ndim = 1;
  bt.shape.data[0] = 2;
  w.set(kNVTERowwiseData, bt);
}

// Side inputs are handed to the core, which checks their dtypes and shapes; only a dtype the
// wrapper cannot describe is refused here (torch's TensorWrapper refuses it the same way).
ffi::Error check_wrappable(const char *op, const char *arg, const Buffer &t) {
  TE_LITE_CHECK(!present(t) || nvte_dtype_of(t.element_type()).has_value(), op, ": argument '",
                arg, "': dtype ", dtype_name(t.element_type()),
                " has no transformer_engine_lite equivalent");
  return ffi::Error::Success();
}

// rng_state: 32-bit words only as [4] (the core checks int64 [2] itself).
ffi::Error check_rng(const char *op, const Buffer &rng) {
  const DataType t = rng.element_type();
  if (!present(rng) || is_rng_words(rng)) return ffi::Error::Success();
  TE_LITE_CHECK(t != DataType::S32 && t != DataType::U32, op,
                ": argument 'rng_state': expected int64 [2] = {seed, offset} or the same bytes as "
                "int32 / uint32 [4], got ", dtype_name(t), " of shape ", shape_str(rng));
  return check_wrappable(op, "rng_state", rng);
}

// The arguments forward and backward share; absent optional tensors are handles without data.
struct Call {
  NVTE_QKV_Layout layout = NVTE_BSHD_BSHD_BSHD;
  NVTE_Bias_Type bias_type = NVTE_NO_BIAS;
  NVTE_Mask_Type mask = NVTE_NO_MASK;
  TensorWrapper tbias, tcu_q, tcu_kv, trng;
  explicit Call(const Device &dev) : tbias(dev), tcu_q(dev), tcu_kv(dev), trng(dev) {}
};

ffi::Error parse_call(const char *op, Call *c, std::string_view qkv_layout, const Buffer &bias,
                      const Buffer &cu_q, const Buffer &cu_kv, const Buffer &rng,
                      std::string_view bias_type, std::string_view mask_type, int64_t max_q,
                      int64_t max_kv) {
  TE_LITE_CHECK(max_q >= 0 && max_kv >= 0, op,
                ": arguments 'max_seqlen_q', 'max_seqlen_kv': expected >= 0, got ", max_q, ", ",
                max_kv);
  TE_LITE_TRY(parse_enum(op, "qkv_layout", qkv_layout, NVTE_THD_THD_THD + 1, nvte_qkv_layout_name,
                         &c->layout));
  TE_LITE_TRY(parse_enum(op, "bias_type", bias_type, NVTE_ALIBI + 1, nvte_bias_type_name,
                         &c->bias_type));
  TE_LITE_TRY(parse_enum(op, "mask_type", mask_type, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK + 1,
                         nvte_mask_type_name, &c->mask));
  TE_LITE_TRY(check_wrappable(op, "bias", bias));
  TE_LITE_TRY(check_wrappable(op, "cu_seqlens_q", cu_q));
  TE_LITE_TRY(check_wrappable(op, "cu_seqlens_kv", cu_kv));
  TE_LITE_TRY(check_rng(op, rng));
  if (present(bias)) c->tbias.data(bias);
  if (present(cu_q)) c->tcu_q.data(cu_q);
  if (present(cu_kv)) c->tcu_kv.data(cu_kv);
  if (present(rng)) set_rng(c->trng, rng);
  return ffi::Error::Success();
}

// O / dQ / dK / dV of a thd call read as 0 past cu_seqlens[b] (torch's at::zeros); CPU only.
void zero_thd(const Device &dev, NVTE_QKV_Layout layout, std::initializer_list<Buffer> results) {
  if (dev.is_gpu() || nvte_get_qkv_format(layout) != NVTE_THD) return;
  for (const Buffer &r : results) {
    if (numel(r) > 0) std::memset(r.untyped_data(), 0, r.size_bytes());
  }
}

// ------------------------------------------------------------------------------------ ops
ffi::Error fused_attn_fwd(const Device &dev, Buffer q, Buffer k, Buffer v, Buffer bias,
                          Buffer cu_seqlens_q, Buffer cu_seqlens_kv, Buffer rng_state, Buffer out,
                          Buffer softmax_lse, std::string_view qkv_layout, int64_t max_seqlen_q,
                          int64_t max_seqlen_kv, double attn_scale, double dropout,
                          std::string_view bias_type, std::string_view mask_type,
                          int64_t window_left, int64_t window_right, bool is_training) {
  constexpr const char *kOp = "te_lite::fused_attn_fwd";
  Call c(dev);
  TE_LITE_TRY(parse_call(kOp, &c, qkv_layout, bias, cu_seqlens_q, cu_seqlens_kv, rng_state,
                         bias_type, mask_type, max_seqlen_q, max_seqlen_kv));
  QKV t(dev);
  TE_LITE_TRY(layout_views(kOp, c.layout, q, k, v, &t));
  int64_t b = 0;
  TE_LITE_TRY(batch_of(kOp, nvte_get_qkv_format(c.layout), t.q, cu_seqlens_q, &b));
  Shape out_shape = t.q;
  out_shape.back() = t.v.back();
  TE_LITE_TRY(check_result(kOp, "out", out, t.q_type, out_shape));
  const int64_t h = t.q[t.q.size() - 2];
  if (is_training) {
    TE_LITE_TRY(
        check_result(kOp, "softmax_lse", softmax_lse, DataType::F32, {b, h, max_seqlen_q}));
  } else {
    TE_LITE_TRY(check_absent(kOp, "softmax_lse", softmax_lse, "is_training=False"));
  }
  zero_thd(dev, c.layout, {out});
  TensorWrapper to(dev), tlse(dev);
  to.data(out);
  if (is_training) tlse.data(softmax_lse);
  const NVTEStatus status = nvte_fused_attn_fwd(
      t.tq.get(), t.tk.get(), t.tv.get(), c.tbias.get(), to.get(), tlse.get(), c.tcu_q.get(),
      c.tcu_kv.get(), c.trng.get(), static_cast<size_t>(max_seqlen_q),
      static_cast<size_t>(max_seqlen_kv), is_training, static_cast<float>(attn_scale),
      static_cast<float>(dropout), c.layout, c.bias_type, c.mask, window_left, window_right,
      /*workspace=*/nullptr, dev.stream);
  return check_nvte(kOp, status);
}

ffi::Error fused_attn_bwd(const Device &dev, Buffer q, Buffer k, Buffer v, Buffer out,
                          Buffer d_out, Buffer softmax_lse, Buffer bias, Buffer cu_seqlens_q,
                          Buffer cu_seqlens_kv, Buffer rng_state, Buffer dq, Buffer dk, Buffer dv,
                          Buffer dbias, std::string_view qkv_layout, int64_t max_seqlen_q,
                          int64_t max_seqlen_kv, double attn_scale, double dropout,
                          std::string_view bias_type, std::string_view mask_type,
                          int64_t window_left, int64_t window_right, bool deterministic) {
  constexpr const char *kOp = "te_lite::fused_attn_bwd";
  Call c(dev);
  TE_LITE_TRY(parse_call(kOp, &c, qkv_layout, bias, cu_seqlens_q, cu_seqlens_kv, rng_state,
                         bias_type, mask_type, max_seqlen_q, max_seqlen_kv));
  // (An empty q has an empty LSE: nothing to check then.)
  TE_LITE_CHECK(numel(softmax_lse) > 0 || numel(q) == 0, kOp,
                ": argument 'softmax_lse': empty; the forward must run with is_training=True for a "
                "backward");
  TE_LITE_CHECK(shape_of(d_out) == shape_of(out) && d_out.element_type() == out.element_type(), kOp,
                ": argument 'd_out': expected the shape ", shape_str(out), " and dtype ",
                dtype_name(out.element_type()), " of 'out', got ", shape_str(d_out), " and ",
                dtype_name(d_out.element_type()));
  for (const auto &[t, arg] : {std::pair{&out, "out"}, std::pair{&d_out, "d_out"},
                               std::pair{&softmax_lse, "softmax_lse"}}) {
    TE_LITE_TRY(check_wrappable(kOp, arg, *t));
  }
  QKV t(dev);
  TE_LITE_TRY(layout_views(kOp, c.layout, q, k, v, &t));
  TE_LITE_TRY(check_result(kOp, "dq", dq, t.q_type, t.q));
  TE_LITE_TRY(check_result(kOp, "dk", dk, t.k_type, t.k));
  TE_LITE_TRY(check_result(kOp, "dv", dv, t.v_type, t.v));
  // dBias only for a post-scale bias tensor (ALiBi slopes and pre-scale biases get none).
  const bool want_dbias = c.bias_type == NVTE_POST_SCALE_BIAS && present(bias);
  if (want_dbias) {
    TE_LITE_TRY(check_result(kOp, "dbias", dbias, bias.element_type(), shape_of(bias)));
  } else {
    TE_LITE_TRY(check_absent(kOp, "dbias", dbias, "no post_scale_bias tensor"));
  }
  zero_thd(dev, c.layout, {dq, dk, dv});
  TensorWrapper to(dev), tdo(dev), tlse(dev), tdq(dev), tdk(dev), tdv(dev), tdbias(dev);
  to.data(out);
  tdo.data(d_out);
  tlse.data(softmax_lse);
  tdq.data(dq);
  tdk.data(dk);
  tdv.data(dv);
  if (want_dbias) tdbias.data(dbias);
  return with_workspace(kOp, dev, [&](NVTETensor ws) {
    return nvte_fused_attn_bwd(
        t.tq.get(), t.tk.get(), t.tv.get(), to.get(), tdo.get(), tlse.get(), c.tbias.get(),
        tdq.get(), tdk.get(), tdv.get(), tdbias.get(), c.tcu_q.get(), c.tcu_kv.get(), c.trng.get(),
        static_cast<size_t>(max_seqlen_q), static_cast<size_t>(max_seqlen_kv),
        static_cast<float>(attn_scale), static_cast<float>(dropout), c.layout, c.bias_type, c.mask,
        window_left, window_right, deterministic, ws, dev.stream);
  });
}

// uint8 [b, h, s_q, s_kv] keep mask (1 = kept) of dropout p under rng_state = {seed, offset}.
ffi::Error fused_attn_dropout_mask(const Device &dev, Buffer rng_state, Buffer mask, int64_t b,
                                   int64_t h, int64_t s_q, int64_t s_kv, double dropout) {
  constexpr const char *kOp = "te_lite::fused_attn_dropout_mask";
  TE_LITE_CHECK(b >= 0 && h >= 0 && s_q >= 0 && s_kv >= 0, kOp,
                ": arguments 'b', 'h', 's_q', 's_kv': expected >= 0, got ", b, ", ", h, ", ", s_q,
                ", ", s_kv);
  TE_LITE_TRY(check_rng(kOp, rng_state));
  TE_LITE_TRY(check_result(kOp, "mask", mask, DataType::U8, {b, h, s_q, s_kv}));
  TensorWrapper trng(dev), tmask(dev);
  set_rng(trng, rng_state);
  tmask.data(mask);
  return check_nvte(kOp, nvte_fused_attn_dropout_mask(trng.get(), static_cast<float>(dropout),
                                                      tmask.get(), dev.stream));
}

}  // namespace

TE_LITE_FFI_HANDLERS(fused_attn_fwd, fused_attn_fwd,
                     // q: [b, s_q, h, d] (bshd), [s_q, b, h, d] (sbhd), [t, h, d] (thd); packed QKV
                     .Arg<Buffer>()
                     // k: [.., h_kv, d]; packed KV (hd_2hd / hd_h2d); [0] when packed into q
                     .Arg<Buffer>()
                     .Arg<Buffer>()  // v: [.., h_kv, d_v]; [0] when packed into q or k
                     // bias: post_scale_bias [1|b, 1|h, s_q, s_kv], ALiBi fp32 slopes, or [0]
                     .Arg<Buffer>()
                     .Arg<Buffer>()  // cu_seqlens_q: int32 [b + 1] (thd, padding masks) or [0]
                     .Arg<Buffer>()  // cu_seqlens_kv: int32 [b + 1] or [0]
                     .Arg<Buffer>()  // rng_state: int64 [2] / int32 [4] (dropout > 0) or [0]
                     .Ret<Buffer>()  // out: q's view shape with d_v, q's dtype
                     // softmax_lse: float32 [b, h, max_seqlen_q]; [0] when not is_training
                     .Ret<Buffer>()
                     .Attr<std::string_view>("qkv_layout")  // "bshd_bshd_bshd", "bs3hd", ...
                     .Attr<int64_t>("max_seqlen_q")
                     .Attr<int64_t>("max_seqlen_kv")
                     .Attr<double>("attn_scale")
                     .Attr<double>("dropout")
                     .Attr<std::string_view>("bias_type")  // "no_bias", "post_scale_bias", ...
                     .Attr<std::string_view>("mask_type")  // "no_mask", "causal", ...
                     .Attr<int64_t>("window_left")         // -1: unbounded
                     .Attr<int64_t>("window_right")
                     .Attr<bool>("is_training")            // write softmax_lse
);

TE_LITE_FFI_HANDLERS(fused_attn_bwd, fused_attn_bwd,
                     .Arg<Buffer>()  // q: as the forward's
                     .Arg<Buffer>()  // k
                     .Arg<Buffer>()  // v
                     .Arg<Buffer>()  // out: the forward's
                     .Arg<Buffer>()  // d_out: out's shape and dtype
                     .Arg<Buffer>()  // softmax_lse: float32 [b, h, max_seqlen_q]
                     .Arg<Buffer>()  // bias: as the forward's, or [0]
                     .Arg<Buffer>()  // cu_seqlens_q: or [0]
                     .Arg<Buffer>()  // cu_seqlens_kv: or [0]
                     .Arg<Buffer>()  // rng_state: the forward's, or [0]
                     .Ret<Buffer>()  // dq: q's view shape and dtype
                     .Ret<Buffer>()  // dk: k's view shape
                     .Ret<Buffer>()  // dv: v's view shape
                     .Ret<Buffer>()  // dbias: bias's shape and dtype (post_scale_bias), else [0]
                     .Attr<std::string_view>("qkv_layout")
                     .Attr<int64_t>("max_seqlen_q")
                     .Attr<int64_t>("max_seqlen_kv")
                     .Attr<double>("attn_scale")
                     .Attr<double>("dropout")
                     .Attr<std::string_view>("bias_type")
                     .Attr<std::string_view>("mask_type")
                     .Attr<int64_t>("window_left")
                     .Attr<int64_t>("window_right")
                     .Attr<bool>("deterministic")
);

TE_LITE_FFI_HANDLERS(fused_attn_dropout_mask, fused_attn_dropout_mask,
                     .Arg<Buffer>()  // rng_state: int64 [2] = {seed, offset} / int32 [4]
                     .Ret<Buffer>()  // mask: uint8 [b, h, s_q, s_kv], 1 = kept
                     .Attr<int64_t>("b")
                     .Attr<int64_t>("h")
                     .Attr<int64_t>("s_q")
                     .Attr<int64_t>("s_kv")
                     .Attr<double>("dropout")
);

}  // namespace te_lite
