// Shared support of the fused-attention tests (test_fused_attn.cpp, test_fused_attn_properties.cpp,
// test_fused_attn_errors.cpp): a problem description, its tensors in any format (bshd / sbhd /
// thd), the call with every argument spelled out, and a double-precision reference that
// materialises the full [s_q, s_kv] score matrix of every (sequence, head). Public C API only: the
// reference shares no code with the kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/fused_attn.h"

namespace attn_test {

using test::TestTensor;

// Bound of every O / dQ / dK / dV / dBias comparison: max |got - ref| <= rel_tol(dtype) * max
// |ref|. fp32 computes in fp32; fp16 widens exactly and computes in fp32, rounding only what it
// stores (2^-11); bf16 rounds P and dS to bf16 before the GEMMs (2^-9 per term, like GPU flash
// kernels) and stores bf16.
inline double rel_tol(NVTEDType t) {
  return t == kNVTEFloat32 ? 1e-5 : t == kNVTEFloat16 ? 2e-3 : 2e-2;
}
// The LSE comes from fp32 logits for every dtype (products of fp16/bf16 inputs are exact in fp32),
// so it gets an fp32 bound: |got - ref| <= kLseTol * max(1, |ref|).
constexpr double kLseTol = 1e-5;
constexpr double kInf = std::numeric_limits<double>::infinity();

inline bool is_padding(NVTE_Mask_Type m) {
  return m == NVTE_PADDING_MASK || m == NVTE_PADDING_CAUSAL_MASK ||
         m == NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
}
inline bool is_causal(NVTE_Mask_Type m) { return m != NVTE_NO_MASK && m != NVTE_PADDING_MASK; }

inline NVTE_QKV_Layout dense_layout(NVTE_QKV_Format f) {
  return f == NVTE_BSHD   ? NVTE_BSHD_BSHD_BSHD
         : f == NVTE_SBHD ? NVTE_SBHD_SBHD_SBHD
                          : NVTE_THD_THD_THD;
}

// One attention problem. len_q / len_kv: each sequence's actual length (padding masks and thd);
// empty means full length (s_q / s_kv). bias_shape: post_scale_bias [1|b, 1|h, s_q, s_kv]; alibi {}
// for the default slopes, {h} or {b, h} for explicit ones.
struct Case {
  NVTEDType dtype = kNVTEFloat32;
  NVTE_QKV_Format fmt = NVTE_BSHD;
  NVTE_Mask_Type mask = NVTE_NO_MASK;
  size_t b = 2, h = 4, h_kv = 2, s_q = 29, s_kv = 37, d_qk = 32, d_v = 32;
  int64_t left = -1, right = -1;
  NVTE_Bias_Type bias = NVTE_NO_BIAS;
  std::vector<size_t> bias_shape;
  float dropout = 0.0f;
  std::vector<int32_t> len_q, len_kv;
  float scale = 0.0f;       // attn_scale; 0: 1 / sqrt(d_qk)
  bool bias_holes = false;  // post_scale_bias with -inf entries, and one row all -inf in plane 0

