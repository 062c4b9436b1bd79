// te_lite fused attention ops: the flash backend's forward / backward (nvte_fused_attn_fwd/bwd) and
// its dropout keep mask (nvte_fused_attn_dropout_mask). Q, K, V arrive as the views the qkv_layout
// describes (packed layouts: views into one buffer); the binding checks each view's strides against
// the layout (the core cannot see strides, only the first element) and the core checks the rest.
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <transformer_engine_lite/fused_attn.h>

#include "common.h"

namespace te_lite {
namespace {

// ------------------------------------------------------------------------------------ enums
// Names come from the core (nvte_*_name), so the accepted strings are exactly the C API's.
template <typename Enum>
Enum parse_enum(const char *op, const char *arg, const std::string &name, int count,
                const char *(*name_of)(Enum)) {
  std::string valid;
  for (int i = 0; i < count; ++i) {
    const char *n = name_of(static_cast<Enum>(i));
    if (name == n) return static_cast<Enum>(i);
    valid += (i ? ", " : "");
    valid += n;
  }
  TORCH_CHECK(false, op, ": argument '", arg, "': expected one of {", valid, "}, got '", name, "'");
}

NVTE_QKV_Layout parse_layout(const char *op, const std::string &s) {
  return parse_enum<NVTE_QKV_Layout>(op, "qkv_layout", s, NVTE_THD_THD_THD + 1,
                                     nvte_qkv_layout_name);
}
NVTE_Bias_Type parse_bias(const char *op, const std::string &s) {
  return parse_enum<NVTE_Bias_Type>(op, "bias_type", s, NVTE_ALIBI + 1, nvte_bias_type_name);
}
NVTE_Mask_Type parse_mask(const char *op, const std::string &s) {
  return parse_enum<NVTE_Mask_Type>(op, "mask_type", s, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK + 1,
                                    nvte_mask_type_name);
}

NVTE_Softmax_Type parse_softmax(const char *op, const std::string &s) {
  return parse_enum<NVTE_Softmax_Type>(op, "softmax_type", s, 3, nvte_softmax_type_name);
}

// softmax_offset: fp32 on q's device, dense (h values: [h] or TE's [1, h, 1, 1]); the core checks
// the shape. Required for 'learnable'; for the other flavours not read (and not passed on).
std::optional<at::Tensor> offset_input(const char *op, NVTE_Softmax_Type st,
                                       const std::optional<at::Tensor> &t, const at::Tensor &q) {
  if (st != NVTE_LEARNABLE_SOFTMAX) return std::nullopt;
  TORCH_CHECK(t.has_value(), op, ": argument 'softmax_offset': required for softmax_type "
              "'learnable'");
  check_same_device(op, q, "q", *t, "softmax_offset");
  TORCH_CHECK(t->scalar_type() == at::kFloat, op, ": argument 'softmax_offset': expected float32, "
              "got ", dtype_name(t->scalar_type()));
  return t->contiguous();
}

// ------------------------------------------------------------------------------------ layouts
// One attention call's Q, K, V as the core takes them: dense-shaped handles over each view's first
// element. `alias` keeps the dense aliases (at::from_blob, no copy) alive for the handles.
struct QKV {
  at::Tensor q, k, v;   // what the core reads (a copy only for a non-dense separate tensor)
  at::Tensor alias[3];  // dense-shaped aliases of q, k, v handed to TensorWrapper
  TensorWrapper tq, tk, tv;
};

// A contiguous tensor of t's shape over t's first element: TensorWrapper describes data pointer,
// dtype and shape only, and the core derives the real strides from the layout.
at::Tensor dense_alias(const at::Tensor &t) {
  if (t.is_contiguous()) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.options());
}

// Whether t's strides are those of a token width `tok` and head stride `head` in `fmt` (dims of
// size 1 are skipped: their stride is arbitrary in torch).
bool strides_match(const at::Tensor &t, NVTE_QKV_Format fmt, int64_t tok, int64_t head) {
  // bshd [b, s, h, d] and sbhd [s, b, h, d] alike: dim 1 steps one token, dim 0 a whole dim 1.
  const std::vector<int64_t> want = fmt == NVTE_THD
                                        ? std::vector<int64_t>{tok, head, 1}
                                        : std::vector<int64_t>{t.size(1) * tok, tok, head, 1};
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.size(i) > 1 && t.stride(i) != want[i]) return false;
  }
  return true;
}

