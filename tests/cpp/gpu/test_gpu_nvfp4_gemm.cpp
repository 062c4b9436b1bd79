// nvte_nvfp4_block_gemm on the GPU (gemm/nvfp4_gemm.cu: bf16 tensor-core block terms, fp32 adds in
// K order) against the CPU kernel, bit for bit (NaN matches NaN). The CPU kernel is pinned to an
// independent scalar oracle at every CPU level by tests/cpp/test_nvfp4_gemm.cpp; equal bits here
// prove the tensor core's block sums exact and the K order kept. Shapes cover output-tile tails
// (128 x 128 tiles), K tails (a partial last 16-block, a partial last 64-K stage), rows that are
// not 16-byte aligned (K not a multiple of 32: the byte-wise staging path), several stages,
// padded and unpadded scale grids, every E4M3 scale byte (NaN, zero, subnormal, negative),
// extreme terms, K = 0 and empty outputs. Skipped without a GPU device.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_mirror.h"
#include "transformer_engine_lite/gemm.h"

namespace {

using test::GpuTensor;
using test::TestTensor;
using test::same_float_bits;

size_t up(size_t a, size_t m) { return (a + m - 1) / m * m; }

// A random row-wise NVFP4 operand [rows, k]: packed codes and a scale grid (TE's padded one, or
// exactly [rows, ceil(k / 16)]). Typical scales are positive normal E4M3 near 1, as a quantizer
// writes them; `any_scale` takes every byte. Grid padding holds NaN bytes, which must not be read.
TestTensor operand(std::mt19937 &rng, size_t rows, size_t k, bool any_scale, bool padded) {
  TestTensor t({rows, k / 2}, kNVTEByte, NVTE_NVFP4_1D_SCALING);
  for (size_t i = 0; i < t.numel(); ++i) t.bytes()[i] = static_cast<uint8_t>(rng() & 0xFF);
  const size_t nb = (k + 15) / 16;
  const size_t gr = padded ? up(rows, 128) : rows, gc = padded ? up(nb, 4) : nb;
  t.set(kNVTERowwiseScaleInv, {gr, gc}, kNVTEFloat8E4M3);
  for (size_t r = 0; r < gr; ++r)
    for (size_t b = 0; b < gc; ++b) {
      const uint8_t s = any_scale ? static_cast<uint8_t>(rng() & 0xFF)
                                  : static_cast<uint8_t>(0x28 + rng() % 48);
      t.bytes(kNVTERowwiseScaleInv)[r * gc + b] = (r < rows && b < nb) ? s : 0x7F;
    }
  return t;
}

std::vector<float> values(TestTensor &d) {
  std::vector<float> out(d.numel());
  if (!out.empty()) std::memcpy(out.data(), d.bytes(), out.size() * sizeof(float));
  return out;
}

// The GEMM on both devices; the GPU's output starts as garbage (every element must be written).
::testing::AssertionResult gpu_equals_cpu(const TestTensor &b, const TestTensor &a, size_t m,
                                          size_t n) {
  TestTensor d_cpu({m, n}, kNVTEFloat32), d_gpu({m, n}, kNVTEFloat32);
  for (size_t i = 0; i < m * n; ++i) d_gpu.f32(kNVTERowwiseData)[i] = 12345.0f;
  if (nvte_nvfp4_block_gemm(b, a, d_cpu, nullptr) != NVTE_SUCCESS)
    return ::testing::AssertionFailure() << "CPU: " << nvte_get_last_error();
  GpuTensor gb(b), ga(a), gd(d_gpu);
  if (nvte_nvfp4_block_gemm(gb, ga, gd, nullptr) != NVTE_SUCCESS)
    return ::testing::AssertionFailure() << "GPU: " << nvte_get_last_error();
  gd.download_all(d_gpu);
  return same_float_bits(values(d_gpu), values(d_cpu));
}

struct Case {
  size_t m, n, k;
};

class Nvfp4BlockGemmGpu : public ::testing::TestWithParam<Case> {};

TEST_P(Nvfp4BlockGemmGpu, EqualsCpuBits) {
  SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.m * 1000003 + c.n * 1009 + c.k));
  for (bool any_scale : {false, true}) {
    const TestTensor b = operand(rng, c.m, c.k, any_scale, any_scale);
    const TestTensor a = operand(rng, c.n, c.k, any_scale, !any_scale);
    EXPECT_TRUE(gpu_equals_cpu(b, a, c.m, c.n)) << "any_scale " << any_scale;
  }
}

