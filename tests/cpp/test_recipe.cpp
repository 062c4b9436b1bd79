// nvte_delayed_scaling_recipe_amax_and_scale_update: both amax algorithms, margins, history
// lengths, special amaxes, in-place aliasing, bit-exact against a reference written here; rejection
// paths.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cast_reference.h"
#include "test_common.h"
#include "transformer_engine_lite/recipe.h"

namespace {

using test::TestTensor;

// TE's update, per column j of a [H, N] history:
//   amax = max over the history ignoring NaN, starting at 0 ("max"), or history[0] ("most_recent");
//   scale = (fp8_max / amax) / 2^margin, each division rounded to fp32, if amax is finite and > 0,
//   else the previous scale; an infinite scale becomes FLT_MAX;
//   history rolls by -1 (row h <- row h+1, last row <- row 0), then row 0 <- 0.
void ref_update(std::vector<float> &hist, std::vector<float> &scale, size_t h, size_t n,
                bool most_recent, NVTEDType fp8, float margin) {
  // 2^margin rounded to fp32; fp32 quotients as double quotients of floats rounded once.
  const float p = static_cast<float>(std::pow(2.0L, static_cast<long double>(margin)));
  const double fp8_max = test::fp8_spec(fp8).max;
  for (size_t j = 0; j < n; ++j) {
    double amax = 0.0;
    if (most_recent) {
      amax = hist[j];
    } else {
      for (size_t i = 0; i < h; ++i)
        if (!std::isnan(hist[i * n + j]) && hist[i * n + j] > amax) amax = hist[i * n + j];
    }
    float s = scale[j];
    if (std::isfinite(amax) && amax > 0.0) {
      const float q = static_cast<float>(fp8_max / amax);
      s = static_cast<float>(static_cast<double>(q) / static_cast<double>(p));
    }
    scale[j] = std::isinf(s) ? FLT_MAX : s;
  }
  std::vector<float> rolled(h * n);
  for (size_t i = 0; i < h; ++i)
    for (size_t j = 0; j < n; ++j) rolled[i * n + j] = i == 0 ? 0.0f : hist[((i + 1) % h) * n + j];
  hist = rolled;
}

using RecipeParam = std::tuple<const char *, NVTEDType, float, std::pair<size_t, size_t>, bool>;
class DelayedScaling : public ::testing::TestWithParam<RecipeParam> {};

TEST_P(DelayedScaling, BitExact) {
  const auto [algo, fp8, margin, dims, in_place] = GetParam();
  const auto [h, n] = dims;
  std::mt19937 rng = test::test_rng();
  TestTensor hist({h, n}, kNVTEFloat32), scale({n}, kNVTEFloat32);
  test::fill_spread(hist, rng, -10, 10);
  for (size_t i = 0; i < h * n; ++i) hist.put(i, std::fabs(hist.get(i)));
  scale.fill_uniform(rng, 0.5, 100.0);
  auto set = [&](size_t i, size_t j, float v) {
    if (i < h && j < n) hist.put(i * n + j, v);
  };
  for (size_t i = 0; i < h; ++i) {
    set(i, 0, 0.0f);    // all-zero history: previous scale kept
    set(i, 4, 1e-41f);  // subnormal amax: fp8_max / amax overflows -> FLT_MAX
    set(i, 5, 0.0f);
  }
  set(0, 1, NAN);           // NaN most recent: "max" skips it, "most_recent" keeps the old scale
  set(h - 1, 2, NAN);       // NaN at the oldest slot: rolls into the last row
  set(h / 2, 3, INFINITY);  // Inf amax: previous scale
  if (n > 5) scale.put(5, INFINITY);  // previous scale Inf and nothing to update it: FLT_MAX
  if (n > 6) scale.put(6, -INFINITY);

  std::vector<float> ref_hist(hist.f32(kNVTERowwiseData), hist.f32(kNVTERowwiseData) + h * n);
  std::vector<float> ref_scale(scale.f32(kNVTERowwiseData), scale.f32(kNVTERowwiseData) + n);
  ref_update(ref_hist, ref_scale, h, n, std::string(algo) == "most_recent", fp8, margin);

  TestTensor new_hist({h, n}, kNVTEFloat32), new_scale({n}, kNVTEFloat32);
  const std::vector<uint8_t> hist_before = hist.buffer().bytes, scale_before = scale.buffer().bytes;
  TestTensor &out_hist = in_place ? hist : new_hist;
  TestTensor &out_scale = in_place ? scale : new_scale;
  ASSERT_NVTE_OK(nvte_delayed_scaling_recipe_amax_and_scale_update(hist, scale, out_hist, out_scale,
                                                                   algo, fp8, margin, nullptr));
  EXPECT_TRUE(test::same_bytes(out_hist.bytes(), reinterpret_cast<const uint8_t *>(ref_hist.data()),
                               h * n * 4))
      << "history";
  EXPECT_TRUE(test::same_bytes(out_scale.bytes(),
                               reinterpret_cast<const uint8_t *>(ref_scale.data()), n * 4))
      << "scale";
  if (!in_place) {
    EXPECT_EQ(hist.buffer().bytes, hist_before) << "input history modified";
    EXPECT_EQ(scale.buffer().bytes, scale_before) << "input scale modified";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DelayedScaling,
    ::testing::Combine(
        ::testing::Values("max", "most_recent"), ::testing::ValuesIn(test::kFp8Types),
        ::testing::Values(0.0f, 1.0f, 2.5f),
        ::testing::Values(std::pair<size_t, size_t>{1, 1}, std::pair<size_t, size_t>{1, 8},
                          std::pair<size_t, size_t>{16, 7}, std::pair<size_t, size_t>{1024, 3},
                          std::pair<size_t, size_t>{1024, 8}, std::pair<size_t, size_t>{5, 130}),
        ::testing::Bool()),
    [](const auto &info) {
      const float m = std::get<2>(info.param);
      const auto d = std::get<3>(info.param);
      return std::string(std::get<0>(info.param)) + "_" + test::dtype_tag(std::get<1>(info.param)) +
             "_margin" + std::to_string(static_cast<int>(m * 10)) + "_h" + std::to_string(d.first) +
             "_n" + std::to_string(d.second) + (std::get<4>(info.param) ? "_inplace" : "");
    });

// Spelled-out values the reference above must agree with.
TEST(DelayedScalingPinned, KnownValues) {
  TestTensor hist({3, 2}, kNVTEFloat32), scale({2}, kNVTEFloat32);
  const float h0[] = {2.0f, 0.0f, 8.0f, 0.0f, 4.0f, 0.0f};  // column 0: 2, 8, 4; column 1: zeros
  std::memcpy(hist.bytes(), h0, sizeof(h0));
  scale.put(0, 1.0);
  scale.put(1, 3.0);
  ASSERT_NVTE_OK(nvte_delayed_scaling_recipe_amax_and_scale_update(hist, scale, hist, scale, "max",
                                                                   kNVTEFloat8E4M3, 1.0f, nullptr));
  EXPECT_EQ(scale.f32(kNVTERowwiseData)[0], 448.0f / 8.0f / 2.0f);
  EXPECT_EQ(scale.f32(kNVTERowwiseData)[1], 3.0f);
  const float h1[] = {0.0f, 0.0f, 4.0f, 0.0f, 2.0f, 0.0f};
  EXPECT_EQ(std::memcmp(hist.bytes(), h1, sizeof(h1)), 0);
  ASSERT_NVTE_OK(nvte_delayed_scaling_recipe_amax_and_scale_update(
      hist, scale, hist, scale, "most_recent", kNVTEFloat8E5M2, 0.0f, nullptr));
  EXPECT_EQ(scale.f32(kNVTERowwiseData)[0], 28.0f);  // row 0 was zeroed: previous scale kept
}

// Fuzzing finding (fuzz_recipe): zero scales (history [h, 0]) passed the null data() of empty
// vectors to memcpy (undefined even for 0 bytes; UBSan nonnull-attribute). Nothing to do: success.
TEST(DelayedScalingPinned, NoScales) {
  for (const char *algo : {"max", "most_recent"}) {
    TestTensor hist({4, 0}, kNVTEFloat32), scale({0}, kNVTEFloat32);
    TestTensor new_hist({4, 0}, kNVTEFloat32), new_scale({0}, kNVTEFloat32);
    ASSERT_NVTE_OK(nvte_delayed_scaling_recipe_amax_and_scale_update(
        hist, scale, new_hist, new_scale, algo, kNVTEFloat8E4M3, 0.0f, nullptr));
    ASSERT_NVTE_OK(nvte_delayed_scaling_recipe_amax_and_scale_update(
        hist, scale, hist, scale, algo, kNVTEFloat8E5M2, 1.0f, nullptr));
  }
}

// ------------------------------------------------------------------ rejections
class DelayedScalingRejects : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(2);
    hist_.fill_uniform(rng, 0, 10);
    scale_.fill_uniform(rng, 1, 2);
    test::poison(new_hist_);
    test::poison(new_scale_);
  }
  NVTEStatus call(const char *algo = "max", NVTEDType fp8 = kNVTEFloat8E4M3, float margin = 0.0f) {
    return nvte_delayed_scaling_recipe_amax_and_scale_update(hist_, scale_, new_hist_, new_scale_,
                                                             algo, fp8, margin, nullptr);
  }
  void TearDown() override {
    EXPECT_TRUE(hist_snap_.unchanged());
    EXPECT_TRUE(scale_snap_.unchanged());
    EXPECT_TRUE(new_hist_snap_.unchanged());
    EXPECT_TRUE(new_scale_snap_.unchanged());
  }
  TestTensor hist_{{4, 3}, kNVTEFloat32}, scale_{{3}, kNVTEFloat32};
  TestTensor new_hist_{{4, 3}, kNVTEFloat32}, new_scale_{{3}, kNVTEFloat32};
  // Taken after SetUp filled the buffers (members are constructed before SetUp runs, so refresh).
  test::Snapshot hist_snap_{hist_}, scale_snap_{scale_}, new_hist_snap_{new_hist_},
      new_scale_snap_{new_scale_};
  void snapshot() {
    hist_snap_ = test::Snapshot(hist_);
    scale_snap_ = test::Snapshot(scale_);
    new_hist_snap_ = test::Snapshot(new_hist_);
    new_scale_snap_ = test::Snapshot(new_scale_);
  }
};