std::string expected_strides(const at::Tensor &t, NVTE_QKV_Format fmt, int64_t tok, int64_t head) {
  std::string s = "[";
  if (fmt != NVTE_THD) s += std::to_string(t.size(1) * tok) + ", ";
  return s + std::to_string(tok) + ", " + std::to_string(head) + ", 1]";
}

// q, k, v must have the strides of views into the buffer the layout names (e.g. bs3hd: one
// [b, s, 3, h, d] buffer); separate tensors of the *_*_* layouts may be any strides (copied dense).
QKV layout_views(const char *op, NVTE_QKV_Layout layout, const at::Tensor &q, const at::Tensor &k,
                 const at::Tensor &v) {
  const NVTE_QKV_Format fmt = nvte_get_qkv_format(layout);
  const NVTE_QKV_Layout_Group grp = nvte_get_qkv_layout_group(layout);
  const int64_t nd = fmt == NVTE_THD ? 3 : 4;
  for (const auto &[t, arg] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check_dtype(op, arg, *t, kHighPrecision);
    TORCH_CHECK(t->dim() == nd, op, ": argument '", arg, "': layout ", nvte_qkv_layout_name(layout),
                " expects a ", nd, "-D tensor (",
                fmt == NVTE_THD    ? "[t, h, d]"
                : fmt == NVTE_BSHD ? "[b, s, h, d]"
                                   : "[s, b, h, d]",
                "), got shape ", t->sizes());
  }
  check_same_device(op, q, "q", k, "k");
  check_same_device(op, q, "q", v, "v");
  // Packed members: which tensors share a buffer, their token width and head stride.
  auto check_packed = [&](const at::Tensor &t, const char *arg, int64_t tok, int64_t head) {
    TORCH_CHECK(strides_match(t, fmt, tok, head), op, ": argument '", arg, "': layout ",
                nvte_qkv_layout_name(layout), " expects a view with strides ",
                expected_strides(t, fmt, tok, head), " into the packed buffer, got shape ",
                t.sizes(), " with strides ", t.strides(),
                " (pass separate tensors with a *_*_* layout instead)");
  };
  QKV r;
  r.q = q;
  r.k = k;
  r.v = v;
  const int64_t h = q.size(nd - 2), d = q.size(nd - 1), h_kv = k.size(nd - 2);
  switch (grp) {
    case NVTE_3HD:
    case NVTE_H3D: {
      const int64_t head = grp == NVTE_3HD ? d : 3 * d;
      for (const auto &[t, arg] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}}) {
        check_packed(*t, arg, 3 * h * d, head);
      }
      break;
    }
    case NVTE_HD_2HD:
    case NVTE_HD_H2D: {
      const int64_t head = grp == NVTE_HD_2HD ? d : 2 * d;
      r.q = q.contiguous();
      check_packed(k, "k", 2 * h_kv * d, head);
      check_packed(v, "v", 2 * h_kv * d, head);
      break;
    }
    default:
      r.q = q.contiguous();
      r.k = k.contiguous();
      r.v = v.contiguous();
      break;
  }
  r.alias[0] = dense_alias(r.q);
  r.alias[1] = dense_alias(r.k);
  r.alias[2] = dense_alias(r.v);
  r.tq.data(r.alias[0]);
  r.tk.data(r.alias[1]);
  r.tv.data(r.alias[2]);
  return r;
}

// Batch size of a call: from Q's batch dim, or cu_seqlens_q's length for thd.
int64_t batch_of(const char *op, NVTE_QKV_Format fmt, const at::Tensor &q,
                 const std::optional<at::Tensor> &cu_q) {
  if (fmt == NVTE_BSHD) return q.size(0);
  if (fmt == NVTE_SBHD) return q.size(1);
  TORCH_CHECK(cu_q.has_value() && cu_q->dim() == 1 && cu_q->size(0) >= 1, op,
              ": argument 'cu_seqlens_q': expected int32 [b + 1] for the thd format, got ",
              cu_q.has_value() ? c10::str(cu_q->sizes()) : std::string("None"));
  return cu_q->size(0) - 1;
}

