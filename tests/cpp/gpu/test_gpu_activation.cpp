// Activations on the GPU against the CPU op: every op (clamped SwiGLU included) forward and backward, every input dtype,
// plain / per-tensor FP8 / MXFP8 outputs. Both devices evaluate the same util/math.h functors with
// the same operation order (no FMA contraction), so every output byte must match.
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/activation.h"

namespace {

using test::GpuTensor;
using test::OutKind;
using test::TestTensor;

using FwdFn = NVTEStatus (*)(const NVTETensor, NVTETensor, NVTEStream);
using BwdFn = NVTEStatus (*)(const NVTETensor, const NVTETensor, NVTETensor, NVTEStream);

// Clamped SwiGLU with a limit inside the input range, so both clamps take effect.
NVTEStatus clamped_fwd(const NVTETensor x, NVTETensor out, NVTEStream s) {
  return nvte_clamped_swiglu(x, out, 2.5f, 1.702f, s);
}
NVTEStatus clamped_bwd(const NVTETensor g, const NVTETensor x, NVTETensor out, NVTEStream s) {
  return nvte_clamped_dswiglu(g, x, out, 2.5f, 1.702f, s);
}
// _v2 with another glu_linear_offset (the kernels' offset parameter).
NVTEStatus clamped_v2_fwd(const NVTETensor x, NVTETensor out, NVTEStream s) {
  return nvte_clamped_swiglu_v2(x, out, 2.5f, 1.702f, 0.5f, s);
}
NVTEStatus clamped_v2_bwd(const NVTETensor g, const NVTETensor x, NVTETensor out, NVTEStream s) {
  return nvte_clamped_dswiglu_v2(g, x, out, 2.5f, 1.702f, 0.5f, s);
}

struct ActOp {
  const char *name;
  bool gated;
  FwdFn fwd;
  BwdFn bwd;
};

const ActOp kOps[] = {
    {"gelu", false, nvte_gelu, nvte_dgelu},       {"qgelu", false, nvte_qgelu, nvte_dqgelu},
    {"relu", false, nvte_relu, nvte_drelu},       {"srelu", false, nvte_srelu, nvte_dsrelu},
    {"silu", false, nvte_silu, nvte_dsilu},       {"geglu", true, nvte_geglu, nvte_dgeglu},
    {"qgeglu", true, nvte_qgeglu, nvte_dqgeglu},  {"reglu", true, nvte_reglu, nvte_dreglu},
    {"sreglu", true, nvte_sreglu, nvte_dsreglu},  {"swiglu", true, nvte_swiglu, nvte_dswiglu},
    {"glu", true, nvte_glu, nvte_dglu},           {"clamped_swiglu", true, clamped_fwd, clamped_bwd},
    {"clamped_swiglu_v2", true, clamped_v2_fwd, clamped_v2_bwd},
};

// Output configurations: (kind, dtype).
struct OutCase {
  OutKind kind;
  NVTEDType dtype;
};
const OutCase kOutCases[] = {
    {OutKind::kPlain, kNVTEFloat32},           {OutKind::kPlain, kNVTEBFloat16},
    {OutKind::kPerTensor, kNVTEFloat8E4M3},    {OutKind::kPerTensor, kNVTEFloat8E5M2FNUZ},
    {OutKind::kMxfp8, kNVTEFloat8E4M3},        {OutKind::kMxfp8, kNVTEFloat8E5M2},
};

// (op index, backward, input dtype, output case index)
using Param = std::tuple<int, bool, NVTEDType, int>;

class GpuActivationTest : public ::testing::TestWithParam<Param> {};

TEST_P(GpuActivationTest, MatchesCpuBytes) {
  SKIP_WITHOUT_GPU();
  const ActOp &op = kOps[std::get<0>(GetParam())];
  const bool bwd = std::get<1>(GetParam());
  const NVTEDType it = std::get<2>(GetParam());
  const OutCase oc = kOutCases[std::get<3>(GetParam())];
  // Odd in both dims: partial MX blocks either way, grid-stride tails in the kernels.
  const std::vector<size_t> act_shape = {3, 41, 71};
  std::vector<size_t> in_shape = act_shape;
  if (op.gated) in_shape.back() *= 2;
  const std::vector<size_t> out_shape = bwd ? in_shape : act_shape;

  std::mt19937 rng(1234u + std::get<0>(GetParam()));
  TestTensor in(in_shape, it), grad(act_shape, it);
  in.fill_uniform(rng, -4.0, 4.0);
  grad.fill_uniform(rng, -2.0, 2.0);
  // A scale that saturates the largest values, so satfinite is exercised on both devices.
  const float scale = oc.kind == OutKind::kPerTensor ? 200.0f : 1.0f;
  TestTensor cpu_out = test::make_output(out_shape, oc.dtype, oc.kind, scale);
  TestTensor gpu_out = test::make_output(out_shape, oc.dtype, oc.kind, scale);

  auto run = [&](NVTETensor g, NVTETensor x, NVTETensor out) {
    return bwd ? op.bwd(g, x, out, nullptr) : op.fwd(x, out, nullptr);
  };
  ASSERT_NVTE_OK(run(grad, in, cpu_out));
  GpuTensor d_in(in), d_grad(grad), d_out(gpu_out);
  ASSERT_NVTE_OK(run(d_grad, d_in, d_out));
  d_out.download_all(gpu_out);
  EXPECT_TRUE(test::same_buffers(gpu_out, cpu_out));
}

INSTANTIATE_TEST_SUITE_P(
    AllOps, GpuActivationTest,
    ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kOps))), ::testing::Bool(),
                       ::testing::Values(kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16),
                       ::testing::Range(0, static_cast<int>(std::size(kOutCases)))),
    [](const ::testing::TestParamInfo<Param> &info) {
      const OutCase oc = kOutCases[std::get<3>(info.param)];
      return std::string(kOps[std::get<0>(info.param)].name) +
             (std::get<1>(info.param) ? "_bwd_" : "_fwd_") +
             test::dtype_tag(std::get<2>(info.param)) + "_to_" + test::out_kind_name(oc.kind) +
             "_" + test::dtype_tag(oc.dtype);
    });

// GPU tensors with a CPU tensor among them are an error naming the op, not a crash.
TEST(GpuActivation, MixedDevicesRejected) {
  SKIP_WITHOUT_GPU();
  TestTensor in({4, 8}, kNVTEFloat32), out({4, 8}, kNVTEFloat32);
  GpuTensor d_in(in);
  EXPECT_NVTE_ERROR(nvte_gelu(d_in, out, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "nvte_gelu");
}

}  // namespace