  NVTE_QKV_Layout layout() const { return dense_layout(fmt); }
  std::string name() const {
    static const char *fmts[] = {"sbhd", "bshd", "thd"};
    std::string n = test::dtype_tag(dtype) + "_" + fmts[fmt] + "_" + nvte_mask_type_name(mask) +
                    "_b" + std::to_string(b) + "h" + std::to_string(h) + "g" +
                    std::to_string(h_kv) + "_s" + std::to_string(s_q) + "x" + std::to_string(s_kv) +
                    "_d" + std::to_string(d_qk) + "x" + std::to_string(d_v);
    auto num = [](int64_t v) { return v < 0 ? std::string("n") : std::to_string(v); };
    if (left != -1 || right != -1) n += "_w" + num(left) + "_" + num(right);
    if (bias != NVTE_NO_BIAS) n += std::string("_") + nvte_bias_type_name(bias);
    if (!bias_shape.empty()) n += "_" + test::shape_tag(bias_shape);
    if (dropout > 0) n += "_p" + std::to_string(static_cast<int>(dropout * 100));
    if (scale != 0.0f)
      n += "_scale" + std::string(scale < 0 ? "m" : "") +
           std::to_string(static_cast<int>(std::fabs(scale) * 100));
    if (bias_holes) n += "_holes";
    for (int32_t l : len_q) n += "_q" + std::to_string(l);
    for (int32_t l : len_kv) n += "_k" + std::to_string(l);
    return n;
  }
};

// The base case (b 2, h 4, h_kv 2, d 32) with a dtype, format, mask and sequence lengths.
inline Case make_case(NVTEDType dt, NVTE_QKV_Format fmt, NVTE_Mask_Type mask, size_t s_q = 29,
                      size_t s_kv = 37) {
  Case c;
  c.dtype = dt;
  c.fmt = fmt;
  c.mask = mask;
  c.s_q = s_q;
  c.s_kv = s_kv;
  return c;
}

inline double round_to(double x, NVTEDType t) {
  if (t == kNVTEFloat16) return test::fp16_to_float(test::float_to_fp16(static_cast<float>(x)));
  if (t == kNVTEBFloat16) return test::bf16_to_float(test::float_to_bf16(static_cast<float>(x)));
  return static_cast<float>(x);
}

// TE's default ALiBi slopes, written the way TE's Python builds the list: for a power of two n the
// geometric series 2^(-8/n)^(i+1); otherwise the series of the largest power of two m < n, then the
// even-indexed entries of the series of 2m for the remaining n - m heads.
inline std::vector<double> te_default_slopes(size_t n) {
  auto pow2 = [](size_t m) {
    std::vector<double> s(m);
    const double start = std::pow(2.0, -8.0 / static_cast<double>(m));
    for (size_t i = 0; i < m; ++i) s[i] = std::pow(start, static_cast<double>(i + 1));
    return s;
  };
  size_t m = 1;
  while (m * 2 <= n) m *= 2;
  std::vector<double> s = pow2(m);
  const std::vector<double> extra = pow2(2 * m);
  for (size_t i = 0; s.size() < n; i += 2) s.push_back(extra[i]);
  return s;
}

// Logical data of a problem, rounded to the dtype: q [b][s_q][h][d_qk], k [b][s_kv][h_kv][d_qk],
// v [b][s_kv][h_kv][d_v], d_o [b][s_q][h][d_v] (values at padded positions too: the kernel must not
// read them), bias as bias_shape, slopes [b][h] (fp32 values), keep [b][h][s_q][s_kv] (the
// library's dropout mask, all ones without dropout).
struct Problem {
  Case c;
  std::vector<int32_t> lq, lkv, cu_q, cu_kv;
  double scale = 0;
  std::vector<double> q, k, v, d_o, bias, slopes;
  std::vector<uint8_t> keep;
  int64_t seed = 0x5eed1234, offset = 77;

