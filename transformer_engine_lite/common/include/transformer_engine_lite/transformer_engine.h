/* Core C API of transformer_engine_lite: dtypes, tensor handles, status codes, build info.
 *
 * Follows TransformerEngine's names and argument conventions (NVTETensor, nvte_* functions); differs
 * where TE's C++ habits do not fit a C ABI:
 *  - every nvte_* op returns an NVTEStatus instead of throwing; nvte_get_last_error() gives the
 *    message (op, argument, what was expected, what was got), kept per thread;
 *  - streams are plain `void *` (NVTEStream), so this header needs no CUDA/HIP headers;
 *  - tensors carry a device tag (CPU or GPU); ops whose tensors disagree on device are rejected.
 * This header compiles as C99 (checked in CI).
 */
#ifndef TRANSFORMER_ENGINE_LITE_TRANSFORMER_ENGINE_H_
#define TRANSFORMER_ENGINE_LITE_TRANSFORMER_ENGINE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define NVTE_API
#else
#define NVTE_API __attribute__((visibility("default")))
#endif

/*! Every API enum is int-sized in C and has `int` as fixed underlying type in C++, so any int a
 *  caller passes is a valid value to read: out-of-range values are rejected with
 *  NVTE_ERROR_INVALID_ARGUMENT. (Without a fixed type, merely reading such a value is undefined
 *  behaviour in C++; UBSan reports it as "not a valid value for type".) */
#ifdef __cplusplus
#define NVTE_ENUM_INT : int
#else
#define NVTE_ENUM_INT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/*! Element types. Values of the TE types match TE's NVTEDType; the FNUZ FP8 types are ours. */
typedef enum NVTEDType NVTE_ENUM_INT {
  kNVTEByte = 0,
  kNVTEInt16 = 1,
  kNVTEInt32 = 2,
  kNVTEInt64 = 3,
  kNVTEFloat32 = 4,
  kNVTEFloat16 = 5,
  kNVTEBFloat16 = 6,
  kNVTEFloat8E4M3 = 7,     /*!< OCP E4M3 ("fn"): max 448, NaN 0x7F/0xFF, no Inf */
  kNVTEFloat8E5M2 = 8,     /*!< OCP E5M2: max 57344, has Inf */
  kNVTEFloat8E8M0 = 9,     /*!< MX block scale: unsigned power of two, 0xFF = NaN */
  kNVTEFloat8E4M3FNUZ = 10, /*!< AMD gfx94x E4M3: bias 8, max 240, NaN 0x80 only, no -0 */
  kNVTEFloat8E5M2FNUZ = 11, /*!< AMD gfx94x E5M2: bias 16, max 57344, NaN 0x80 only, no -0 */
  kNVTENumTypes
} NVTEDType;

/*! Status of an nvte_* call. Anything but NVTE_SUCCESS leaves a message in nvte_get_last_error(). */
typedef enum NVTEStatus NVTE_ENUM_INT {
  NVTE_SUCCESS = 0,
  NVTE_ERROR_INVALID_ARGUMENT = 1, /*!< bad shape, dtype, device, null pointer ... */
  NVTE_ERROR_UNSUPPORTED = 2,      /*!< valid request this build or device cannot do */
  NVTE_ERROR_INTERNAL = 3          /*!< library bug or resource failure */
} NVTEStatus;

/*! Where a tensor's memory lives. */
typedef enum NVTEDevice NVTE_ENUM_INT { kNVTEDeviceCPU = 0, kNVTEDeviceGPU = 1 } NVTEDevice;

/*! How an FP8 tensor is scaled (TE's NVTEScalingMode). */
typedef enum NVTEScalingMode NVTE_ENUM_INT {
  NVTE_DELAYED_TENSOR_SCALING = 0, /*!< one fp32 scale per tensor (delayed and current scaling) */
  NVTE_MXFP8_1D_SCALING = 1,       /*!< one E8M0 scale per 32 consecutive elements */
  NVTE_BLOCK_SCALING_1D = 2,       /*!< one fp32 scale per 1x128 tile (Float8BlockScaling) */
  NVTE_BLOCK_SCALING_2D = 3,       /*!< one fp32 scale per 128x128 block (Float8BlockScaling) */
  NVTE_NVFP4_1D_SCALING = 4,       /*!< E2M1 data, one E4M3 scale per 16 elements x fp32 amax */
  NVTE_INVALID_SCALING = 100
} NVTEScalingMode;

/*! Maximum rank of a tensor. */
#define NVTE_MAX_NDIM 8

/*! Tensor shape: dims in row-major order (last dim contiguous). */
typedef struct NVTEShape {
  size_t data[NVTE_MAX_NDIM];
  size_t ndim;
} NVTEShape;

