// Scaled softmax variants (plain, masked, upper-triangular, bottom-right causal) vs double refs.
// Forward and backward, in place and out of place, and every rejected argument.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/softmax.h"

namespace {

using test::TestTensor;

enum class Variant { kScaled, kMasked, kMaskedBroadcast, kUpperTriang, kAlignedCausal };

const char *variant_name(Variant v) {
  switch (v) {
    case Variant::kScaled: return "scaled";
    case Variant::kMasked: return "masked";
    case Variant::kMaskedBroadcast: return "masked_bcast";
    case Variant::kUpperTriang: return "upper_triang";
    default: return "aligned_causal";
  }
}

bool has_mask(Variant v) { return v == Variant::kMasked || v == Variant::kMaskedBroadcast; }

// Problem size as [b, h, sq, sk]; upper-triangular runs on [b * h, sk, sk].
struct Dims {
  size_t b, h, sq, sk;
};
const Dims kDims[] = {{1, 1, 1, 1},  {2, 3, 5, 17},  {1, 2, 7, 97},
                      {1, 1, 3, 1025}, {2, 1, 17, 1}, {1, 2, 33, 20}};

std::vector<size_t> tensor_shape(Variant v, Dims d) {
  if (v == Variant::kUpperTriang) return {d.b * d.h, d.sk, d.sk};
  return {d.b, d.h, d.sq, d.sk};
}

constexpr float kScale = 0.7f;  // not a power of two: the scaling rounds

// Byte mask [b or 1, 1, sq, sk]: ~30% masked, and the first query row of batch 0 fully masked.
std::vector<uint8_t> make_mask(std::mt19937 &rng, size_t mb, size_t sq, size_t sk) {
  std::bernoulli_distribution masked(0.3);
  std::vector<uint8_t> m(mb * sq * sk);
  for (auto &e : m) e = masked(rng) ? 1 : 0;
  for (size_t j = 0; j < sk; ++j) m[j] = 1;
  return m;
}

// Number of leading positions row i keeps under the variant's causal rule.
size_t kept(Variant v, size_t i, size_t sq, size_t sk) {
  if (v == Variant::kUpperTriang) return i + 1;
  if (v == Variant::kAlignedCausal) {
    const long long n = static_cast<long long>(i) + static_cast<long long>(sk) -
                        static_cast<long long>(sq) + 1;  // j <= i + sk - sq
    return static_cast<size_t>(std::clamp<long long>(n, 0, static_cast<long long>(sk)));
  }
  return sk;
}

// Forward reference in double, row by row: masked logits are -10000; causal-dropped positions 0.
std::vector<double> ref_forward(Variant v, const std::vector<size_t> &shape,
                                const std::vector<double> &x, const std::vector<uint8_t> &mask,
                                size_t mask_b, size_t heads, double scale) {
  const size_t sk = shape.back(), sq = shape[shape.size() - 2];
  const size_t rows = x.size() / std::max<size_t>(sk, 1);
  std::vector<double> y(x.size(), 0.0);
  for (size_t r = 0; r < rows; ++r) {
    const size_t i = r % sq, batch = r / (sq * heads), n = kept(v, i, sq, sk);
    if (n == 0) continue;
    std::vector<double> l(n);
    for (size_t j = 0; j < n; ++j) {
      const bool m = has_mask(v) && mask[((mask_b == 1 ? 0 : batch) * sq + i) * sk + j];
      l[j] = m ? -10000.0 : scale * x[r * sk + j];
    }
    const double mx = *std::max_element(l.begin(), l.end());
    double sum = 0;
    for (double &e : l) sum += (e = std::exp(e - mx));
    for (size_t j = 0; j < n; ++j) y[r * sk + j] = l[j] / sum;
  }
  return y;
}

// Backward reference: scale * y * (dy - sum(dy * y)) per row.
std::vector<double> ref_backward(const std::vector<double> &dy, const std::vector<double> &y,
                                 size_t sk, double scale) {
  std::vector<double> dx(y.size());
  for (size_t r = 0; r * sk < y.size(); ++r) {
    double dot = 0;
    for (size_t j = 0; j < sk; ++j) dot += dy[r * sk + j] * y[r * sk + j];
    for (size_t j = 0; j < sk; ++j) dx[r * sk + j] = scale * y[r * sk + j] * (dy[r * sk + j] - dot);
  }
  return dx;
}

// Calls the forward of a variant (mask ignored by the unmasked ones).
NVTEStatus forward(Variant v, const TestTensor &x, const TestTensor *mask, TestTensor &y,
                   float scale) {
  switch (v) {
    case Variant::kScaled: return nvte_scaled_softmax_forward(x, y, scale, nullptr);
    case Variant::kMasked:
    case Variant::kMaskedBroadcast:
      return nvte_scaled_masked_softmax_forward(x, mask ? mask->handle() : nullptr, y, scale,
                                                nullptr);
    case Variant::kUpperTriang:
      return nvte_scaled_upper_triang_masked_softmax_forward(x, y, scale, nullptr);
    default: return nvte_scaled_aligned_causal_masked_softmax_forward(x, y, scale, nullptr);
  }
}

NVTEStatus backward(Variant v, NVTETensor dy, NVTETensor y, NVTETensor dx, float scale) {
  switch (v) {
    case Variant::kScaled: return nvte_scaled_softmax_backward(dy, y, dx, scale, nullptr);
    case Variant::kMasked:
    case Variant::kMaskedBroadcast:
      return nvte_scaled_masked_softmax_backward(dy, y, dx, scale, nullptr);
    case Variant::kUpperTriang:
      return nvte_scaled_upper_triang_masked_softmax_backward(dy, y, dx, scale, nullptr);
    default: return nvte_scaled_aligned_causal_masked_softmax_backward(dy, y, dx, scale, nullptr);
  }
}

using Param = std::tuple<Variant, NVTEDType, Dims>;

std::string param_name(const ::testing::TestParamInfo<Param> &info) {
  const auto &[v, t, d] = info.param;
  return std::string(variant_name(v)) + "_" + test::dtype_tag(t) + "_" +
         test::shape_tag(tensor_shape(v, d));
}

class SoftmaxTest : public ::testing::TestWithParam<Param> {};

TEST_P(SoftmaxTest, Forward) {
  const auto &[v, t, d] = GetParam();
  const std::vector<size_t> shape = tensor_shape(v, d);
  std::mt19937 rng(7);
  TestTensor x(shape, t), y(shape, t);
  const std::vector<double> xv = x.fill_uniform(rng, -5.0, 5.0);
  const size_t mb = v == Variant::kMaskedBroadcast ? 1 : d.b;
  TestTensor mask({mb, 1, d.sq, d.sk}, kNVTEByte);
  std::vector<uint8_t> m;
  if (has_mask(v)) {
    m = make_mask(rng, mb, d.sq, d.sk);
    std::copy(m.begin(), m.end(), mask.bytes());
  }
  ASSERT_NVTE_OK(forward(v, x, &mask, y, kScale));
  const std::vector<double> ref =
      ref_forward(v, shape, xv, m, mb, shape.size() == 4 ? d.h : 1, kScale);
  EXPECT_TRUE(test::close(y.to_double(), ref, test::tolerance(t)));
  // Probability exactly 0 wherever a causal rule dropped the position (not just "small").
  if (v == Variant::kUpperTriang || v == Variant::kAlignedCausal) {
    const size_t sq = shape[shape.size() - 2], sk = shape.back();
    for (size_t r = 0; r < y.numel() / sk; ++r)
      for (size_t j = kept(v, r % sq, sq, sk); j < sk; ++j)
        ASSERT_EQ(y.get(r * sk + j), 0.0) << "row " << r << ", col " << j;
  }
}

// Backward from the reference probabilities (stored in the dtype), out of place and in place
// (output_grads aliasing incoming_grads, as TE allows).
TEST_P(SoftmaxTest, Backward) {
  const auto &[v, t, d] = GetParam();
  const std::vector<size_t> shape = tensor_shape(v, d);
  const size_t sk = shape.back();
  std::mt19937 rng(11);
  std::vector<double> logits(test::numel_of(shape));
  std::uniform_real_distribution<double> dist(-5.0, 5.0);
  for (double &e : logits) e = dist(rng);
  const size_t mb = v == Variant::kMaskedBroadcast ? 1 : d.b;
  const std::vector<uint8_t> m =
      has_mask(v) ? make_mask(rng, mb, d.sq, d.sk) : std::vector<uint8_t>{};
  const std::vector<double> probs =
      ref_forward(v, shape, logits, m, mb, shape.size() == 4 ? d.h : 1, kScale);
  TestTensor y(shape, t), dy(shape, t), dx(shape, t);
  for (size_t i = 0; i < probs.size(); ++i) y.put(i, probs[i]);
  const std::vector<double> yv = y.to_double(), dyv = dy.fill_uniform(rng, -1.0, 1.0);
  const std::vector<double> ref = ref_backward(dyv, yv, sk, kScale);

  ASSERT_NVTE_OK(backward(v, dy, y, dx, kScale));
  EXPECT_TRUE(test::close(dx.to_double(), ref, test::tolerance(t))) << "out of place";
  ASSERT_NVTE_OK(backward(v, dy, y, dy, kScale));
  EXPECT_TRUE(test::close(dy.to_double(), ref, test::tolerance(t))) << "in place";
}

INSTANTIATE_TEST_SUITE_P(AllVariants, SoftmaxTest,
                         ::testing::Combine(::testing::Values(Variant::kScaled, Variant::kMasked,
                                                              Variant::kMaskedBroadcast,
                                                              Variant::kUpperTriang,
                                                              Variant::kAlignedCausal),
                                            ::testing::Values(kNVTEFloat32, kNVTEFloat16,
                                                              kNVTEBFloat16),
                                            ::testing::ValuesIn(kDims)),
                         param_name);

// A fully masked row is uniform (TE's -10000 fill), whatever the logits.
TEST(SoftmaxEdge, FullyMaskedRowIsUniform) {
  TestTensor x({1, 1, 2, 5}, kNVTEFloat32), y({1, 1, 2, 5}, kNVTEFloat32);
  TestTensor mask({1, 1, 2, 5}, kNVTEByte);
  std::mt19937 rng(3);
  x.fill_uniform(rng, -100.0, 100.0);
  std::fill(mask.bytes(), mask.bytes() + 5, uint8_t{1});
  ASSERT_NVTE_OK(nvte_scaled_masked_softmax_forward(x, mask, y, 1.0f, nullptr));
  for (size_t j = 0; j < 5; ++j) EXPECT_FLOAT_EQ(y.get(j), 0.2f);
}

// The aligned-causal rule with sq > sk: the first sq - sk rows keep nothing and are all zeros.
TEST(SoftmaxEdge, AlignedCausalEmptyRowsAreZero) {
  TestTensor x({1, 1, 4, 2}, kNVTEFloat32), y({1, 1, 4, 2}, kNVTEFloat32);
  std::fill(x.f32(kNVTERowwiseData), x.f32(kNVTERowwiseData) + 8, 1.0f);
  ASSERT_NVTE_OK(nvte_scaled_aligned_causal_masked_softmax_forward(x, y, 1.0f, nullptr));
  const std::vector<double> expect = {0, 0, 0, 0, 1, 0, 0.5, 0.5};
  EXPECT_EQ(y.to_double(), expect);
}

// Fuzzing finding (tests/fuzz): an empty tensor may declare any size in its other dims, and
// [2^20, 2^20, 2^20, 0] made the kernels loop over 2^60 empty rows (a hang). Now a no-op.
TEST(SoftmaxEdge, EmptyWithHugeDimsIsANoOp) {
  const size_t m = size_t{1} << 20;
  TestTensor x({m, m, m, 0}, kNVTEFloat32), y({m, m, m, 0}, kNVTEFloat32), dx({m, m, m, 0}, kNVTEFloat32);
  ASSERT_NVTE_OK(nvte_scaled_softmax_forward(x, y, 1.0f, nullptr));
  ASSERT_NVTE_OK(nvte_scaled_softmax_backward(x, y, dx, 1.0f, nullptr));
  TestTensor u({m * m, 0, 0}, kNVTEBFloat16), v({m * m, 0, 0}, kNVTEBFloat16);
  ASSERT_NVTE_OK(nvte_scaled_upper_triang_masked_softmax_forward(u, v, 1.0f, nullptr));
}

// ------------------------------------------------------------------ rejected arguments
// Fills a tensor's data with a sentinel; unchanged() then tells whether a failing call wrote to it.
struct Sentinel {
  explicit Sentinel(TestTensor &t) : t_(t) {
    std::vector<uint8_t> &b = t.buffer().bytes;
    std::fill(b.begin(), b.end(), uint8_t{0xA5});
    saved_ = b;
  }
  bool unchanged() const { return t_.buffer().bytes == saved_; }
  TestTensor &t_;
  std::vector<uint8_t> saved_;
};

constexpr NVTEStatus kInvalid = NVTE_ERROR_INVALID_ARGUMENT;

TEST(SoftmaxErrors, NullsAndDtypes) {
  TestTensor x({2, 3, 5, 17}, kNVTEBFloat16), y({2, 3, 5, 17}, kNVTEBFloat16);
  TestTensor mask({2, 1, 5, 17}, kNVTEByte);
  Sentinel s(y);
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_forward(nullptr, y, 1.0f, nullptr), kInvalid,
                    "nvte_scaled_softmax_forward", "'input'", "NULL");
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_forward(x, nullptr, 1.0f, nullptr), kInvalid,
                    "'softmax_results'", "NULL");
  EXPECT_NVTE_ERROR(nvte_scaled_masked_softmax_forward(x, nullptr, y, 1.0f, nullptr), kInvalid,
                    "'mask'", "NULL");
  TestTensor no_data({2, 3, 5, 17}, kNVTEBFloat16);
  no_data.set_null(kNVTERowwiseData, {2, 3, 5, 17}, kNVTEBFloat16);
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_forward(no_data, y, 1.0f, nullptr), kInvalid, "'input'",
                    "null pointer");
  TestTensor no_mask({2, 1, 5, 17}, kNVTEByte);
  no_mask.set_null(kNVTERowwiseData, {2, 1, 5, 17}, kNVTEByte);
  EXPECT_NVTE_ERROR(nvte_scaled_masked_softmax_forward(x, no_mask, y, 1.0f, nullptr), kInvalid,
                    "'mask'", "null pointer");
  TestTensor i32({2, 3, 5, 17}, kNVTEInt32);
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_forward(i32, y, 1.0f, nullptr), kInvalid, "'input'",
                    "expected dtype", "int32");
  TestTensor y16({2, 3, 5, 17}, kNVTEFloat16);
  Sentinel s16(y16);
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_forward(x, y16, 1.0f, nullptr), kInvalid,
                    "'softmax_results'", "bfloat16", "float16");
  TestTensor fmask({2, 1, 5, 17}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_scaled_masked_softmax_forward(x, fmask, y, 1.0f, nullptr), kInvalid,
                    "'mask'", "expected dtype", "float32");
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_forward(x, y, NAN, nullptr), kInvalid, "'scale_factor'",
                    "finite");
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_backward(x, x, y, INFINITY, nullptr), kInvalid,
                    "'scale_factor'");
  // Backward: every buffer present and of one dtype.
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_backward(nullptr, x, y, 1.0f, nullptr), kInvalid,
                    "'incoming_grads'", "NULL");
  EXPECT_NVTE_ERROR(nvte_scaled_masked_softmax_backward(x, nullptr, y, 1.0f, nullptr), kInvalid,
                    "'softmax_results'", "NULL");
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_backward(x, x, nullptr, 1.0f, nullptr), kInvalid,
                    "'output_grads'", "NULL");
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_backward(x, y16, y, 1.0f, nullptr), kInvalid,
                    "'softmax_results'", "float16");
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_backward(x, x, y16, 1.0f, nullptr), kInvalid,
                    "'output_grads'", "float16");
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_backward(x, no_data, y, 1.0f, nullptr), kInvalid,
                    "'softmax_results'", "null pointer");
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(s16.unchanged());
}

