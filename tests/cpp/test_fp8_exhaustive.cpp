// Exhaustive FP8 checks: every bf16 and fp16 bit pattern quantized by nvte_quantize (scale 1)
// equals, byte for byte, NVIDIA's satfinite cast (OCP formats, when cuda_fp8.h is available) and
// the independent nearest-search encoder; every FP8 code dequantizes to its definition.
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/cast.h"

#ifdef NVTE_TEST_HAVE_CUDA_FP8
#include <cuda_fp8.h>
#endif

namespace {

using test::TestTensor;

const NVTEDType kFp8Types[] = {kNVTEFloat8E4M3, kNVTEFloat8E5M2, kNVTEFloat8E4M3FNUZ,
                               kNVTEFloat8E5M2FNUZ};

// ------------------------------------------------------------------ encode: all 16-bit patterns
class Fp8ExhaustiveEncode : public ::testing::TestWithParam<std::tuple<NVTEDType, NVTEDType>> {
 protected:
  // Quantizes all 65,536 patterns of the 16-bit input dtype with scale 1; returns the FP8 bytes.
  std::vector<uint8_t> quantize_all(NVTEDType in_dtype, NVTEDType fp8) {
    TestTensor in({256, 256}, in_dtype);
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint16_t bits = static_cast<uint16_t>(i);
      std::memcpy(in.bytes() + 2 * i, &bits, 2);
    }
    TestTensor out({256, 256}, fp8);
    out.set_scale(1.0f);
    out.set_amax();
    out.set_scale_inv();
    EXPECT_EQ(nvte_quantize(in, out, nullptr), NVTE_SUCCESS) << nvte_get_last_error();
    // Some patterns are NaN, so the amax is NaN; scale_inv is 1 / 1.
    EXPECT_TRUE(std::isnan(out.f32(kNVTEAmax)[0]));
    EXPECT_EQ(out.f32(kNVTERowwiseScaleInv)[0], 1.0f);
    return std::vector<uint8_t>(out.bytes(), out.bytes() + 65536);
  }
  static double value_of(uint16_t bits, NVTEDType in_dtype) {
    return in_dtype == kNVTEBFloat16 ? test::bf16_to_float(bits) : test::fp16_to_float(bits);
  }
};

TEST_P(Fp8ExhaustiveEncode, MatchesNearestSearchEncoder) {
  const auto [in_dtype, fp8] = GetParam();
  const std::vector<uint8_t> got = quantize_all(in_dtype, fp8);
  std::vector<uint8_t> ref(65536);
  for (uint32_t i = 0; i < 65536; ++i)
    ref[i] = test::ref_fp8_encode(value_of(static_cast<uint16_t>(i), in_dtype), fp8);
  EXPECT_TRUE(test::same_bytes(got.data(), ref.data(), ref.size()));
}

// cuda_fp8.h has OCP formats only; FNUZ is pinned by the nearest-search encoder above.
class Fp8ExhaustiveEncodeOcp : public Fp8ExhaustiveEncode {};

TEST_P(Fp8ExhaustiveEncodeOcp, MatchesNvidiaSatfiniteCast) {
  const auto [in_dtype, fp8] = GetParam();
#ifndef NVTE_TEST_HAVE_CUDA_FP8
  GTEST_SKIP()
      << "cuda_fp8.h not found at configure time (set CUDA_HOME): NVIDIA oracle unavailable";
#else
  const std::vector<uint8_t> got = quantize_all(in_dtype, fp8);
  const __nv_fp8_interpretation_t interp = fp8 == kNVTEFloat8E4M3 ? __NV_E4M3 : __NV_E5M2;
  std::vector<uint8_t> from_float(65536), direct(65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t bits = static_cast<uint16_t>(i);
    // The documented oracle: the fp32 value (exact for every 16-bit input) through the satfinite
    // cast.
    from_float[i] =
        __nv_cvt_float_to_fp8(static_cast<float>(value_of(bits, in_dtype)), __NV_SATFINITE, interp);
    // And NVIDIA's direct 16-bit conversions, which TE's kernels use for bf16/fp16 inputs.
    if (in_dtype == kNVTEBFloat16) {
      __nv_bfloat16_raw r;
      r.x = bits;
      direct[i] = __nv_cvt_bfloat16raw_to_fp8(r, __NV_SATFINITE, interp);
    } else {
      __half_raw r;
      r.x = bits;
      direct[i] = __nv_cvt_halfraw_to_fp8(r, __NV_SATFINITE, interp);
    }
  }
  EXPECT_TRUE(test::same_bytes(got.data(), from_float.data(), got.size()))
      << "vs __nv_cvt_float_to_fp8";
  EXPECT_TRUE(test::same_bytes(got.data(), direct.data(), got.size()))
      << "vs __nv_cvt_" << (in_dtype == kNVTEBFloat16 ? "bfloat16raw" : "halfraw") << "_to_fp8";
#endif
}

INSTANTIATE_TEST_SUITE_P(AllPatterns, Fp8ExhaustiveEncode,
                         ::testing::Combine(::testing::Values(kNVTEBFloat16, kNVTEFloat16),
                                            ::testing::ValuesIn(kFp8Types)),
                         [](const auto &info) {
                           return test::dtype_tag(std::get<0>(info.param)) + "_to_" +
                                  test::dtype_tag(std::get<1>(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(AllPatterns, Fp8ExhaustiveEncodeOcp,
                         ::testing::Combine(::testing::Values(kNVTEBFloat16, kNVTEFloat16),
                                            ::testing::Values(kNVTEFloat8E4M3, kNVTEFloat8E5M2)),
                         [](const auto &info) {
                           return test::dtype_tag(std::get<0>(info.param)) + "_to_" +
                                  test::dtype_tag(std::get<1>(info.param));
                         });

// ------------------------------------------------------------------ decode: all 256 codes
class Fp8ExhaustiveDecode : public ::testing::TestWithParam<std::tuple<NVTEDType, NVTEDType>> {};

TEST_P(Fp8ExhaustiveDecode, MatchesFormatDefinition) {
  const auto [fp8, out_dtype] = GetParam();
  TestTensor in({16, 16}, fp8);
  for (int c = 0; c < 256; ++c) in.bytes()[c] = static_cast<uint8_t>(c);
  in.set_scale_inv(1.0f);
  TestTensor out({16, 16}, out_dtype);
  ASSERT_NVTE_OK(nvte_dequantize(in, out, nullptr));
  for (int c = 0; c < 256; ++c) {
    const double ref = test::ref_fp8_decode(static_cast<uint8_t>(c), fp8);
    const double got = out.get(c);
    SCOPED_TRACE("code 0x" + std::to_string(c));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << "got " << got;
      continue;
    }
    // Every FP8 value is exact in fp32, fp16 and bf16: compare values and the sign of zero.
    EXPECT_EQ(got, ref);
    EXPECT_EQ(std::signbit(got), std::signbit(ref));
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodes, Fp8ExhaustiveDecode,
                         ::testing::Combine(::testing::ValuesIn(kFp8Types),
                                            ::testing::Values(kNVTEFloat32, kNVTEFloat16,
                                                              kNVTEBFloat16)),
                         [](const auto &info) {
                           return test::dtype_tag(std::get<0>(info.param)) + "_to_" +
                                  test::dtype_tag(std::get<1>(info.param));
                         });

}  // namespace