/*! One buffer of a tensor: pointer, element type, shape. */
typedef struct NVTEBasicTensor {
  void *data_ptr;
  NVTEDType dtype;
  NVTEShape shape;
} NVTEBasicTensor;

/*! The buffers a tensor handle can hold (TE's NVTETensorParam). */
typedef enum NVTETensorParam NVTE_ENUM_INT {
  kNVTERowwiseData = 0,        /*!< data, row-major */
  kNVTEColumnwiseData = 1,     /*!< transposed copy (per-tensor FP8) or column-wise MXFP8 data */
  kNVTEScale = 2,              /*!< fp32 scalar: q = encode(x * scale) */
  kNVTEAmax = 3,               /*!< fp32 scalar: max|x| recorded by producers */
  kNVTERowwiseScaleInv = 4,    /*!< fp32 scalar (per-tensor) or E8M0 [rows, cols/32] (MXFP8) */
  kNVTEColumnwiseScaleInv = 5, /*!< E8M0 [rows/32, cols] (MXFP8 column-wise) */
  kNVTEColumnwiseAmax = 6,     /*!< fp32 scalar: amax of the column-wise NVFP4 copy */
  kNVTENumTensorParams,        /*!< buffer params are 0 .. kNVTENumTensorParams - 1 */
  /*! TE's non-buffer params (values as TE's), set with nvte_set_tensor_param_v2. uint8 (bool):
   *  the NVFP4 tensor has one amax per row of each copy (fp32 [rows] for the row-wise copy,
   *  [last dim] for the column-wise one) instead of one per tensor; filled by the quantize. */
  kNVTERowScaledNVFP4 = 8,
  /*! int32: the E4M3 bound of the NVFP4 per-tensor scale, S_enc = 6 * bound / amax (448, or 256
   *  with 4over6 for map-to-4 headroom); quantize, dequantize and GEMM read it. */
  kNVTENVFP4E4M3Max = 9
} NVTETensorParam;

/*! Opaque tensor handle. Holds pointers only; never owns memory. */
typedef void *NVTETensor;

/*! Stream: cudaStream_t / hipStream_t on GPU builds, ignored on the CPU. */
typedef void *NVTEStream;

/*! Creates an empty tensor handle (CPU device, no buffers). Returns NULL only on allocation failure. */
NVTE_API NVTETensor nvte_create_tensor(NVTEScalingMode scaling_mode);

/*! Destroys a handle (not the memory it points to). NULL is ignored. */
NVTE_API void nvte_destroy_tensor(NVTETensor tensor);

/*! Sets one buffer of a tensor. A non-empty shape may describe at most PTRDIFF_MAX bytes (larger
 *  ones, e.g. dims whose product wraps around, are NVTE_ERROR_INVALID_ARGUMENT); an empty one (a dim
 *  of 0) may declare any other dims. */
NVTE_API NVTEStatus nvte_set_tensor_param(NVTETensor *tensor, NVTETensorParam param_name,
                                          const NVTEBasicTensor *param);

/*! Reads one buffer of a tensor (a zeroed struct for a NULL handle). */
NVTE_API NVTEBasicTensor nvte_get_tensor_param(const NVTETensor tensor, NVTETensorParam param_name);

/*! Sets / reads a non-buffer param (kNVTERowScaledNVFP4: uint8 0/1; kNVTENVFP4E4M3Max: int32 448
 *  or 256) from / into `buf` of `size_in_bytes`. The getter writes nothing for a NULL handle or
 *  buf; `size_written` (may be NULL) receives the param's size. */
NVTE_API NVTEStatus nvte_set_tensor_param_v2(NVTETensor tensor, NVTETensorParam param,
                                             const void *buf, size_t size_in_bytes);
NVTE_API void nvte_get_tensor_param_v2(const NVTETensor tensor, NVTETensorParam param, void *buf,
                                       size_t size_in_bytes, size_t *size_written);

/*! Sets / reads the device tag. */
NVTE_API NVTEStatus nvte_set_tensor_device(NVTETensor tensor, NVTEDevice device);
NVTE_API NVTEDevice nvte_tensor_device(const NVTETensor tensor);

/*! Convenience accessors of the row-wise data (TE names). */
NVTE_API NVTEShape nvte_tensor_shape(const NVTETensor tensor);
NVTE_API NVTEDType nvte_tensor_type(const NVTETensor tensor);
NVTE_API void *nvte_tensor_data(const NVTETensor tensor);
NVTE_API NVTEScalingMode nvte_tensor_scaling_mode(const NVTETensor tensor);
NVTE_API size_t nvte_tensor_numel(const NVTETensor tensor);

