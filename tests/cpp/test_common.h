// Shared test support: owning tensors behind NVTETensor handles, independent (double-based) dtype
// conversions, the one tolerance table, a verbose closeness check and an error-expectation macro.
// Nothing here includes library internals: references must stay independent of the kernels.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "transformer_engine_lite/transformer_engine.h"

namespace test {

// f() run with n OpenMP threads, the previous count restored after (the thread-count
// bit-identity tests); without OpenMP, just f().
template <typename F>
auto with_threads(int n, F &&f) -> decltype(f()) {
#ifdef _OPENMP
  struct Restore {
    int saved = omp_get_max_threads();
    ~Restore() { omp_set_num_threads(saved); }
  } restore;
  omp_set_num_threads(n);
#else
  (void)n;
#endif
  return f();
}

// ------------------------------------------------------------------ independent conversions
inline uint32_t fbits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// got == want bit for bit, NaN matching any NaN (payloads are the device's); the first 3
// differences in the message.
inline ::testing::AssertionResult same_float_bits(const std::vector<float> &got,
                                                  const std::vector<float> &want) {
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool ok = (std::isnan(got[i]) && std::isnan(want[i])) || fbits(got[i]) == fbits(want[i]);
    if (!ok && bad++ < 3)
      first += " [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " +
               std::to_string(want[i]);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << want.size() << " differ:" << first;
}
inline float bitsf(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// bf16 <-> float. Round to nearest even done on the double value with an explicit tie rule.
inline float bf16_to_float(uint16_t b) { return bitsf(static_cast<uint32_t>(b) << 16); }
inline uint16_t float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u = fbits(f);
  uint32_t lo = u & 0xFFFF, hi = u >> 16;
  if (lo > 0x8000 || (lo == 0x8000 && (hi & 1))) hi += 1;
  return static_cast<uint16_t>(hi);
}
// fp16 via the compiler's _Float16 (IEEE binary16, round to nearest even).
inline float fp16_to_float(uint16_t h) { _Float16 v; std::memcpy(&v, &h, 2); return static_cast<float>(v); }
inline uint16_t float_to_fp16(float f) { _Float16 v = static_cast<_Float16>(f); uint16_t h; std::memcpy(&h, &v, 2); return h; }

struct Fp8Spec {
  int exp_bits, man_bits, bias;
  bool fnuz;
  double max;
};
inline Fp8Spec fp8_spec(NVTEDType t) {
  switch (t) {
    case kNVTEFloat8E4M3: return {4, 3, 7, false, 448.0};
    case kNVTEFloat8E5M2: return {5, 2, 15, false, 57344.0};
    case kNVTEFloat8E4M3FNUZ: return {4, 3, 8, true, 240.0};
    case kNVTEFloat8E5M2FNUZ: return {5, 2, 16, true, 57344.0};
    default: ADD_FAILURE() << "not an FP8 dtype: " << t; return {4, 3, 7, false, 448.0};
  }
}
inline bool is_fp8(NVTEDType t) {
  return t == kNVTEFloat8E4M3 || t == kNVTEFloat8E5M2 || t == kNVTEFloat8E4M3FNUZ ||
         t == kNVTEFloat8E5M2FNUZ;
}

// Decode from the format definition with ldexp (independent of the library's bit tricks).
inline double ref_fp8_decode(uint8_t v, NVTEDType t) {
  const Fp8Spec s = fp8_spec(t);
  const int sign = v >> 7, mag = v & 0x7F;
  const int e = mag >> s.man_bits, m = mag & ((1 << s.man_bits) - 1);
  if (s.fnuz && v == 0x80) return std::numeric_limits<double>::quiet_NaN();
  if (!s.fnuz && s.exp_bits == 4 && mag == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  if (!s.fnuz && s.exp_bits == 5 && e == 31)
    return m ? std::numeric_limits<double>::quiet_NaN()
             : (sign ? -1.0 : 1.0) * std::numeric_limits<double>::infinity();
  const double val = e == 0 ? std::ldexp(m, 1 - s.bias - s.man_bits)
                            : std::ldexp(1.0 + m / double(1 << s.man_bits), e - s.bias);
  return sign ? -val : val;
}

// Encode by exhaustive nearest search over the format's finite codes: ties go to the even mantissa;
// NaN -> NaN code; beyond max (Inf included) -> +-max (satfinite); -0 kept only in OCP.
inline uint8_t ref_fp8_encode(double x, NVTEDType t) {
  const Fp8Spec s = fp8_spec(t);
  if (std::isnan(x)) return s.fnuz ? 0x80 : 0x7F;
  const bool neg = std::signbit(x);
  double a = std::fabs(x);
  if (a > s.max) a = s.max;
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 128; ++c) {
    const double v = ref_fp8_decode(static_cast<uint8_t>(c), t);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(v - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) { best_d = d; best = c; }
  }
  if (s.fnuz && best == 0) return 0;
  return static_cast<uint8_t>(best | (neg ? 0x80 : 0));
}

// ------------------------------------------------------------------ tolerances (the one table)
struct Tol { double atol, rtol; };
// TE's gtest tolerances per output dtype; FP8 outputs are compared bit for bit where the spec is exact.
inline Tol tolerance(NVTEDType t) {
  switch (t) {
    case kNVTEFloat32: return {1e-6, 5e-6};
    case kNVTEFloat16: return {1e-5, 1e-3};
    case kNVTEBFloat16: return {1e-5, 1e-2};
    default: return {1e-2, 1e-2};  // FP8
  }
}
// Gradients of norms accumulate over rows: TE's looser bound.
inline Tol norm_grad_tolerance(NVTEDType t) {
  Tol base = tolerance(t);
  return {std::max(base.atol, 5e-4), std::max(base.rtol, 5e-4)};
}
// Activations evaluated in fp32 with tanhf/expf, where terms cancel (1 - tanh^2 in the GELU derivative
// near saturation): about one ulp of an O(1) intermediate times the grad and gate factors (up to ~2e-6
// for grad, gate in [-4, 4]), above the fp32 storage tolerance.
inline Tol activation_tolerance(NVTEDType t) {
  Tol base = tolerance(t);
  return {std::max(base.atol, 1e-5), base.rtol};
}
// Rounding error of one FP8 format, in the quantized domain (x * scale, or x / MX block scale): half a
// unit in the last place relative, plus half the smallest subnormal absolute.
inline Tol fp8_quantization_tolerance(NVTEDType t) {
  const Fp8Spec s = fp8_spec(t);
  return {std::ldexp(0.5, 1 - s.bias - s.man_bits), std::ldexp(1.0, -(s.man_bits + 1))};
}
// FP32 accumulation of k terms whose magnitudes sum to l1 (GEMM dot products, bias gradients):
// absolute allowance 4 sqrt(k) 2^-24 l1, the statistical bound with a safety factor (blocked kernels
// never approach the worst case k 2^-24 l1), plus 8 ulps of l1 for fp32 epilogue math on the result
// (output scale, GELU). Added to tolerance(out) of the output dtype.
inline double fp32_accumulation_atol(size_t k, double l1) {
  return (4.0 * std::sqrt(static_cast<double>(k)) + 8.0) * std::ldexp(l1, -24);
}
// GELU / dGELU fused into a vendor GEMM epilogue (cuBLASLt) need not be our util/math.h tanh: the
// hardware tanh.approx.f32 has relative error <= 2^-11 (delta). gelu(x) = 0.5 x (1 + t) moves by
// <= 0.5 |x| delta; gelu'(x) by <= (0.5 + |x| k0 (1 + 3 k1 x^2)) delta <= (0.5 + 2 |x|) delta for
// |x| <= 3, times the incoming factor (the product, for dGELU; 1 for GELU). `max_arg` bounds |x|.
inline double vendor_gelu_atol(double max_arg, double max_factor) {
  return (0.5 + 2.0 * max_arg) * std::ldexp(max_factor, -11);
}

// ------------------------------------------------------------------ owning test tensor
inline size_t dtype_bytes(NVTEDType t) { return nvte_dtype_size(t); }
inline size_t numel_of(const std::vector<size_t> &shape) {
  size_t n = 1;
  for (size_t d : shape) n *= d;
  return n;
}

struct Buffer {
  std::vector<uint8_t> bytes;
  std::vector<size_t> shape;
  NVTEDType dtype = kNVTEFloat32;
};

// Owns the memory of every buffer it sets on its handle.
class TestTensor {
 public:
  TestTensor() = default;
  TestTensor(const std::vector<size_t> &shape, NVTEDType dtype,
             NVTEScalingMode mode = NVTE_DELAYED_TENSOR_SCALING) {
    h_ = nvte_create_tensor(mode);
    set(kNVTERowwiseData, shape, dtype);
  }
  ~TestTensor() { nvte_destroy_tensor(h_); }
  TestTensor(const TestTensor &) = delete;
  TestTensor &operator=(const TestTensor &) = delete;
  TestTensor(TestTensor &&o) noexcept { *this = std::move(o); }
  TestTensor &operator=(TestTensor &&o) noexcept {
    std::swap(h_, o.h_);
    for (int i = 0; i < kNVTENumTensorParams; ++i) std::swap(buf_[i], o.buf_[i]);
    return *this;
  }

