// Fused attention on the CPU (nvte_fused_attn_fwd / _bwd) against the double-precision reference of
// fused_attn_reference.h, the numerics sweep: one axis at a time around a base case (dtype x format
// x mask, sequence lengths, head dims, GQA/MQA, windows, biases, dropout) plus mixed cases. Exact
// properties (fully masked rows, optional arguments, thd and packed layouts bit for bit, the dropout
// mask): test_fused_attn_properties.cpp.
#include <set>
#include <string>
#include <vector>

#include "fused_attn_reference.h"

namespace {

using namespace attn_test;

void run_and_check(const Case &c) {
  Problem p = make_problem(c);
  auto t = make_tensors(p);
  const Call call(p, *t);
  ASSERT_NVTE_OK(call.fwd());
  ASSERT_NVTE_OK(call.bwd());
  expect_matches(p, *t, reference(p));
}

// ------------------------------------------------------------------ the swept cases
const NVTEDType kDtypes[] = {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16};
const NVTE_Mask_Type kMasks[] = {NVTE_NO_MASK,
                                 NVTE_PADDING_MASK,
                                 NVTE_CAUSAL_MASK,
                                 NVTE_PADDING_CAUSAL_MASK,
                                 NVTE_CAUSAL_BOTTOM_RIGHT_MASK,
                                 NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK};

std::vector<Case> all_cases() {
  std::vector<Case> out;
  std::set<std::string> seen;
  auto add = [&](Case c) {
    // Variable lengths where the format or mask uses them: sequence 0 has fewer queries (2/3),
    // sequence 1 fewer keys, so both directions of sq vs skv occur within one call.
    if ((c.fmt == NVTE_THD || is_padding(c.mask)) && c.len_q.empty()) {
      c.len_q.assign(c.b, static_cast<int32_t>(c.s_q));
      c.len_kv.assign(c.b, static_cast<int32_t>(c.s_kv));
      c.len_q[0] = std::max<int32_t>(1, static_cast<int32_t>(c.s_q * 2 / 3));
      if (c.b > 1) c.len_kv[1] = std::max<int32_t>(1, static_cast<int32_t>(c.s_kv * 2 / 3));
    }
    if (seen.insert(c.name()).second) out.push_back(c);
  };
  const NVTEDType f32 = kNVTEFloat32, f16 = kNVTEFloat16, bf16 = kNVTEBFloat16;
  // 1. every dtype x format x mask around the base (b 2, h 4, h_kv 2, s 29 x 37, d 32).
  for (NVTEDType dt : kDtypes)
    for (NVTE_QKV_Format fmt : {NVTE_BSHD, NVTE_SBHD, NVTE_THD})
      for (NVTE_Mask_Type m : kMasks) add(make_case(dt, fmt, m));
  // 2. sequence lengths, both directions of s_q != s_kv, one and several key blocks of 64.
  const size_t lens[][2] = {{1, 1},   {17, 17},  {97, 97},  {130, 130}, {1, 130},
                            {130, 1}, {97, 130}, {130, 97}, {130, 17}};
  for (NVTEDType dt : {f32, bf16})
    for (auto l : lens)
      for (NVTE_Mask_Type m : {NVTE_NO_MASK, NVTE_CAUSAL_BOTTOM_RIGHT_MASK})
        add(make_case(dt, NVTE_BSHD, m, l[0], l[1]));
  add(make_case(f32, NVTE_BSHD, NVTE_CAUSAL_MASK, 130, 97));
  add(make_case(f32, NVTE_BSHD, NVTE_CAUSAL_MASK, 97, 130));
  for (auto l : {std::pair<size_t, size_t>{65, 63}, {63, 65}, {128, 129}})
    add(make_case(bf16, NVTE_SBHD, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, l.first, l.second));
  add(make_case(f16, NVTE_THD, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 130, 97));
  add(make_case(bf16, NVTE_THD, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 97, 130));
  // 3. head dims, d_v != d_qk too.
  const size_t dims[][2] = {{32, 32},  {59, 59}, {64, 64}, {128, 128}, {64, 32},
                            {32, 128}, {59, 17}, {1, 1},   {256, 256}, {2, 255}};
  for (NVTEDType dt : kDtypes)
    for (auto d : dims) {
      Case c = make_case(dt, dt == f16 ? NVTE_SBHD : NVTE_BSHD, NVTE_CAUSAL_MASK, 70, 70);
      c.d_qk = d[0];
      c.d_v = d[1];
      add(c);
    }
  // 4. GQA / MQA.
  const size_t heads[][2] = {{4, 4}, {4, 2}, {4, 1}, {6, 3}, {6, 2}, {6, 1}, {8, 1}};
  for (NVTEDType dt : {f32, bf16})
    for (auto hh : heads) {
      Case c = make_case(dt, hh[1] == 1 ? NVTE_THD : NVTE_BSHD,
                         hh[1] == 1 ? NVTE_PADDING_CAUSAL_MASK : NVTE_CAUSAL_MASK, 70, 70);
      c.h = hh[0];
      c.h_kv = hh[1];
      add(c);
    }
  // 5. sliding windows (s 97 x 130 so whole key blocks fall outside some windows).
  struct W {
    NVTE_Mask_Type m;
    NVTE_QKV_Format f;
    int64_t l, r;
  };
  const W wins[] = {{NVTE_CAUSAL_MASK, NVTE_BSHD, 8, -1},
                    {NVTE_CAUSAL_MASK, NVTE_BSHD, 8, 0},
                    {NVTE_CAUSAL_BOTTOM_RIGHT_MASK, NVTE_BSHD, 8, 0},
                    {NVTE_CAUSAL_BOTTOM_RIGHT_MASK, NVTE_SBHD, 70, -1},
                    {NVTE_PADDING_CAUSAL_MASK, NVTE_BSHD, 5, -1},
                    {NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, NVTE_THD, 20, 0},
                    {NVTE_NO_MASK, NVTE_BSHD, 3, 5},
                    {NVTE_PADDING_MASK, NVTE_BSHD, 3, 5},
                    {NVTE_PADDING_MASK, NVTE_THD, 9, 2},
                    {NVTE_NO_MASK, NVTE_BSHD, 0, 0},
                    {NVTE_NO_MASK, NVTE_SBHD, -1, 4},
                    {NVTE_NO_MASK, NVTE_BSHD, 5, -1},
                    {NVTE_NO_MASK, NVTE_BSHD, 70, 70}};
  for (NVTEDType dt : {f32, bf16})
    for (const W &w : wins) {
      Case c = make_case(dt, w.f, w.m, 97, 130);
      c.left = w.l;
      c.right = w.r;
      add(c);
    }
  {
    Case c = make_case(f16, NVTE_BSHD, NVTE_NO_MASK, 130, 97);
    c.left = 3;
    c.right = 5;
    add(c);
  }
  // 6. post_scale_bias in its four shapes (dBias summed over the broadcast dims) and ALiBi.
  for (NVTEDType dt : kDtypes)
    for (auto bs :
         {std::vector<size_t>{1, 4, 29, 37}, {2, 1, 29, 37}, {2, 4, 29, 37}, {1, 1, 29, 37}}) {
      Case c = make_case(dt, NVTE_BSHD, NVTE_NO_MASK);
      c.bias = NVTE_POST_SCALE_BIAS;
      c.bias_shape = bs;
      add(c);
    }
  for (NVTE_Mask_Type m :
       {NVTE_CAUSAL_BOTTOM_RIGHT_MASK, NVTE_PADDING_MASK, NVTE_PADDING_CAUSAL_MASK})
    for (NVTE_QKV_Format f : {NVTE_BSHD, NVTE_THD}) {
      Case c = make_case(f == NVTE_THD ? bf16 : f32, f, m, 130, 97);
      c.bias = NVTE_POST_SCALE_BIAS;
      c.bias_shape = {2, 4, 130, 97};
      add(c);
    }
  struct A {
    NVTEDType dt;
    NVTE_QKV_Format f;
    NVTE_Mask_Type m;
    size_t h, h_kv;
    std::vector<size_t> shape;
  };
  const A alibis[] = {{f32, NVTE_BSHD, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, 4, 2, {}},
                      {f32, NVTE_BSHD, NVTE_NO_MASK, 6, 3, {}},
                      {f16, NVTE_SBHD, NVTE_CAUSAL_MASK, 6, 3, {}},
                      {bf16, NVTE_THD, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 6, 6, {}},
                      {f32, NVTE_BSHD, NVTE_NO_MASK, 5, 1, {}},
                      {f32, NVTE_BSHD, NVTE_NO_MASK, 4, 2, {4}},
                      {bf16, NVTE_BSHD, NVTE_PADDING_MASK, 4, 2, {4}},
                      {f32, NVTE_BSHD, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, 4, 2, {2, 4}},
                      {f16, NVTE_THD, NVTE_PADDING_MASK, 4, 4, {2, 4}}};
  for (const A &a : alibis) {
    Case c = make_case(a.dt, a.f, a.m, 97, 70);
    c.h = a.h;
    c.h_kv = a.h_kv;
    c.bias = NVTE_ALIBI;
    c.bias_shape = a.shape;
    add(c);
  }
  // -inf bias entries (masking through the bias; a row of head 0 loses every key).
  for (NVTEDType dt : kDtypes) {
    Case c = make_case(dt, dt == f32 ? NVTE_THD : NVTE_BSHD, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK,
                       97, 130);
    c.bias = NVTE_POST_SCALE_BIAS;
    c.bias_shape = {1, 4, 97, 130};
    c.bias_holes = true;
    add(c);
  }
  // attn_scale: sharp (logits up to ~80: the running max must rescale across key blocks), negative.
  for (float sc : {2.5f, -0.7f})
    for (NVTEDType dt : {f32, bf16}) {
      Case c = make_case(dt, NVTE_BSHD, NVTE_NO_MASK, 70, 200);
      c.scale = sc;
      add(c);
    }
  // 7. dropout: the reference applies the library's own keep mask.
  for (NVTEDType dt : {f32, bf16})
    for (float pdrop : {0.1f, 0.5f}) {
      Case c1 = make_case(dt, NVTE_BSHD, NVTE_NO_MASK, 70, 97);
      Case c2 = make_case(dt, NVTE_THD, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 97, 70);
      Case c3 = make_case(dt, NVTE_SBHD, NVTE_PADDING_MASK);
      c3.bias = NVTE_POST_SCALE_BIAS;
      c3.bias_shape = {1, 4, 29, 37};
      for (Case *c : {&c1, &c2, &c3}) {
        c->dropout = pdrop;
        add(*c);
      }
    }
  // 8. mixed: several features at once; a sequence without keys; one sequence.
  Case m1 = make_case(bf16, NVTE_SBHD, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, 97, 130);
  m1.h = 6;
  m1.d_qk = 64;
  m1.d_v = 48;
  m1.left = 40;
  m1.bias = NVTE_ALIBI;
  m1.dropout = 0.2f;
  add(m1);
  Case m2 = make_case(f16, NVTE_THD, NVTE_PADDING_CAUSAL_MASK, 130, 97);
  m2.b = 3;
  m2.h_kv = 1;
  m2.d_qk = m2.d_v = 59;
  m2.bias = NVTE_POST_SCALE_BIAS;
  m2.bias_shape = {3, 1, 130, 97};
  m2.len_q = {130, 5, 64};
  m2.len_kv = {97, 0, 65};
  m2.dropout = 0.1f;
  add(m2);
  Case m3 = make_case(f32, NVTE_BSHD, NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK, 40, 50);
  m3.b = 3;
  m3.len_q = {40, 0, 12};
  m3.len_kv = {0, 50, 3};
  m3.left = 2;
  add(m3);
  Case m4 = make_case(bf16, NVTE_BSHD, NVTE_NO_MASK, 64, 64);
  m4.b = m4.h = m4.h_kv = 1;
  m4.d_qk = m4.d_v = 128;
  add(m4);
  return out;
}

class FusedAttnRef : public ::testing::TestWithParam<Case> {};

TEST_P(FusedAttnRef, ForwardBackwardMatchReference) { run_and_check(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Sweep, FusedAttnRef, ::testing::ValuesIn(all_cases()),
                         [](const auto &info) { return info.param.name(); });

}  // namespace
