// Attention sinks on the GPU flash kernel (fused_attn.cu: the online softmax starts from the sink;
// fused_attn_bwd.cu: the offset-gradient kernel) against the CPU flash kernel on the same inputs and
// against the fp64 reference of fused_attn_sinks_reference.h: O, LSE (which includes the sink),
// dQ / dK / dV (deterministic and atomic backward) and d softmax_offset, fp16 / bf16, GQA, causal
// masks with rows that keep no key, padding. The offset gradient is bit-identical between runs
// (fixed reduction order).
#include <memory>
#include <vector>

#include "fused_attn_sinks_reference.h"
#include "gpu/gpu_mirror.h"

namespace {

using namespace sink_test;
using test::GpuTensor;
using test::TestTensor;

struct Param {
  NVTEDType dt;
  NVTE_Mask_Type mask;
  NVTE_Softmax_Type st;
};

class GpuSinks : public ::testing::TestWithParam<Param> {};

// TE's workspace protocol (a handle without data is a size query), as test_gpu_fused_attn.cpp.
template <typename F>
NVTEStatus with_workspace(F &&call) {
  NVTETensor query = nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING);
  const NVTEStatus st = call(query);
  const NVTEShape shape = nvte_tensor_shape(query);
  nvte_destroy_tensor(query);
  if (st != NVTE_SUCCESS) return st;
  if (shape.ndim != 1 || shape.data[0] == 0) return call(nullptr);
  GpuTensor ws({shape.data[0]}, kNVTEByte);
  return call(static_cast<NVTETensor>(ws));
}

TEST_P(GpuSinks, MatchesCpuAndReference) {
  SKIP_WITHOUT_GPU();
  const Param &pp = GetParam();
  const bool learn = pp.st == NVTE_LEARNABLE_SOFTMAX;
  SinkRun cpu(pp.dt, pp.mask, pp.st);
  ASSERT_EQ(cpu.fwd(pp.st, learn ? cpu.toff.handle() : nullptr), NVTE_SUCCESS)
      << nvte_get_last_error();
  ASSERT_EQ(cpu.bwd(pp.st, learn ? cpu.toff.handle() : nullptr, learn ? cpu.tdoff.handle() : nullptr),
            NVTE_SUCCESS)
      << nvte_get_last_error();
  const Ref ref = reference(cpu);

  SinkRun host(pp.dt, pp.mask, pp.st);  // same seed: same inputs; receives the GPU's results
  GpuTensor q(host.tq), k(host.tk), v(host.tv), o(host.to), lse(host.tlse), d_o(host.tdo),
      dq(host.tdq), dk(host.tdk), dv(host.tdv), off(host.toff), doff(host.tdoff);
  std::unique_ptr<GpuTensor> cu_q, cu_kv;
  if (!host.lens_q.empty()) {
    cu_q = std::make_unique<GpuTensor>(host.tcuq);
    cu_kv = std::make_unique<GpuTensor>(host.tcukv);
  }
  NVTETensor cq = cu_q ? static_cast<NVTETensor>(*cu_q) : nullptr;
  NVTETensor ckv = cu_kv ? static_cast<NVTETensor>(*cu_kv) : nullptr;
  NVTETensor toff = learn ? static_cast<NVTETensor>(off) : nullptr;
  NVTETensor tdoff = learn ? static_cast<NVTETensor>(doff) : nullptr;
  const Sizes &z = host.z;
  ASSERT_EQ(nvte_fused_attn_fwd_softmax(q, k, v, nullptr, toff, o, lse, cq, ckv, nullptr, z.s_q,
                                        z.s_kv, true, host.scale, 0.0f, NVTE_BSHD_BSHD_BSHD,
                                        NVTE_NO_BIAS, pp.mask, pp.st, -1, -1, nullptr, nullptr),
            NVTE_SUCCESS)
      << nvte_get_last_error();
  std::vector<double> first_doff;
  for (bool deterministic : {true, true, false}) {
    ASSERT_EQ(with_workspace([&](NVTETensor ws) {
                return nvte_fused_attn_bwd_softmax(
                    q, k, v, o, d_o, lse, nullptr, toff, dq, dk, dv, nullptr, tdoff, cq, ckv,
                    nullptr, z.s_q, z.s_kv, host.scale, 0.0f, NVTE_BSHD_BSHD_BSHD, NVTE_NO_BIAS,
                    pp.mask, pp.st, -1, -1, deterministic, ws, nullptr);
              }),
              NVTE_SUCCESS)
        << nvte_get_last_error();
    for (auto [g, h] : {std::pair{&o, &host.to}, {&lse, &host.tlse}, {&dq, &host.tdq},
                        {&dk, &host.tdk}, {&dv, &host.tdv}, {&doff, &host.tdoff}})
      g->download(*h, kNVTERowwiseData);
    const double tol = rel_tol(pp.dt);
    expect_close("GPU O", host.to, ref.o, tol);
    expect_close("GPU dQ", host.tdq, ref.dq, tol);
    expect_close("GPU dK", host.tdk, ref.dk, tol);
    expect_close("GPU dV", host.tdv, ref.dv, tol);
    expect_close("GPU O vs CPU", host.to, cpu.to.to_double(), tol);
    expect_close("GPU dQ vs CPU", host.tdq, cpu.tdq.to_double(), tol);
    for (size_t i = 0; i < ref.lse.size(); ++i) {
      if (std::isinf(ref.lse[i])) {
        EXPECT_TRUE(std::isinf(host.tlse.get(i)) && host.tlse.get(i) < 0) << "LSE " << i;
      } else {
        EXPECT_NEAR(host.tlse.get(i), ref.lse[i], 2e-5 * std::max(1.0, std::fabs(ref.lse[i])))
            << "LSE " << i;
      }
    }
    if (learn) {
      for (size_t hh = 0; hh < z.h; ++hh)
        EXPECT_NEAR(host.tdoff.get(hh), ref.doff[hh], tol * ref.doff_mag[hh] + 1e-6)
            << "GPU dSoftmaxOffset " << hh;
      if (first_doff.empty()) {
        first_doff = host.tdoff.to_double();
      } else {
        EXPECT_EQ(first_doff, host.tdoff.to_double()) << "dSoftmaxOffset not deterministic";
      }
    }
  }
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (NVTEDType dt : {kNVTEFloat16, kNVTEBFloat16})
    for (NVTE_Softmax_Type st : {NVTE_OFF_BY_ONE_SOFTMAX, NVTE_LEARNABLE_SOFTMAX})
      for (NVTE_Mask_Type m : {NVTE_NO_MASK, NVTE_CAUSAL_BOTTOM_RIGHT_MASK, NVTE_PADDING_CAUSAL_MASK})
        out.push_back({dt, m, st});
  return out;
}
INSTANTIATE_TEST_SUITE_P(Gpu, GpuSinks, ::testing::ValuesIn(params()));

}  // namespace
