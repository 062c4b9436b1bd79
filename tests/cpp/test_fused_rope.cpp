// Fused RoPE forward and backward vs double references built from TE's definition
// x * cos(f) + rotate_half(x) * sin(f): sbhd / bshd / thd, interleaved or not, full and partial
// rotary dims, odd lengths, fp32 / fp16 / bf16, in place, with and without start_positions and
// context-parallel shards (rows built from the chunk layout, not the kernel's formula); the
// backward is the forward's adjoint;
// pass-through features and thd padding tokens are copied bit for bit; every rejected argument
// leaves the output untouched.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/fused_rope.h"

namespace {

using test::TestTensor;
using Shape = std::vector<size_t>;

// s: positions per sequence (sbhd/bshd; the longest thd sequence), b: batch (thd: sequences),
// h heads of d features, d2 rotated, s_max positions in freqs (>= s).
struct Dims {
  size_t s, b, h, d, d2, s_max;
};
const Dims kDims[] = {{1, 1, 1, 2, 2, 1},     {7, 3, 2, 16, 16, 7},  {5, 2, 3, 10, 6, 9},
                      {33, 1, 4, 64, 32, 40}, {13, 4, 1, 128, 128, 13}, {3, 5, 2, 6, 4, 3}};

// Which rows of freqs the tokens use: per-sequence start offsets (start_i = (3 i + 1) % 5) and
// the context-parallel shard (cp_size, cp_rank).
struct Variant {
  bool start;
  int cp_size, cp_rank;
};
const Variant kVariants[] = {{false, 1, 0}, {true, 1, 0}, {false, 2, 1}, {true, 3, 2}};
constexpr size_t kMaxStart = 4;

std::string variant_name(const Variant &v) {
  std::string n = v.start ? "_start" : "";
  if (v.cp_size > 1) n += "_cp" + std::to_string(v.cp_size) + "r" + std::to_string(v.cp_rank);
  return n;
}

// The C API without start_positions, on a single rank (cp_size 1), default stream: the calls of
// most tests.
NVTEStatus rope_fwd(NVTETensor in, NVTETensor cu, NVTETensor freqs, NVTETensor out,
                    NVTE_QKV_Format f, bool interleaved) {
  return nvte_fused_rope_forward(in, cu, freqs, nullptr, out, f, interleaved, 1, 0, nullptr);
}
NVTEStatus rope_bwd(NVTETensor in, NVTETensor cu, NVTETensor freqs, NVTETensor out,
                    NVTE_QKV_Format f, bool interleaved) {
  return nvte_fused_rope_backward(in, cu, freqs, nullptr, out, f, interleaved, 1, 0, nullptr);
}

const char *format_name(NVTE_QKV_Format f) {
  return f == NVTE_SBHD ? "sbhd" : (f == NVTE_BSHD ? "bshd" : "thd");
}

// Tokens of one problem in memory order, each with its row of freqs (-1: thd padding, copied).
struct Layout {
  Shape shape;
  std::vector<int32_t> cu;      // thd offsets (of the whole sequences: cp_size x the local ones)
  std::vector<int32_t> starts;  // start_positions, empty for none
  std::vector<long> position;
};

// Rows of one sequence's `len` local tokens: the full sequence of cp_size * len positions from
// `start`, cut into 2 cp_size chunks, of which the rank holds chunk cp_rank, then chunk
// 2 cp_size - 1 - cp_rank.
std::vector<long> shard_rows(size_t len, long start, const Variant &v) {
  std::vector<long> full(len * static_cast<size_t>(v.cp_size));
  for (size_t i = 0; i < full.size(); ++i) full[i] = start + static_cast<long>(i);
  if (v.cp_size == 1) return full;
  const size_t n = len / 2;
  const size_t first = static_cast<size_t>(v.cp_rank), second = 2 * v.cp_size - 1 - first;
  std::vector<long> rows(full.begin() + first * n, full.begin() + (first + 1) * n);
  rows.insert(rows.end(), full.begin() + second * n, full.begin() + (second + 1) * n);
  return rows;
}

// thd sequence lengths cycle through s, 0, (s + 1) / 2, 1 (empty and one-token sequences
// included), followed by 3 padding tokens that belong to no sequence.
constexpr size_t kThdPadding = 3;

// With context parallelism every local length is even (two chunks): odd ones are rounded up.
Layout make_layout(NVTE_QKV_Format f, const Dims &d, const Variant &v = kVariants[0]) {
  Layout l;
  const auto even = [&](size_t n) { return v.cp_size > 1 ? n + n % 2 : n; };
  const size_t s = even(d.s);
  for (size_t i = 0; v.start && i < d.b; ++i) {
    l.starts.push_back(static_cast<int32_t>((3 * i + 1) % 5));
  }
  const auto start = [&](size_t i) { return v.start ? static_cast<long>(l.starts[i]) : 0L; };
  if (f == NVTE_SBHD) {
    l.shape = {s, d.b, d.h, d.d};
    l.position.resize(s * d.b);
    for (size_t bi = 0; bi < d.b; ++bi) {
      const std::vector<long> rows = shard_rows(s, start(bi), v);
      for (size_t si = 0; si < s; ++si) l.position[si * d.b + bi] = rows[si];
    }
  } else if (f == NVTE_BSHD) {
    l.shape = {d.b, s, d.h, d.d};
    for (size_t bi = 0; bi < d.b; ++bi) {
      const std::vector<long> rows = shard_rows(s, start(bi), v);
      l.position.insert(l.position.end(), rows.begin(), rows.end());
    }
  } else {
    const size_t cycle[] = {d.s, 0, (d.s + 1) / 2, 1};
    l.cu.push_back(0);
    for (size_t i = 0; i < d.b; ++i) {
      const size_t len = even(cycle[i % 4]);
      const std::vector<long> rows = shard_rows(len, start(i), v);
      l.position.insert(l.position.end(), rows.begin(), rows.end());
      l.cu.push_back(l.cu.back() + static_cast<int32_t>(len) * v.cp_size);
    }
    for (size_t i = 0; i < kThdPadding; ++i) l.position.push_back(-1);
    l.shape = {l.position.size(), d.h, d.d};
  }
  return l;
}

// TE's rotate_half over d2 features.
std::vector<double> rotate_half(const std::vector<double> &x, bool interleaved) {
  const size_t n = x.size(), half = n / 2;
  std::vector<double> r(n);
  for (size_t j = 0; j < n; ++j) {
    if (interleaved) {
      r[j] = j % 2 == 0 ? -x[j + 1] : x[j - 1];
    } else {
      r[j] = j < half ? -x[j + half] : x[j - half];
    }
  }
  return r;
}

// The forward as an explicit d2 x d2 matrix per position: M = diag(cos f) + diag(sin f) R, R the
// matrix of rotate_half (built from unit vectors). The backward reference multiplies by M^T.
std::vector<double> rope_matrix(const double *f, size_t d2, bool interleaved) {
  std::vector<double> m(d2 * d2, 0.0);
  for (size_t k = 0; k < d2; ++k) {
    std::vector<double> e(d2, 0.0);
    e[k] = 1.0;
    const std::vector<double> col = rotate_half(e, interleaved);
    for (size_t j = 0; j < d2; ++j) m[j * d2 + k] = std::sin(f[j]) * col[j];
  }
  for (size_t j = 0; j < d2; ++j) m[j * d2 + j] += std::cos(f[j]);
  return m;
}

std::vector<double> reference(const Layout &l, const Dims &d, bool interleaved,
                              const std::vector<double> &x, const std::vector<double> &freqs,
                              bool backward) {
  std::vector<double> y = x;  // pass-through features and padding tokens
  for (size_t tok = 0; tok < l.position.size(); ++tok) {
    if (l.position[tok] < 0) continue;
    const std::vector<double> m =
        rope_matrix(&freqs[static_cast<size_t>(l.position[tok]) * d.d2], d.d2, interleaved);
    for (size_t head = 0; head < d.h; ++head) {
      const size_t base = (tok * d.h + head) * d.d;
      for (size_t j = 0; j < d.d2; ++j) {
        double acc = 0.0;
        for (size_t k = 0; k < d.d2; ++k)
          acc += (backward ? m[k * d.d2 + j] : m[j * d.d2 + k]) * x[base + k];
        y[base + j] = acc;
      }
    }
  }
  return y;
}

NVTEStatus run(bool backward, NVTETensor in, NVTETensor cu, NVTETensor freqs, NVTETensor out,
               NVTE_QKV_Format f, bool interleaved, NVTETensor starts = nullptr,
               const Variant &v = kVariants[0]) {
  return backward ? nvte_fused_rope_backward(in, cu, freqs, starts, out, f, interleaved,
                                             v.cp_size, v.cp_rank, nullptr)
                  : nvte_fused_rope_forward(in, cu, freqs, starts, out, f, interleaved, v.cp_size,
                                            v.cp_rank, nullptr);
}

// Every byte of `out` outside the rotated features equals that of `in`.
::testing::AssertionResult passthrough_exact(const Layout &l, const Dims &d, const TestTensor &in,
                                             const TestTensor &out) {
  const size_t es = nvte_dtype_size(in.buffer().dtype);
  const uint8_t *a = in.buffer().bytes.data(), *b = out.buffer().bytes.data();
  for (size_t tok = 0; tok < l.position.size(); ++tok) {
    for (size_t head = 0; head < d.h; ++head) {
      const size_t first = l.position[tok] < 0 ? 0 : d.d2;
      const size_t off = ((tok * d.h + head) * d.d + first) * es, n = (d.d - first) * es;
      if (std::memcmp(a + off, b + off, n) != 0) {
        return ::testing::AssertionFailure() << "token " << tok << " head " << head
                                             << ": features from " << first << " changed";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// (format, interleaved, dtype, dims index, variant index)
using Param = std::tuple<NVTE_QKV_Format, bool, NVTEDType, int, int>;

std::string param_name(const ::testing::TestParamInfo<Param> &info) {
  const auto &[f, interleaved, t, di, vi] = info.param;
  const Dims &d = kDims[di];
  return std::string(format_name(f)) + (interleaved ? "_interleaved_" : "_") +
         test::dtype_tag(t) + "_s" + std::to_string(d.s) + "b" + std::to_string(d.b) + "h" +
         std::to_string(d.h) + "d" + std::to_string(d.d) + "r" + std::to_string(d.d2) +
         variant_name(kVariants[vi]);
}

class FusedRopeTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const auto &[f, interleaved, t, di, vi] = GetParam();
    fmt = f;
    inter = interleaved;
    dtype = t;
    dims = kDims[di];
    var = kVariants[vi];
    layout = make_layout(f, dims, var);
    std::mt19937 rng(17u + static_cast<unsigned>(di));
    // Arbitrary angles, different for every feature (not TE's duplicated halves), so a kernel that
    // used the wrong feature's angle for a partner would show. Rows for the longest (even) full
    // sequence past the largest start.
    const size_t rows = (dims.s_max + 1) * static_cast<size_t>(var.cp_size) + kMaxStart;
    freqs = TestTensor({var.start || var.cp_size > 1 ? rows : dims.s_max, 1, 1, dims.d2},
                       kNVTEFloat32);
    fv = freqs.fill_uniform(rng, -8.0, 8.0);
    if (f == NVTE_THD) {
      cu = TestTensor({layout.cu.size()}, kNVTEInt32);
      for (size_t i = 0; i < layout.cu.size(); ++i) cu.put(i, layout.cu[i]);
    }
    if (var.start) {
      starts = TestTensor({layout.starts.size()}, kNVTEInt32);
      for (size_t i = 0; i < layout.starts.size(); ++i) starts.put(i, layout.starts[i]);
    }
    x = TestTensor(layout.shape, t);
    xv = x.fill_uniform(rng, -2.0, 2.0);
  }
  NVTETensor cu_handle() const { return fmt == NVTE_THD ? cu.handle() : nullptr; }
  NVTETensor starts_handle() const { return var.start ? starts.handle() : nullptr; }
  NVTEStatus run(bool backward, NVTETensor in, NVTETensor out) const {
    return ::run(backward, in, cu_handle(), freqs, out, fmt, inter, starts_handle(), var);
  }

  // Runs one direction out of place and in place; both must match the reference, the in-place
  // result bit for bit the out-of-place one.
  void check(bool backward) {
    TestTensor y(layout.shape, dtype);
    ASSERT_NVTE_OK(run(backward, x, y));
    const std::vector<double> ref = reference(layout, dims, inter, xv, fv, backward);
    EXPECT_TRUE(test::close(y.to_double(), ref, test::tolerance(dtype)));
    EXPECT_TRUE(passthrough_exact(layout, dims, x, y));
    TestTensor z(layout.shape, dtype);
    z.buffer().bytes = x.buffer().bytes;
    ASSERT_NVTE_OK(run(backward, z, z));
    EXPECT_TRUE(test::same_bytes(z.bytes(), y.bytes(), y.buffer().bytes.size())) << "in place";
  }

  NVTE_QKV_Format fmt = NVTE_SBHD;
  bool inter = false;
  NVTEDType dtype = kNVTEFloat32;
  Dims dims{};
  Variant var{};
  Layout layout;
  TestTensor freqs, cu, starts, x;
  std::vector<double> fv, xv;
};

TEST_P(FusedRopeTest, Forward) { check(false); }

TEST_P(FusedRopeTest, Backward) { check(true); }

// <fwd(x), g> == <x, bwd(g)>: the backward is the transpose of the forward, whatever the angles.
// Allowance: the dtype's relative rounding of each stored result times the l1 norm of the terms.
TEST_P(FusedRopeTest, BackwardIsAdjoint) {
  std::mt19937 rng(99);
  TestTensor g(layout.shape, dtype), y(layout.shape, dtype), dx(layout.shape, dtype);
  const std::vector<double> gv = g.fill_uniform(rng, -1.0, 1.0);
  ASSERT_NVTE_OK(run(false, x, y));
  ASSERT_NVTE_OK(run(true, g, dx));
  const std::vector<double> yv = y.to_double(), dxv = dx.to_double();
  double lhs = 0, rhs = 0, l1 = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    lhs += yv[i] * gv[i];
    rhs += xv[i] * dxv[i];
    l1 += std::fabs(yv[i] * gv[i]) + std::fabs(xv[i] * dxv[i]);
  }
  const test::Tol tol = test::tolerance(dtype);
  EXPECT_NEAR(lhs, rhs, tol.rtol * l1 + tol.atol * static_cast<double>(xv.size()));
}

INSTANTIATE_TEST_SUITE_P(
    All, FusedRopeTest,
    ::testing::Combine(::testing::Values(NVTE_SBHD, NVTE_BSHD, NVTE_THD), ::testing::Bool(),
                       ::testing::Values(kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16),
                       ::testing::Range(0, static_cast<int>(std::size(kDims))),
                       ::testing::Range(0, static_cast<int>(std::size(kVariants)))),
    param_name);

// TE's angles (theta_i = 10000^(-2i/d2), concatenated twice) at positions 4000..4015: arguments of
// thousands of radians stay accurate (cos/sin of the fp32 angle, not of a rounded product).
TEST(FusedRopeEdge, LargeAnglesMatchReference) {
  const Dims d{16, 2, 3, 64, 64, 16};
  for (bool interleaved : {false, true}) {
    const Layout l = make_layout(NVTE_SBHD, d);
    TestTensor freqs({d.s_max, 1, 1, d.d2}, kNVTEFloat32), x(l.shape, kNVTEFloat32),
        y(l.shape, kNVTEFloat32);
    for (size_t p = 0; p < d.s_max; ++p) {
      for (size_t j = 0; j < d.d2; ++j) {
        const size_t i = interleaved ? j / 2 : j % (d.d2 / 2);
        const float theta = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / d.d2);
        freqs.put(p * d.d2 + j, static_cast<float>(4000 + p) * theta);
      }
    }
    std::mt19937 rng(5);
    const std::vector<double> xv = x.fill_uniform(rng, -1.0, 1.0);
    ASSERT_NVTE_OK(rope_fwd(x, nullptr, freqs, y, NVTE_SBHD, interleaved));
    const std::vector<double> ref = reference(l, d, interleaved, xv, freqs.to_double(), false);
    EXPECT_TRUE(test::close(y.to_double(), ref, test::tolerance(kNVTEFloat32)));
  }
}

// thd without tokens, and thd whose tokens all lie past the last (empty) sequence: copied.
TEST(FusedRopeEdge, ThdEmptyAndAllPadding) {
  TestTensor freqs({4, 1, 1, 8}, kNVTEFloat32), cu0({2}, kNVTEInt32);
  TestTensor x0({0, 2, 8}, kNVTEFloat32), y0({0, 2, 8}, kNVTEFloat32);
  ASSERT_NVTE_OK(rope_fwd(x0, cu0, freqs, y0, NVTE_THD, false));
  TestTensor cu({1}, kNVTEInt32), x({5, 2, 8}, kNVTEBFloat16), y({5, 2, 8}, kNVTEBFloat16);
  std::mt19937 rng(1);
  x.fill_uniform(rng, -1.0, 1.0);
  ASSERT_NVTE_OK(rope_bwd(x, cu, freqs, y, NVTE_THD, true));
  EXPECT_TRUE(test::same_bytes(y.bytes(), x.bytes(), x.buffer().bytes.size()));
}

// ------------------------------------------------------------------ rejected arguments
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

// A second handle onto another tensor's memory, at a byte offset.
struct View {
  View(TestTensor &base, size_t byte_offset, const Shape &shape, NVTEDType dtype)
      : h(nvte_create_tensor(NVTE_DELAYED_TENSOR_SCALING)) {
    NVTEBasicTensor bt{};
    bt.data_ptr = base.bytes() + byte_offset;
    bt.dtype = dtype;
    bt.shape.ndim = shape.size();
    for (size_t i = 0; i < shape.size(); ++i) bt.shape.data[i] = shape[i];
    EXPECT_EQ(nvte_set_tensor_param(&h, kNVTERowwiseData, &bt), NVTE_SUCCESS);
  }
  ~View() { nvte_destroy_tensor(h); }
  View(const View &) = delete;
  View &operator=(const View &) = delete;
  NVTETensor h;
};

constexpr NVTEStatus kInvalid = NVTE_ERROR_INVALID_ARGUMENT;

TEST(FusedRopeErrors, NullsDtypesAndFormats) {
  TestTensor x({5, 2, 3, 8}, kNVTEBFloat16), y({5, 2, 3, 8}, kNVTEBFloat16);
  TestTensor freqs({5, 1, 1, 8}, kNVTEFloat32);
  Sentinel s(y);
  EXPECT_NVTE_ERROR(rope_fwd(nullptr, nullptr, freqs, y, NVTE_SBHD, false),
                    kInvalid, "nvte_fused_rope_forward", "'input'", "NULL");
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, nullptr, y, NVTE_SBHD, false),
                    kInvalid, "'freqs'", "NULL");
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, freqs, nullptr, NVTE_SBHD, false),
                    kInvalid, "'output'", "NULL");
  EXPECT_NVTE_ERROR(rope_bwd(nullptr, nullptr, freqs, y, NVTE_SBHD, false),
                    kInvalid, "nvte_fused_rope_backward", "'output_grads'", "NULL");
  EXPECT_NVTE_ERROR(rope_bwd(x, nullptr, freqs, nullptr, NVTE_SBHD, false),
                    kInvalid, "'input_grads'", "NULL");
  TestTensor no_data({5, 2, 3, 8}, kNVTEBFloat16);
  no_data.set_null(kNVTERowwiseData, {5, 2, 3, 8}, kNVTEBFloat16);
  EXPECT_NVTE_ERROR(rope_fwd(no_data, nullptr, freqs, y, NVTE_SBHD, false),
                    kInvalid, "'input'", "null pointer");
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, freqs, y, static_cast<NVTE_QKV_Format>(3), false),
                    kInvalid, "'qkv_format'", "NVTE_THD (2)", "got 3");
  TestTensor i32({5, 2, 3, 8}, kNVTEInt32);
  EXPECT_NVTE_ERROR(rope_fwd(i32, nullptr, freqs, y, NVTE_SBHD, false),
                    kInvalid, "'input'", "expected dtype", "int32");
  TestTensor y16({5, 2, 3, 8}, kNVTEFloat16);
  Sentinel s16(y16);
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, freqs, y16, NVTE_SBHD, false),
                    kInvalid, "'output'", "bfloat16", "float16");
  EXPECT_NVTE_ERROR(rope_bwd(x, nullptr, freqs, y16, NVTE_SBHD, false),
                    kInvalid, "'input_grads'", "'output_grads'", "float16");
  TestTensor f16({5, 1, 1, 8}, kNVTEFloat16);
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, f16, y, NVTE_SBHD, false),
                    kInvalid, "'freqs'", "expected dtype", "float32", "float16");
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(s16.unchanged());
}

