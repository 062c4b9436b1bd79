// Multi-tensor ops on the GPU against the CPU op: Adam (each variant), SGD, scale, L2 norm and FP8
// scales. Both devices run the same per-element math (multi_tensor_params.h), so element-wise
// results are compared byte for byte; the L2 norm's partial sums differ in order (fp32 tree on the
// GPU, double on the CPU) and are compared to a tolerance.
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_mirror.h"
#include "multi_tensor_reference.h"
#include "transformer_engine_lite/multi_tensor.h"

namespace {

using test::GpuTensor;
using test::HandleLists;
using test::TestTensor;

// 70000: several blocks per tensor and more than one L2 chunk of 65536.
const std::vector<size_t> kSizes = {1, 300, 70000};
constexpr int kChunk = 2048 * 32;
const char *const kKindNames[] = {"plain", "master", "remainder", "fp8"};

// The same random lists on the host (CPU run) and mirrored on the device (GPU run).
struct Lists {
  std::vector<std::vector<TestTensor>> host, gpu_result;
  std::vector<std::vector<std::unique_ptr<GpuTensor>>> dev;
  HandleLists h_host, h_dev;
  Lists(const std::vector<NVTEDType> &dtypes, const std::vector<bool> &scalar, std::mt19937 &rng)
      : host(dtypes.size()), gpu_result(dtypes.size()), dev(dtypes.size()),
        h_host(dtypes.size()), h_dev(dtypes.size()) {
    for (size_t i = 0; i < dtypes.size(); ++i) {
      for (size_t n : kSizes) {
        const size_t numel = scalar[i] ? 1 : n;
        host[i].emplace_back(std::vector<size_t>{numel}, dtypes[i]);
        gpu_result[i].emplace_back(std::vector<size_t>{numel}, dtypes[i]);
        TestTensor &t = host[i].back();
        if (dtypes[i] == kNVTEInt16 || dtypes[i] == kNVTEByte) {
          for (size_t k = 0; k < t.buffer().bytes.size(); ++k) t.bytes()[k] = uint8_t(rng());
        } else {
          // exp_avg_sq (list 3) and FP8 scale / amax / scale_inv (5-7) are >= 0.
          t.fill_uniform(rng, i == 3 || i >= 5 ? 0.0 : -1.0, 1.0);
        }
        dev[i].push_back(std::make_unique<GpuTensor>(t));
        h_host.add(i, t);
        h_dev.add(i, *dev[i].back());
      }
    }
  }
  // Every list's GPU result equals the CPU's bytes.
  void expect_same() {
    for (size_t i = 0; i < host.size(); ++i) {
      for (size_t j = 0; j < kSizes.size(); ++j) {
        dev[i][j]->download(gpu_result[i][j], kNVTERowwiseData);
        const auto &a = gpu_result[i][j].buffer().bytes, &b = host[i][j].buffer().bytes;
        EXPECT_TRUE(test::same_bytes(a.data(), b.data(), a.size()))
            << "list " << i << " tensor " << j;
      }
    }
  }
};

struct Flags {
  TestTensor host{std::vector<size_t>{1}, kNVTEInt32};
  std::unique_ptr<GpuTensor> dev;
  explicit Flags(int v) {
    host.put(0, v);
    dev = std::make_unique<GpuTensor>(host);
  }
};

class GpuMultiTensorAdamTest : public ::testing::TestWithParam<int> {};

TEST_P(GpuMultiTensorAdamTest, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const int kind = GetParam();  // 0 plain bf16, 1 master, 2 remainder, 3 fp8
  std::mt19937 rng(21 + kind);
  std::vector<NVTEDType> dt = {kNVTEBFloat16, kNVTEBFloat16, kNVTEFloat32, kNVTEFloat32};
  std::vector<bool> scalar(8, false);
  if (kind == 1) dt.push_back(kNVTEFloat32);
  if (kind == 2) dt.push_back(kNVTEInt16);
  if (kind == 3) {
    dt[1] = kNVTEByte;
    for (int i = 0; i < 4; ++i) dt.push_back(kNVTEFloat32);
    scalar[5] = scalar[6] = scalar[7] = true;
  }
  Lists l(dt, scalar, rng);
  Flags cpu(0), gpu(0);
  auto call = [&](HandleLists &h, NVTETensor noop) {
    const size_t nl = h.lists(), np = h.per_list();
    if (kind == 2) {
      return nvte_multi_tensor_adam_param_remainder_cuda(kChunk, noop, h.get(), nl, np, 1e-3f,
                                                         0.9f, 0.999f, 1e-8f, 5, 1, 1, 0.01f,
                                                         nullptr);
    }
    if (kind == 3) {
      return nvte_multi_tensor_adam_fp8_cuda(kChunk, noop, h.get(), nl, np, 1e-3f, 0.9f, 0.999f,
                                             1e-8f, 5, 0, 1, 0.01f, kNVTEFloat8E4M3, nullptr);
    }
    return nvte_multi_tensor_adam_cuda(kChunk, noop, h.get(), nl, np, 1e-3f, 0.9f, 0.999f, 1e-8f,
                                       5, 1, 1, 0.01f, nullptr);
  };
  ASSERT_NVTE_OK(call(l.h_host, cpu.host));
  ASSERT_NVTE_OK(call(l.h_dev, *gpu.dev));
  l.expect_same();
}

INSTANTIATE_TEST_SUITE_P(Kinds, GpuMultiTensorAdamTest, ::testing::Range(0, 4),
                         [](const ::testing::TestParamInfo<int> &info) {
                           return std::string(kKindNames[info.param]);
                         });

TEST(GpuMultiTensor, SgdMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  Lists l({kNVTEFloat16, kNVTEFloat32, kNVTEFloat32, kNVTEFloat16}, std::vector<bool>(4, false),
          rng);
  Flags cpu(0), gpu(0);
  ASSERT_NVTE_OK(nvte_multi_tensor_sgd_cuda(kChunk, cpu.host, l.h_host.get(), 4, kSizes.size(),
                                            0.01f, 0.9f, 0.1f, 0.05f, 1, 0, 0, 0.5f, nullptr));
  ASSERT_NVTE_OK(nvte_multi_tensor_sgd_cuda(kChunk, *gpu.dev, l.h_dev.get(), 4, kSizes.size(),
                                            0.01f, 0.9f, 0.1f, 0.05f, 1, 0, 0, 0.5f, nullptr));
  l.expect_same();
}

TEST(GpuMultiTensor, ScaleMatchesCpuAndFlagsOverflow) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  Lists l({kNVTEBFloat16, kNVTEFloat32}, {false, false}, rng);
  l.host[0][2].put(69999, INFINITY);
  l.dev[0][2] = std::make_unique<GpuTensor>(l.host[0][2]);
  HandleLists h(2);
  for (size_t j = 0; j < kSizes.size(); ++j) h.add(0, *l.dev[0][j]), h.add(1, *l.dev[1][j]);
  Flags cpu(0), gpu(0);
  ASSERT_NVTE_OK(nvte_multi_tensor_scale_cuda(kChunk, cpu.host, l.h_host.get(), 2, kSizes.size(),
                                              0.125f, nullptr));
  ASSERT_NVTE_OK(nvte_multi_tensor_scale_cuda(kChunk, *gpu.dev, h.get(), 2, kSizes.size(), 0.125f,
                                              nullptr));
  l.expect_same();
  TestTensor flag({1}, kNVTEInt32);
  gpu.dev->download(flag, kNVTERowwiseData);
  EXPECT_EQ(cpu.host.get(0), 1.0);
  EXPECT_EQ(flag.get(0), 1.0);
}

