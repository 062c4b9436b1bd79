// Tensor handles, error reporting, quantization configs and build info of the C API.
#include <limits>
#include <string>

#include "test_common.h"
#include "transformer_engine_lite/cast.h"

namespace {

TEST(TensorApi, SetAndGetParams) {
  test::TestTensor t({3, 5}, kNVTEBFloat16);
  t.set_scale(2.0f);
  NVTEShape s = nvte_tensor_shape(t);
  ASSERT_EQ(s.ndim, 2u);
  EXPECT_EQ(s.data[0], 3u);
  EXPECT_EQ(s.data[1], 5u);
  EXPECT_EQ(nvte_tensor_type(t), kNVTEBFloat16);
  EXPECT_EQ(nvte_tensor_numel(t), 15u);
  EXPECT_EQ(nvte_tensor_data(t), t.bytes());
  EXPECT_EQ(nvte_tensor_scaling_mode(t), NVTE_DELAYED_TENSOR_SCALING);
  NVTEBasicTensor sc = nvte_get_tensor_param(t, kNVTEScale);
  EXPECT_EQ(sc.data_ptr, t.bytes(kNVTEScale));
  EXPECT_EQ(sc.dtype, kNVTEFloat32);
  EXPECT_EQ(nvte_tensor_device(t), kNVTEDeviceCPU);
  t.set_device(kNVTEDeviceGPU);
  EXPECT_EQ(nvte_tensor_device(t), kNVTEDeviceGPU);
}

TEST(TensorApi, NullHandlesAreHarmless) {
  nvte_destroy_tensor(nullptr);
  EXPECT_EQ(nvte_tensor_numel(nullptr), 0u);
  EXPECT_EQ(nvte_tensor_data(nullptr), nullptr);
  EXPECT_EQ(nvte_get_tensor_param(nullptr, kNVTEScale).data_ptr, nullptr);
  EXPECT_EQ(nvte_tensor_scaling_mode(nullptr), NVTE_INVALID_SCALING);
}

TEST(TensorApi, RejectsBadParams) {
  NVTETensor h = nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING);
  NVTEBasicTensor bt{};
  bt.dtype = kNVTEFloat32;
  bt.shape.ndim = 1;
  bt.shape.data[0] = 4;
  EXPECT_NVTE_ERROR(nvte_set_tensor_param(nullptr, kNVTEScale, &bt), NVTE_ERROR_INVALID_ARGUMENT,
                    "nvte_set_tensor_param", "'tensor'", "NULL");
  EXPECT_NVTE_ERROR(nvte_set_tensor_param(&h, kNVTEScale, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "'param'");
  EXPECT_NVTE_ERROR(nvte_set_tensor_param(&h, static_cast<NVTETensorParam>(42), &bt),
                    NVTE_ERROR_INVALID_ARGUMENT, "'param_name'", "got 42");
  bt.dtype = static_cast<NVTEDType>(99);
  EXPECT_NVTE_ERROR(nvte_set_tensor_param(&h, kNVTEScale, &bt), NVTE_ERROR_INVALID_ARGUMENT,
                    "'param.dtype'", "got 99");
  bt.dtype = kNVTEFloat32;
  bt.shape.ndim = NVTE_MAX_NDIM + 1;
  EXPECT_NVTE_ERROR(nvte_set_tensor_param(&h, kNVTEScale, &bt), NVTE_ERROR_INVALID_ARGUMENT,
                    "'param.shape'");
  EXPECT_NVTE_ERROR(nvte_set_tensor_device(h, static_cast<NVTEDevice>(7)),
                    NVTE_ERROR_INVALID_ARGUMENT, "'device'", "got 7");
  EXPECT_NVTE_ERROR(nvte_set_tensor_device(nullptr, kNVTEDeviceCPU), NVTE_ERROR_INVALID_ARGUMENT,
                    "'tensor'");
  // A failed call leaves the handle as it was.
  EXPECT_EQ(nvte_get_tensor_param(h, kNVTEScale).data_ptr, nullptr);
  nvte_destroy_tensor(h);
}

// Fuzzing finding (tests/fuzz, fuzz_cast / fuzz_rowwise): a shape whose element count wraps around
// size_t ([2^63 + 7, 2] counts 14 elements) was accepted, and quantize / activations then walked
// 2^63 rows of a 14-element buffer. Non-empty shapes must now describe at most PTRDIFF_MAX bytes;
// empty ones (a dim of 0) may still declare any other dims.
TEST(TensorApi, RejectsShapesLargerThanMemory) {
  NVTETensor h = nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING);
  float data[14] = {};
  NVTEBasicTensor bt{};
  bt.data_ptr = data;
  bt.dtype = kNVTEFloat32;
  bt.shape.ndim = 2;
  bt.shape.data[0] = (size_t{1} << 63) + 7;
  bt.shape.data[1] = 2;
  EXPECT_NVTE_ERROR(nvte_set_tensor_param(&h, kNVTERowwiseData, &bt), NVTE_ERROR_INVALID_ARGUMENT,
                    "nvte_set_tensor_param", "'param.shape'", "PTRDIFF_MAX");
  EXPECT_EQ(nvte_get_tensor_param(h, kNVTERowwiseData).data_ptr, nullptr);
  bt.shape.data[0] = size_t{1} << 61;  // 2^62 fp32 elements: 2^64 bytes, no wrap in the count
  EXPECT_NVTE_ERROR(nvte_set_tensor_param(&h, kNVTERowwiseData, &bt), NVTE_ERROR_INVALID_ARGUMENT,
                    "'param.shape'");
  bt.dtype = kNVTEByte;  // 2^62 bytes fit
  ASSERT_NVTE_OK(nvte_set_tensor_param(&h, kNVTERowwiseData, &bt));
  bt.dtype = kNVTEFloat32;
  bt.shape.ndim = 3;  // empty: any other dims
  bt.shape.data[0] = 0;
  bt.shape.data[1] = std::numeric_limits<size_t>::max();
  bt.shape.data[2] = std::numeric_limits<size_t>::max();
  ASSERT_NVTE_OK(nvte_set_tensor_param(&h, kNVTERowwiseData, &bt));
  EXPECT_EQ(nvte_tensor_numel(h), 0u);
  nvte_destroy_tensor(h);
}