TEST(FusedRopeErrors, Shapes) {
  TestTensor x({5, 2, 3, 8}, kNVTEFloat32), y({5, 2, 3, 8}, kNVTEFloat32);
  TestTensor freqs({5, 1, 1, 8}, kNVTEFloat32);
  Sentinel s(y);
  TestTensor y_other({5, 2, 3, 10}, kNVTEFloat32);
  Sentinel so(y_other);
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, freqs, y_other, NVTE_SBHD, false),
                    kInvalid, "'output'", "[5, 2, 3, 8]", "[5, 2, 3, 10]");
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, freqs, y, NVTE_THD, false),
                    kInvalid, "'input'", "3-D", "4-D");
  for (const Shape &bad : {Shape{5, 1, 8}, Shape{5, 2, 1, 8}, Shape{5, 1, 3, 8}}) {
    TestTensor f(bad, kNVTEFloat32);
    EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, f, y, NVTE_SBHD, false),
                      kInvalid, "'freqs'");
  }
  // d2 odd, larger than the head dim, or empty.
  for (size_t d2 : {size_t{5}, size_t{10}, size_t{0}}) {
    TestTensor f({5, 1, 1, d2}, kNVTEFloat32);
    const std::string got = "got d2 = " + std::to_string(d2);
    EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, f, y, NVTE_SBHD, false),
                      kInvalid, "'freqs'", "even rotary dim", got.c_str());
  }
  // Fewer positions in freqs than the sequence has: sbhd counts dim 0, bshd dim 1.
  TestTensor short_f({4, 1, 1, 8}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, short_f, y, NVTE_SBHD, false),
                    kInvalid, "'freqs'", "at least the 5 positions", "got 4");
  TestTensor xb({2, 5, 3, 8}, kNVTEFloat32), yb({2, 5, 3, 8}, kNVTEFloat32);
  Sentinel sb(yb);
  EXPECT_NVTE_ERROR(rope_bwd(xb, nullptr, short_f, yb, NVTE_BSHD, false),
                    kInvalid, "'freqs'", "at least the 5 positions", "bshd");
  ASSERT_NVTE_OK(rope_fwd(xb, nullptr, freqs, yb, NVTE_BSHD, false));
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(so.unchanged());
}

