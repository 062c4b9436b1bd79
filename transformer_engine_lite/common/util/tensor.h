// Internal view of an NVTETensor handle and the argument checks every op entry uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "error.h"
#include "transformer_engine_lite/transformer_engine.h"

namespace nvte {

using DType = NVTEDType;

const char *dtype_name(DType t);
size_t dtype_size(DType t);
// FP8 data types (not E8M0, which only holds MX scales).
bool is_fp8(DType t);
// Largest finite value of an FP8 data type.
float fp8_max(DType t);

struct SimpleTensor {
  void *dptr = nullptr;
  std::vector<size_t> shape;
  DType dtype = kNVTEFloat32;

  bool has_data() const { return dptr != nullptr; }
  size_t ndim() const { return shape.size(); }
  size_t numel() const;
  // 2-D view used by row-wise kernels: all leading dims flattened into rows.
  size_t rows() const;
  size_t cols() const { return shape.empty() ? 1 : shape.back(); }
  std::string describe() const;  // e.g. "bfloat16[8, 16]"
  template <typename T>
  T *ptr() const { return static_cast<T *>(dptr); }
};

std::string shape_str(const std::vector<size_t> &shape);

struct Tensor {
  SimpleTensor data;                  // row-wise data
  SimpleTensor columnwise_data;       // transposed (per-tensor) or column-wise MXFP8 data
  SimpleTensor scale;                 // fp32 scalar
  SimpleTensor amax;                  // fp32 scalar
  SimpleTensor scale_inv;             // fp32 scalar or E8M0 row-wise block scales
  SimpleTensor columnwise_scale_inv;  // E8M0 column-wise block scales
  SimpleTensor columnwise_amax;       // fp32 scalar: amax of the column-wise NVFP4 copy
  NVTEScalingMode scaling_mode = NVTE_DELAYED_TENSOR_SCALING;
  NVTEDevice device = kNVTEDeviceCPU;
  bool row_scaled_nvfp4 = false;  // NVFP4: one amax per row of each copy (kNVTERowScaledNVFP4)
  int nvfp4_e4m3_max = 448;       // NVFP4: E4M3 bound of the per-tensor scale (448 or 256)

  DType dtype() const { return data.has_data() ? data.dtype : columnwise_data.dtype; }
  const std::vector<size_t> &shape() const {
    return data.has_data() || columnwise_data.shape.empty() ? data.shape : columnwise_data.shape;
  }
  bool is_mxfp8() const { return scaling_mode == NVTE_MXFP8_1D_SCALING; }
};

// Handle -> tensor; a NULL handle is an error naming `arg`.
const Tensor &as_tensor(const NVTETensor t, const char *arg);
Tensor &as_tensor_mut(NVTETensor t, const char *arg);
// Handle -> tensor or nullptr (for optional arguments such as bias).
const Tensor *as_tensor_opt(const NVTETensor t);

// ---- argument checks; each message names the argument, the expectation and what was got ----
void check_has_data(const Tensor &t, const char *arg);
void check_dtype(const SimpleTensor &t, const char *arg, std::initializer_list<DType> allowed);
void check_shape(const SimpleTensor &t, const char *arg, const std::vector<size_t> &expected);
void check_same_shape(const SimpleTensor &a, const char *arg_a, const SimpleTensor &b,
                      const char *arg_b);
void check_ndim(const SimpleTensor &t, const char *arg, size_t ndim);
void check_ndim_at_least(const SimpleTensor &t, const char *arg, size_t ndim);
// fp32 scalar (numel 1) with data; `what` is e.g. "scale".
void check_fp32_scalar(const SimpleTensor &t, const char *arg, const char *what);
// Whether the byte ranges of two buffers intersect (buffers without data never do).
bool overlaps(const SimpleTensor &a, const SimpleTensor &b);
// Output buffer `b` must not share memory with input buffer `a` (kernels that read and write in one
// pass would otherwise read their own output).
void check_no_overlap(const SimpleTensor &a, const char *arg_a, const SimpleTensor &b,
                      const char *arg_b);
// All given tensors must be on one device; returns it. Entries with a null tensor are skipped.
NVTEDevice check_same_device(std::initializer_list<std::pair<const Tensor *, const char *>> ts);
// Routes on a device: returns normally for the CPU; for the GPU in a build without a GPU backend
// raises NVTE_ERROR_UNSUPPORTED naming the op.
void require_cpu_backend(NVTEDevice device, const char *op);
// Routing of ops that have GPU kernels: false -> run the CPU kernel; true -> run the GPU launcher (GPU
// build with a usable device). GPU tensors in a CPU-only build, or on a host without a device, raise
// NVTE_ERROR_UNSUPPORTED naming the op.
bool use_gpu(NVTEDevice device, const char *op);
// True in builds with a GPU backend (CUDA or ROCm).
constexpr bool kGpuBuild =
#ifdef NVTE_WITH_GPU
    true;
#else
    false;
#endif

constexpr DType kHighPrecisionTypes[] = {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16};

}  // namespace nvte

namespace nvte {
// Options behind an NVTEQuantizationConfig handle.
struct QuantizationConfig {
  bool force_pow_2_scales = false;
  float amax_epsilon = 0.0f;
  NVTETensor rng_state = nullptr;      // int64 [2] (seed, offset) for stochastic rounding
  bool nvfp4_2d_quantization = false;  // NVFP4: one scale per 16x16 block
  bool stochastic_rounding = false;    // NVFP4: stochastic E2M1 rounding
  bool nvfp4_rht = false;              // NVFP4: RHT before the column-wise copy
  uint32_t nvfp4_rht_sign_mask = 0;    // NVFP4: RHT sign mask (bit i: sign i is -1)
  uint8_t nvfp4_4over6_mode = 0;       // NVFP4: NVTENVFP44Over6Mode
  bool nvfp4_4over6_err_fast_math = false;  // NVFP4 4over6: errors in the E4M3-scaled domain
  bool nvfp4_amax_given = false;       // NVFP4: the output's amaxes are inputs (a reduced amax)
};
}  // namespace nvte