TEST(ErrorApi, SuccessClearsTheLastError) {
  EXPECT_NE(nvte_set_tensor_device(nullptr, kNVTEDeviceCPU), NVTE_SUCCESS);
  EXPECT_NE(std::string(nvte_get_last_error()), "");
  EXPECT_EQ(nvte_get_last_status(), NVTE_ERROR_INVALID_ARGUMENT);
  test::TestTensor t({1}, kNVTEFloat32);
  t.set_device(kNVTEDeviceCPU);
  EXPECT_EQ(std::string(nvte_get_last_error()), "");
  EXPECT_EQ(nvte_get_last_status(), NVTE_SUCCESS);
}

TEST(DTypeApi, NamesAndSizes) {
  EXPECT_EQ(nvte_dtype_size(kNVTEFloat32), 4u);
  EXPECT_EQ(nvte_dtype_size(kNVTEBFloat16), 2u);
  EXPECT_EQ(nvte_dtype_size(kNVTEFloat8E4M3FNUZ), 1u);
  EXPECT_EQ(nvte_dtype_size(kNVTEInt64), 8u);
  EXPECT_EQ(nvte_dtype_size(static_cast<NVTEDType>(77)), 0u);
  EXPECT_EQ(std::string(nvte_dtype_name(kNVTEFloat8E5M2)), "float8_e5m2");
  EXPECT_EQ(std::string(nvte_dtype_name(static_cast<NVTEDType>(77))), "unknown");
}

TEST(QuantizationConfigApi, Attributes) {
  NVTEQuantizationConfig c = nvte_create_quantization_config();
  ASSERT_NE(c, nullptr);
  bool pow2 = true;
  float eps = 1e-12f;
  ASSERT_NVTE_OK(nvte_set_quantization_config_attribute(c, kNVTEQuantizationConfigForcePow2Scales,
                                                        &pow2, sizeof(pow2)));
  ASSERT_NVTE_OK(nvte_set_quantization_config_attribute(c, kNVTEQuantizationConfigAmaxEpsilon,
                                                        &eps, sizeof(eps)));
  EXPECT_NVTE_ERROR(nvte_set_quantization_config_attribute(c, kNVTEQuantizationConfigAmaxEpsilon,
                                                           &eps, 8),
                    NVTE_ERROR_INVALID_ARGUMENT, "'size_in_bytes'", "got 8");
  float neg = -1.0f;
  EXPECT_NVTE_ERROR(nvte_set_quantization_config_attribute(c, kNVTEQuantizationConfigAmaxEpsilon,
                                                           &neg, sizeof(neg)),
                    NVTE_ERROR_INVALID_ARGUMENT, "epsilon >= 0");
  EXPECT_NVTE_ERROR(nvte_set_quantization_config_attribute(nullptr,
                                                           kNVTEQuantizationConfigAmaxEpsilon,
                                                           &eps, sizeof(eps)),
                    NVTE_ERROR_INVALID_ARGUMENT, "'config'");
  EXPECT_NVTE_ERROR(nvte_set_quantization_config_attribute(
                        c, static_cast<NVTEQuantizationConfigAttribute>(7), &eps, sizeof(eps)),
                    NVTE_ERROR_INVALID_ARGUMENT, "'attr'");  // 2, 3, 7: no attribute
  EXPECT_NVTE_ERROR(nvte_set_quantization_config_attribute(c, kNVTEQuantizationConfigNumAttributes,
                                                           &eps, sizeof(eps)),
                    NVTE_ERROR_INVALID_ARGUMENT, "'attr'");
  EXPECT_NVTE_ERROR(nvte_set_quantization_config_attribute(c, kNVTEQuantizationConfigAmaxEpsilon,
                                                           nullptr, sizeof(eps)),
                    NVTE_ERROR_INVALID_ARGUMENT, "'buf'");
  nvte_destroy_quantization_config(c);
  nvte_destroy_quantization_config(nullptr);
}

TEST(BuildInfo, ReportsVersionAndBackends) {
  const std::string info = nvte_get_build_info();
  EXPECT_NE(info.find("\"version\": \"" + std::string(nvte_get_version()) + "\""), std::string::npos)
      << info;
  EXPECT_NE(info.find("\"device_backends\": [\"cpu\""), std::string::npos) << info;
  EXPECT_NE(info.find("\"cpu_features\""), std::string::npos) << info;
}

}  // namespace