TEST(FusedRopeErrors, CuSeqlens) {
  TestTensor x({9, 3, 8}, kNVTEFloat16), y({9, 3, 8}, kNVTEFloat16);
  TestTensor freqs({4, 1, 1, 8}, kNVTEFloat32);
  Sentinel s(y);
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, freqs, y, NVTE_THD, false),
                    kInvalid, "'cu_seqlens'", "thd", "got none");
  TestTensor cu64({3}, kNVTEInt64);
  EXPECT_NVTE_ERROR(rope_fwd(x, cu64, freqs, y, NVTE_THD, false), kInvalid,
                    "'cu_seqlens'", "int32", "int64");
  TestTensor cu2d({3, 1}, kNVTEInt32);
  EXPECT_NVTE_ERROR(rope_fwd(x, cu2d, freqs, y, NVTE_THD, false), kInvalid,
                    "'cu_seqlens'", "1-D");
  const auto offsets = [](std::vector<int32_t> v) {
    TestTensor t({v.size()}, kNVTEInt32);
    for (size_t i = 0; i < v.size(); ++i) t.put(i, v[i]);
    return t;
  };
  struct Bad {
    std::vector<int32_t> cu;
    const char *arg, *what;
  };
  const Bad bads[] = {{{1, 4, 8}, "'cu_seqlens'", "cu_seqlens[0] == 0, got 1"},
                      {{0, 4, 3}, "'cu_seqlens'", "cu_seqlens[1] = 4 > cu_seqlens[2] = 3"},
                      {{0, 4, 7, 10}, "'cu_seqlens'", "cu_seqlens[3] / cp_size (1) <= the 9"},
                      {{0, 3, 8}, "'freqs'", "sequence 1 has 5 tokens"}};
  for (const Bad &b : bads) {
    TestTensor cu = offsets(b.cu);
    EXPECT_NVTE_ERROR(rope_fwd(x, cu, freqs, y, NVTE_THD, false), kInvalid,
                      b.arg, b.what);
    EXPECT_NVTE_ERROR(rope_bwd(x, cu, freqs, y, NVTE_THD, false),
                      kInvalid, b.arg, b.what);
  }
  // Offsets are thd-only.
  TestTensor x4({4, 2, 3, 8}, kNVTEFloat16), y4({4, 2, 3, 8}, kNVTEFloat16);
  Sentinel s4(y4);
  TestTensor cu = offsets({0, 4, 8});
  EXPECT_NVTE_ERROR(rope_fwd(x4, cu, freqs, y4, NVTE_BSHD, false),
                    kInvalid, "'cu_seqlens'", "expected none for qkv_format bshd");
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(s4.unchanged());
}

