// The scaled softmax variants on the GPU against the CPU op: forward and backward, every dtype, odd
// and long rows, fully masked and empty causal rows, in place. The GPU sums each row in the CPU's
// order, so the results are the CPU's bytes.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/softmax.h"

namespace {

using test::GpuTensor;
using test::TestTensor;
using Shape = std::vector<size_t>;

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

// [b, h, sq, sk]; upper-triangular runs on [b * h, sk, sk]. sk from 1 to above one block's
// 4 x 512 elements per pass; sq > sk leaves bottom-right causal rows with nothing kept.
struct Dims {
  size_t b, h, sq, sk;
};
const Dims kDims[] = {{1, 1, 1, 1}, {2, 3, 5, 17}, {1, 2, 7, 97}, {1, 1, 3, 2049},
                      {2, 1, 17, 1}, {1, 2, 33, 20}, {2, 2, 16, 300}};

Shape tensor_shape(Variant v, Dims d) {
  if (v == Variant::kUpperTriang) return {d.b * d.h, d.sk, d.sk};
  return {d.b, d.h, d.sq, d.sk};
}

constexpr float kScale = 0.7f;

NVTEStatus forward(Variant v, NVTETensor in, NVTETensor mask, NVTETensor out) {
  switch (v) {
    case Variant::kScaled: return nvte_scaled_softmax_forward(in, out, kScale, nullptr);
    case Variant::kMasked:
    case Variant::kMaskedBroadcast:
      return nvte_scaled_masked_softmax_forward(in, mask, out, kScale, nullptr);
    case Variant::kUpperTriang:
      return nvte_scaled_upper_triang_masked_softmax_forward(in, out, kScale, nullptr);
    default: return nvte_scaled_aligned_causal_masked_softmax_forward(in, out, kScale, nullptr);
  }
}

NVTEStatus backward(Variant v, NVTETensor dy, NVTETensor y, NVTETensor dx) {
  switch (v) {
    case Variant::kScaled: return nvte_scaled_softmax_backward(dy, y, dx, kScale, nullptr);
    case Variant::kMasked:
    case Variant::kMaskedBroadcast:
      return nvte_scaled_masked_softmax_backward(dy, y, dx, kScale, nullptr);
    case Variant::kUpperTriang:
      return nvte_scaled_upper_triang_masked_softmax_backward(dy, y, dx, kScale, nullptr);
    default:
      return nvte_scaled_aligned_causal_masked_softmax_backward(dy, y, dx, kScale, nullptr);
  }
}

// The CPU's bytes: both devices compute each element with the same fp32 operations (exp_f32, the
// scale, the division) and the row sums in the CPU's lane order (softmax.cu lane_sum), so every
// value, zeros included, is bit for bit the CPU's; FP8 attention's emulation depends on it.
::testing::AssertionResult matches_cpu(const TestTensor &gpu, const TestTensor &cpu) {
  const std::vector<uint8_t> &g = gpu.buffer().bytes, &c = cpu.buffer().bytes;
  if (g == c) return ::testing::AssertionSuccess();
  const size_t width = g.size() / std::max<size_t>(1, cpu.numel());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < cpu.numel(); ++i) {
    const bool same = std::memcmp(g.data() + i * width, c.data() + i * width, width) == 0;
    if (!same && bad++ == 0) first = i;
  }
  return ::testing::AssertionFailure() << bad << " of " << cpu.numel() << " elements differ from "
                                       << "the CPU's bytes; first [" << first << "] got "
                                       << gpu.get(first) << ", expected " << cpu.get(first);
}

// (variant, dtype, dims index, in place)
using Param = std::tuple<Variant, NVTEDType, int, bool>;

class GpuSoftmaxTest : public ::testing::TestWithParam<Param> {};