  size_t iq(size_t bi, size_t i, size_t hd, size_t d) const {
    return ((bi * c.s_q + i) * c.h + hd) * c.d_qk + d;
  }
  size_t ik(size_t bi, size_t j, size_t g, size_t d) const {
    return ((bi * c.s_kv + j) * c.h_kv + g) * c.d_qk + d;
  }
  size_t iv(size_t bi, size_t j, size_t g, size_t d) const {
    return ((bi * c.s_kv + j) * c.h_kv + g) * c.d_v + d;
  }
  size_t io(size_t bi, size_t i, size_t hd, size_t d) const {
    return ((bi * c.s_q + i) * c.h + hd) * c.d_v + d;
  }
  size_t ils(size_t bi, size_t hd, size_t i) const { return (bi * c.h + hd) * c.s_q + i; }
  // Token row of (sequence bi, position i) in a tensor of this format (s: its padded length).
  size_t row(size_t bi, size_t i, size_t s, bool q_side) const {
    if (c.fmt == NVTE_THD) return static_cast<size_t>((q_side ? cu_q : cu_kv)[bi]) + i;
    return c.fmt == NVTE_BSHD ? bi * s + i : i * c.b + bi;
  }
  size_t rows(bool q_side) const {
    if (c.fmt == NVTE_THD) return static_cast<size_t>((q_side ? cu_q : cu_kv)[c.b]);
    return c.b * (q_side ? c.s_q : c.s_kv);
  }
  std::vector<size_t> shape(bool q_side, size_t heads, size_t d) const {
    const size_t s = q_side ? c.s_q : c.s_kv;
    if (c.fmt == NVTE_THD) return {rows(q_side), heads, d};
    return c.fmt == NVTE_BSHD ? std::vector<size_t>{c.b, s, heads, d}
                              : std::vector<size_t>{s, c.b, heads, d};
  }
  // The mask rule of fused_attn.h, per sequence (lengths sq, skv).
  bool kept(int64_t i, int64_t j, int64_t sq, int64_t skv) const {
    if (i >= sq || j >= skv) return false;
    const bool top_left = c.mask == NVTE_CAUSAL_MASK || c.mask == NVTE_PADDING_CAUSAL_MASK;
    const int64_t off = top_left ? 0 : skv - sq, right = is_causal(c.mask) ? 0 : c.right;
    if (c.left >= 0 && j < i + off - c.left) return false;
    return right < 0 || j <= i + off + right;
  }
  double bias_at(size_t bi, size_t hd, int64_t i, int64_t j, int64_t sq, int64_t skv) const {
    if (c.bias == NVTE_POST_SCALE_BIAS) {
      const size_t bb = c.bias_shape[0] == 1 ? 0 : bi, bh = c.bias_shape[1] == 1 ? 0 : hd;
      return bias[((bb * c.bias_shape[1] + bh) * c.s_q + i) * c.s_kv + j];
    }
    if (c.bias == NVTE_ALIBI) return -slopes[bi * c.h + hd] * std::fabs(double(i + skv - sq - j));
    return 0.0;
  }
};

inline Problem make_problem(const Case &c, uint32_t rng_seed = 1) {
  Problem p;
  p.c = c;
  std::mt19937 rng(rng_seed);
  auto fill = [&](std::vector<double> &v, size_t n, double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    v.resize(n);
    for (double &x : v) x = round_to(dist(rng), c.dtype);
  };
  // Inputs in [-2, 2): logits of std ~1.3 after 1/sqrt(d), a softmax far from uniform.
  fill(p.q, c.b * c.s_q * c.h * c.d_qk, -2, 2);
  fill(p.k, c.b * c.s_kv * c.h_kv * c.d_qk, -2, 2);
  fill(p.v, c.b * c.s_kv * c.h_kv * c.d_v, -1, 1);
  fill(p.d_o, c.b * c.s_q * c.h * c.d_v, -1, 1);
  p.scale =
      c.scale != 0.0f ? c.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d_qk)));
  p.lq = c.len_q.empty() ? std::vector<int32_t>(c.b, static_cast<int32_t>(c.s_q)) : c.len_q;
  p.lkv = c.len_kv.empty() ? std::vector<int32_t>(c.b, static_cast<int32_t>(c.s_kv)) : c.len_kv;
  p.cu_q.assign(c.b + 1, 0);
  p.cu_kv.assign(c.b + 1, 0);
  for (size_t i = 0; i < c.b; ++i) {
    p.cu_q[i + 1] = p.cu_q[i] + p.lq[i];
    p.cu_kv[i + 1] = p.cu_kv[i] + p.lkv[i];
  }
  // Padded positions of bshd / sbhd inputs hold NaN: nothing may read them.
  if (c.fmt != NVTE_THD && is_padding(c.mask))
    for (size_t bi = 0; bi < c.b; ++bi) {
      for (size_t i = static_cast<size_t>(p.lq[bi]); i < c.s_q; ++i)
        for (size_t hd = 0; hd < c.h; ++hd) {
          for (size_t d = 0; d < c.d_qk; ++d) p.q[p.iq(bi, i, hd, d)] = NAN;
          for (size_t d = 0; d < c.d_v; ++d) p.d_o[p.io(bi, i, hd, d)] = NAN;
        }
      for (size_t j = static_cast<size_t>(p.lkv[bi]); j < c.s_kv; ++j)
        for (size_t g = 0; g < c.h_kv; ++g) {
          for (size_t d = 0; d < c.d_qk; ++d) p.k[p.ik(bi, j, g, d)] = NAN;
          for (size_t d = 0; d < c.d_v; ++d) p.v[p.iv(bi, j, g, d)] = NAN;
        }
    }
  if (c.bias == NVTE_POST_SCALE_BIAS) fill(p.bias, test::numel_of(c.bias_shape), -1, 1);
  if (c.bias_holes) {
    for (size_t e = 0; e < p.bias.size(); e += 5) p.bias[e] = -kInf;
    for (size_t j = 0; j < c.s_kv; ++j) p.bias[2 * c.s_kv + j] = -kInf;
  }
  if (c.bias == NVTE_ALIBI) {
    const std::vector<double> def = te_default_slopes(c.h);
    std::uniform_real_distribution<double> dist(0.05, 0.6);
    p.slopes.resize(c.b * c.h);
    for (size_t bi = 0; bi < c.b; ++bi)
      for (size_t hd = 0; hd < c.h; ++hd) {
        const double s = c.bias_shape.empty()                 ? def[hd]
                         : c.bias_shape.size() == 1 && bi > 0 ? p.slopes[hd]
                                                              : dist(rng);
        p.slopes[bi * c.h + hd] = static_cast<float>(s);
      }
  }
  p.keep.assign(c.b * c.h * c.s_q * c.s_kv, 1);
  return p;
}