TEST(FusedRopeErrors, StartPositionsAndContextParallel) {
  TestTensor x({6, 2, 3, 8}, kNVTEFloat32), y({6, 2, 3, 8}, kNVTEFloat32);
  TestTensor freqs({12, 1, 1, 8}, kNVTEFloat32);
  Sentinel s(y);
  const auto ints = [](std::vector<int32_t> v, NVTEDType t = kNVTEInt32) {
    TestTensor r({v.size()}, t);
    for (size_t i = 0; i < v.size(); ++i) r.put(i, v[i]);
    return r;
  };
  const auto fwd = [&](NVTETensor in, NVTETensor cu, NVTETensor sp, NVTETensor out,
                       NVTE_QKV_Format f, int cp, int rank) {
    return nvte_fused_rope_forward(in, cu, freqs, sp, out, f, false, cp, rank, nullptr);
  };
  TestTensor sp64 = ints({0, 1}, kNVTEInt64), sp3 = ints({0, 1, 2});
  EXPECT_NVTE_ERROR(fwd(x, nullptr, sp64, y, NVTE_SBHD, 1, 0), kInvalid, "'start_positions'",
                    "int32", "int64");
  EXPECT_NVTE_ERROR(fwd(x, nullptr, sp3, y, NVTE_SBHD, 1, 0), kInvalid, "'start_positions'",
                    "[2]", "[3]");
  // Rows start .. start + cp_size * s - 1 must lie in freqs' 12: 6 + 6 = 12 fits, 7 does not.
  TestTensor ok = ints({6, 0}), past = ints({0, 7}), neg = ints({-1, 0});
  TestTensor y2({6, 2, 3, 8}, kNVTEFloat32);
  ASSERT_NVTE_OK(fwd(x, nullptr, ok, y2, NVTE_SBHD, 1, 0));
  EXPECT_NVTE_ERROR(fwd(x, nullptr, past, y, NVTE_SBHD, 1, 0), kInvalid, "'start_positions'",
                    "sequence 1 needs rows 7 .. 12");
  EXPECT_NVTE_ERROR(nvte_fused_rope_backward(x, nullptr, freqs, neg, y, NVTE_SBHD, false, 1, 0,
                                             nullptr),
                    kInvalid, "nvte_fused_rope_backward", "'start_positions'", "got "
                    "start_positions[0] = -1");
  EXPECT_NVTE_ERROR(fwd(x, nullptr, ok, y, NVTE_SBHD, 2, 0), kInvalid, "'start_positions'",
                    "sequence 0 needs rows 6 .. 17");
  EXPECT_NVTE_ERROR(fwd(x, nullptr, nullptr, y, NVTE_SBHD, 0, 0), kInvalid, "'cp_size'",
                    "got 0");
  EXPECT_NVTE_ERROR(fwd(x, nullptr, nullptr, y, NVTE_SBHD, 2, 2), kInvalid, "'cp_rank'",
                    "got 2");
  EXPECT_NVTE_ERROR(fwd(x, nullptr, nullptr, y, NVTE_SBHD, 3, 0), kInvalid, "'freqs'",
                    "at least the 18 positions");
  TestTensor xo({5, 2, 3, 8}, kNVTEFloat32), yo({5, 2, 3, 8}, kNVTEFloat32);
  Sentinel so(yo);
  EXPECT_NVTE_ERROR(fwd(xo, nullptr, nullptr, yo, NVTE_SBHD, 2, 1), kInvalid, "'input'",
                    "local sequence length must be even", "got 5");
  // thd: local lengths cu[i] / cp_size differences must be even; starts per sequence.
  TestTensor xt({7, 3, 8}, kNVTEFloat32), yt({7, 3, 8}, kNVTEFloat32);
  Sentinel st(yt);
  TestTensor cu_odd = ints({0, 6, 12}), cu = ints({0, 8, 12}), spt = ints({0, 9});
  EXPECT_NVTE_ERROR(fwd(xt, cu_odd, nullptr, yt, NVTE_THD, 2, 0), kInvalid, "'cu_seqlens'",
                    "even number of local tokens", "got 3 for sequence 0");
  EXPECT_NVTE_ERROR(fwd(xt, cu, spt, yt, NVTE_THD, 2, 1), kInvalid, "'start_positions'",
                    "sequence 1 needs rows 9 .. 12");
  EXPECT_NVTE_ERROR(fwd(xt, cu, sp3, yt, NVTE_THD, 2, 1), kInvalid, "'start_positions'",
                    "one offset per sequence of cu_seqlens");
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(so.unchanged());
  EXPECT_TRUE(st.unchanged());
}

