// LayerNorm / RMSNorm on the GPU against the CPU op: every input and weight dtype, zero-centered
// gamma, odd shapes, plain / per-tensor FP8 / MXFP8 z. Row sums run in a different order on each
// device, so z, mu, rsigma and dx agree to rounding (FP8: a neighbouring code at most), while
// dgamma / dbeta use the CPU's chunked reduction order and must match byte for byte.
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/normalization.h"

namespace {

using test::GpuTensor;
using test::OutKind;
using test::TestTensor;
using Shape = std::vector<size_t>;

constexpr float kEps = 1e-5f;

// Runs a call the TE way on either device: query the workspace with a handle without data, then
// call again with a buffer of the queried shape on the device the op runs on.
NVTEStatus with_workspace(bool gpu, const std::function<NVTEStatus(NVTETensor)> &call) {
  NVTETensor query = nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING);
  NVTEStatus st = call(query);
  if (st == NVTE_SUCCESS) {
    const NVTEShape s = nvte_tensor_shape(query);
    const Shape shape(s.data, s.data + s.ndim);
    if (gpu) {
      GpuTensor ws(shape, nvte_tensor_type(query));
      st = call(ws);
    } else {
      TestTensor ws(shape, nvte_tensor_type(query));
      st = call(ws);
    }
  }
  nvte_destroy_tensor(query);
  return st;
}

size_t rows_of(const Shape &s) {
  size_t r = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) r *= s[i];
  return r;
}

// hidden 1 (zero variance), odd sizes, a row count that the backward's 16-row chunks do not divide,
// a hidden size above one block's 4 x 512 elements per pass, and one above the 16 x 512 the forward
// keeps in registers (the rest re-read from memory in each pass).
const Shape kShapes[] = {{5, 1}, {3, 17, 33}, {300, 96}, {40, 4097}, {3, 8291}};

struct OutCase {
  OutKind kind;
  NVTEDType dtype;  // kNVTEFloat32 with kPlain: fp32 z
};
const OutCase kOutCases[] = {{OutKind::kPlain, kNVTEFloat32},
                             {OutKind::kPlain, kNVTEBFloat16},
                             {OutKind::kPerTensor, kNVTEFloat8E4M3},
                             {OutKind::kMxfp8, kNVTEFloat8E4M3}};

// (LayerNorm?, x dtype, gamma in fp32?, zero-centered gamma, shape index, z case index)
using Param = std::tuple<bool, NVTEDType, bool, bool, int, int>;

std::string param_name(const ::testing::TestParamInfo<Param> &info) {
  const auto &[ln, xt, w32, zc, shape, oc] = info.param;
  return std::string(ln ? "LayerNorm_" : "RMSNorm_") + test::dtype_tag(xt) +
         (w32 ? "_wfp32" : "_wx") + (zc ? "_zc_" : "_") + test::shape_tag(kShapes[shape]) + "_" +
         test::out_kind_name(kOutCases[oc].kind) + "_" + test::dtype_tag(kOutCases[oc].dtype);
}

// One problem's inputs on the host; the GPU gets device copies of them.
struct Problem {
  bool ln;
  Shape shape;
  size_t rows, h;
  bool zc;
  TestTensor x, gamma, beta;

  Problem(bool layernorm, const Shape &s, NVTEDType xt, NVTEDType wt, bool zero_centered)
      : ln(layernorm), shape(s), rows(rows_of(s)), h(s.back()), zc(zero_centered), x(s, xt),
        gamma({h}, wt), beta({h}, wt) {
    std::mt19937 rng(77u + static_cast<unsigned>(h));
    x.fill_uniform(rng, -1.0, 3.0);  // mean 1: the variance must be taken around the mean
    if (zc) {
      gamma.fill_uniform(rng, -0.5, 0.5);
    } else {
      gamma.fill_uniform(rng, 0.5, 1.5);
    }
    beta.fill_uniform(rng, -1.0, 1.0);
  }