// Handles of one call's tensors (absent ones have a NULL handle). Outputs start as 0xFF bytes (NaN
// in every float dtype), so an element the kernel should write but does not fails the comparison.
struct Tensors {
  TestTensor q, k, v, bias, cu_q, cu_kv, rng, o, lse, d_o, dq, dk, dv, dbias;
};

inline void fill_sentinel(TestTensor &t) { std::memset(t.bytes(), 0xFF, t.buffer().bytes.size()); }
inline bool is_sentinel(const TestTensor &t) {
  if (t.handle() == nullptr) return true;
  for (uint8_t b : t.buffer().bytes)
    if (b != 0xFF) return false;
  return true;
}

// Writes logical [b][s][heads][d] data into a tensor of the problem's format.
inline void scatter(const Problem &p, TestTensor &t, const std::vector<double> &src, bool q_side,
                    size_t heads, size_t d) {
  const size_t s = q_side ? p.c.s_q : p.c.s_kv;
  const std::vector<int32_t> &len = q_side ? p.lq : p.lkv;
  for (size_t bi = 0; bi < p.c.b; ++bi) {
    const size_t n = p.c.fmt == NVTE_THD ? static_cast<size_t>(len[bi]) : s;
    for (size_t i = 0; i < n; ++i)
      for (size_t hd = 0; hd < heads; ++hd)
        for (size_t e = 0; e < d; ++e)
          t.put((p.row(bi, i, s, q_side) * heads + hd) * d + e,
                src[((bi * s + i) * heads + hd) * d + e]);
  }
}