TEST_F(DelayedScalingRejects, Algorithm) {
  snapshot();
  EXPECT_NVTE_ERROR(call(nullptr), NVTE_ERROR_INVALID_ARGUMENT,
                    "nvte_delayed_scaling_recipe_amax_and_scale_update", "'amax_compute_algo'",
                    "NULL");
  EXPECT_NVTE_ERROR(call("mean"), NVTE_ERROR_INVALID_ARGUMENT, "'amax_compute_algo'",
                    "\"max\" or \"most_recent\"", "\"mean\"");
  EXPECT_NVTE_ERROR(call(""), NVTE_ERROR_INVALID_ARGUMENT, "'amax_compute_algo'");
  EXPECT_NVTE_ERROR(call("MAX"), NVTE_ERROR_INVALID_ARGUMENT, "'amax_compute_algo'", "\"MAX\"");
}
TEST_F(DelayedScalingRejects, Fp8DtypeAndMargin) {
  snapshot();
  EXPECT_NVTE_ERROR(call("max", kNVTEFloat32), NVTE_ERROR_INVALID_ARGUMENT, "'fp8_dtype'",
                    "float32");
  EXPECT_NVTE_ERROR(call("max", kNVTEFloat8E8M0), NVTE_ERROR_INVALID_ARGUMENT, "'fp8_dtype'",
                    "float8_e8m0");
  EXPECT_NVTE_ERROR(call("max", kNVTEFloat8E4M3, NAN), NVTE_ERROR_INVALID_ARGUMENT, "'margin'",
                    "finite");
  EXPECT_NVTE_ERROR(call("max", kNVTEFloat8E4M3, INFINITY), NVTE_ERROR_INVALID_ARGUMENT,
                    "'margin'");
}
TEST_F(DelayedScalingRejects, NullHandlesAndData) {
  snapshot();
  EXPECT_NVTE_ERROR(nvte_delayed_scaling_recipe_amax_and_scale_update(
                        nullptr, scale_, new_hist_, new_scale_, "max", kNVTEFloat8E4M3, 0, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "'amax_history'", "NULL");
  EXPECT_NVTE_ERROR(nvte_delayed_scaling_recipe_amax_and_scale_update(
                        hist_, scale_, new_hist_, nullptr, "max", kNVTEFloat8E4M3, 0, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "'updated_scale'", "NULL");
  TestTensor empty({4, 3}, kNVTEFloat32);
  empty.set_null(kNVTERowwiseData, {4, 3}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_delayed_scaling_recipe_amax_and_scale_update(
                        hist_, scale_, empty, new_scale_, "max", kNVTEFloat8E4M3, 0, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "'updated_amax_history'", "null");
}
TEST_F(DelayedScalingRejects, ShapesAndDtypes) {
  TestTensor flat({12}, kNVTEFloat32), zero_len({0, 3}, kNVTEFloat32), bf({4, 3}, kNVTEBFloat16);
  TestTensor scale4({4}, kNVTEFloat32), hist43({3, 4}, kNVTEFloat32), scale_bf({3}, kNVTEBFloat16);
  snapshot();
  auto run = [&](const TestTensor &h, const TestTensor &s, const TestTensor &uh,
                 const TestTensor &us) {
    return nvte_delayed_scaling_recipe_amax_and_scale_update(h, s, uh, us, "max", kNVTEFloat8E4M3,
                                                             0, nullptr);
  };
  EXPECT_NVTE_ERROR(run(flat, scale_, new_hist_, new_scale_), NVTE_ERROR_INVALID_ARGUMENT,
                    "'amax_history'", "2-D", "1-D");
  EXPECT_NVTE_ERROR(run(zero_len, scale_, zero_len, new_scale_), NVTE_ERROR_INVALID_ARGUMENT,
                    "'amax_history'", "history length >= 1");
  EXPECT_NVTE_ERROR(run(bf, scale_, new_hist_, new_scale_), NVTE_ERROR_INVALID_ARGUMENT,
                    "'amax_history'", "float32", "bfloat16");
  EXPECT_NVTE_ERROR(run(hist_, scale4, new_hist_, new_scale_), NVTE_ERROR_INVALID_ARGUMENT,
                    "'scale'", "[3]", "[4]");
  EXPECT_NVTE_ERROR(run(hist_, scale_bf, new_hist_, new_scale_), NVTE_ERROR_INVALID_ARGUMENT,
                    "'scale'", "bfloat16");
  EXPECT_NVTE_ERROR(run(hist_, scale_, hist43, new_scale_), NVTE_ERROR_INVALID_ARGUMENT,
                    "'updated_amax_history'", "[4, 3]", "[3, 4]");
  EXPECT_NVTE_ERROR(run(hist_, scale_, new_hist_, scale4), NVTE_ERROR_INVALID_ARGUMENT,
                    "'updated_scale'", "[3]", "[4]");
}
TEST_F(DelayedScalingRejects, PartialOverlap) {
  // updated_amax_history shifted by one row inside amax_history's buffer: neither in place nor
  // disjoint.
  TestTensor big({5, 3}, kNVTEFloat32);
  NVTEBasicTensor bt = nvte_get_tensor_param(big, kNVTERowwiseData);
  bt.shape.data[0] = 4;
  TestTensor h0({4, 3}, kNVTEFloat32), h1({4, 3}, kNVTEFloat32);
  NVTETensor a = h0.handle(), b = h1.handle();
  ASSERT_NVTE_OK(nvte_set_tensor_param(&a, kNVTERowwiseData, &bt));
  bt.data_ptr = static_cast<float *>(bt.data_ptr) + 3;
  ASSERT_NVTE_OK(nvte_set_tensor_param(&b, kNVTERowwiseData, &bt));
  snapshot();
  EXPECT_NVTE_ERROR(nvte_delayed_scaling_recipe_amax_and_scale_update(
                        h0, scale_, h1, new_scale_, "max", kNVTEFloat8E4M3, 0, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "'updated_amax_history'", "overlap");
  // updated_scale placed inside amax_history.
  NVTEBasicTensor st = nvte_get_tensor_param(hist_, kNVTERowwiseData);
  st.shape.ndim = 1;
  st.shape.data[0] = 3;
  TestTensor s_alias({3}, kNVTEFloat32);
  NVTETensor c = s_alias.handle();
  ASSERT_NVTE_OK(nvte_set_tensor_param(&c, kNVTERowwiseData, &st));
  EXPECT_NVTE_ERROR(nvte_delayed_scaling_recipe_amax_and_scale_update(
                        hist_, scale_, new_hist_, s_alias, "max", kNVTEFloat8E4M3, 0, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "'updated_scale'", "overlap");
}
TEST_F(DelayedScalingRejects, Devices) {
  new_scale_.set_device(kNVTEDeviceGPU);
  snapshot();
  EXPECT_NVTE_ERROR(call(), NVTE_ERROR_INVALID_ARGUMENT, "'updated_scale'", "device", "gpu");
  hist_.set_device(kNVTEDeviceGPU);
  scale_.set_device(kNVTEDeviceGPU);
  new_hist_.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(call(), NVTE_ERROR_UNSUPPORTED, "tensors are on the GPU");
}

}  // namespace