  NVTEStatus forward(bool gpu, NVTETensor x_, NVTETensor g_, NVTETensor b_, NVTETensor z,
                     NVTETensor mu, NVTETensor rs) const {
    return with_workspace(gpu, [&](NVTETensor ws) {
      return ln ? nvte_layernorm_fwd(x_, g_, b_, kEps, z, mu, rs, ws, 0, zc, nullptr)
                : nvte_rmsnorm_fwd(x_, g_, kEps, z, rs, ws, 0, zc, nullptr);
    });
  }
  NVTEStatus backward(bool gpu, NVTETensor dz, NVTETensor x_, NVTETensor mu, NVTETensor rs,
                      NVTETensor g_, NVTETensor dx, NVTETensor dg, NVTETensor db) const {
    return with_workspace(gpu, [&](NVTETensor ws) {
      return ln ? nvte_layernorm_bwd(dz, x_, mu, rs, g_, dx, dg, db, ws, 0, zc, nullptr)
                : nvte_rmsnorm_bwd(dz, x_, rs, g_, dx, dg, ws, 0, zc, nullptr);
    });
  }
};

class GpuNormTest : public ::testing::TestWithParam<Param> {};

TEST_P(GpuNormTest, ForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto &[ln, xt, w32, zc, shape_idx, oc_idx] = GetParam();
  const Problem pb(ln, kShapes[shape_idx], xt, w32 ? kNVTEFloat32 : xt, zc);
  const OutCase oc = kOutCases[oc_idx];
  const float scale = 60.0f;  // z up to ~8 (gamma 1.5, |xhat| 1.7, beta 1): e4m3 saturates a few

  TestTensor z = test::make_output(pb.shape, oc.dtype, oc.kind, scale);
  TestTensor mu({pb.rows}, kNVTEFloat32), rs({pb.rows}, kNVTEFloat32);
  ASSERT_NVTE_OK(pb.forward(false, pb.x, pb.gamma, pb.beta, z, mu, rs));

  TestTensor gz = test::make_output(pb.shape, oc.dtype, oc.kind, scale);
  TestTensor gmu({pb.rows}, kNVTEFloat32), grs({pb.rows}, kNVTEFloat32);
  GpuTensor d_x(pb.x), d_g(pb.gamma), d_b(pb.beta), d_z(gz),
      d_mu(gmu), d_rs(grs);
  ASSERT_NVTE_OK(pb.forward(true, d_x, d_g, d_b, d_z, d_mu, d_rs));
  d_z.download_all(gz);
  d_mu.download(gmu, kNVTERowwiseData);
  d_rs.download(grs, kNVTERowwiseData);

  const test::Tol f32 = test::tolerance(kNVTEFloat32);
  if (ln) {
    EXPECT_TRUE(test::close(gmu.to_double(), mu.to_double(), f32)) << "mu";
  }
  EXPECT_TRUE(test::close(grs.to_double(), rs.to_double(), f32)) << "rsigma";
  EXPECT_TRUE(test::close_across_devices(gz, z, kNVTERowwiseData)) << "z";
  EXPECT_TRUE(test::close(gz.to_double(kNVTEAmax), z.to_double(kNVTEAmax), f32)) << "amax";
  if (oc.kind == OutKind::kPerTensor) {
    EXPECT_TRUE(test::close_across_devices(gz, z, kNVTEColumnwiseData)) << "z transposed";
    EXPECT_EQ(gz.f32(kNVTERowwiseScaleInv)[0], z.f32(kNVTERowwiseScaleInv)[0]) << "scale_inv";
  } else if (oc.kind == OutKind::kMxfp8) {
    EXPECT_TRUE(test::close_across_devices(gz, z, kNVTEColumnwiseData)) << "z column-wise";
    // A block scale changes only if the block's amax crosses a power of two between devices.
    for (NVTETensorParam p : {kNVTERowwiseScaleInv, kNVTEColumnwiseScaleInv}) {
      EXPECT_TRUE(test::same_bytes(gz.bytes(p), z.bytes(p), z.buffer(p).bytes.size()))
          << "E8M0 scales (param " << p << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypes, GpuNormTest,
    ::testing::Combine(::testing::Bool(),
                       ::testing::Values(kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16),
                       ::testing::Bool(), ::testing::Bool(),
                       ::testing::Range(0, static_cast<int>(std::size(kShapes))),
                       ::testing::Range(0, static_cast<int>(std::size(kOutCases)))),
    param_name);

// (LayerNorm?, x dtype, gamma in fp32?, zero-centered gamma, shape index)
using BwdParam = std::tuple<bool, NVTEDType, bool, bool, int>;

class GpuNormBwdTest : public ::testing::TestWithParam<BwdParam> {};

std::string bwd_param_name(const ::testing::TestParamInfo<BwdParam> &info) {
  const auto &[ln, xt, w32, zc, shape] = info.param;
  return std::string(ln ? "LayerNorm_" : "RMSNorm_") + test::dtype_tag(xt) +
         (w32 ? "_wfp32" : "_wx") + (zc ? "_zc_" : "_") + test::shape_tag(kShapes[shape]);
}

// dx to rounding; dgamma / dbeta byte for byte (same chunks, same order, same fp32 operations).
// mu / rsigma come from the CPU forward, so both devices differentiate at the same point.
TEST_P(GpuNormBwdTest, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const auto &[ln, xt, w32, zc, shape_idx] = GetParam();
  const Problem pb(ln, kShapes[shape_idx], xt, w32 ? kNVTEFloat32 : xt, zc);
  const NVTEDType wt = w32 ? kNVTEFloat32 : xt;

  TestTensor z(pb.shape, kNVTEFloat32), mu({pb.rows}, kNVTEFloat32), rs({pb.rows}, kNVTEFloat32);
  ASSERT_NVTE_OK(pb.forward(false, pb.x, pb.gamma, pb.beta, z, mu, rs));
  TestTensor dz(pb.shape, xt);
  std::mt19937 rng(5u);
  dz.fill_uniform(rng, -1.0, 1.0);

  TestTensor dx(pb.shape, xt), dg({pb.h}, wt), db({pb.h}, wt);
  ASSERT_NVTE_OK(pb.backward(false, dz, pb.x, mu, rs, pb.gamma, dx, dg, db));

  TestTensor gdx(pb.shape, xt), gdg({pb.h}, wt), gdb({pb.h}, wt);
  GpuTensor d_dz(dz), d_x(pb.x), d_mu(mu), d_rs(rs), d_g(pb.gamma), d_dx(gdx), d_dg(gdg),
      d_db(gdb);
  ASSERT_NVTE_OK(pb.backward(true, d_dz, d_x, d_mu, d_rs, d_g, d_dx, d_dg, d_db));
  d_dx.download(gdx, kNVTERowwiseData);
  d_dg.download(gdg, kNVTERowwiseData);
  d_db.download(gdb, kNVTERowwiseData);

  EXPECT_TRUE(test::close(gdx.to_double(), dx.to_double(), test::norm_grad_tolerance(xt))) << "dx";
  EXPECT_TRUE(test::same_bytes(gdg.bytes(), dg.bytes(), dg.buffer().bytes.size())) << "dgamma";
  if (ln) {
    EXPECT_TRUE(test::same_bytes(gdb.bytes(), db.bytes(), db.buffer().bytes.size())) << "dbeta";
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllDtypes, GpuNormBwdTest,
    ::testing::Combine(::testing::Bool(),
                       ::testing::Values(kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16),
                       ::testing::Bool(), ::testing::Bool(),
                       ::testing::Range(0, static_cast<int>(std::size(kShapes)))),
    bwd_param_name);

// dz, x and dx may each have their own dtype: the GPU kernels load and store each by its own.
TEST(GpuNormBwd, MixedActivationDtypes) {
  SKIP_WITHOUT_GPU();
  const Problem pb(true, {33, 130}, kNVTEFloat16, kNVTEFloat32, false);
  TestTensor z(pb.shape, kNVTEFloat32), mu({pb.rows}, kNVTEFloat32), rs({pb.rows}, kNVTEFloat32);
  ASSERT_NVTE_OK(pb.forward(false, pb.x, pb.gamma, pb.beta, z, mu, rs));
  TestTensor dz(pb.shape, kNVTEBFloat16);
  std::mt19937 rng(6u);
  dz.fill_uniform(rng, -1.0, 1.0);
  TestTensor dx(pb.shape, kNVTEFloat32), dg({pb.h}, kNVTEFloat32), db({pb.h}, kNVTEFloat32);
  ASSERT_NVTE_OK(pb.backward(false, dz, pb.x, mu, rs, pb.gamma, dx, dg, db));
  TestTensor gdx(pb.shape, kNVTEFloat32), gdg({pb.h}, kNVTEFloat32), gdb({pb.h}, kNVTEFloat32);
  GpuTensor d_dz(dz), d_x(pb.x), d_mu(mu), d_rs(rs), d_g(pb.gamma), d_dx(gdx), d_dg(gdg),
      d_db(gdb);
  ASSERT_NVTE_OK(pb.backward(true, d_dz, d_x, d_mu, d_rs, d_g, d_dx, d_dg, d_db));
  d_dx.download(gdx, kNVTERowwiseData);
  d_dg.download(gdg, kNVTERowwiseData);
  d_db.download(gdb, kNVTERowwiseData);
  EXPECT_TRUE(test::close(gdx.to_double(), dx.to_double(),
                          test::norm_grad_tolerance(kNVTEFloat32)))
      << "dx";
  EXPECT_TRUE(test::same_bytes(gdg.bytes(), dg.bytes(), dg.buffer().bytes.size())) << "dgamma";
  EXPECT_TRUE(test::same_bytes(gdb.bytes(), db.bytes(), db.buffer().bytes.size())) << "dbeta";
}

// nvte_rmsnorm_bwd_add on the GPU: the fused residual add, dx to rounding of the CPU's, dgamma byte
// for byte, for an fp32 and a bf16 `add`.
TEST(GpuNormBwd, RMSNormBwdAddMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (NVTEDType at : {kNVTEFloat32, kNVTEBFloat16}) {
    const Problem pb(false, {45, 257}, kNVTEBFloat16, kNVTEFloat32, true);
    TestTensor z(pb.shape, kNVTEFloat32), mu({pb.rows}, kNVTEFloat32),
        rs({pb.rows}, kNVTEFloat32);
    ASSERT_NVTE_OK(pb.forward(false, pb.x, pb.gamma, pb.beta, z, mu, rs));
    TestTensor dz(pb.shape, kNVTEBFloat16), add(pb.shape, at);
    std::mt19937 rng(8u);
    dz.fill_uniform(rng, -1.0, 1.0);
    add.fill_uniform(rng, -4.0, 4.0);
    auto call = [&](bool gpu, NVTETensor dz_, NVTETensor x_, NVTETensor add_, NVTETensor rs_,
                    NVTETensor g_, NVTETensor dx_, NVTETensor dg_) {
      return with_workspace(gpu, [&](NVTETensor ws) {
        return nvte_rmsnorm_bwd_add(dz_, x_, add_, rs_, g_, dx_, dg_, ws, 0, true, nullptr);
      });
    };
    TestTensor dx(pb.shape, kNVTEBFloat16), dg({pb.h}, kNVTEFloat32);
    ASSERT_NVTE_OK(call(false, dz, pb.x, add, rs, pb.gamma, dx, dg));
    TestTensor gdx(pb.shape, kNVTEBFloat16), gdg({pb.h}, kNVTEFloat32);
    GpuTensor d_dz(dz), d_x(pb.x), d_add(add), d_rs(rs), d_g(pb.gamma), d_dx(gdx), d_dg(gdg);
    ASSERT_NVTE_OK(call(true, d_dz, d_x, d_add, d_rs, d_g, d_dx, d_dg));
    d_dx.download(gdx, kNVTERowwiseData);
    d_dg.download(gdg, kNVTERowwiseData);
    EXPECT_TRUE(test::close(gdx.to_double(), dx.to_double(),
                            test::norm_grad_tolerance(kNVTEBFloat16)))
        << "dx, add " << test::dtype_tag(at);
    EXPECT_TRUE(test::same_bytes(gdg.bytes(), dg.bytes(), dg.buffer().bytes.size())) << "dgamma";
  }
}

}  // namespace
