// GPU test support for ops checked against their CPU result: a device copy of a host TestTensor
// behind its own GPU-tagged handle, the skip check, the output configurations fused producers
// support, and the GPU-vs-CPU comparisons (bytes where the CPU and GPU share every operation).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_common.h"

namespace test {

// A GPU is usable here: the tests skip otherwise (CI has none; they still must compile).
inline bool gpu_available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!::test::gpu_available()) GTEST_SKIP() << "no GPU device"

inline void cuda_check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Device copy of every buffer a host TestTensor has set, with the same shapes, dtypes and scaling
// mode, tagged kNVTEDeviceGPU. Outputs are read back with download().
class GpuTensor {
 public:
  explicit GpuTensor(const TestTensor &host)
      : h_(nvte_create_tensor(nvte_tensor_scaling_mode(host.handle()))) {
    for (int i = 0; i < kNVTENumTensorParams; ++i) {
      const NVTETensorParam p = static_cast<NVTETensorParam>(i);
      const Buffer &b = host.buffer(p);
      if (b.bytes.empty()) continue;
      cuda_check(cudaMalloc(&ptr_[i], b.bytes.size()), "cudaMalloc");
      cuda_check(cudaMemcpy(ptr_[i], b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice),
                 "cudaMemcpy to device");
      attach(p, ptr_[i], b.shape, b.dtype);
    }
    if (nvte_set_tensor_device(h_, kNVTEDeviceGPU) != NVTE_SUCCESS)
      throw std::runtime_error(nvte_get_last_error());
  }
  // A device workspace of the queried shape and dtype.
  GpuTensor(const std::vector<size_t> &shape, NVTEDType dtype)
      : h_(nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING)) {
    const size_t bytes = std::max<size_t>(1, numel_of(shape) * dtype_bytes(dtype));
    cuda_check(cudaMalloc(&ptr_[0], bytes), "cudaMalloc");
    attach(kNVTERowwiseData, ptr_[0], shape, dtype);
    if (nvte_set_tensor_device(h_, kNVTEDeviceGPU) != NVTE_SUCCESS)
      throw std::runtime_error(nvte_get_last_error());
  }
  ~GpuTensor() {
    for (void *p : ptr_) (void)cudaFree(p);
    nvte_destroy_tensor(h_);
  }
  GpuTensor(const GpuTensor &) = delete;
  GpuTensor &operator=(const GpuTensor &) = delete;

  operator NVTETensor() const { return h_; }

  // Copies buffer p back over the same buffer of `host` (which has the shape it was made from).
  void download(TestTensor &host, NVTETensorParam p) const {
    Buffer &b = host.buffer(p);
    cuda_check(cudaDeviceSynchronize(), "kernel execution");
    cuda_check(cudaMemcpy(b.bytes.data(), ptr_[p], b.bytes.size(), cudaMemcpyDeviceToHost),
               "cudaMemcpy to host");
  }
  // Every buffer that was set.
  void download_all(TestTensor &host) const {
    for (int i = 0; i < kNVTENumTensorParams; ++i) {
      if (ptr_[i] != nullptr) download(host, static_cast<NVTETensorParam>(i));
    }
  }

 private:
  void attach(NVTETensorParam p, void *ptr, const std::vector<size_t> &shape, NVTEDType dtype) {
    NVTEBasicTensor bt{};
    bt.data_ptr = ptr;
    bt.dtype = dtype;
    bt.shape.ndim = shape.size();
    for (size_t i = 0; i < shape.size(); ++i) bt.shape.data[i] = shape[i];
    if (nvte_set_tensor_param(&h_, p, &bt) != NVTE_SUCCESS)
      throw std::runtime_error(nvte_get_last_error());
  }

  NVTETensor h_ = nullptr;
  void *ptr_[kNVTENumTensorParams] = {};
};

// ------------------------------------------------------------------ fused producer outputs
// The output configurations of a fused producer (norm z, activation output).
enum class OutKind {
  kPlain,       // fp32 / fp16 / bf16
  kPerTensor,   // FP8 with scale, amax, scale_inv and the transposed copy
  kMxfp8,       // MXFP8 row-wise and column-wise, E8M0 scales both ways
};

inline const char *out_kind_name(OutKind k) {
  return k == OutKind::kPlain ? "plain" : (k == OutKind::kPerTensor ? "per_tensor" : "mxfp8");
}

inline NVTEScalingMode out_mode(OutKind k) {
  return k == OutKind::kMxfp8 ? NVTE_MXFP8_1D_SCALING : NVTE_DELAYED_TENSOR_SCALING;
}

// A host output of 2-D view [rows, cols] (shape's leading dims flattened); amax and scale_inv
// start at -1 so a missing write shows.
inline TestTensor make_output(const std::vector<size_t> &shape, NVTEDType t, OutKind k,
                              float scale = 1.0f) {
  size_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  const size_t cols = shape.back();
  TestTensor out(shape, t, out_mode(k));
  if (k == OutKind::kPerTensor) {
    out.set_scale(scale);
    out.set_amax(-1.0f);
    out.set_scale_inv(-1.0f);
    out.set(kNVTEColumnwiseData, {cols, rows}, t);
  } else if (k == OutKind::kMxfp8) {
    out.set(kNVTERowwiseScaleInv, {rows, (cols + 31) / 32}, kNVTEFloat8E8M0);
    out.set(kNVTEColumnwiseData, shape, t);
    out.set(kNVTEColumnwiseScaleInv, {(rows + 31) / 32, cols}, kNVTEFloat8E8M0);
    out.set_amax(-1.0f);
  } else {
    out.set_amax(-1.0f);  // producers record amax for plain outputs too (current scaling)
  }
  return out;
}

// Every buffer of two tensors built alike, byte for byte.
inline ::testing::AssertionResult same_buffers(const TestTensor &gpu, const TestTensor &cpu) {
  static const char *kNames[] = {"data", "column-wise data", "scale", "amax", "scale_inv",
                                 "column-wise scale_inv"};
  for (int i = 0; i < kNVTENumTensorParams; ++i) {
    const Buffer &g = gpu.buffer(static_cast<NVTETensorParam>(i));
    const Buffer &c = cpu.buffer(static_cast<NVTETensorParam>(i));
    if (g.bytes.size() != c.bytes.size())
      return ::testing::AssertionFailure() << kNames[i] << ": sizes differ";
    ::testing::AssertionResult r = same_bytes(g.bytes.data(), c.bytes.data(), g.bytes.size());
    if (!r) return ::testing::AssertionFailure() << kNames[i] << ": " << r.message();
  }
  return ::testing::AssertionSuccess();
}

// Values of buffer p close across devices, for results whose fp32 values differ between devices
// only by the order of a row's sums: the dtype's tolerance, and for FP8 one unit in the last place
// (decoded), since rounding to the output dtype may then land on a neighbouring code.
inline ::testing::AssertionResult close_across_devices(const TestTensor &gpu, const TestTensor &cpu,
                                                 NVTETensorParam p) {
  const NVTEDType t = cpu.buffer(p).dtype;
  Tol tol = tolerance(t);
  if (is_fp8(t)) {
    const Tol q = fp8_quantization_tolerance(t);  // half an ulp: doubled
    tol = {2 * q.atol, 2 * q.rtol};
  }
  return close(gpu.to_double(p), cpu.to_double(p), tol);
}

}  // namespace test