// Optional int32 / int64 side inputs: on q's device, dense.
std::optional<at::Tensor> side_input(const char *op, const char *arg,
                                     const std::optional<at::Tensor> &t, const at::Tensor &q) {
  if (!t.has_value()) return std::nullopt;
  check_same_device(op, q, "q", *t, arg);
  return t->contiguous();
}

// The arguments forward and backward share, parsed and made dense where the core needs it.
struct Call {
  NVTE_QKV_Layout layout;
  NVTE_Bias_Type bias_type;
  NVTE_Mask_Type mask;
  std::optional<at::Tensor> bias, cu_q, cu_kv, rng;
  TensorWrapper tbias, tcu_q, tcu_kv, trng;
};

void parse_call(const char *op, Call *c, const at::Tensor &q, const std::string &qkv_layout,
                const std::optional<at::Tensor> &bias, const std::optional<at::Tensor> &cu_q,
                const std::optional<at::Tensor> &cu_kv, const std::optional<at::Tensor> &rng,
                const std::string &bias_type, const std::string &mask_type) {
  c->layout = parse_layout(op, qkv_layout);
  c->bias_type = parse_bias(op, bias_type);
  c->mask = parse_mask(op, mask_type);
  c->bias = side_input(op, "bias", bias, q);
  c->cu_q = side_input(op, "cu_seqlens_q", cu_q, q);
  c->cu_kv = side_input(op, "cu_seqlens_kv", cu_kv, q);
  c->rng = side_input(op, "rng_state", rng, q);
  if (c->bias) c->tbias.data(*c->bias);
  if (c->cu_q) c->tcu_q.data(*c->cu_q);
  if (c->cu_kv) c->tcu_kv.data(*c->cu_kv);
  if (c->rng) c->trng.data(*c->rng);
}

// O / dQ / dK / dV. thd tokens past cu_seqlens[b] belong to no sequence and the kernels leave
// them alone: zero-filled here so they read as 0 (like padded bshd / sbhd rows, which the kernels
// zero themselves).
at::Tensor new_output(NVTE_QKV_Layout layout, at::IntArrayRef shape, const at::TensorOptions &opt) {
  return nvte_get_qkv_format(layout) == NVTE_THD ? at::zeros(shape, opt) : at::empty(shape, opt);
}

// A handle whose buffer the core may request (TE's workspace protocol, GPU backward only): the
// first call either runs (no workspace needed: its shape stays unset) or only sets the shape.
template <typename Fn>
void with_optional_workspace(const char *op, const at::Tensor &like, Fn &&call) {
  TensorWrapper query;
  check_nvte(call(query), op);
  const NVTEBasicTensor bt = nvte_get_tensor_param(query.get(), kNVTERowwiseData);
  int64_t numel = bt.shape.ndim > 0 ? 1 : 0;
  for (size_t i = 0; i < bt.shape.ndim; ++i) numel *= static_cast<int64_t>(bt.shape.data[i]);
  if (numel == 0) return;  // the first call ran: nothing was requested
  const at::Tensor buffer = allocate_workspace(query, like);
  TensorWrapper workspace;
  workspace.data(buffer);
  check_nvte(call(workspace), op);
}

