// Attention sinks (nvte_fused_attn_fwd_softmax / _bwd_softmax, TE's NVTE_Softmax_Type) on the CPU
// flash kernel against an fp64 reference written from the definition in fused_attn.h: per row the
// softmax over the kept keys plus one sink logit (0 for off-by-one, softmax_offset[h] for
// learnable) that has no value row. Checked: O, the LSE (which includes the sink), dQ, dK, dV and
// d softmax_offset, for GQA, causal / bottom-right causal (rows with no key: O = 0, LSE = sink),
// padding (cu_seqlens) and sliding windows; plus the argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fused_attn_sinks_reference.h"

namespace {

using namespace sink_test;
using test::TestTensor;

struct Param {
  NVTEDType dt;
  NVTE_Mask_Type mask;
  NVTE_Softmax_Type st;
  int64_t left, right;
};

class SinkTest : public ::testing::TestWithParam<Param> {};

TEST_P(SinkTest, MatchesFp64Reference) {
  const Param &pp = GetParam();
  SinkRun r(pp.dt, pp.mask, pp.st);
  r.left = pp.left;
  r.right = pp.right;
  const bool learn = pp.st == NVTE_LEARNABLE_SOFTMAX;
  ASSERT_EQ(r.fwd(pp.st, learn ? r.toff.handle() : nullptr), NVTE_SUCCESS) << nvte_get_last_error();
  ASSERT_EQ(r.bwd(pp.st, learn ? r.toff.handle() : nullptr, learn ? r.tdoff.handle() : nullptr),
            NVTE_SUCCESS)
      << nvte_get_last_error();
  const Ref f = reference(r);
  const double tol = rel_tol(pp.dt);
  expect_close("O", r.to, f.o, tol);
  expect_close("dQ", r.tdq, f.dq, tol);
  expect_close("dK", r.tdk, f.dk, tol);
  expect_close("dV", r.tdv, f.dv, tol);
  // LSE: fp32 log of an fp32 running sum; absolute error a few fp32 ulps of its magnitude.
  for (size_t i = 0; i < f.lse.size(); ++i) {
    if (std::isinf(f.lse[i])) {
      EXPECT_TRUE(std::isinf(r.tlse.get(i)) && r.tlse.get(i) < 0) << "LSE " << i;
      continue;
    }
    ASSERT_NEAR(r.tlse.get(i), f.lse[i], 1e-5 * std::max(1.0, std::fabs(f.lse[i])) +
                                             (pp.dt == kNVTEBFloat16 ? 1e-2 : 0.0))
        << "LSE row " << i;
  }
  if (learn) {
    // A sum of exp(a - lse) * rowsum(dO * O) over every row: the kernel's O is rounded to the
    // dtype, so each term may move by rel_tol of its absolute size.
    for (size_t hh = 0; hh < r.z.h; ++hh)
      EXPECT_NEAR(r.tdoff.get(hh), f.doff[hh], tol * f.doff_mag[hh] + 1e-6) << "dSoftmaxOffset "
                                                                             << hh;
  }
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (NVTEDType dt : {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16})
    for (NVTE_Softmax_Type st : {NVTE_OFF_BY_ONE_SOFTMAX, NVTE_LEARNABLE_SOFTMAX})
      for (NVTE_Mask_Type m : {NVTE_NO_MASK, NVTE_CAUSAL_MASK, NVTE_CAUSAL_BOTTOM_RIGHT_MASK,
                               NVTE_PADDING_MASK, NVTE_PADDING_CAUSAL_MASK})
        out.push_back({dt, m, st, -1, m == NVTE_NO_MASK || m == NVTE_PADDING_MASK ? -1 : 0});
  out.push_back({kNVTEFloat32, NVTE_NO_MASK, NVTE_LEARNABLE_SOFTMAX, 5, 2});  // sliding window
  out.push_back({kNVTEFloat32, NVTE_NO_MASK, NVTE_VANILLA_SOFTMAX, -1, -1});  // the reference's own
  return out;
}
INSTANTIATE_TEST_SUITE_P(Cpu, SinkTest, ::testing::ValuesIn(params()));

// Bottom-right causal with s_q > s_kv: the first rows keep no key, so all their mass is the sink's.
TEST(SinkRows, RowWithoutKeysHasSinkLse) {
  SinkRun r(kNVTEFloat32, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, NVTE_LEARNABLE_SOFTMAX);
  ASSERT_EQ(r.fwd(NVTE_LEARNABLE_SOFTMAX, r.toff), NVTE_SUCCESS) << nvte_get_last_error();
  for (size_t hh = 0; hh < r.z.h; ++hh) {
    EXPECT_EQ(r.tlse.get(hh * r.z.s_q), r.offset[hh]) << "LSE of row 0, head " << hh;
    for (size_t d = 0; d < r.z.d; ++d) EXPECT_EQ(r.to.get(hh * r.z.d + d), 0.0);
  }
}

// Off-by-one is the learnable softmax with zero offsets; vanilla equals the plain entry point.
TEST(SinkFlavours, Consistent) {
  SinkRun a(kNVTEBFloat16, NVTE_CAUSAL_MASK, NVTE_OFF_BY_ONE_SOFTMAX);
  SinkRun b(kNVTEBFloat16, NVTE_CAUSAL_MASK, NVTE_LEARNABLE_SOFTMAX);
  for (size_t hh = 0; hh < b.z.h; ++hh) b.toff.put(hh, 0.0);
  ASSERT_EQ(a.fwd(NVTE_OFF_BY_ONE_SOFTMAX, nullptr), NVTE_SUCCESS) << nvte_get_last_error();
  ASSERT_EQ(b.fwd(NVTE_LEARNABLE_SOFTMAX, b.toff), NVTE_SUCCESS) << nvte_get_last_error();
  EXPECT_EQ(a.to.to_double(), b.to.to_double());
  EXPECT_EQ(a.tlse.to_double(), b.tlse.to_double());
  SinkRun c(kNVTEFloat16, NVTE_NO_MASK, NVTE_VANILLA_SOFTMAX);
  ASSERT_EQ(c.fwd(NVTE_VANILLA_SOFTMAX, nullptr), NVTE_SUCCESS) << nvte_get_last_error();
  const std::vector<double> o = c.to.to_double(), lse = c.tlse.to_double();
  ASSERT_EQ(nvte_fused_attn_fwd(c.tq, c.tk, c.tv, nullptr, c.to, c.tlse, nullptr, nullptr, nullptr,
                                c.z.s_q, c.z.s_kv, true, c.scale, 0.0f, NVTE_BSHD_BSHD_BSHD,
                                NVTE_NO_BIAS, NVTE_NO_MASK, -1, -1, nullptr, nullptr),
            NVTE_SUCCESS);
  EXPECT_EQ(o, c.to.to_double());
  EXPECT_EQ(lse, c.tlse.to_double());
  // The sink changes the result (a test that cannot fail otherwise would prove nothing).
  SinkRun d(kNVTEFloat16, NVTE_NO_MASK, NVTE_OFF_BY_ONE_SOFTMAX);
  ASSERT_EQ(d.fwd(NVTE_OFF_BY_ONE_SOFTMAX, nullptr), NVTE_SUCCESS);
  EXPECT_NE(o, d.to.to_double());
}

void expect_error(NVTEStatus s, const char *needle) {
  ASSERT_NE(s, NVTE_SUCCESS);
  EXPECT_NE(std::string(nvte_get_last_error()).find(needle), std::string::npos)
      << nvte_get_last_error();
}

TEST(SinkErrors, Arguments) {
  SinkRun r(kNVTEFloat32, NVTE_NO_MASK, NVTE_LEARNABLE_SOFTMAX);
  expect_error(r.fwd(NVTE_LEARNABLE_SOFTMAX, nullptr), "SoftmaxOffset");
  expect_error(r.fwd(static_cast<NVTE_Softmax_Type>(7), nullptr), "softmax_type");
  TestTensor wrong({r.z.h + 1}, kNVTEFloat32), half({r.z.h}, kNVTEFloat16);
  expect_error(r.fwd(NVTE_LEARNABLE_SOFTMAX, wrong), "SoftmaxOffset");
  expect_error(r.fwd(NVTE_LEARNABLE_SOFTMAX, half), "SoftmaxOffset");
  TestTensor flat({r.z.h}, kNVTEFloat32);  // [h] is accepted as well as [1, h, 1, 1]
  ASSERT_EQ(r.fwd(NVTE_LEARNABLE_SOFTMAX, flat), NVTE_SUCCESS) << nvte_get_last_error();
  expect_error(r.bwd(NVTE_OFF_BY_ONE_SOFTMAX, nullptr, r.tdoff), "dSoftmaxOffset");
  expect_error(r.bwd(NVTE_LEARNABLE_SOFTMAX, r.toff, wrong), "dSoftmaxOffset");
  EXPECT_STREQ(nvte_softmax_type_name(NVTE_OFF_BY_ONE_SOFTMAX), "off-by-one");
  EXPECT_STREQ(nvte_softmax_type_name(static_cast<NVTE_Softmax_Type>(9)), "unknown");
}

}  // namespace
