// nvte_nvfp4_block_gemm against a scalar oracle: each 16-K block's term in double (exact: E2M1 and
// E4M3 decoded by this file's own tables, products and sums of <= 20 significant bits), rounded to
// fp32 (exactly), and the block terms added in K order in fp32 from +0. Compared bit for bit (NaN
// matches NaN) over random shapes (row / column / K tails), every E4M3 scale byte (NaN, zero,
// subnormal, 448), all-extreme codes, cancellation, padded and unpadded scale grids, empty
// operands, and the argument errors. ci/isa_matrix.sh runs it at every CPU level (NVTE_CPU_ISA):
// bf16 dot products, AVX-512, AVX2 and SSE2 fp32 clones must all give the oracle's bits.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/gemm.h"

namespace {

using test::TestTensor;
using test::same_float_bits;

constexpr double kE2M1[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

// OCP E4M3 (no infinities; S.1111.111 is NaN), decoded from its fields.
double e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}

size_t up(size_t a, size_t m) { return (a + m - 1) / m * m; }

// One operand: codes [rows][k] (4 bits each) and scales [rows][ceil(k / 16)] as bytes.
struct Operand {
  size_t rows = 0, k = 0;
  std::vector<uint8_t> codes, scales;
  uint8_t code(size_t r, size_t j) const { return codes[r * k + j]; }
  uint8_t scale(size_t r, size_t b) const { return scales[r * ((k + 15) / 16) + b]; }
};

// The tensor the API takes: row-wise data [rows, k / 2], scale grid padded as TE's (or not).
TestTensor to_tensor(const Operand &o, bool padded_grid) {
  TestTensor t({o.rows, o.k / 2}, kNVTEByte, NVTE_NVFP4_1D_SCALING);
  for (size_t r = 0; r < o.rows; ++r)
    for (size_t j = 0; j < o.k; j += 2)
      t.bytes()[r * (o.k / 2) + j / 2] =
          static_cast<uint8_t>(o.code(r, j) | (o.code(r, j + 1) << 4));
  const size_t nb = (o.k + 15) / 16;
  const size_t gr = padded_grid ? up(o.rows, 128) : o.rows, gc = padded_grid ? up(nb, 4) : nb;
  t.set(kNVTERowwiseScaleInv, {gr, gc}, kNVTEFloat8E4M3);
  for (size_t r = 0; r < gr; ++r)
    for (size_t b = 0; b < gc; ++b)  // padding: NaN bytes, which must not be read
      t.bytes(kNVTERowwiseScaleInv)[r * gc + b] = (r < o.rows && b < nb) ? o.scale(r, b) : 0x7F;
  return t;
}

std::vector<float> oracle(const Operand &b, const Operand &a) {
  const size_t m = b.rows, n = a.rows, k = b.k, nb = (k + 15) / 16;
  std::vector<float> d(m * n);
  for (size_t r = 0; r < m; ++r)
    for (size_t c = 0; c < n; ++c) {
      float acc = 0.0f;
      for (size_t blk = 0; blk < nb; ++blk) {
        double s = 0.0;
        for (size_t j = blk * 16; j < std::min(k, blk * 16 + 16); ++j)
          s += kE2M1[b.code(r, j)] * kE2M1[a.code(c, j)];
        const double term = s * e4m3(b.scale(r, blk)) * e4m3(a.scale(c, blk));
        acc = acc + static_cast<float>(term);  // fp32, in K order
      }
      d[r * n + c] = acc;
    }
  return d;
}

Operand random_operand(std::mt19937 &rng, size_t rows, size_t k, bool any_scale) {
  Operand o;
  o.rows = rows;
  o.k = k;
  o.codes.resize(rows * k);
  o.scales.resize(rows * ((k + 15) / 16));
  for (auto &c : o.codes) c = static_cast<uint8_t>(rng() & 15);
  // Typical scales: positive normal E4M3 (exponents near 1, as a quantizer writes them); any:
  // every byte, NaN (0x7F / 0xFF), zeros, subnormals and negatives included.
  for (auto &s : o.scales)
    s = any_scale ? static_cast<uint8_t>(rng() & 0xFF) : static_cast<uint8_t>(0x28 + rng() % 48);
  return o;
}

std::vector<float> run(const Operand &b, const Operand &a, bool padded = true) {
  TestTensor tb = to_tensor(b, padded), ta = to_tensor(a, !padded);
  TestTensor d({b.rows, a.rows}, kNVTEFloat32);
  for (size_t i = 0; i < d.numel(); ++i) d.f32(kNVTERowwiseData)[i] = 12345.0f;  // overwritten
  const NVTEStatus st = nvte_nvfp4_block_gemm(tb, ta, d, nullptr);
  EXPECT_EQ(st, NVTE_SUCCESS) << nvte_get_last_error();
  std::vector<float> out(d.numel());
  // an empty output's vector has no buffer (memcpy's pointers must not be null, even for 0 bytes)
  if (!out.empty()) std::memcpy(out.data(), d.bytes(), out.size() * sizeof(float));
  return out;
}

struct Case {
  size_t m, n, k;
};

class Nvfp4BlockGemm : public ::testing::TestWithParam<Case> {};

TEST_P(Nvfp4BlockGemm, RandomMatchesOracle) {
  const Case c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.m * 1000003 + c.n * 1009 + c.k));
  for (bool any_scale : {false, true}) {
    const Operand b = random_operand(rng, c.m, c.k, any_scale);
    const Operand a = random_operand(rng, c.n, c.k, any_scale);
    EXPECT_TRUE(same_float_bits(run(b, a, any_scale), oracle(b, a))) << "any_scale " << any_scale;
  }
}