// ------------------------------------------------------------------------------------ ops
std::tuple<at::Tensor, at::Tensor> fused_attn_fwd(
    const at::Tensor &q_, const at::Tensor &k_, const at::Tensor &v_, const std::string &qkv_layout,
    const std::optional<at::Tensor> &bias, const std::optional<at::Tensor> &cu_seqlens_q,
    const std::optional<at::Tensor> &cu_seqlens_kv, int64_t max_seqlen_q, int64_t max_seqlen_kv,
    double attn_scale, double dropout, const std::optional<at::Tensor> &rng_state,
    const std::string &bias_type, const std::string &mask_type, int64_t window_left,
    int64_t window_right, bool is_training, const std::string &softmax_type,
    const std::optional<at::Tensor> &softmax_offset) {
  constexpr const char *kOp = "te_lite::fused_attn_fwd";
  TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_kv >= 0, kOp,
              ": arguments 'max_seqlen_q', 'max_seqlen_kv': expected >= 0, got ", max_seqlen_q,
              ", ", max_seqlen_kv);
  Call c;
  parse_call(kOp, &c, q_, qkv_layout, bias, cu_seqlens_q, cu_seqlens_kv, rng_state, bias_type,
             mask_type);
  const NVTE_Softmax_Type st = parse_softmax(kOp, softmax_type);
  const std::optional<at::Tensor> offset = offset_input(kOp, st, softmax_offset, q_);
  TensorWrapper toffset;
  if (offset) toffset.data(*offset);
  const DeviceContext ctx(q_);
  QKV t = layout_views(kOp, c.layout, q_, k_, v_);
  const int64_t b = batch_of(kOp, nvte_get_qkv_format(c.layout), q_, cu_seqlens_q);
  std::vector<int64_t> out_shape = q_.sizes().vec();
  out_shape.back() = v_.size(-1);
  at::Tensor out = new_output(c.layout, out_shape, q_.options());
  const int64_t h = q_.size(-2);
  at::Tensor lse = is_training ? at::empty({b, h, max_seqlen_q}, q_.options().dtype(at::kFloat))
                               : at::empty({0}, q_.options().dtype(at::kFloat));
  TensorWrapper to, tlse;
  to.data(out);
  if (is_training) tlse.data(lse);
  check_nvte(
      nvte_fused_attn_fwd_softmax(
          t.tq.get(), t.tk.get(), t.tv.get(), c.tbias.get(), toffset.get(), to.get(), tlse.get(),
          c.tcu_q.get(), c.tcu_kv.get(), c.trng.get(), static_cast<size_t>(max_seqlen_q),
          static_cast<size_t>(max_seqlen_kv), is_training, static_cast<float>(attn_scale),
          static_cast<float>(dropout), c.layout, c.bias_type, c.mask, st, window_left,
          window_right, /*workspace=*/nullptr, ctx.stream()),
      kOp);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_attn_bwd(
    const at::Tensor &q_, const at::Tensor &k_, const at::Tensor &v_, const at::Tensor &out_,
    const at::Tensor &d_out_, const at::Tensor &softmax_lse, const std::string &qkv_layout,
    const std::optional<at::Tensor> &bias, const std::optional<at::Tensor> &cu_seqlens_q,
    const std::optional<at::Tensor> &cu_seqlens_kv, int64_t max_seqlen_q, int64_t max_seqlen_kv,
    double attn_scale, double dropout, const std::optional<at::Tensor> &rng_state,
    const std::string &bias_type, const std::string &mask_type, int64_t window_left,
    int64_t window_right, bool deterministic, const std::string &softmax_type,
    const std::optional<at::Tensor> &softmax_offset) {
  constexpr const char *kOp = "te_lite::fused_attn_bwd";
  TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_kv >= 0, kOp,
              ": arguments 'max_seqlen_q', 'max_seqlen_kv': expected >= 0, got ", max_seqlen_q,
              ", ", max_seqlen_kv);
  Call c;
  parse_call(kOp, &c, q_, qkv_layout, bias, cu_seqlens_q, cu_seqlens_kv, rng_state, bias_type,
             mask_type);
  const NVTE_Softmax_Type st = parse_softmax(kOp, softmax_type);
  const std::optional<at::Tensor> offset = offset_input(kOp, st, softmax_offset, q_);
  // d softmax_offset: the offset's shape (learnable), else empty.
  at::Tensor doffset = offset ? at::empty(offset->sizes(), offset->options())
                              : at::empty({0}, q_.options().dtype(at::kFloat));
  TensorWrapper toffset, tdoffset;
  if (offset) {
    toffset.data(*offset);
    tdoffset.data(doffset);
  }
  // (An empty q has an empty LSE: nothing to check then.)
  TORCH_CHECK(softmax_lse.numel() > 0 || q_.numel() == 0, kOp,
              ": argument 'softmax_lse': empty; the forward must run with is_training=True for a "
              "backward");
  for (const auto &[t, arg] : {std::pair{&out_, "out"}, std::pair{&d_out_, "d_out"},
                               std::pair{&softmax_lse, "softmax_lse"}}) {
    check_same_device(kOp, q_, "q", *t, arg);
  }
  TORCH_CHECK(d_out_.sizes() == out_.sizes() && d_out_.scalar_type() == out_.scalar_type(), kOp,
              ": argument 'd_out': expected the shape ", out_.sizes(), " and dtype ",
              dtype_name(out_.scalar_type()), " of 'out', got ", d_out_.sizes(), " and ",
              dtype_name(d_out_.scalar_type()));
  const DeviceContext ctx(q_);
  QKV t = layout_views(kOp, c.layout, q_, k_, v_);
  const at::Tensor out = out_.contiguous(), d_out = d_out_.contiguous(),
                   lse = softmax_lse.contiguous();
  at::Tensor dq = new_output(c.layout, q_.sizes(), q_.options());
  at::Tensor dk = new_output(c.layout, k_.sizes(), k_.options());
  at::Tensor dv = new_output(c.layout, v_.sizes(), v_.options());
  // dBias only for a post-scale bias tensor (ALiBi slopes and pre-scale biases get none).
  const bool want_dbias = c.bias_type == NVTE_POST_SCALE_BIAS && c.bias.has_value();
  at::Tensor dbias =
      want_dbias ? at::empty(c.bias->sizes(), c.bias->options()) : at::empty({0}, q_.options());
  TensorWrapper to, tdo, tlse, tdq, tdk, tdv, tdbias;
  to.data(out);
  tdo.data(d_out);
  tlse.data(lse);
  tdq.data(dq);
  tdk.data(dk);
  tdv.data(dv);
  if (want_dbias) tdbias.data(dbias);
  with_optional_workspace(kOp, q_, [&](const TensorWrapper &ws) {
    return nvte_fused_attn_bwd_softmax(
        t.tq.get(), t.tk.get(), t.tv.get(), to.get(), tdo.get(), tlse.get(), c.tbias.get(),
        toffset.get(), tdq.get(), tdk.get(), tdv.get(), tdbias.get(), tdoffset.get(),
        c.tcu_q.get(), c.tcu_kv.get(), c.trng.get(), static_cast<size_t>(max_seqlen_q),
        static_cast<size_t>(max_seqlen_kv), static_cast<float>(attn_scale),
        static_cast<float>(dropout), c.layout, c.bias_type, c.mask, st, window_left, window_right,
        deterministic, ws.get(), ctx.stream());
  });
  return {dq, dk, dv, dbias, doffset};
}