TEST(SoftmaxErrors, Shapes) {
  TestTensor x({2, 3, 5, 17}, kNVTEFloat32), y({2, 3, 5, 17}, kNVTEFloat32);
  Sentinel s(y);
  TestTensor x3({6, 5, 17}, kNVTEFloat32), y3({6, 5, 17}, kNVTEFloat32);
  Sentinel s3(y3);
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_forward(x3, y3, 1.0f, nullptr), kInvalid, "'input'",
                    "4-D", "3-D");
  EXPECT_NVTE_ERROR(nvte_scaled_aligned_causal_masked_softmax_forward(x3, y3, 1.0f, nullptr),
                    kInvalid, "'input'", "4-D");
  EXPECT_NVTE_ERROR(nvte_scaled_upper_triang_masked_softmax_forward(x, y, 1.0f, nullptr), kInvalid,
                    "'input'", "3-D", "4-D");
  EXPECT_NVTE_ERROR(nvte_scaled_upper_triang_masked_softmax_forward(x3, y3, 1.0f, nullptr),
                    kInvalid, "'input'", "square", "[6, 5, 17]");
  EXPECT_NVTE_ERROR(nvte_scaled_upper_triang_masked_softmax_backward(x3, y3, y3, 1.0f, nullptr),
                    kInvalid, "'incoming_grads'", "square");
  TestTensor y_other({2, 3, 5, 16}, kNVTEFloat32);
  Sentinel so(y_other);
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_forward(x, y_other, 1.0f, nullptr), kInvalid,
                    "'softmax_results'", "[2, 3, 5, 17]", "[2, 3, 5, 16]");
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_backward(x, y_other, y, 1.0f, nullptr), kInvalid,
                    "'softmax_results'", "[2, 3, 5, 16]");
  EXPECT_NVTE_ERROR(nvte_scaled_aligned_causal_masked_softmax_backward(x, y, y_other, 1.0f,
                                                                       nullptr),
                    kInvalid, "'output_grads'", "[2, 3, 5, 16]");
  // Mask [b or 1, 1, sq, sk].
  for (const std::vector<size_t> &bad :
       {std::vector<size_t>{3, 1, 5, 17}, {2, 3, 5, 17}, {2, 1, 4, 17}, {2, 1, 5, 16},
        {2, 5, 17}}) {
    TestTensor mask(bad, kNVTEByte);
    EXPECT_NVTE_ERROR(nvte_scaled_masked_softmax_forward(x, mask, y, 1.0f, nullptr), kInvalid,
                      "'mask'", "expected shape [2 or 1, 1, 5, 17]");
  }
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(s3.unchanged());
  EXPECT_TRUE(so.unchanged());
}

