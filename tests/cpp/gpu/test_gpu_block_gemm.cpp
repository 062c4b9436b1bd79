// The GEMM with block-scaled operands on the GPU, the route the library takes there: each operand
// (Float8BlockScaling 1x128 activations by 128x128 weights, or NVFP4 with 1x16 / 16x16 blocks)
// dequantized on the device to fp32 (cast/block_quantize.cu, nvfp4_quantize.cu), then the GPU's
// fp32 GEMM (nvte_cublas_gemm: cuBLASLt with CUBLAS_COMPUTE_32F, or the tiled kernel). The
// dequantized operands equal the CPU's byte for byte; the product differs from the exact one
// (fp64 over the same fp32 operands) only by fp32 accumulation in some order: |err| <=
// gamma_K * sum_k |x_k w_k|, gamma_K = K u / (1 - K u), u = 2^-24 (Higham, any summation order).
// Against the CPU's GEMM (where the build has one) the bound doubles. Skipped without a GPU.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "cast_reference.h"
#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/cast.h"
#include "transformer_engine_lite/gemm.h"

namespace {

using test::GpuTensor;
using test::Shape;
using test::TestTensor;

size_t up(size_t a, size_t m) { return (a + m - 1) / m * m; }
size_t cdiv(size_t a, size_t b) { return (a + b - 1) / b; }

enum class Fmt { kBlock, kNvfp4 };

// A row-wise quantized copy of a [rows, cols] operand on the CPU (its quantize is pinned to the
// GPU's bytes by test_gpu_block_scaling.cpp / test_gpu_nvfp4.cpp).
TestTensor quantize(const TestTensor &x, size_t rows, size_t cols, Fmt f, bool two_d) {
  if (f == Fmt::kBlock) {
    TestTensor q({rows, cols}, kNVTEFloat8E4M3,
                 two_d ? NVTE_BLOCK_SCALING_2D : NVTE_BLOCK_SCALING_1D);
    q.set(kNVTERowwiseScaleInv,
          two_d ? Shape{cdiv(rows, 128), up(cdiv(cols, 128), 4)}
                : Shape{cdiv(cols, 128), up(rows, 4)},
          kNVTEFloat32);
    EXPECT_EQ(nvte_quantize(x, q, nullptr), NVTE_SUCCESS) << nvte_get_last_error();
    return q;
  }
  TestTensor q({rows, cols / 2}, kNVTEByte, NVTE_NVFP4_1D_SCALING);
  q.set(kNVTERowwiseScaleInv, {up(rows, 128), up(cdiv(cols, 16), 4)}, kNVTEFloat8E4M3);
  q.set(kNVTEAmax, {1}, kNVTEFloat32);
  NVTEQuantizationConfig cfg = nvte_create_quantization_config();
  nvte_set_quantization_config_attribute(cfg, kNVTEQuantizationConfigNVFP42DQuantization, &two_d,
                                         1);
  EXPECT_EQ(nvte_quantize_v2(x, q, cfg, nullptr), NVTE_SUCCESS) << nvte_get_last_error();
  nvte_destroy_quantization_config(cfg);
  return q;
}

bool have_cpu_gemm() {
  return std::string(nvte_get_build_info()).find("\"gemm_cpu\": null") == std::string::npos;
}

// fmt, M (tokens), N (out features), K, weight 2-D blocks
using Param = std::tuple<Fmt, size_t, size_t, size_t, bool>;
class BlockScaledGemmGpu : public ::testing::TestWithParam<Param> {};

TEST_P(BlockScaledGemmGpu, DequantizedFp32GemmWithinAccumulationBound) {
  SKIP_WITHOUT_GPU();
  const auto [fmt, M, N, K, w2d] = GetParam();
  std::mt19937 rng = test::test_rng();
  TestTensor x({M, K}, kNVTEFloat32), w({N, K}, kNVTEFloat32);
  test::fill_spread(x, rng, -4, 2);
  test::fill_spread(w, rng, -6, 0);
  const TestTensor xq = quantize(x, M, K, fmt, false), wq = quantize(w, N, K, fmt, w2d);

  // Dequantize on both devices: the GEMM's operands, byte for byte.
  TestTensor xf({M, K}, kNVTEFloat32), wf({N, K}, kNVTEFloat32);
  TestTensor gxf({M, K}, kNVTEFloat32), gwf({N, K}, kNVTEFloat32);
  ASSERT_NVTE_OK(nvte_dequantize(xq, xf, nullptr));
  ASSERT_NVTE_OK(nvte_dequantize(wq, wf, nullptr));
  GpuTensor d_xq(xq), d_wq(wq), d_xf(gxf), d_wf(gwf);
  ASSERT_NVTE_OK(nvte_dequantize(d_xq, d_xf, nullptr));
  ASSERT_NVTE_OK(nvte_dequantize(d_wq, d_wf, nullptr));
  d_xf.download_all(gxf);
  d_wf.download_all(gwf);
  ASSERT_TRUE(test::same_buffers(gxf, xf)) << "activation operand";
  ASSERT_TRUE(test::same_buffers(gwf, wf)) << "weight operand";

  // y [M, N] = x [M, K] @ w [N, K]^T: gemm.h's D[n, m] = op(B)[n, k] @ op(A)[k, m] with A = w
  // (transa), B = x.
  TestTensor y({M, N}, kNVTEFloat32);
  GpuTensor d_y(y);
  ASSERT_NVTE_OK(nvte_cublas_gemm(d_wf, d_xf, d_y, nullptr, nullptr, true, false, false, nullptr,
                                  false, false, 0, nullptr));
  d_y.download_all(y);

  const std::vector<double> a = xf.to_double(), b = wf.to_double(), got = y.to_double();
  const double u = std::ldexp(1.0, -24), gamma = K * u / (1.0 - K * u);
  std::vector<double> bound(M * N);
  size_t bad = 0;
  for (size_t i = 0; i < M; ++i)
    for (size_t j = 0; j < N; ++j) {
      double exact = 0.0, mag = 0.0;
      for (size_t k = 0; k < K; ++k) {
        exact += a[i * K + k] * b[j * K + k];  // products of fp32 values: exact in fp64
        mag += std::fabs(a[i * K + k] * b[j * K + k]);
      }
      // fp64's own rounding of the reference: K * 2^-53 * mag, far under the fp32 bound.
      bound[i * N + j] = gamma * mag + K * std::ldexp(mag, -52);
      if (!(std::fabs(got[i * N + j] - exact) <= bound[i * N + j]) && bad++ < 4)
        ADD_FAILURE() << "y[" << i << ", " << j << "] = " << got[i * N + j] << ", exact "
                      << exact << ", bound " << bound[i * N + j];
    }
  EXPECT_EQ(bad, 0u);

  if (!have_cpu_gemm()) return;
  TestTensor yc({M, N}, kNVTEFloat32);
  ASSERT_NVTE_OK(nvte_cublas_gemm(wf, xf, yc, nullptr, nullptr, true, false, false, nullptr,
                                  false, false, 0, nullptr));
  const std::vector<double> cpu = yc.to_double();
  for (size_t i = 0; i < M * N; ++i)
    ASSERT_LE(std::fabs(got[i] - cpu[i]), 2 * bound[i]) << "GPU vs CPU GEMM at " << i;
}

std::string name(const ::testing::TestParamInfo<Param> &info) {
  const auto &[fmt, M, N, K, w2d] = info.param;
  return std::string(fmt == Fmt::kBlock ? "fp8block" : "nvfp4") + "_M" + std::to_string(M) + "_N" +
         std::to_string(N) + "_K" + std::to_string(K) + (w2d ? "_w2d" : "_w1d");
}

// Aligned (several K blocks), ragged (a partial last K block of either format, odd M and N), and
// K longer than one 128-block.
INSTANTIATE_TEST_SUITE_P(
    Shapes, BlockScaledGemmGpu,
    ::testing::Combine(::testing::Values(Fmt::kBlock, Fmt::kNvfp4),
                       ::testing::Values(size_t{64}, size_t{33}),
                       ::testing::Values(size_t{96}, size_t{40}),
                       ::testing::Values(size_t{384}, size_t{200}), ::testing::Bool()),
    name);

}  // namespace