TEST(GpuMultiTensor, L2NormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  Lists l({kNVTEFloat32}, {false}, rng);
  const int chunk = 4096, max_chunks = 18;
  const size_t n = kSizes.size();
  TestTensor out[2] = {TestTensor({1}, kNVTEFloat32), TestTensor({1}, kNVTEFloat32)};
  TestTensor ret[2] = {TestTensor({1}, kNVTEFloat32), TestTensor({1}, kNVTEFloat32)};
  TestTensor per[2] = {TestTensor({n}, kNVTEFloat32), TestTensor({n}, kNVTEFloat32)};
  TestTensor scratch({n * max_chunks}, kNVTEFloat32), inv({1}, kNVTEFloat32);
  inv.put(0, 0.5);
  Flags cpu(0), gpu(0);
  ASSERT_NVTE_OK(nvte_multi_tensor_unscale_l2norm_cuda(chunk, cpu.host, l.h_host.get(), 1, n,
                                                       out[0], scratch, ret[0], per[0], inv, 1,
                                                       max_chunks, nullptr));
  GpuTensor d_out(out[1]), d_ret(ret[1]), d_per(per[1]), d_scratch(scratch), d_inv(inv);
  ASSERT_NVTE_OK(nvte_multi_tensor_unscale_l2norm_cuda(chunk, *gpu.dev, l.h_dev.get(), 1, n,
                                                       d_out, d_scratch, d_ret, d_per, d_inv, 1,
                                                       max_chunks, nullptr));
  d_ret.download(ret[1], kNVTERowwiseData);
  d_per.download(per[1], kNVTERowwiseData);
  const test::Tol tol{1e-6, 1e-5};
  EXPECT_TRUE(test::close(ret[1].to_double(), ret[0].to_double(), tol));
  EXPECT_TRUE(test::close(per[1].to_double(), per[0].to_double(), tol));
}

TEST(GpuMultiTensor, ComputeScaleMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  Lists l({kNVTEFloat32, kNVTEFloat32, kNVTEFloat32}, {false, false, false}, rng);
  Flags cpu(0), gpu(0);
  ASSERT_NVTE_OK(nvte_multi_tensor_compute_scale_and_scale_inv_cuda(
      kChunk, cpu.host, l.h_host.get(), 3, kSizes.size(), 448.0f, 0, 0.0f, nullptr));
  ASSERT_NVTE_OK(nvte_multi_tensor_compute_scale_and_scale_inv_cuda(
      kChunk, *gpu.dev, l.h_dev.get(), 3, kSizes.size(), 448.0f, 0, 0.0f, nullptr));
  l.expect_same();
}

}  // namespace