  // Allocates (zeroed) and attaches a buffer; an empty shape means a scalar ({1}).
  void set(NVTETensorParam p, const std::vector<size_t> &shape, NVTEDType dtype) {
    Buffer &b = buf_[p];
    b.shape = shape;
    b.dtype = dtype;
    b.bytes.assign(std::max<size_t>(1, numel_of(shape) * dtype_bytes(dtype)), 0);
    attach(p);
  }
  // Attaches a buffer description with a null pointer (for "missing data" tests).
  void set_null(NVTETensorParam p, const std::vector<size_t> &shape, NVTEDType dtype) {
    NVTEBasicTensor bt{};
    bt.data_ptr = nullptr;
    bt.dtype = dtype;
    bt.shape.ndim = shape.size();
    for (size_t i = 0; i < shape.size(); ++i) bt.shape.data[i] = shape[i];
    buf_[p] = Buffer{};
    ASSERT_EQ(nvte_set_tensor_param(&h_, p, &bt), NVTE_SUCCESS) << nvte_get_last_error();
  }
  void set_scale(float s) { set(kNVTEScale, {1}, kNVTEFloat32); f32(kNVTEScale)[0] = s; }
  void set_amax(float a = 0.0f) { set(kNVTEAmax, {1}, kNVTEFloat32); f32(kNVTEAmax)[0] = a; }
  void set_scale_inv(float s = 0.0f) { set(kNVTERowwiseScaleInv, {1}, kNVTEFloat32); f32(kNVTERowwiseScaleInv)[0] = s; }
  void set_device(NVTEDevice d) { ASSERT_EQ(nvte_set_tensor_device(h_, d), NVTE_SUCCESS); }