/*! Size in bytes of one element of `dtype` (0 for an unknown dtype). */
NVTE_API size_t nvte_dtype_size(NVTEDType dtype);
/*! Name of a dtype ("float32", "float8_e4m3", ...); "unknown" for values out of range. */
NVTE_API const char *nvte_dtype_name(NVTEDType dtype);

/*! Message of the last failed nvte_* call on this thread ("" if the last call succeeded). */
NVTE_API const char *nvte_get_last_error(void);
/*! Status of the last nvte_* call on this thread. */
NVTE_API NVTEStatus nvte_get_last_status(void);

/*! JSON object describing this build: version, device backends, CPU features, FP8 flavour. */
NVTE_API const char *nvte_get_build_info(void);
/*! Library version string, e.g. "0.1.0". */
NVTE_API const char *nvte_get_version(void);

/*! NVFP4 4over6 candidate selection (TE's NVTENVFP44Over6Mode). */
typedef enum NVTENVFP44Over6Mode NVTE_ENUM_INT {
  kNVTENVFP44Over6Disabled = 0, /*!< plain NVFP4 */
  kNVTENVFP44Over6MinMAE = 1,   /*!< keep the candidate of lower summed absolute error */
  kNVTENVFP44Over6MinMSE = 2    /*!< keep the candidate of lower summed squared error */
} NVTENVFP44Over6Mode;

/*! Quantization options (TE's NVTEQuantizationConfig) used by current scaling. */
typedef void *NVTEQuantizationConfig;
typedef enum NVTEQuantizationConfigAttribute NVTE_ENUM_INT {
  kNVTEQuantizationConfigForcePow2Scales = 0, /*!< bool: clear the scale's mantissa bits */
  kNVTEQuantizationConfigAmaxEpsilon = 1,     /*!< float: amax is clamped to at least this */
  /*! NVTETensor: int64 [2] (seed, offset) in host memory, read by each quantize that rounds
   *  stochastically (values 2 and 3, TE's noop tensor and deprecated block format, are not taken) */
  kNVTEQuantizationConfigRNGState = 4,
  kNVTEQuantizationConfigNVFP42DQuantization = 5, /*!< bool: NVFP4 16x16 block scales (weights) */
  kNVTEQuantizationConfigStochasticRounding = 6,  /*!< bool: NVFP4 stochastic E2M1 rounding */
  /*! uint8 NVTENVFP44Over6Mode: NVFP4 4over6, each block quantized twice (block scale for a
   *  block max of 6, and 1.5x that: map-to-4) keeping the candidate of lower error */
  kNVTEQuantizationConfigNVFP44Over6Mode = 8,
  /*! bool: 4over6 errors in the E4M3-scaled domain (x * S_enc vs e2m1 * e4m3 scale, TE's fast
   *  math path) instead of the input domain; bit-exact either way */
  kNVTEQuantizationConfigNVFP44Over6ErrUseFastMath = 9,
  kNVTEQuantizationConfigNumAttributes,
  /*! Ours (TE runs the RHT as separate hadamard_transform calls): bool, apply the 16-point random
   *  Hadamard transform along the rows of the NVFP4 column-wise copy before quantizing it */
  kNVTEQuantizationConfigNVFP4RHT = 64,
  /*! Ours: uint32, the RHT sign mask (bit i set: sign i is -1; TE's wgrad vector is 0xD7E8) */
  kNVTEQuantizationConfigNVFP4RHTSignMask = 65,
  /*! Ours: bool, the NVFP4 output's amax (row-wise) and columnwise_amax (after the RHT when it is
   *  applied) already hold the per-tensor amaxes, e.g. max-reduced over a process group or mesh
   *  axes (TE's NVFP4 quantize always reads them there after nvte_compute_amax and an optional
   *  all-reduce; ours computes them from the input unless this is set). S_enc comes from them and
   *  they are left as given. Not with row-scaled NVFP4 (its amaxes are per row). */
  kNVTEQuantizationConfigNVFP4AmaxGiven = 66
} NVTEQuantizationConfigAttribute;

NVTE_API NVTEQuantizationConfig nvte_create_quantization_config(void);
NVTE_API void nvte_destroy_quantization_config(NVTEQuantizationConfig config);
/*! Sets an attribute from `buf` of `size_in_bytes` (sizeof(bool) or sizeof(float)). */
NVTE_API NVTEStatus nvte_set_quantization_config_attribute(NVTEQuantizationConfig config,
                                                           NVTEQuantizationConfigAttribute attr,
                                                           const void *buf, size_t size_in_bytes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TRANSFORMER_ENGINE_LITE_TRANSFORMER_ENGINE_H_ */