inline std::unique_ptr<Tensors> make_tensors(Problem &p) {
  const Case &c = p.c;
  auto t = std::make_unique<Tensors>();
  auto dense = [&](TestTensor &x, bool q_side, size_t heads, size_t d) {
    x = TestTensor(p.shape(q_side, heads, d), c.dtype);
  };
  dense(t->q, true, c.h, c.d_qk);
  dense(t->k, false, c.h_kv, c.d_qk);
  dense(t->v, false, c.h_kv, c.d_v);
  dense(t->d_o, true, c.h, c.d_v);
  scatter(p, t->q, p.q, true, c.h, c.d_qk);
  scatter(p, t->k, p.k, false, c.h_kv, c.d_qk);
  scatter(p, t->v, p.v, false, c.h_kv, c.d_v);
  scatter(p, t->d_o, p.d_o, true, c.h, c.d_v);
  dense(t->o, true, c.h, c.d_v);
  dense(t->dq, true, c.h, c.d_qk);
  dense(t->dk, false, c.h_kv, c.d_qk);
  dense(t->dv, false, c.h_kv, c.d_v);
  t->lse = TestTensor({c.b, c.h, c.s_q}, kNVTEFloat32);
  for (TestTensor *x : {&t->o, &t->dq, &t->dk, &t->dv, &t->lse}) fill_sentinel(*x);
  if (c.fmt == NVTE_THD || is_padding(c.mask)) {
    t->cu_q = TestTensor({c.b + 1}, kNVTEInt32);
    t->cu_kv = TestTensor({c.b + 1}, kNVTEInt32);
    std::memcpy(t->cu_q.bytes(), p.cu_q.data(), 4 * (c.b + 1));
    std::memcpy(t->cu_kv.bytes(), p.cu_kv.data(), 4 * (c.b + 1));
  }
  if (c.bias == NVTE_POST_SCALE_BIAS) {
    t->bias = TestTensor(c.bias_shape, c.dtype);
    for (size_t i = 0; i < p.bias.size(); ++i) t->bias.put(i, p.bias[i]);
    t->dbias = TestTensor(c.bias_shape, c.dtype);
    fill_sentinel(t->dbias);
  } else if (c.bias == NVTE_ALIBI && !c.bias_shape.empty()) {
    t->bias = TestTensor(c.bias_shape, kNVTEFloat32);
    for (size_t i = 0; i < t->bias.numel(); ++i) t->bias.put(i, p.slopes[i]);
  }
  if (c.dropout > 0) {
    t->rng = TestTensor({2}, kNVTEInt64);
    const int64_t st[2] = {p.seed, p.offset};
    std::memcpy(t->rng.bytes(), st, sizeof(st));
    TestTensor mask({c.b, c.h, c.s_q, c.s_kv}, kNVTEByte);
    EXPECT_EQ(nvte_fused_attn_dropout_mask(t->rng, c.dropout, mask, nullptr), NVTE_SUCCESS)
        << nvte_get_last_error();
    std::memcpy(p.keep.data(), mask.bytes(), p.keep.size());
  }
  return t;
}

// A handle over part of another tensor's buffer (views into a packed QKV / KV, overlapping
// outputs).
struct View {
  NVTETensor h = nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING);
  View(void *ptr, const std::vector<size_t> &shape, NVTEDType dt) {
    NVTEBasicTensor bt{};
    bt.data_ptr = ptr;
    bt.dtype = dt;
    bt.shape.ndim = shape.size();
    for (size_t i = 0; i < shape.size(); ++i) bt.shape.data[i] = shape[i];
    EXPECT_EQ(nvte_set_tensor_param(&h, kNVTERowwiseData, &bt), NVTE_SUCCESS)
        << nvte_get_last_error();
  }
  ~View() { nvte_destroy_tensor(h); }
  View(const View &) = delete;
  View &operator=(const View &) = delete;
  operator NVTETensor() const { return h; }
};

// Every argument of a forward / backward call; starts valid for its problem, tests edit fields.
struct Call {
  NVTETensor q, k, v, bias, o, lse, cu_q, cu_kv, rng, d_o, dq, dk, dv, dbias;
  size_t max_q, max_kv;
  bool training = true;
  float scale, dropout;
  NVTE_QKV_Layout layout;
  NVTE_Bias_Type bias_type;
  NVTE_Mask_Type mask;
  int64_t left, right;