  NVTETensor handle() const { return h_; }
  operator NVTETensor() const { return h_; }
  Buffer &buffer(NVTETensorParam p = kNVTERowwiseData) { return buf_[p]; }
  const Buffer &buffer(NVTETensorParam p = kNVTERowwiseData) const { return buf_[p]; }
  uint8_t *bytes(NVTETensorParam p = kNVTERowwiseData) { return buf_[p].bytes.data(); }
  float *f32(NVTETensorParam p) { return reinterpret_cast<float *>(buf_[p].bytes.data()); }
  size_t numel(NVTETensorParam p = kNVTERowwiseData) const { return numel_of(buf_[p].shape); }

  // Element i of a buffer as double (decoding fp16/bf16/FP8/E8M0).
  double get(size_t i, NVTETensorParam p = kNVTERowwiseData) const {
    const Buffer &b = buf_[p];
    const uint8_t *d = b.bytes.data();
    switch (b.dtype) {
      case kNVTEFloat32: { float v; std::memcpy(&v, d + 4 * i, 4); return v; }
      case kNVTEFloat16: { uint16_t v; std::memcpy(&v, d + 2 * i, 2); return fp16_to_float(v); }
      case kNVTEBFloat16: { uint16_t v; std::memcpy(&v, d + 2 * i, 2); return bf16_to_float(v); }
      case kNVTEInt32: { int32_t v; std::memcpy(&v, d + 4 * i, 4); return v; }
      case kNVTEInt64: { int64_t v; std::memcpy(&v, d + 8 * i, 8); return static_cast<double>(v); }
      case kNVTEByte: return d[i];
      case kNVTEFloat8E8M0: return d[i] == 0xFF ? NAN : std::ldexp(1.0, int(d[i]) - 127);
      default: return ref_fp8_decode(d[i], b.dtype);
    }
  }
  std::vector<double> to_double(NVTETensorParam p = kNVTERowwiseData) const {
    std::vector<double> out(numel(p));
    for (size_t i = 0; i < out.size(); ++i) out[i] = get(i, p);
    return out;
  }
  // Stores v (rounded to the buffer's dtype; FP8 via the independent encoder, unscaled).
  void put(size_t i, double v, NVTETensorParam p = kNVTERowwiseData) {
    Buffer &b = buf_[p];
    uint8_t *d = b.bytes.data();
    switch (b.dtype) {
      case kNVTEFloat32: { float f = static_cast<float>(v); std::memcpy(d + 4 * i, &f, 4); break; }
      case kNVTEFloat16: { uint16_t h = float_to_fp16(static_cast<float>(v)); std::memcpy(d + 2 * i, &h, 2); break; }
      case kNVTEBFloat16: { uint16_t h = float_to_bf16(static_cast<float>(v)); std::memcpy(d + 2 * i, &h, 2); break; }
      case kNVTEInt32: { int32_t x = static_cast<int32_t>(v); std::memcpy(d + 4 * i, &x, 4); break; }
      case kNVTEInt64: { int64_t x = static_cast<int64_t>(v); std::memcpy(d + 8 * i, &x, 8); break; }
      case kNVTEByte: d[i] = static_cast<uint8_t>(v); break;
      default: d[i] = ref_fp8_encode(v, b.dtype); break;
    }
  }
  // Fills with uniform values in [lo, hi), already rounded to the dtype; returns them as doubles.
  std::vector<double> fill_uniform(std::mt19937 &rng, double lo, double hi,
                                   NVTETensorParam p = kNVTERowwiseData) {
    std::uniform_real_distribution<double> dist(lo, hi);
    for (size_t i = 0; i < numel(p); ++i) put(i, dist(rng), p);
    return to_double(p);
  }

