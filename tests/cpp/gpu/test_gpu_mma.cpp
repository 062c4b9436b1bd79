// The warp-level m16n8k16 product of platform/gpu_mma.h alone (nvte_gpu_mma_m16n8k16_check: one
// warp loads A 16x16, B 16x8 and C 16x8 by PTX's fragment layout, multiplies, stores D), against a
// host double-precision reference. The flash attention forward's tensor-core path
// (fused_attn_fwd_mma.cu) is built on this layout: on sm_80+ it is the mma.sync instruction, on
// gpusim the lane-by-lane emulation, and both must agree with the reference.
//   OneHotK  k = 0..15 one at a time, A[:, k] = r + 1, B[k, :] = (n + 1) / 8, C = 64 r + n: D is
//            exact, so a swapped row, column, k half or accumulator register fails with the
//            element, its lane (4 (r % 8) + (n % 8) / 2) and register ((r >= 8) * 2 + n % 2) named.
//   Random   values in [-2, 2]: |D - ref| <= 2^-20 (sum |a b| + |c|), fp32 accumulation of 16
//            exact products (the tensor core's internal order and rounding differ from a serial
//            fp32 sum by a few fp32 ulps of the magnitude).
#include <cuda_runtime_api.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/gpu_mirror.h"

extern "C" NVTEStatus nvte_gpu_mma_m16n8k16_check(const void *a, const void *b, float *d,
                                                  NVTEDType dtype, NVTEStream stream);

namespace {

using test::cuda_check;

uint16_t to16(NVTEDType dt, float v) {
  return dt == kNVTEBFloat16 ? test::float_to_bf16(v) : test::float_to_fp16(v);
}
float from16(NVTEDType dt, uint16_t v) {
  return dt == kNVTEBFloat16 ? test::bf16_to_float(v) : test::fp16_to_float(v);
}

// D = A B + C on the device; a, b as 16-bit values of dt (rounded from the given floats).
std::vector<float> device_mma(NVTEDType dt, const std::vector<uint16_t> &a,
                              const std::vector<uint16_t> &b, const std::vector<float> &c) {
  void *da = nullptr, *db = nullptr, *dd = nullptr;
  cuda_check(cudaMalloc(&da, 256 * 2), "cudaMalloc");
  cuda_check(cudaMalloc(&db, 128 * 2), "cudaMalloc");
  cuda_check(cudaMalloc(&dd, 128 * 4), "cudaMalloc");
  cuda_check(cudaMemcpy(da, a.data(), 256 * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_check(cudaMemcpy(db, b.data(), 128 * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_check(cudaMemcpy(dd, c.data(), 128 * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  const NVTEStatus st = nvte_gpu_mma_m16n8k16_check(da, db, static_cast<float *>(dd), dt, nullptr);
  EXPECT_EQ(st, NVTE_SUCCESS) << nvte_get_last_error();
  std::vector<float> d(128);
  cuda_check(cudaMemcpy(d.data(), dd, 128 * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cuda_check(cudaFree(da), "cudaFree");
  cuda_check(cudaFree(db), "cudaFree");
  cuda_check(cudaFree(dd), "cudaFree");
  return d;
}

// Every element of d within tol(r, n) of ref; the first miss names its lane and register.
::testing::AssertionResult matches(const std::vector<float> &d, const std::vector<double> &ref,
                                   const std::vector<double> &tol) {
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) {
      const int i = r * 8 + n;
      if (!(std::fabs(d[i] - ref[i]) <= tol[i])) {
        return ::testing::AssertionFailure()
               << "D[" << r << "][" << n << "] = " << d[i] << ", expected " << ref[i] << " (tol "
               << tol[i] << "): lane " << 4 * (r % 8) + n / 2 << ", register c["
               << (r >= 8) * 2 + n % 2 << "]";
      }
    }
  return ::testing::AssertionSuccess();
}

class GpuMma : public ::testing::TestWithParam<NVTEDType> {};

TEST_P(GpuMma, OneHotK) {
  SKIP_WITHOUT_GPU();
  const NVTEDType dt = GetParam();
  for (int k = 0; k < 16; ++k) {
    std::vector<uint16_t> a(256, to16(dt, 0.0f)), b(128, to16(dt, 0.0f));
    std::vector<float> c(128);
    std::vector<double> ref(128), tol(128, 0.0);
    for (int r = 0; r < 16; ++r) a[r * 16 + k] = to16(dt, static_cast<float>(r + 1));
    for (int n = 0; n < 8; ++n) b[k * 8 + n] = to16(dt, static_cast<float>(n + 1) / 8);
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n) {
        c[r * 8 + n] = static_cast<float>(64 * r + n);
        ref[r * 8 + n] = 64.0 * r + n + (r + 1) * (n + 1) / 8.0;
      }
    EXPECT_TRUE(matches(device_mma(dt, a, b, c), ref, tol)) << "one-hot k = " << k;
  }
}

TEST_P(GpuMma, Random) {
  SKIP_WITHOUT_GPU();
  const NVTEDType dt = GetParam();
  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<uint16_t> a(256), b(128);
    std::vector<float> c(128);
    for (auto &x : a) x = to16(dt, u(gen));
    for (auto &x : b) x = to16(dt, u(gen));
    for (auto &x : c) x = u(gen);
    std::vector<double> ref(128), tol(128);
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 8; ++n) {
        double s = c[r * 8 + n], mag = std::fabs(c[r * 8 + n]);
        for (int k = 0; k < 16; ++k) {
          const double p = static_cast<double>(from16(dt, a[r * 16 + k])) * from16(dt, b[k * 8 + n]);
          s += p;
          mag += std::fabs(p);
        }
        ref[r * 8 + n] = s;
        tol[r * 8 + n] = std::ldexp(mag, -20);
      }
    EXPECT_TRUE(matches(device_mma(dt, a, b, c), ref, tol)) << "repetition " << rep;
  }
}

TEST(GpuMmaErrors, RejectsOtherDtypes) {
  SKIP_WITHOUT_GPU();
  float *d = nullptr;
  cuda_check(cudaMalloc(reinterpret_cast<void **>(&d), 128 * 4), "cudaMalloc");
  EXPECT_NE(nvte_gpu_mma_m16n8k16_check(d, d, d, kNVTEFloat32, nullptr), NVTE_SUCCESS);
  EXPECT_NE(std::string(nvte_get_last_error()).find("dtype"), std::string::npos)
      << nvte_get_last_error();
  cuda_check(cudaFree(d), "cudaFree");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuMma, ::testing::Values(kNVTEBFloat16, kNVTEFloat16),
                         [](const auto &info) {
                           return std::string(info.param == kNVTEBFloat16 ? "bf16" : "fp16");
                         });

}  // namespace