// In place (same buffer) is tested above; a partial overlap of the output with the input, or
// freqs / cu_seqlens living inside the output, is rejected.
TEST(FusedRopeErrors, Overlap) {
  const Shape shape = {3, 1, 2, 8};
  TestTensor big({4, 1, 2, 8}, kNVTEFloat32), freqs({3, 1, 1, 8}, kNVTEFloat32);
  Sentinel s(big);
  View in(big, 0, shape, kNVTEFloat32), shifted(big, 16 * 4, shape, kNVTEFloat32);
  EXPECT_NVTE_ERROR(rope_fwd(in.h, nullptr, freqs, shifted.h, NVTE_SBHD, false),
                    kInvalid, "'output'", "'input'", "overlapping");
  TestTensor x(shape, kNVTEFloat32);
  View f_in_out(big, 0, {3, 1, 1, 8}, kNVTEFloat32);
  EXPECT_NVTE_ERROR(rope_bwd(x, nullptr, f_in_out.h, in.h, NVTE_SBHD, false),
                    kInvalid, "'input_grads'", "'freqs'", "overlapping");
  TestTensor xt({6, 2, 8}, kNVTEFloat32), yt({6, 2, 8}, kNVTEFloat32);
  Sentinel st(yt);
  View cu_in_out(yt, 0, {2}, kNVTEInt32);  // the sentinel bytes would be garbage offsets anyway
  EXPECT_NVTE_ERROR(rope_fwd(xt, cu_in_out.h, freqs, yt, NVTE_THD, false),
                    kInvalid, "'output'", "'cu_seqlens'", "overlapping");
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(st.unchanged());
}

