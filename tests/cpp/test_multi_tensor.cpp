// Multi-tensor ops on the CPU against fp64 references written here: Adam (plain, fp32 master,
// bf16 + int16 remainders, FP8 params, capturable), SGD (momentum, nesterov, weight decay orders),
// scale with overflow flag, L2 norms (several chunks, per tensor, unscaled), FP8 scales from amax,
// and argument errors naming the argument.
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "multi_tensor_reference.h"
#include "transformer_engine_lite/multi_tensor.h"

namespace {

using test::HandleLists;
using test::TestTensor;

// Awkward sizes: an empty tensor, one element, odd lengths past the CPU's 16K-element pieces.
const std::vector<size_t> kSizes = {0, 1, 97, 1025, 16411};
constexpr int kChunk = 2048 * 32;

TestTensor noop_flag(int v = 0) {
  TestTensor t({1}, kNVTEInt32);
  t.put(0, v);
  return t;
}

// ---- Adam: (kind, grad dtype, param dtype, mode, bias_correction)
enum Kind { kPlain, kMaster, kRemainder, kFp8 };
const char *const kKindNames[] = {"plain", "master", "remainder", "fp8"};
using AdamParam = std::tuple<int, NVTEDType, NVTEDType, int, int>;
class MultiTensorAdamTest : public ::testing::TestWithParam<AdamParam> {};

TEST_P(MultiTensorAdamTest, MatchesFp64Reference) {
  const auto [kind, gdt, pdt_in, mode, bc] = GetParam();
  const NVTEDType pdt =
      kind == kRemainder ? kNVTEBFloat16 : kind == kFp8 ? kNVTEFloat8E4M3 : pdt_in;
  const test::AdamRef a{1e-2, 0.9, 0.999, 1e-8, 0.05, 3, mode, bc};
  std::mt19937 rng(7 + kind);
  const size_t lists = kind == kPlain ? 4 : kind == kFp8 ? 8 : 5;
  HandleLists h(lists);
  std::vector<TestTensor> g, p, m, v, x, sc, am, si;
  for (size_t n : kSizes) {
    g.emplace_back(std::vector<size_t>{n}, gdt);
    p.emplace_back(std::vector<size_t>{n}, pdt);
    m.emplace_back(std::vector<size_t>{n}, kNVTEFloat32);
    v.emplace_back(std::vector<size_t>{n}, kNVTEFloat32);
    x.emplace_back(std::vector<size_t>{n}, kind == kRemainder ? kNVTEInt16 : kNVTEFloat32);
    g.back().fill_uniform(rng, -1.0, 1.0);
    m.back().fill_uniform(rng, -0.1, 0.1);
    v.back().fill_uniform(rng, 0.0, 0.01);
    for (size_t i = 0; i < n; ++i) {
      const float master = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
      if (kind == kRemainder) {  // split as the kernel does: bf16 bits rounded up, low 16 bits
        uint32_t bits;
        std::memcpy(&bits, &master, 4);
        int16_t rem = static_cast<int16_t>(bits & 0xFFFF);
        uint16_t hi = static_cast<uint16_t>((bits >> 16) + (rem < 0 ? 1 : 0));
        std::memcpy(p.back().bytes() + 2 * i, &hi, 2);
        std::memcpy(x.back().bytes() + 2 * i, &rem, 2);
      } else {
        x.back().put(i, master);
        p.back().put(i, kind == kFp8 ? master * 4.0 : master);
      }
    }
    sc.emplace_back(std::vector<size_t>{1}, kNVTEFloat32);
    am.emplace_back(std::vector<size_t>{1}, kNVTEFloat32);
    si.emplace_back(std::vector<size_t>{1}, kNVTEFloat32);
    sc.back().put(0, 4.0);
    am.back().put(0, 0.5);
  }
  // Inputs as fp64 (the master: fp32 list, or reconstructed from bf16 + remainder).
  auto master_of = [&](size_t j, size_t i) -> double {
    if (kind == kPlain) return p[j].get(i);
    if (kind != kRemainder) return x[j].get(i);
    uint16_t hi;
    int16_t rem;
    std::memcpy(&hi, p[j].bytes() + 2 * i, 2);
    std::memcpy(&rem, x[j].bytes() + 2 * i, 2);
    if (rem < 0) --hi;
    return test::bitsf((uint32_t(hi) << 16) | uint16_t(rem));
  };
  std::vector<std::vector<double>> rp(kSizes.size()), rm(kSizes.size()), rv(kSizes.size());
  double ref_amax = 0.5;
  for (size_t j = 0; j < kSizes.size(); ++j) {
    for (size_t i = 0; i < kSizes[j]; ++i) {
      double pp = master_of(j, i), mm = m[j].get(i), vv = v[j].get(i);
      test::adam_ref(a, g[j].get(i), pp, mm, vv);
      rp[j].push_back(pp);
      rm[j].push_back(mm);
      rv[j].push_back(vv);
      ref_amax = std::max(ref_amax, std::fabs(pp));
    }
    h.add(0, g[j]);
    h.add(1, p[j]);
    h.add(2, m[j]);
    h.add(3, v[j]);
    if (lists >= 5) h.add(4, x[j]);
    if (lists == 8) {
      h.add(5, sc[j]);
      h.add(6, am[j]);
      h.add(7, si[j]);
    }
  }
  TestTensor noop = noop_flag();
  const NVTEStatus st =
      kind == kRemainder
          ? nvte_multi_tensor_adam_param_remainder_cuda(kChunk, noop, h.get(), lists, h.per_list(),
                                                        1e-2f, 0.9f, 0.999f, 1e-8f, 3, mode, bc,
                                                        0.05f, nullptr)
      : kind == kFp8
          ? nvte_multi_tensor_adam_fp8_cuda(kChunk, noop, h.get(), lists, h.per_list(), 1e-2f,
                                            0.9f, 0.999f, 1e-8f, 3, mode, bc, 0.05f,
                                            kNVTEFloat8E4M3, nullptr)
          : nvte_multi_tensor_adam_cuda(kChunk, noop, h.get(), lists, h.per_list(), 1e-2f, 0.9f,
                                        0.999f, 1e-8f, 3, mode, bc, 0.05f, nullptr);
  ASSERT_EQ(st, NVTE_SUCCESS) << nvte_get_last_error();
  const test::Tol f32 = test::tolerance(kNVTEFloat32);
  for (size_t j = 0; j < kSizes.size(); ++j) {
    std::vector<double> got_master(kSizes[j]), scaled_ref(kSizes[j]);
    for (size_t i = 0; i < kSizes[j]; ++i) {
      got_master[i] = master_of(j, i);
      scaled_ref[i] = rp[j][i] * 4.0;
    }
    EXPECT_TRUE(test::close(m[j].to_double(), rm[j], f32)) << "exp_avg " << j;
    EXPECT_TRUE(test::close(v[j].to_double(), rv[j], f32)) << "exp_avg_sq " << j;
    if (kind != kPlain) {
      EXPECT_TRUE(test::close(got_master, rp[j], f32)) << "master " << j;
    }
    if (kind == kFp8) {
      const test::Tol q = test::fp8_quantization_tolerance(pdt);  // 2x: a tie may round either way
      EXPECT_TRUE(test::close(p[j].to_double(), scaled_ref, {2 * q.atol, 2 * q.rtol}));
      EXPECT_EQ(si[j].get(0), 0.25);
    } else {
      EXPECT_TRUE(test::close(p[j].to_double(), rp[j], test::tolerance(pdt))) << "params " << j;
    }
  }
  if (kind == kFp8) {
    for (size_t j = 0; j < kSizes.size(); ++j) {
      // Each tensor's amax: max of 0.5 and its own new master.
      double want = 0.5;
      for (double q : rp[j]) want = std::max(want, std::fabs(q));
      EXPECT_NEAR(am[j].get(0), want, want * 1e-6) << "amax " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, MultiTensorAdamTest,
    ::testing::Combine(::testing::Values(kPlain, kMaster, kRemainder, kFp8),
                       ::testing::Values(kNVTEFloat32, kNVTEBFloat16),
                       ::testing::Values(kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16),
                       ::testing::Values(0, 1), ::testing::Values(0, 1)),
    [](const ::testing::TestParamInfo<AdamParam> &info) {
      return std::string(kKindNames[std::get<0>(info.param)]) + "_g" +
             test::dtype_tag(std::get<1>(info.param)) + "_p" +
             test::dtype_tag(std::get<2>(info.param)) + "_mode" +
             std::to_string(std::get<3>(info.param)) + "_bc" +
             std::to_string(std::get<4>(info.param));
    });

TEST(MultiTensorAdamCapturable, ReadsDeviceScalarsAndSkipsOnNoop) {
  std::mt19937 rng(3);
  TestTensor g({300}, kNVTEFloat32), p({300}, kNVTEFloat32), m({300}, kNVTEFloat32),
      v({300}, kNVTEFloat32), lr({1}, kNVTEFloat32), step({1}, kNVTEInt32),
      inv({1}, kNVTEFloat32);
  g.fill_uniform(rng, -1, 1);
  p.fill_uniform(rng, -1, 1);
  lr.put(0, 1e-3);
  step.put(0, 2);
  inv.put(0, 0.5);
  const std::vector<double> p0 = p.to_double();
  HandleLists h(4);
  h.add(0, g);
  h.add(1, p);
  h.add(2, m);
  h.add(3, v);
  TestTensor skip = noop_flag(1);
  ASSERT_NVTE_OK(nvte_multi_tensor_adam_capturable_cuda(kChunk, skip, h.get(), 4, 1, lr, 0.9f,
                                                        0.999f, 1e-8f, step, 1, 1, 0.0f, inv,
                                                        nullptr));
  EXPECT_EQ(p.to_double(), p0);
  TestTensor run = noop_flag(0);
  ASSERT_NVTE_OK(nvte_multi_tensor_adam_capturable_cuda(kChunk, run, h.get(), 4, 1, lr, 0.9f,
                                                        0.999f, 1e-8f, step, 1, 1, 0.0f, inv,
                                                        nullptr));
  const test::AdamRef a{1e-3, 0.9, 0.999, 1e-8, 0.0, 2, 1, 1};
  std::vector<double> want(300);
  for (size_t i = 0; i < 300; ++i) {
    double pp = p0[i], mm = 0, vv = 0;
    test::adam_ref(a, g.get(i) * 0.5, pp, mm, vv);
    want[i] = pp;
  }
  EXPECT_TRUE(test::close(p.to_double(), want, test::tolerance(kNVTEFloat32)));
}

// ---- SGD: (momentum case, grad dtype, weight dtype, with model-weights output)
struct SgdCase {
  test::SgdRef s;
  const char *name;
};
const SgdCase kSgd[] = {
    {{0.0, 0.0, 0.0, 0.1, 1.0, false, false, false}, "plain"},
    {{0.01, 0.9, 0.0, 0.1, 1.0, false, true, false}, "momentum_first"},
    {{0.01, 0.9, 0.1, 0.1, 0.5, false, false, false}, "momentum_dampening"},
    {{0.01, 0.9, 0.0, 0.1, 1.0, true, false, false}, "nesterov"},
    {{0.01, 0.9, 0.0, 0.1, 1.0, false, false, true}, "wd_after_momentum"}};
using SgdParam = std::tuple<int, NVTEDType, NVTEDType, bool>;
class MultiTensorSgdTest : public ::testing::TestWithParam<SgdParam> {};

TEST_P(MultiTensorSgdTest, MatchesFp64Reference) {
  const auto [ci, gdt, wdt, with_out] = GetParam();
  const test::SgdRef s = kSgd[ci].s;
  std::mt19937 rng(11 + ci);
  HandleLists h(with_out ? 4 : 3);
  std::vector<TestTensor> g, w, mo, out;
  std::vector<std::vector<double>> rw, rm;
  for (size_t n : kSizes) {
    g.emplace_back(std::vector<size_t>{n}, gdt);
    w.emplace_back(std::vector<size_t>{n}, wdt);
    mo.emplace_back(std::vector<size_t>{n}, wdt);
    out.emplace_back(std::vector<size_t>{n}, kNVTEFloat16);
    g.back().fill_uniform(rng, -1, 1);
    w.back().fill_uniform(rng, -1, 1);
    mo.back().fill_uniform(rng, -0.5, 0.5);
    rw.emplace_back();
    rm.emplace_back();
    for (size_t i = 0; i < n; ++i) {
      double ww = w.back().get(i), mm = mo.back().get(i);
      test::sgd_ref(s, g.back().get(i), ww, mm);
      rw.back().push_back(ww);
      rm.back().push_back(mm);
    }
  }
  for (size_t j = 0; j < kSizes.size(); ++j) {
    h.add(0, g[j]);
    h.add(1, w[j]);
    h.add(2, mo[j]);
    if (with_out) h.add(3, out[j]);
  }
  TestTensor noop = noop_flag();
  ASSERT_NVTE_OK(nvte_multi_tensor_sgd_cuda(kChunk, noop, h.get(), h.lists(), h.per_list(),
                                            float(s.wd), float(s.momentum), float(s.dampening),
                                            float(s.lr), s.nesterov, s.first_run,
                                            s.wd_after_momentum, float(s.scale), nullptr));
  for (size_t j = 0; j < kSizes.size(); ++j) {
    EXPECT_TRUE(test::close(w[j].to_double(), rw[j], test::tolerance(wdt))) << j;
    if (s.momentum != 0) {
      EXPECT_TRUE(test::close(mo[j].to_double(), rm[j], test::tolerance(wdt)));
    }
    if (with_out) {
      EXPECT_TRUE(test::close(out[j].to_double(), w[j].to_double(), test::tolerance(kNVTEFloat16)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, MultiTensorSgdTest,
    ::testing::Combine(::testing::Range(0, 5), ::testing::Values(kNVTEFloat32, kNVTEFloat16),
                       ::testing::Values(kNVTEFloat32, kNVTEBFloat16), ::testing::Bool()),
    [](const ::testing::TestParamInfo<SgdParam> &info) {
      return std::string(kSgd[std::get<0>(info.param)].name) + "_g" +
             test::dtype_tag(std::get<1>(info.param)) + "_w" +
             test::dtype_tag(std::get<2>(info.param)) + (std::get<3>(info.param) ? "_out" : "");
    });

// fp16 weights: the step is rounded to fp16 before it is added (TE's kernel), so with a
// power-of-two lr and momentum the result is torch.optim.SGD's fp16 update, which steps by its
// rounded buffer: buf = fp16(momentum * mom + g); w = fp16(w - lr * buf), bit for bit. Values
// stay in [0.25, 1) so every intermediate is exact in fp32 and the only roundings are these.
TEST(MultiTensorSgd, Fp16StepRoundedLikeTorch) {
  const double lr = 0.25, momentum = 0.125;
  std::mt19937 rng(5);
  TestTensor g({4099}, kNVTEFloat16), w({4099}, kNVTEFloat16), mo({4099}, kNVTEFloat16);
  const std::vector<double> gv = g.fill_uniform(rng, 0.5, 1.0);
  const std::vector<double> wv = w.fill_uniform(rng, 0.25, 1.0);
  const std::vector<double> mv = mo.fill_uniform(rng, 0.25, 0.5);
  TestTensor ref_w({4099}, kNVTEFloat16), ref_m({4099}, kNVTEFloat16);
  for (size_t i = 0; i < gv.size(); ++i) {
    ref_m.put(i, momentum * mv[i] + gv[i]);     // one rounding to fp16
    ref_w.put(i, wv[i] - lr * ref_m.get(i));    // from the rounded buffer, one rounding
  }
  HandleLists h(3);
  h.add(0, g);
  h.add(1, w);
  h.add(2, mo);
  TestTensor noop = noop_flag();
  ASSERT_NVTE_OK(nvte_multi_tensor_sgd_cuda(kChunk, noop, h.get(), 3, 1, 0.0f, float(momentum),
                                            0.0f, float(lr), 0, 0, 0, 1.0f, nullptr));
  EXPECT_EQ(w.to_double(), ref_w.to_double());
  EXPECT_EQ(mo.to_double(), ref_m.to_double());
}

TEST(MultiTensorSgd, NoopFlagSkips) {
  TestTensor g({5}, kNVTEFloat32), w({5}, kNVTEFloat32), mo({5}, kNVTEFloat32);
  for (size_t i = 0; i < 5; ++i) g.put(i, 1.0), w.put(i, 2.0);
  HandleLists h(3);
  h.add(0, g);
  h.add(1, w);
  h.add(2, mo);
  TestTensor noop = noop_flag(1);
  ASSERT_NVTE_OK(nvte_multi_tensor_sgd_cuda(kChunk, noop, h.get(), 3, 1, 0, 0, 0, 0.5f, 0, 0, 0,
                                            1.0f, nullptr));
  EXPECT_EQ(w.get(0), 2.0);
}

// ---- scale: (in dtype, out dtype, in place)
using ScaleParam = std::tuple<NVTEDType, NVTEDType>;
class MultiTensorScaleTest : public ::testing::TestWithParam<ScaleParam> {};

TEST_P(MultiTensorScaleTest, ScalesAndFlagsOverflow) {
  const auto [idt, odt] = GetParam();
  std::mt19937 rng(5);
  std::vector<TestTensor> in, out;
  HandleLists h(2);
  for (size_t n : kSizes) {
    in.emplace_back(std::vector<size_t>{n}, idt);
    out.emplace_back(std::vector<size_t>{n}, odt);
    in.back().fill_uniform(rng, -3, 3);
  }
  for (size_t j = 0; j < kSizes.size(); ++j) h.add(0, in[j]), h.add(1, out[j]);
  TestTensor noop = noop_flag();
  ASSERT_NVTE_OK(nvte_multi_tensor_scale_cuda(kChunk, noop, h.get(), 2, h.per_list(), 0.25f,
                                              nullptr));
  EXPECT_EQ(noop.get(0), 0.0);
  for (size_t j = 0; j < kSizes.size(); ++j) {
    std::vector<double> want = in[j].to_double();
    for (double &x : want) x *= 0.25;
    EXPECT_TRUE(test::close(out[j].to_double(), want, test::tolerance(odt)));
  }
  in[3].put(500, INFINITY);
  ASSERT_NVTE_OK(nvte_multi_tensor_scale_cuda(kChunk, noop, h.get(), 2, h.per_list(), 0.25f,
                                              nullptr));
  EXPECT_EQ(noop.get(0), 1.0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MultiTensorScaleTest,
                         ::testing::Combine(::testing::Values(kNVTEFloat32, kNVTEFloat16,
                                                              kNVTEBFloat16),
                                            ::testing::Values(kNVTEFloat32, kNVTEBFloat16)),
                         [](const ::testing::TestParamInfo<ScaleParam> &info) {
                           return test::dtype_tag(std::get<0>(info.param)) + "_to_" +
                                  test::dtype_tag(std::get<1>(info.param));
                         });

TEST(MultiTensorScale, InPlace) {
  TestTensor x({1025}, kNVTEFloat32);
  std::mt19937 rng(1);
  std::vector<double> want = x.fill_uniform(rng, -1, 1);
  for (double &v : want) v = static_cast<float>(v) * 3.0f;
  HandleLists h(2);
  h.add(0, x);
  h.add(1, x);
  TestTensor noop = noop_flag();
  ASSERT_NVTE_OK(nvte_multi_tensor_scale_cuda(kChunk, noop, h.get(), 2, 1, 3.0f, nullptr));
  EXPECT_EQ(x.to_double(), want);
}

// ---- L2 norm over several chunks per tensor, per tensor, unscaled.
class MultiTensorL2NormTest : public ::testing::TestWithParam<NVTEDType> {};

TEST_P(MultiTensorL2NormTest, MatchesFp64Reference) {
  const NVTEDType dt = GetParam();
  std::mt19937 rng(9);
  const int chunk = 1000;  // 17 chunks in the largest tensor
  std::vector<TestTensor> xs;
  HandleLists h(1);
  std::vector<double> per;
  double total = 0;
  for (size_t n : kSizes) {
    xs.emplace_back(std::vector<size_t>{n}, dt);
    xs.back().fill_uniform(rng, -2, 2);
    double s = 0;
    for (double v : xs.back().to_double()) s += v * v * 0.25;  // unscaled by 0.5
    per.push_back(std::sqrt(s));
    total += s;
  }
  for (auto &x : xs) h.add(0, x);
  const int max_chunks = 17;
  TestTensor out({320}, kNVTEFloat32), out_per({xs.size() * max_chunks}, kNVTEFloat32),
      ret({1}, kNVTEFloat32), ret_per({xs.size()}, kNVTEFloat32), inv({1}, kNVTEFloat32);
  inv.put(0, 0.5);
  TestTensor noop = noop_flag();
  ASSERT_NVTE_OK(nvte_multi_tensor_unscale_l2norm_cuda(chunk, noop, h.get(), 1, h.per_list(), out,
                                                       out_per, ret, ret_per, inv, 1, max_chunks,
                                                       nullptr));
  const test::Tol tol{1e-6, 1e-6};
  EXPECT_TRUE(test::close({ret.get(0)}, {std::sqrt(total)}, tol));
  EXPECT_TRUE(test::close(ret_per.to_double(), per, tol));
  EXPECT_EQ(noop.get(0), 0.0);
  // Plain norm, no per-tensor output; an Inf raises the flag.
  xs[2].put(5, INFINITY);
  ASSERT_NVTE_OK(nvte_multi_tensor_l2norm_cuda(chunk, noop, h.get(), 1, h.per_list(), out, out_per,
                                               ret, ret_per, 0, max_chunks, nullptr));
  EXPECT_EQ(noop.get(0), 1.0);
  EXPECT_TRUE(std::isinf(ret.get(0)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MultiTensorL2NormTest,
                         ::testing::Values(kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16),
                         [](const ::testing::TestParamInfo<NVTEDType> &info) {
                           return test::dtype_tag(info.param);
                         });

TEST(MultiTensorComputeScale, CurrentScalingRule) {
  const double amaxes[] = {0.0, 1.0, 3.0, 1e-30, INFINITY, NAN};
  TestTensor amax({6}, kNVTEFloat32), scale({6}, kNVTEFloat32), scale_inv({6}, kNVTEFloat32);
  for (size_t i = 0; i < 6; ++i) amax.put(i, amaxes[i]);
  HandleLists h(3);
  h.add(0, amax);
  h.add(1, scale);
  h.add(2, scale_inv);
  TestTensor noop = noop_flag();
  ASSERT_NVTE_OK(nvte_multi_tensor_compute_scale_and_scale_inv_cuda(kChunk, noop, h.get(), 3, 1,
                                                                    448.0f, 1, 0.0f, nullptr));
  // 448 / 3 = 149.33 -> 128 (power of two); 1e-30 -> 4.48e32 -> 2^108; 0 / Inf / NaN -> 1.
  const double want[] = {1.0, 256.0, 128.0, std::ldexp(1.0, 108), 1.0, 1.0};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(scale.get(i), want[i]) << i;
    EXPECT_EQ(scale_inv.get(i), 1.0 / want[i]) << i;
  }
}

// ---- argument errors name the argument.
TEST(MultiTensorErrors, NameTheArgument) {
  TestTensor g({4}, kNVTEFloat32), p({4}, kNVTEFloat32), m({4}, kNVTEFloat32),
      v({4}, kNVTEFloat32), v_short({3}, kNVTEFloat32), m16({4}, kNVTEFloat16);
  TestTensor noop = noop_flag(), bad_noop({1}, kNVTEFloat32);
  auto lists = [](std::vector<NVTETensor> l) {
    HandleLists h(l.size());
    for (size_t i = 0; i < l.size(); ++i) h.add(i, l[i]);
    return h;
  };
  HandleLists three = lists({g, p, m});
  EXPECT_NVTE_ERROR(nvte_multi_tensor_adam_cuda(kChunk, noop, three.get(), 3, 1, 1e-3f, 0.9f,
                                                0.999f, 1e-8f, 1, 1, 1, 0.0f, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "num_tensor_lists", "4 or 5", "got 3");
  HandleLists bad_m = lists({g, p, m16, v});
  EXPECT_NVTE_ERROR(nvte_multi_tensor_adam_cuda(kChunk, noop, bad_m.get(), 4, 1, 1e-3f, 0.9f,
                                                0.999f, 1e-8f, 1, 1, 1, 0.0f, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "tensor_lists[2][0] (exp_avg)", "float16");
  HandleLists short_v = lists({g, p, m, v_short});
  EXPECT_NVTE_ERROR(nvte_multi_tensor_adam_cuda(kChunk, noop, short_v.get(), 4, 1, 1e-3f, 0.9f,
                                                0.999f, 1e-8f, 1, 1, 1, 0.0f, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "tensor_lists[3][0] (exp_avg_sq)", "expected 4");
  HandleLists ok = lists({g, p, m, v});
  EXPECT_NVTE_ERROR(nvte_multi_tensor_adam_cuda(kChunk, noop, ok.get(), 4, 1, 1e-3f, 0.9f,
                                                0.999f, 1e-8f, 1, 2, 1, 0.0f, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "'mode'", "got 2");
  EXPECT_NVTE_ERROR(nvte_multi_tensor_adam_cuda(kChunk, noop, ok.get(), 4, 1, 1e-3f, 1.5f,
                                                0.999f, 1e-8f, 1, 1, 1, 0.0f, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "'beta1'");
  EXPECT_NVTE_ERROR(nvte_multi_tensor_adam_cuda(0, noop, ok.get(), 4, 1, 1e-3f, 0.9f, 0.999f,
                                                1e-8f, 1, 1, 1, 0.0f, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "'chunk_size'");
  EXPECT_NVTE_ERROR(nvte_multi_tensor_adam_cuda(kChunk, bad_noop, ok.get(), 4, 1, 1e-3f, 0.9f,
                                                0.999f, 1e-8f, 1, 1, 1, 0.0f, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "'noop_flag'", "int32");
  EXPECT_NVTE_ERROR(nvte_multi_tensor_adam_fp8_cuda(kChunk, noop, ok.get(), 4, 1, 1e-3f, 0.9f,
                                                    0.999f, 1e-8f, 1, 1, 1, 0.0f,
                                                    kNVTEFloat8E4M3, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "num_tensor_lists", "expected 8");
  HandleLists one = lists({g});
  TestTensor out({1}, kNVTEFloat32), out_per({1}, kNVTEFloat32), ret({1}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_multi_tensor_l2norm_cuda(2, noop, one.get(), 1, 1, out, out_per, ret,
                                                  ret, 0, 1, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "'max_chunks_per_tensor'", "expected >= 2");
}

}  // namespace