  Call(const Problem &p, const Tensors &t)
      : q(t.q),
        k(t.k),
        v(t.v),
        bias(t.bias),
        o(t.o),
        lse(t.lse),
        cu_q(t.cu_q),
        cu_kv(t.cu_kv),
        rng(t.rng),
        d_o(t.d_o),
        dq(t.dq),
        dk(t.dk),
        dv(t.dv),
        dbias(t.dbias),
        max_q(p.c.s_q),
        max_kv(p.c.s_kv),
        scale(static_cast<float>(p.scale)),
        dropout(p.c.dropout),
        layout(p.c.layout()),
        bias_type(p.c.bias),
        mask(p.c.mask),
        left(p.c.left),
        right(p.c.right) {}
  NVTEStatus fwd() const {
    return nvte_fused_attn_fwd(q, k, v, bias, o, lse, cu_q, cu_kv, rng, max_q, max_kv, training,
                               scale, dropout, layout, bias_type, mask, left, right, nullptr,
                               nullptr);
  }
  NVTEStatus bwd() const {
    return nvte_fused_attn_bwd(q, k, v, o, d_o, lse, bias, dq, dk, dv, dbias, cu_q, cu_kv, rng,
                               max_q, max_kv, scale, dropout, layout, bias_type, mask, left, right,
                               true, nullptr, nullptr);
  }
};