// A second handle onto another tensor's memory, at a byte offset.
struct View {
  View(TestTensor &base, size_t byte_offset, const std::vector<size_t> &shape, NVTEDType dtype)
      : h(nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING)) {
    NVTEBasicTensor bt{};
    bt.data_ptr = base.bytes() + byte_offset;
    bt.dtype = dtype;
    bt.shape.ndim = shape.size();
    for (size_t i = 0; i < shape.size(); ++i) bt.shape.data[i] = shape[i];
    EXPECT_EQ(nvte_set_tensor_param(&h, kNVTERowwiseData, &bt), NVTE_SUCCESS);
  }
  ~View() { nvte_destroy_tensor(h); }
  NVTETensor h;
};

// In place (the very same buffer) is fine for forward and backward; a partial overlap is rejected.
TEST(SoftmaxEdge, InPlaceAndOverlap) {
  const std::vector<size_t> shape = {1, 2, 3, 17};
  std::mt19937 rng(5);
  TestTensor x(shape, kNVTEFloat32), y(shape, kNVTEFloat32), big({1, 2, 4, 17}, kNVTEFloat32);
  x.fill_uniform(rng, -3.0, 3.0);
  ASSERT_NVTE_OK(nvte_scaled_aligned_causal_masked_softmax_forward(x, y, kScale, nullptr));
  ASSERT_NVTE_OK(nvte_scaled_aligned_causal_masked_softmax_forward(x, x, kScale, nullptr));
  EXPECT_TRUE(test::same_bytes(x.bytes(), y.bytes(), y.buffer().bytes.size())) << "in place";

  Sentinel s(big);
  View in(big, 0, shape, kNVTEFloat32), shifted(big, 17 * 4, shape, kNVTEFloat32);
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_forward(in.h, shifted.h, 1.0f, nullptr), kInvalid,
                    "'softmax_results'", "overlapping");
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_backward(in.h, y, shifted.h, 1.0f, nullptr), kInvalid,
                    "'output_grads'", "'incoming_grads'", "overlapping");
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_backward(y, in.h, shifted.h, 1.0f, nullptr), kInvalid,
                    "'output_grads'", "'softmax_results'", "overlapping");
  // A byte mask living inside the output buffer.
  TestTensor x1({1, 1, 3, 4}, kNVTEFloat32), out({1, 1, 3, 4}, kNVTEFloat32);
  Sentinel so(out);
  View mask_in_out(out, 0, {1, 1, 3, 4}, kNVTEByte);
  EXPECT_NVTE_ERROR(nvte_scaled_masked_softmax_forward(x1, mask_in_out.h, out, 1.0f, nullptr),
                    kInvalid, "'softmax_results'", "'mask'", "overlapping");
  EXPECT_TRUE(so.unchanged());
  EXPECT_TRUE(s.unchanged());
}

TEST(SoftmaxErrors, Devices) {
  TestTensor x({2, 3, 5, 17}, kNVTEFloat32), y({2, 3, 5, 17}, kNVTEFloat32);
  TestTensor mask({1, 1, 5, 17}, kNVTEByte);
  Sentinel s(y);
  mask.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_scaled_masked_softmax_forward(x, mask, y, 1.0f, nullptr), kInvalid,
                    "'mask'", "device", "gpu");
  y.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_backward(x, x, y, 1.0f, nullptr), kInvalid,
                    "'output_grads'", "device");
  x.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(nvte_scaled_masked_softmax_forward(x, mask, y, 1.0f, nullptr),
                    NVTE_ERROR_UNSUPPORTED, "nvte_scaled_masked_softmax_forward", "GPU");
  EXPECT_NVTE_ERROR(nvte_scaled_softmax_backward(x, x, y, 1.0f, nullptr), NVTE_ERROR_UNSUPPORTED,
                    "GPU");
  EXPECT_TRUE(s.unchanged());
}

}  // namespace