// uint8 [b, h, s_q, s_kv] keep mask (1 = kept) of dropout p under rng_state = {seed, offset}.
at::Tensor fused_attn_dropout_mask(const at::Tensor &rng_state_, int64_t b, int64_t h, int64_t s_q,
                                   int64_t s_kv, double dropout) {
  constexpr const char *kOp = "te_lite::fused_attn_dropout_mask";
  TORCH_CHECK(b >= 0 && h >= 0 && s_q >= 0 && s_kv >= 0, kOp,
              ": arguments 'b', 'h', 's_q', 's_kv': expected >= 0, got ", b, ", ", h, ", ", s_q,
              ", ", s_kv);
  const DeviceContext ctx(rng_state_);
  const at::Tensor rng_state = rng_state_.contiguous();
  at::Tensor mask = at::empty({b, h, s_q, s_kv}, rng_state.options().dtype(at::kByte));
  TensorWrapper trng, tmask;
  trng.data(rng_state);
  tmask.data(mask);
  check_nvte(nvte_fused_attn_dropout_mask(trng.get(), static_cast<float>(dropout), tmask.get(),
                                          ctx.stream()),
             kOp);
  return mask;
}

void register_impls(torch::Library &m) {
  m.impl("fused_attn_fwd", &fused_attn_fwd);
  m.impl("fused_attn_bwd", &fused_attn_bwd);
  m.impl("fused_attn_dropout_mask", &fused_attn_dropout_mask);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif
