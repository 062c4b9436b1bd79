// Rejection paths of nvte_cublas_gemm: each bad argument gets its status and a message naming the
// argument and the expectation, and no output byte changes.
#include <string>

#include "test_common.h"
#include "transformer_engine_lite/gemm.h"

namespace {

using test::TestTensor;

bool have_gemm() {
  return std::string(nvte_get_build_info()).find("\"gemm_cpu\": null") == std::string::npos;
}

// A valid forward GEMM with bias and GELU: m = 5, n = 4, k = 3 (A [k, m], B [n, k], D [n, m]).
class GemmErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (TestTensor *t : {&A, &B, &D, &bias, &pre})
      for (size_t i = 0; i < t->numel(); ++i) t->put(i, 0.25 * static_cast<double>(i % 7) - 0.5);
    snapshot();
  }
  void snapshot() {
    d0 = D.buffer().bytes;
    bias0 = bias.buffer().bytes;
    pre0 = pre.buffer().bytes;
  }
  NVTEStatus gemm(NVTETensor a, NVTETensor b, NVTETensor d, NVTETensor bi, NVTETensor pg,
                  bool ta = false, bool tb = false, bool grad = false, bool acc = false,
                  NVTETensor ws = nullptr) {
    return nvte_cublas_gemm(a, b, d, bi, pg, ta, tb, grad, ws, acc, false, 0, nullptr);
  }
  NVTEStatus gemm_default() { return gemm(A, B, D, bias, pre); }
  void TearDown() override {
    EXPECT_EQ(D.buffer().bytes, d0) << "D changed by a failing call";
    EXPECT_EQ(bias.buffer().bytes, bias0) << "bias changed by a failing call";
    EXPECT_EQ(pre.buffer().bytes, pre0) << "pre_gelu_out changed by a failing call";
  }

  TestTensor A{{3, 5}, kNVTEBFloat16}, B{{4, 3}, kNVTEBFloat16}, D{{4, 5}, kNVTEFloat32};
  TestTensor bias{{5}, kNVTEBFloat16}, pre{{4, 5}, kNVTEBFloat16};
  std::vector<uint8_t> d0, bias0, pre0;
};

constexpr NVTEStatus kInvalid = NVTE_ERROR_INVALID_ARGUMENT;
constexpr NVTEStatus kUnsupported = NVTE_ERROR_UNSUPPORTED;

TEST_F(GemmErrorTest, ValidBaselineSucceeds) {
  if (!have_gemm()) {
    EXPECT_NVTE_ERROR(gemm_default(), kUnsupported, "oneDNN", "NVTE_WITH_ONEDNN");
    return;
  }
  EXPECT_NE(std::string(nvte_get_build_info()).find("oneDNN"), std::string::npos);
  ASSERT_NVTE_OK(gemm_default());
  snapshot();  // this call was meant to write
}

TEST_F(GemmErrorTest, NullHandles) {
  EXPECT_NVTE_ERROR(gemm(nullptr, B, D, bias, pre), kInvalid, "'A'", "NULL");
  EXPECT_NVTE_ERROR(gemm(A, nullptr, D, bias, pre), kInvalid, "'B'", "NULL");
  EXPECT_NVTE_ERROR(gemm(A, B, nullptr, bias, pre), kInvalid, "'D'", "NULL");
}

TEST_F(GemmErrorTest, NullDataPointers) {
  TestTensor a({3, 5}, kNVTEBFloat16), d({4, 5}, kNVTEFloat32);
  a.set_null(kNVTERowwiseData, {3, 5}, kNVTEBFloat16);
  d.set_null(kNVTERowwiseData, {4, 5}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(gemm(a, B, D, bias, pre), kInvalid, "'A'", "null pointer");
  EXPECT_NVTE_ERROR(gemm(A, B, d, bias, pre), kInvalid, "'D'", "null pointer");
}

TEST_F(GemmErrorTest, OperandRankAndDtype) {
  TestTensor a1({15}, kNVTEBFloat16), a_int({3, 5}, kNVTEInt32), d_int({4, 5}, kNVTEInt32);
  EXPECT_NVTE_ERROR(gemm(a1, B, D, bias, pre), kInvalid, "'A'", "at least 2");
  EXPECT_NVTE_ERROR(gemm(a_int, B, D, bias, pre), kInvalid, "'A'", "expected dtype", "int32");
  EXPECT_NVTE_ERROR(gemm(A, B, d_int, bias, pre), kInvalid, "'D'", "expected dtype", "int32");
}

TEST_F(GemmErrorTest, InnerDimensionMismatch) {
  TestTensor b({4, 7}, kNVTEBFloat16);
  EXPECT_NVTE_ERROR(gemm(A, b, D, bias, pre), kInvalid, "'B'", "k = 3", "[4, 7]");
  // transa: A [3, 5] is [m, k] = [3, 5], so k = 5 no longer matches B's 3.
  EXPECT_NVTE_ERROR(gemm(A, B, D, bias, pre, true), kInvalid, "'B'", "k = 5", "transa=true");
  // transb: B [4, 3] is [k, n] = [4, 3]: k = 4 != 3.
  EXPECT_NVTE_ERROR(gemm(A, B, D, bias, pre, false, true), kInvalid, "'B'", "transb=true");
}

TEST_F(GemmErrorTest, OutputShape) {
  TestTensor d({5, 4}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(gemm(A, B, d, bias, pre), kInvalid, "'D'", "[4, 5]", "got [5, 4]");
}

TEST_F(GemmErrorTest, BiasShapeAndDtype) {
  TestTensor b4({4}, kNVTEBFloat16), b2d({1, 5}, kNVTEBFloat16), b8({5}, kNVTEFloat8E4M3);
  EXPECT_NVTE_ERROR(gemm(A, B, D, b4, pre), kInvalid, "'bias'", "[5]", "got [4]");
  EXPECT_NVTE_ERROR(gemm(A, B, D, b2d, pre), kInvalid, "'bias'", "[5]", "got [1, 5]");
  EXPECT_NVTE_ERROR(gemm(A, B, D, b8, pre), kInvalid, "'bias'", "expected dtype", "float8_e4m3");
  // Grad mode without pre_gelu_out: the bias gradient of op(B) has n = 4 entries, not m = 5.
  EXPECT_NVTE_ERROR(gemm(A, B, D, bias, nullptr, false, false, true), kInvalid, "'bias'", "[4]",
                    "op(B)");
}

TEST_F(GemmErrorTest, PreGeluShapeAndDtype) {
  TestTensor p({5, 4}, kNVTEBFloat16), p8({4, 5}, kNVTEFloat8E4M3);
  EXPECT_NVTE_ERROR(gemm(A, B, D, bias, p), kInvalid, "'pre_gelu_out'", "[4, 5]");
  EXPECT_NVTE_ERROR(gemm(A, B, D, bias, p8), kInvalid, "'pre_gelu_out'", "expected dtype");
}

TEST_F(GemmErrorTest, Fp8OperandNeedsScaleInv) {
  TestTensor a({3, 5}, kNVTEFloat8E4M3), b({4, 3}, kNVTEFloat8E5M2);
  b.set_scale_inv(1.0f);
  EXPECT_NVTE_ERROR(gemm(a, b, D, bias, pre), kInvalid, "'A'", "scale_inv", "null pointer");
  a.set_scale_inv(1.0f);
  b.set(kNVTERowwiseScaleInv, {1}, kNVTEBFloat16);
  EXPECT_NVTE_ERROR(gemm(a, b, D, bias, pre), kInvalid, "'B'", "scale_inv", "float32");
  b.set(kNVTERowwiseScaleInv, {2}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(gemm(a, b, D, bias, pre), kInvalid, "'B'", "scale_inv", "one element");
}

TEST_F(GemmErrorTest, UnsupportedDtypeMixes) {
  TestTensor a32({3, 5}, kNVTEFloat32), a16({3, 5}, kNVTEFloat16), a8({3, 5}, kNVTEFloat8E4M3);
  a8.set_scale_inv(1.0f);
  EXPECT_NVTE_ERROR(gemm(a32, B, D, bias, pre), kUnsupported, "'A' and 'B'", "float32",
                    "bfloat16");
  EXPECT_NVTE_ERROR(gemm(a16, B, D, bias, pre), kUnsupported, "'A' and 'B'", "float16");
  EXPECT_NVTE_ERROR(gemm(a8, B, D, bias, pre), kUnsupported, "'A' and 'B'", "float8_e4m3");
}

TEST_F(GemmErrorTest, Fp8OutputNeedsScale) {
  TestTensor d({4, 5}, kNVTEFloat8E4M3);
  EXPECT_NVTE_ERROR(gemm(A, B, d, bias, pre), kInvalid, "'D'", "scale");
}

TEST_F(GemmErrorTest, AccumulateIntoFp8Output) {
  TestTensor d({4, 5}, kNVTEFloat8E4M3);
  d.set_scale(1.0f);
  const std::vector<uint8_t> before = d.buffer().bytes;
  EXPECT_NVTE_ERROR(gemm(A, B, d, bias, pre, false, false, false, true), kUnsupported,
                    "'accumulate'", "FP8");
  EXPECT_EQ(d.buffer().bytes, before);
}

TEST_F(GemmErrorTest, BlockScaledTensorsUnsupported) {
  TestTensor a({3, 5}, kNVTEFloat8E4M3, NVTE_MXFP8_1D_SCALING), b({4, 3}, kNVTEFloat8E4M3);
  a.set_scale_inv(1.0f);
  b.set_scale_inv(1.0f);
  EXPECT_NVTE_ERROR(gemm(a, b, D, bias, pre), kUnsupported, "'A'", "MXFP8");
  TestTensor d({4, 5}, kNVTEFloat8E4M3, NVTE_MXFP8_1D_SCALING);
  EXPECT_NVTE_ERROR(gemm(A, B, d, bias, pre), kUnsupported, "'D'", "scaling mode");
}

TEST_F(GemmErrorTest, DeviceMix) {
  B.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(gemm_default(), kInvalid, "'B'", "device");
  B.set_device(kNVTEDeviceCPU);
  bias.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(gemm_default(), kInvalid, "'bias'", "device");
  bias.set_device(kNVTEDeviceCPU);
  TestTensor ws({64}, kNVTEByte);
  ws.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(gemm(A, B, D, bias, pre, false, false, false, false, ws), kInvalid,
                    "'workspace'", "device");
}

TEST_F(GemmErrorTest, GpuTensorsInCpuBuild) {
  for (TestTensor *t : {&A, &B, &D, &bias, &pre}) t->set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(gemm_default(), kUnsupported, "nvte_cublas_gemm", "GPU");
}

TEST_F(GemmErrorTest, OutputOverlappingInput) {
  // D's memory inside A's: rejected before oneDNN could read what it writes.
  std::vector<float> mem(64, 1.0f);
  NVTETensor a = nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING);
  NVTETensor d = nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING);
  NVTEBasicTensor ta{mem.data(), kNVTEFloat32, {{3, 5}, 2}};
  NVTEBasicTensor td{mem.data() + 8, kNVTEFloat32, {{4, 5}, 2}};
  ASSERT_NVTE_OK(nvte_set_tensor_param(&a, kNVTERowwiseData, &ta));
  ASSERT_NVTE_OK(nvte_set_tensor_param(&d, kNVTERowwiseData, &td));
  TestTensor b({4, 3}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(gemm(a, b, d, nullptr, nullptr), kInvalid, "'D'", "'A'", "overlapping");
  // pre_gelu_out (an output in the forward pass) may not alias D either.
  NVTEBasicTensor tp{D.bytes(), kNVTEBFloat16, {{4, 5}, 2}};
  NVTETensor p = nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING);
  ASSERT_NVTE_OK(nvte_set_tensor_param(&p, kNVTERowwiseData, &tp));
  EXPECT_NVTE_ERROR(gemm(A, B, D, bias, p), kInvalid, "'pre_gelu_out'", "overlapping");
  for (float v : mem) ASSERT_EQ(v, 1.0f);
  nvte_destroy_tensor(a);
  nvte_destroy_tensor(d);
  nvte_destroy_tensor(p);
}

}  // namespace