 private:
  void attach(NVTETensorParam p) {
    Buffer &b = buf_[p];
    NVTEBasicTensor bt{};
    bt.data_ptr = b.bytes.data();
    bt.dtype = b.dtype;
    bt.shape.ndim = b.shape.size();
    for (size_t i = 0; i < b.shape.size(); ++i) bt.shape.data[i] = b.shape[i];
    ASSERT_EQ(nvte_set_tensor_param(&h_, p, &bt), NVTE_SUCCESS) << nvte_get_last_error();
  }

  NVTETensor h_ = nullptr;
  Buffer buf_[kNVTENumTensorParams];
};

// ------------------------------------------------------------------ comparisons
// Checks |a - r| <= atol + rtol * |r| elementwise (NaN must match NaN, Inf must match Inf); reports the
// number of mismatches and the first few with their indices.
inline ::testing::AssertionResult close(const std::vector<double> &actual,
                                        const std::vector<double> &ref, Tol tol) {
  if (actual.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << actual.size() << " != " << ref.size();
  size_t bad = 0;
  std::ostringstream first;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double a = actual[i], r = ref[i];
    bool ok;
    if (std::isnan(r) || std::isnan(a)) ok = std::isnan(r) && std::isnan(a);
    else if (std::isinf(r) || std::isinf(a)) ok = a == r;
    else ok = std::fabs(a - r) <= tol.atol + tol.rtol * std::fabs(r);
    if (!ok) {
      if (bad < 5) first << "\n  [" << i << "] got " << a << ", expected " << r;
      if (std::isfinite(a) && std::isfinite(r)) worst = std::max(worst, std::fabs(a - r));
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << ref.size()
                                       << " elements differ (atol " << tol.atol << ", rtol "
                                       << tol.rtol << ", worst abs diff " << worst << "):"
                                       << first.str();
}

// Bit-exact comparison of byte buffers with the first mismatches reported.
inline ::testing::AssertionResult same_bytes(const uint8_t *actual, const uint8_t *ref, size_t n) {
  size_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < n; ++i) {
    if (actual[i] != ref[i]) {
      if (bad < 5) first << "\n  [" << i << "] got 0x" << std::hex << int(actual[i]) << ", expected 0x" << int(ref[i]) << std::dec;
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " bytes differ:" << first.str();
}

inline std::string dtype_tag(NVTEDType t) {
  std::string s = nvte_dtype_name(t);
  for (char &c : s) if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}
inline std::string shape_tag(const std::vector<size_t> &shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

}  // namespace test

// The call must fail with `status` and the message must contain every given substring (e.g. the
// argument's name and the expectation).
#define EXPECT_NVTE_ERROR(call, status, ...)                                              \
  do {                                                                                    \
    const NVTEStatus _st = (call);                                                        \
    EXPECT_EQ(_st, status) << #call << " -> " << nvte_get_last_error();                  \
    const std::string _msg = nvte_get_last_error();                                       \
    for (const char *_needle : {__VA_ARGS__})                                             \
      EXPECT_NE(_msg.find(_needle), std::string::npos)                                    \
          << "error message of " #call " lacks '" << _needle << "': " << _msg;            \
  } while (0)

#define ASSERT_NVTE_OK(call) ASSERT_EQ((call), NVTE_SUCCESS) << #call << ": " << nvte_get_last_error()