TEST_P(GpuSoftmaxTest, ForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  const auto [v, t, dims_idx, in_place] = GetParam();
  const Dims d = kDims[dims_idx];
  const Shape shape = tensor_shape(v, d);
  std::mt19937 rng(31u + static_cast<unsigned>(dims_idx));
  TestTensor x(shape, t), dy(shape, t);
  x.fill_uniform(rng, -8.0, 8.0);
  dy.fill_uniform(rng, -1.0, 1.0);
  TestTensor mask;
  if (has_mask(v)) {
    const size_t mb = v == Variant::kMasked ? d.b : 1;
    mask = TestTensor({mb, 1, d.sq, d.sk}, kNVTEByte);
    std::bernoulli_distribution masked(0.3);
    for (size_t i = 0; i < mask.numel(); ++i) mask.bytes()[i] = masked(rng) ? 1 : 0;
    for (size_t j = 0; j < d.sk; ++j) mask.bytes()[j] = 1;  // a fully masked row: uniform
  }

  // Forward: the CPU out of place; the GPU in place (output = input buffer) when asked.
  TestTensor y(shape, t);
  ASSERT_NVTE_OK(forward(v, x, has_mask(v) ? mask.handle() : nullptr, y));
  TestTensor gy(shape, t);
  GpuTensor d_x(x), d_y(gy);
  std::unique_ptr<GpuTensor> d_mask;
  if (has_mask(v)) d_mask = std::make_unique<GpuTensor>(mask);
  NVTETensor d_out = in_place ? static_cast<NVTETensor>(d_x) : static_cast<NVTETensor>(d_y);
  ASSERT_NVTE_OK(forward(v, d_x, has_mask(v) ? static_cast<NVTETensor>(*d_mask) : nullptr, d_out));
  (in_place ? d_x : d_y).download(gy, kNVTERowwiseData);
  EXPECT_TRUE(matches_cpu(gy, y)) << "softmax_results";

  // Backward from the CPU's y on both devices; in place: output_grads over incoming_grads.
  TestTensor dx(shape, t);
  ASSERT_NVTE_OK(backward(v, dy, y, dx));
  TestTensor gdx(shape, t);
  GpuTensor d_dy(dy), d_yc(y), d_dx(gdx);
  NVTETensor d_grad_out = in_place ? static_cast<NVTETensor>(d_dy) : static_cast<NVTETensor>(d_dx);
  ASSERT_NVTE_OK(backward(v, d_dy, d_yc, d_grad_out));
  (in_place ? d_dy : d_dx).download(gdx, kNVTERowwiseData);
  EXPECT_TRUE(matches_cpu(gdx, dx)) << "output_grads";
}

std::string param_name(const ::testing::TestParamInfo<Param> &info) {
  const auto &[v, t, dims_idx, in_place] = info.param;
  const Dims d = kDims[dims_idx];
  return std::string(variant_name(v)) + "_" + test::dtype_tag(t) + "_" + std::to_string(d.b) +
         "x" + std::to_string(d.h) + "x" + std::to_string(d.sq) + "x" + std::to_string(d.sk) +
         (in_place ? "_inplace" : "");
}

INSTANTIATE_TEST_SUITE_P(
    AllVariants, GpuSoftmaxTest,
    ::testing::Combine(::testing::Values(Variant::kScaled, Variant::kMasked,
                                         Variant::kMaskedBroadcast, Variant::kUpperTriang,
                                         Variant::kAlignedCausal),
                       ::testing::Values(kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16),
                       ::testing::Range(0, static_cast<int>(std::size(kDims))), ::testing::Bool()),
    param_name);

}  // namespace

namespace {

// Rows longer than the kernel's 2048-term shared-memory chunk (softmax.cu lane_sum): each lane's
// chain runs over three chunks and the tail (4133 = 258 16-blocks + 5) sits in the last one; the
// masked variant with a random mask and the aligned-causal one (valid prefixes ending in every
// chunk), fp32 and bf16: the CPU's bytes forward and backward.
TEST(GpuSoftmaxLongRows, MultiChunkRowsMatchCpuBytes) {
  SKIP_WITHOUT_GPU();
  const Dims d{1, 1, 3, 4133};
  for (Variant v : {Variant::kScaled, Variant::kMasked, Variant::kAlignedCausal}) {
    for (NVTEDType t : {kNVTEFloat32, kNVTEBFloat16}) {
      const Shape shape = tensor_shape(v, d);
      std::mt19937 rng(77u);
      TestTensor x(shape, t), dy(shape, t), y(shape, t), dx(shape, t), gy(shape, t), gdx(shape, t);
      x.fill_uniform(rng, -8.0, 8.0);
      dy.fill_uniform(rng, -1.0, 1.0);
      TestTensor mask;
      if (has_mask(v)) {
        mask = TestTensor({d.b, 1, d.sq, d.sk}, kNVTEByte);
        std::bernoulli_distribution masked(0.3);
        for (size_t i = 0; i < mask.numel(); ++i) mask.bytes()[i] = masked(rng) ? 1 : 0;
      }
      ASSERT_NVTE_OK(forward(v, x, has_mask(v) ? mask.handle() : nullptr, y));
      GpuTensor d_x(x), d_y(gy);
      std::unique_ptr<GpuTensor> d_mask;
      if (has_mask(v)) d_mask = std::make_unique<GpuTensor>(mask);
      ASSERT_NVTE_OK(
          forward(v, d_x, has_mask(v) ? static_cast<NVTETensor>(*d_mask) : nullptr, d_y));
      d_y.download(gy, kNVTERowwiseData);
      EXPECT_TRUE(matches_cpu(gy, y)) << variant_name(v) << " " << test::dtype_tag(t) << " fwd";
      ASSERT_NVTE_OK(backward(v, dy, y, dx));
      GpuTensor d_dy(dy), d_yc(y), d_dx(gdx);
      ASSERT_NVTE_OK(backward(v, d_dy, d_yc, d_dx));
      d_dx.download(gdx, kNVTERowwiseData);
      EXPECT_TRUE(matches_cpu(gdx, dx)) << variant_name(v) << " " << test::dtype_tag(t) << " bwd";
    }
  }
}

}  // namespace