// K: 2 (one partial block), 30 and 40 (partial last block; rows of 15 / 20 bytes, unaligned), 64
// (one stage), 96 and 200 (a partial last stage), 256 and 520 (several stages); m / n around the
// 128 x 128 tile and the 16 x 8 fragments.
INSTANTIATE_TEST_SUITE_P(Shapes, Nvfp4BlockGemmGpu,
                         ::testing::Values(Case{1, 1, 2}, Case{1, 1, 16}, Case{3, 5, 30},
                                           Case{17, 9, 40}, Case{64, 64, 64}, Case{65, 63, 96},
                                           Case{33, 129, 200}, Case{130, 257, 256},
                                           Case{256, 72, 520}),
                         [](const auto &info) {
                           return std::to_string(info.param.m) + "x" +
                                  std::to_string(info.param.n) + "x" + std::to_string(info.param.k);
                         });

TEST(Nvfp4BlockGemmGpuEdges, ExtremeTermsAndCancellation) {
  SKIP_WITHOUT_GPU();
  // Largest terms (6 * 6 * 448 * 448 * 16) in block 0, cancelled by block 1 in row 0, then the
  // smallest scales (2^-9): the fp32 running sum rounds only in K order.
  const size_t m = 3, n = 2, k = 96, nb = k / 16;
  TestTensor b({m, k / 2}, kNVTEByte, NVTE_NVFP4_1D_SCALING);
  TestTensor a({n, k / 2}, kNVTEByte, NVTE_NVFP4_1D_SCALING);
  for (TestTensor *t : {&b, &a}) {
    const size_t rows = t == &b ? m : n;
    t->set(kNVTERowwiseScaleInv, {rows, nb}, kNVTEFloat8E4M3);
    for (size_t r = 0; r < rows; ++r)
      for (size_t j = 0; j < k / 2; ++j)
        t->bytes()[r * (k / 2) + j] = j < 16 ? 0x77 : 0x11;  // +6 +6 in blocks 0-1, then 0.5
    for (size_t r = 0; r < rows; ++r)
      for (size_t blk = 0; blk < nb; ++blk)
        t->bytes(kNVTERowwiseScaleInv)[r * nb + blk] = blk < 2 ? 0x7E : 0x01;  // 448, 2^-9
  }
  for (size_t j = 8; j < 16; ++j) b.bytes()[j] = 0xFF;  // row 0 block 1: -6 -6, cancels block 0
  b.bytes(kNVTERowwiseScaleInv)[1 * nb + 3] = 0x00;    // row 1 block 3: zero scale
  b.bytes(kNVTERowwiseScaleInv)[2 * nb + 4] = 0xFF;    // row 2 block 4: NaN scale
  EXPECT_TRUE(gpu_equals_cpu(b, a, m, n));
}

TEST(Nvfp4BlockGemmGpuEdges, EmptyOperands) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  // K = 0 writes zeros; m or n = 0 writes nothing.
  for (const Case &c : {Case{3, 5, 0}, Case{0, 5, 32}, Case{4, 0, 32}}) {
    const TestTensor b = operand(rng, c.m, c.k, false, true);
    const TestTensor a = operand(rng, c.n, c.k, false, true);
    EXPECT_TRUE(gpu_equals_cpu(b, a, c.m, c.n)) << c.m << "x" << c.n << "x" << c.k;
  }
}

TEST(Nvfp4BlockGemmGpuEdges, MixedDevicesAreNamed) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  const TestTensor b = operand(rng, 4, 32, false, true), a = operand(rng, 5, 32, false, true);
  TestTensor d({4, 5}, kNVTEFloat32);
  GpuTensor gb(b), gd(d);
  EXPECT_NE(nvte_nvfp4_block_gemm(gb, a, gd, nullptr), NVTE_SUCCESS);
  EXPECT_NE(std::string(nvte_get_last_error()).find("'A'"), std::string::npos)
      << nvte_get_last_error();
}

}  // namespace