// Row tails (3-row tiles), column tails (64-column panels, 16 / 8 lanes), partial last K block,
// K = 2, and the parallel split over row chunks (96 rows) and panels.
INSTANTIATE_TEST_SUITE_P(Shapes, Nvfp4BlockGemm,
                         ::testing::Values(Case{1, 1, 16}, Case{1, 1, 2}, Case{2, 3, 32},
                                           Case{3, 64, 16}, Case{4, 65, 48}, Case{7, 17, 40},
                                           Case{37, 129, 80}, Case{97, 70, 24},
                                           Case{200, 130, 256}, Case{64, 192, 1008},
                                           Case{5, 300, 30}),
                         [](const auto &info) {
                           return std::to_string(info.param.m) + "x" +
                                  std::to_string(info.param.n) + "x" + std::to_string(info.param.k);
                         });

TEST(Nvfp4BlockGemmEdges, ExtremeTermsAndCancellation) {
  // Largest terms (6 * 6 * 448 * 448 * 16), then blocks that cancel them exactly, then the
  // smallest (0.5 * 0.5 * 2^-9 * 2^-9): the fp32 running sum rounds, in K order only.
  const size_t k = 16 * 6;
  Operand b, a;
  for (Operand *o : {&b, &a}) {
    o->rows = 3;
    o->k = k;
    o->codes.assign(3 * k, 7);  // +6
    o->scales.assign(3 * 6, 0x7E);  // 448
  }
  for (size_t j = 16; j < 32; ++j) b.codes[j] = 15;  // row 0 block 1: -6 (cancels block 0)
  for (size_t j = 32; j < 96; ++j) b.codes[j] = a.codes[j] = 1;  // 0.5
  for (size_t blk = 2; blk < 6; ++blk) b.scales[blk] = a.scales[blk] = 0x01;  // 2^-9
  b.scales[1 * 6 + 3] = 0x00;  // row 1 block 3: zero scale
  b.scales[2 * 6 + 4] = 0xFF;  // row 2 block 4: NaN scale
  for (size_t j = 0; j < 16; ++j) b.codes[1 * k + j] = 8;  // row 1 block 0: -0 codes
  EXPECT_TRUE(same_float_bits(run(b, a), oracle(b, a)));
}

TEST(Nvfp4BlockGemmEdges, EmptyOperands) {
  std::mt19937 rng(7);
  // K = 0 writes zeros; m or n = 0 writes nothing.
  for (const Case &c : {Case{3, 5, 0}, Case{0, 5, 32}, Case{4, 0, 32}}) {
    const Operand b = random_operand(rng, c.m, c.k, false);
    const Operand a = random_operand(rng, c.n, c.k, false);
    EXPECT_TRUE(same_float_bits(run(b, a), std::vector<float>(c.m * c.n, 0.0f)));
  }
}

TEST(Nvfp4BlockGemmErrors, ArgumentsAreNamed) {
  std::mt19937 rng(3);
  const Operand b = random_operand(rng, 4, 32, false), a = random_operand(rng, 5, 32, false);
  const Operand a48 = random_operand(rng, 5, 48, false);
  TestTensor tb = to_tensor(b, true), ta = to_tensor(a, true), ta48 = to_tensor(a48, true);
  auto expect = [](NVTEStatus st, NVTEStatus want, const char *needle) {
    EXPECT_EQ(st, want);
    EXPECT_NE(std::string(nvte_get_last_error()).find(needle), std::string::npos)
        << nvte_get_last_error();
  };
  TestTensor d({4, 5}, kNVTEFloat32), d_bad({5, 4}, kNVTEFloat32), d_bf16({4, 5}, kNVTEBFloat16);
  expect(nvte_nvfp4_block_gemm(tb, ta48, d, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "same K");
  expect(nvte_nvfp4_block_gemm(tb, ta, d_bad, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'D'");
  expect(nvte_nvfp4_block_gemm(tb, ta, d_bf16, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'D'");
  TestTensor plain({4, 16}, kNVTEByte);
  expect(nvte_nvfp4_block_gemm(plain, ta, d, nullptr), NVTE_ERROR_INVALID_ARGUMENT,
         "NVTE_NVFP4_1D_SCALING");
  TestTensor small({4, 16}, kNVTEByte, NVTE_NVFP4_1D_SCALING);
  small.set(kNVTERowwiseScaleInv, {4, 1}, kNVTEFloat8E4M3);  // needs 2 scales per row
  expect(nvte_nvfp4_block_gemm(small, ta, d, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "scale_inv");
  expect(nvte_nvfp4_block_gemm(nullptr, ta, d, nullptr), NVTE_ERROR_INVALID_ARGUMENT, "'B'");
}

}  // namespace