// Reference results in the logical layouts of Problem (dbias: bias_shape). empty_row[bi * s_q + i]:
// the row is padding or keeps no key (its O, dQ must be exactly 0 and its LSE -inf).
// The gradients through dS (dQ, dK, dBias) cancel: a row with one key has dS = 0 exactly, while the
// kernel's dP - delta leaves fp32 rounding noise. *_mag holds each element's sum of absolute terms
// (dS replaced by P (|dP| + |delta|)); comparisons allow kAccumNoise times its maximum on top of
// the relative bound.
constexpr double kAccumNoise = 16.0 / (1 << 24);  // 16 fp32 ulps of the absolute sum
struct Ref {
  std::vector<double> o, lse, dq, dk, dv, dbias, dq_mag, dk_mag, dbias_mag;
  std::vector<char> empty_row;
};
inline double max_abs(const std::vector<double> &v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

inline Ref reference(const Problem &p) {
  const Case &c = p.c;
  Ref r;
  r.o.assign(p.d_o.size(), 0.0);
  r.lse.assign(c.b * c.h * c.s_q, -kInf);
  r.dq.assign(p.q.size(), 0.0);
  r.dk.assign(p.k.size(), 0.0);
  r.dv.assign(p.v.size(), 0.0);
  r.dbias.assign(p.bias.size(), 0.0);
  r.dq_mag.assign(p.q.size(), 0.0);
  r.dk_mag.assign(p.k.size(), 0.0);
  r.dbias_mag.assign(p.bias.size(), 0.0);
  r.empty_row.assign(c.b * c.s_q, 1);
  const double keep_scale = 1.0 / (1.0 - static_cast<double>(static_cast<float>(c.dropout)));
  std::vector<double> P(c.s_q * c.s_kv), M(c.s_q * c.s_kv), dS(c.s_q * c.s_kv);
  for (size_t bi = 0; bi < c.b; ++bi) {
    const int64_t sq = p.lq[bi], skv = p.lkv[bi];
    for (size_t hd = 0; hd < c.h; ++hd) {
      const size_t g = hd / (c.h / c.h_kv);
      std::fill(P.begin(), P.end(), 0.0);
      std::fill(dS.begin(), dS.end(), 0.0);
      for (int64_t i = 0; i < sq; ++i) {
        double mx = -kInf;
        for (int64_t j = 0; j < skv; ++j) {  // logits (the full score row), then the softmax
          double x = -kInf;
          if (p.kept(i, j, sq, skv)) {
            double dot = 0;
            for (size_t d = 0; d < c.d_qk; ++d)
              dot += p.q[p.iq(bi, i, hd, d)] * p.k[p.ik(bi, j, g, d)];
            x = static_cast<double>(static_cast<float>(p.scale)) * dot +
                p.bias_at(bi, hd, i, j, sq, skv);
          }
          P[i * c.s_kv + j] = x;
          mx = std::max(mx, x);
        }
        if (mx == -kInf) {
          for (int64_t j = 0; j < skv; ++j) P[i * c.s_kv + j] = 0.0;
          continue;
        }
        r.empty_row[bi * c.s_q + i] = 0;
        double sum = 0;
        for (int64_t j = 0; j < skv; ++j) sum += std::exp(P[i * c.s_kv + j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[p.ils(bi, hd, i)] = lse;
        for (int64_t j = 0; j < skv; ++j) {
          P[i * c.s_kv + j] = std::exp(P[i * c.s_kv + j] - lse);
          M[i * c.s_kv + j] = p.keep[((bi * c.h + hd) * c.s_q + i) * c.s_kv + j] * keep_scale;
        }
        // O = (P * M) V; dP~ = dO V^T; delta = sum_j P M dP~; dS = P (M dP~ - delta).
        double delta = 0;
        for (int64_t j = 0; j < skv; ++j) {
          const double pm = P[i * c.s_kv + j] * M[i * c.s_kv + j];
          double dpt = 0;
          for (size_t d = 0; d < c.d_v; ++d) {
            r.o[p.io(bi, i, hd, d)] += pm * p.v[p.iv(bi, j, g, d)];
            dpt += p.d_o[p.io(bi, i, hd, d)] * p.v[p.iv(bi, j, g, d)];
            r.dv[p.iv(bi, j, g, d)] += pm * p.d_o[p.io(bi, i, hd, d)];
          }
          dS[i * c.s_kv + j] = dpt * M[i * c.s_kv + j];
          delta += pm * dpt;
        }
        for (int64_t j = 0; j < skv; ++j) {
          const double ds = P[i * c.s_kv + j] * (dS[i * c.s_kv + j] - delta);
          const double ds_abs =
              P[i * c.s_kv + j] * (std::fabs(dS[i * c.s_kv + j]) + std::fabs(delta));
          for (size_t d = 0; d < c.d_qk; ++d) {
            r.dq[p.iq(bi, i, hd, d)] += p.scale * ds * p.k[p.ik(bi, j, g, d)];
            r.dk[p.ik(bi, j, g, d)] += p.scale * ds * p.q[p.iq(bi, i, hd, d)];
            r.dq_mag[p.iq(bi, i, hd, d)] += p.scale * ds_abs * std::fabs(p.k[p.ik(bi, j, g, d)]);
            r.dk_mag[p.ik(bi, j, g, d)] += p.scale * ds_abs * std::fabs(p.q[p.iq(bi, i, hd, d)]);
          }
          if (c.bias == NVTE_POST_SCALE_BIAS) {
            const size_t bb = c.bias_shape[0] == 1 ? 0 : bi, bh = c.bias_shape[1] == 1 ? 0 : hd;
            r.dbias[((bb * c.bias_shape[1] + bh) * c.s_q + i) * c.s_kv + j] += ds;
            r.dbias_mag[((bb * c.bias_shape[1] + bh) * c.s_q + i) * c.s_kv + j] += ds_abs;
          }
        }
      }
    }
  }
  return r;
}

// max |got - ref| against rel_tol * max |ref|, plus elements that must match exactly (zeros of
// padding / empty rows, -inf LSE). NaN (an unwritten sentinel) counts as an infinite error.
struct Stat {
  explicit Stat(std::string n) : name(std::move(n)) {}
  std::string name;
  double max_err = 0, max_ref = 0;
  size_t exact_bad = 0;
  std::string first;
  void add(double got, double ref, bool exact, size_t at) {
    if (exact) {
      if (!(got == ref) && exact_bad++ == 0)
        first = " first exact mismatch at " + std::to_string(at) + ": got " + std::to_string(got) +
                ", expected " + std::to_string(ref);
      return;
    }
    double err = std::fabs(got - ref);
    if (std::isnan(err)) err = kInf;
    if (err > max_err) {
      max_err = err;
      if (err > 0)
        first = " worst at " + std::to_string(at) + ": got " + std::to_string(got) + ", expected " +
                std::to_string(ref);
    }
    max_ref = std::max(max_ref, std::fabs(ref));
  }
  ::testing::AssertionResult check(double tol, double atol = 0) const {
    if (exact_bad == 0 && max_err <= tol * max_ref + atol) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << name << ": max err " << max_err << " > " << tol << " * max|ref| " << max_ref << " + "
           << atol << "; " << exact_bad << " exact mismatches;" << first;
  }
};

// Compares a call's outputs (after fwd and bwd) with the reference: the relative bounds above,
// exact zeros / -inf where a row is padding or keeps no key and for padded keys, no sentinel left.
inline void expect_matches(const Problem &p, const Tensors &t, const Ref &r) {
  const Case &c = p.c;
  Stat o("O"), dq("dQ"), dk("dK"), dv("dV"), db("dBias");
  size_t lse_bad = 0;
  std::string lse_first;
  for (size_t bi = 0; bi < c.b; ++bi) {
    const size_t nq = c.fmt == NVTE_THD ? static_cast<size_t>(p.lq[bi]) : c.s_q;
    const size_t nkv = c.fmt == NVTE_THD ? static_cast<size_t>(p.lkv[bi]) : c.s_kv;
    for (size_t hd = 0; hd < c.h; ++hd)
      for (size_t i = 0; i < c.s_q; ++i) {
        const double got = t.lse.get(p.ils(bi, hd, i)), ref = r.lse[p.ils(bi, hd, i)];
        const bool ok = std::isinf(ref)
                            ? got == ref
                            : std::fabs(got - ref) <= kLseTol * std::max(1.0, std::fabs(ref));
        if (!ok && lse_bad++ == 0)
          lse_first = "LSE[" + std::to_string(p.ils(bi, hd, i)) + "] = " + std::to_string(got) +
                      ", expected " + std::to_string(ref);
      }
    for (size_t i = 0; i < nq; ++i) {
      const bool empty = r.empty_row[bi * c.s_q + i];
      for (size_t hd = 0; hd < c.h; ++hd) {
        const size_t ro = (p.row(bi, i, c.s_q, true) * c.h + hd);
        for (size_t d = 0; d < c.d_v; ++d)
          o.add(t.o.get(ro * c.d_v + d), r.o[p.io(bi, i, hd, d)], empty, ro);
        for (size_t d = 0; d < c.d_qk; ++d)
          dq.add(t.dq.get(ro * c.d_qk + d), r.dq[p.iq(bi, i, hd, d)], empty, ro);
      }
    }
    for (size_t j = 0; j < nkv; ++j) {
      const bool pad = j >= static_cast<size_t>(p.lkv[bi]);  // padded keys: dK = dV = 0 exactly
      for (size_t g = 0; g < c.h_kv; ++g) {
        const size_t rk = p.row(bi, j, c.s_kv, false) * c.h_kv + g;
        for (size_t d = 0; d < c.d_qk; ++d)
          dk.add(t.dk.get(rk * c.d_qk + d), r.dk[p.ik(bi, j, g, d)], pad, rk);
        for (size_t d = 0; d < c.d_v; ++d)
          dv.add(t.dv.get(rk * c.d_v + d), r.dv[p.iv(bi, j, g, d)], pad, rk);
      }
    }
  }
  for (size_t e = 0; e < r.dbias.size(); ++e) db.add(t.dbias.get(e), r.dbias[e], false, e);
  const double tol = rel_tol(c.dtype);
  EXPECT_EQ(lse_bad, 0u) << lse_bad << " LSE mismatches, first: " << lse_first;
  EXPECT_TRUE(o.check(tol));
  EXPECT_TRUE(dq.check(tol, kAccumNoise * max_abs(r.dq_mag)));
  EXPECT_TRUE(dk.check(tol, kAccumNoise * max_abs(r.dk_mag)));
  EXPECT_TRUE(dv.check(tol));
  if (c.bias == NVTE_POST_SCALE_BIAS) {
    EXPECT_TRUE(db.check(tol, kAccumNoise * max_abs(r.dbias_mag)));
  }
}

}  // namespace attn_test