TEST(FusedRopeErrors, Devices) {
  TestTensor x({5, 2, 3, 8}, kNVTEFloat32), y({5, 2, 3, 8}, kNVTEFloat32);
  TestTensor freqs({5, 1, 1, 8}, kNVTEFloat32);
  Sentinel s(y);
  freqs.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, freqs, y, NVTE_SBHD, false),
                    kInvalid, "'freqs'", "device", "gpu");
  x.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, freqs, y, NVTE_SBHD, false),
                    kInvalid, "'output'", "device");
  TestTensor xt({6, 3, 8}, kNVTEFloat32), yt({6, 3, 8}, kNVTEFloat32), cu({2}, kNVTEInt32);
  Sentinel st(yt);
  cu.set_device(kNVTEDeviceGPU);
  EXPECT_NVTE_ERROR(rope_fwd(xt, cu, freqs, yt, NVTE_THD, false),
                    kInvalid, "device");
  y.set_device(kNVTEDeviceGPU);
  // Every tensor on the GPU: the CPU-only build (or a host without a device) cannot run it.
  EXPECT_NVTE_ERROR(rope_fwd(x, nullptr, freqs, y, NVTE_SBHD, false),
                    NVTE_ERROR_UNSUPPORTED, "nvte_fused_rope_forward", "GPU");
  EXPECT_NVTE_ERROR(rope_bwd(x, nullptr, freqs, y, NVTE_SBHD, true),
                    NVTE_ERROR_UNSUPPORTED, "nvte_fused_rope_backward", "GPU");
  EXPECT_TRUE(s.unchanged());
  EXPECT_TRUE(st.unchanged());
}

}  // namespace
