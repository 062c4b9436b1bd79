// Shared plumbing of the libFuzzer harnesses (tests/fuzz/fuzz_*.cpp, run by ci/fuzz.sh).
//
// Each harness decodes its input into one small problem: a call pattern, shapes, dtypes, scalars and
// a few "mutations" that break one argument at a time. Every buffer the harness hands the library is
// a heap block of exactly the size its declared shape and dtype imply (or a view inside one such
// block, for overlapping arguments), so a call the library accepts is a call it may perform, and any
// access outside those bytes is an ASan report. The contract checked after every call:
//   - the status is one of the NVTEStatus values and equals nvte_get_last_status();
//   - NVTE_SUCCESS leaves nvte_get_last_error() == ""; an error leaves a message that starts with the
//     op's name; NVTE_ERROR_INTERNAL ("library bug") is never returned;
//   - a failed call changed no byte of any buffer (README: "nothing is written by a failed call").
// A violation prints what happened and aborts (libFuzzer keeps the input). An exhausted input reads
// as zeros, and a zero mutation byte means "leave it valid", so short seeds reach the valid paths.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "transformer_engine_lite/transformer_engine.h"

namespace fz {

// Most elements one buffer may declare; keeps every execution well under a millisecond or so.
constexpr size_t kMaxElems = 1 << 14;

[[noreturn]] inline void fail(const std::string &what) {
  std::fprintf(stderr, "\n==== fuzz contract violation: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// ---------------------------------------------------------------- input decoding
class Input {
 public:
  Input(const uint8_t *data, size_t size) : p_(data), n_(size) {}

  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  uint32_t u32() { return static_cast<uint32_t>(u16()) | (static_cast<uint32_t>(u16()) << 16); }
  uint64_t u64() { return static_cast<uint64_t>(u32()) | (static_cast<uint64_t>(u32()) << 32); }
  bool flag() { return u8() & 1; }
  // Value in [lo, hi] (one byte; hi - lo < 256 is the useful range).
  size_t range(size_t lo, size_t hi) { return lo + u8() % (hi - lo + 1); }
  size_t remaining() const { return n_ - (i_ < n_ ? i_ : n_); }

  // A float that is usually a plain value, sometimes one of the edge cases.
  float real(float plain) {
    const uint8_t k = u8();
    if (k == 0) return plain;
    static const float kEdge[] = {0.0f,
                                  -0.0f,
                                  1.0f,
                                  -1.0f,
                                  0.5f,
                                  1e-30f,
                                  1e30f,
                                  -1e30f,
                                  std::numeric_limits<float>::denorm_min(),
                                  std::numeric_limits<float>::max(),
                                  -std::numeric_limits<float>::max(),
                                  std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(),
                                  std::numeric_limits<float>::quiet_NaN(),
                                  448.0f,
                                  57344.0f,
                                  240.0f,
                                  65504.0f,
                                  3.0e38f,
                                  2.0f,
                                  0.999999f,
                                  1.0000001f};
    constexpr size_t n = sizeof(kEdge) / sizeof(kEdge[0]);
    if (k <= n) return kEdge[k - 1];
    float f;
    const uint32_t bits = u32();
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }

  // A signed 64-bit value near the interesting boundaries of window sizes, offsets and lengths.
  int64_t i64(int64_t plain) {
    const uint8_t k = u8();
    switch (k % 16) {
      case 0: return plain;
      case 1: return -1;
      case 2: return 0;
      case 3: return -2;
      case 4: return static_cast<int64_t>(u8());
      case 5: return -static_cast<int64_t>(u8()) - 1;
      case 6: return std::numeric_limits<int64_t>::max();
      case 7: return std::numeric_limits<int64_t>::min();
      case 8: return std::numeric_limits<int32_t>::max();
      case 9: return std::numeric_limits<int32_t>::min();
      case 10: return plain + 1;
      case 11: return plain - 1;
      default: return static_cast<int64_t>(u64());
    }
  }

  // An unsigned size, usually `plain`, sometimes an edge (0, 1, +-1, huge).
  size_t size(size_t plain) {
    const uint8_t k = u8();
    switch (k % 12) {
      case 0: return plain;
      case 1: return 0;
      case 2: return 1;
      case 3: return plain + 1;
      case 4: return plain ? plain - 1 : 0;
      case 5: return u8();
      case 6: return std::numeric_limits<size_t>::max();
      case 7: return size_t{1} << 31;
      case 8: return size_t{1} << 32;
      case 9: return (size_t{1} << 62) + 1;
      default: return static_cast<size_t>(u64());
    }
  }

 private:
  const uint8_t *p_;
  size_t n_;
  size_t i_ = 0;
};

// Element count with overflow detection (SIZE_MAX when the product does not fit).
inline size_t numel(const std::vector<size_t> &shape) {
  size_t n = 1;
  for (size_t d : shape) {
    if (d == 0) return 0;
  }
  for (size_t d : shape) {
    if (n > std::numeric_limits<size_t>::max() / d) return std::numeric_limits<size_t>::max();
    n *= d;
  }
  return n;
}

// Whether a shape declares a size memory can have: empty (a dim of 0), or at most PTRDIFF_MAX bytes
// of elements of `elem_bytes` (nvte_set_tensor_param rejects the rest).
inline bool size_fits(const std::vector<size_t> &shape, size_t elem_bytes) {
  for (size_t d : shape) {
    if (d == 0) return true;
  }
  const size_t limit = static_cast<size_t>(PTRDIFF_MAX) / (elem_bytes ? elem_bytes : 1);
  size_t n = 1;
  for (size_t d : shape) {
    if (n > limit / d) return false;
    n *= d;
  }
  return true;
}

// Huge dims for empty tensors ([0, huge, ...] is a valid empty tensor with any non-null pointer).
inline size_t huge_dim(Input &in) {
  static const size_t kHuge[] = {size_t{1} << 31,          (size_t{1} << 32) + 1,
                                 size_t{1} << 40,          (size_t{1} << 62) + 3,
                                 std::numeric_limits<size_t>::max(),
                                 std::numeric_limits<size_t>::max() / 2 + 1,
                                 static_cast<size_t>(std::numeric_limits<int64_t>::max()),
                                 65537};
  return kHuge[in.u8() % (sizeof(kHuge) / sizeof(kHuge[0]))];
}

// Sometimes (1 input byte in 32) turns `shape` into an empty one with a huge other dim, the same for
// every tensor of the call ([0, 2^40] and [2^40, 0] are valid empty tensors). `zero` / `huge` pick
// the dims (default: any).
inline void maybe_huge_empty(Input &in, std::vector<size_t> &shape, int zero = -1, int huge = -1) {
  if (in.u8() % 32 != 31 || shape.size() < 2) return;
  const size_t z = zero >= 0 ? static_cast<size_t>(zero) : in.u8() % shape.size();
  size_t h = huge >= 0 ? static_cast<size_t>(huge) : in.u8() % shape.size();
  if (h == z) h = (z + 1) % shape.size();
  shape[z] = 0;
  shape[h] = huge_dim(in) >> (in.u8() % 24);
}

// ---------------------------------------------------------------- memory
// Exact-size heap blocks (so ASan's redzones start right after the declared bytes) and views into
// them (overlapping arguments). Freed at the end of the input.
class Arena {
 public:
  Arena() = default;
  Arena(const Arena &) = delete;
  Arena &operator=(const Arena &) = delete;
  ~Arena() {
    for (auto &b : blocks_) std::free(b.p);
  }

  // A fresh block of `bytes` (0 allowed: a non-null pointer that must never be dereferenced; ASan
  // reports any access to a malloc(0) block).
  void *fresh(size_t bytes) {
    void *p = std::malloc(bytes);
    if (p == nullptr && bytes == 0) p = std::malloc(1);
    if (p == nullptr) fail("harness: malloc failed");
    blocks_.push_back({static_cast<uint8_t *>(p), bytes});
    return p;
  }

  // `bytes` at an 8-byte aligned offset of an existing block chosen by the input, if one is large
  // enough; otherwise a fresh block. Used to make arguments overlap.
  void *inside(Input &in, size_t bytes) {
    if (blocks_.empty()) return fresh(bytes);
    const size_t start = in.u8() % blocks_.size();
    for (size_t j = 0; j < blocks_.size(); ++j) {
      const Block &b = blocks_[(start + j) % blocks_.size()];
      if (b.n < bytes) continue;
      const size_t slots = (b.n - bytes) / 8 + 1;
      return b.p + 8 * (in.u8() % slots);
    }
    return fresh(bytes);
  }

  // Fills a block's bytes from the input's fill mode: 0 small values, 1 edge values, 2 raw bytes.
  static void fill(Input &in, void *p, size_t bytes, NVTEDType dtype);

  void snapshot() {
    saved_.clear();
    for (const Block &b : blocks_) saved_.emplace_back(b.p, b.p + b.n);
  }
  // Index of the first block whose bytes differ from the snapshot, or -1.
  int changed_block() const {
    for (size_t i = 0; i < saved_.size() && i < blocks_.size(); ++i) {
      if (blocks_[i].n && std::memcmp(saved_[i].data(), blocks_[i].p, blocks_[i].n) != 0) {
        return static_cast<int>(i);
      }
    }
    return -1;
  }

 private:
  struct Block {
    uint8_t *p;
    size_t n;
  };
  std::vector<Block> blocks_;
  std::vector<std::vector<uint8_t>> saved_;
};

inline uint16_t f32_to_half_bits(float f, bool bf16) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (bf16) return static_cast<uint16_t>(u >> 16);
  // Crude but total fp16 conversion (sign, clamped exponent, truncated mantissa; NaN kept).
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((u >> 23) & 0xFF) - 127 + 15;
  const uint32_t man = (u >> 13) & 0x3FFu;
  if (((u >> 23) & 0xFF) == 0xFF) return static_cast<uint16_t>(sign | 0x7C00u | (man ? 0x200u : 0));
  if (exp <= 0) return static_cast<uint16_t>(sign);
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | man);
}

inline void Arena::fill(Input &in, void *p, size_t bytes, NVTEDType dtype) {
  uint8_t *b = static_cast<uint8_t *>(p);
  const uint8_t mode = in.u8() % 4;
  uint32_t state = 0x9E3779B9u ^ in.u8();  // fixed generator: inputs replay bit-exactly
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  };
  if (mode == 3) {  // raw bytes of the generator: any bit pattern (NaN payloads, FP8 NaNs, ...)
    for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(next());
    return;
  }
  auto value = [&]() -> float {
    const uint32_t r = next();
    if (mode == 1 && r % 7 == 0) {
      static const float kEdge[] = {std::numeric_limits<float>::infinity(),
                                    -std::numeric_limits<float>::infinity(),
                                    std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 1e30f,
                                    -3e38f, 1e-40f, 65504.0f, 448.0f};
      return kEdge[(r >> 8) % (sizeof(kEdge) / sizeof(kEdge[0]))];
    }
    if (mode == 2) return 0.0f;
    return (static_cast<float>(r % 2001) - 1000.0f) / 250.0f;  // [-4, 4]
  };
  switch (dtype) {
    case kNVTEFloat32:
      for (size_t i = 0; i + 4 <= bytes; i += 4) {
        const float v = value();
        std::memcpy(b + i, &v, 4);
      }
      break;
    case kNVTEFloat16:
    case kNVTEBFloat16:
      for (size_t i = 0; i + 2 <= bytes; i += 2) {
        const uint16_t h = f32_to_half_bits(value(), dtype == kNVTEBFloat16);
        std::memcpy(b + i, &h, 2);
      }
      break;
    case kNVTEFloat8E8M0:  // block scales: mostly around 2^0
      for (size_t i = 0; i < bytes; ++i) {
        b[i] = mode == 1 ? static_cast<uint8_t>(next()) : static_cast<uint8_t>(120 + next() % 16);
      }
      break;
    default:  // FP8 codes, bytes, integers: small bytes (int32 tensors get explicit values)
      for (size_t i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(next() & 0x3F);
      break;
  }
}

// ---------------------------------------------------------------- tensor handles
// One buffer of a handle, as the harness intends it before mutation.
struct Buf {
  NVTETensorParam param;
  NVTEDType dtype;
  std::vector<size_t> shape;
  // Value to store when the buffer is an fp32 scalar (scale, scale_inv, amax); NaN = fill normally.
  float scalar = std::numeric_limits<float>::quiet_NaN();
  // Described without memory (a NULL data pointer), e.g. a dtype-only row-wise description.
  bool no_data = false;
};

inline size_t dsize(NVTEDType t) {
  switch (t) {
    case kNVTEByte: case kNVTEFloat8E4M3: case kNVTEFloat8E5M2: case kNVTEFloat8E8M0:
    case kNVTEFloat8E4M3FNUZ: case kNVTEFloat8E5M2FNUZ: return 1;
    case kNVTEInt16: case kNVTEFloat16: case kNVTEBFloat16: return 2;
    case kNVTEInt32: case kNVTEFloat32: return 4;
    case kNVTEInt64: return 8;
    default: return 0;
  }
}

// Field-wise equality of two buffer descriptions (the struct has padding).
inline bool same_param(const NVTEBasicTensor &a, const NVTEBasicTensor &b) {
  if (a.data_ptr != b.data_ptr || a.dtype != b.dtype || a.shape.ndim != b.shape.ndim) return false;
  for (size_t i = 0; i < a.shape.ndim && i < NVTE_MAX_NDIM; ++i) {
    if (a.shape.data[i] != b.shape.data[i]) return false;
  }
  return true;
}

// NVTE_FUZZ_STATS=1: per-op counts of each status, printed at exit (ci/fuzz.sh replays the committed
// corpus with it to show which ops it reaches with valid calls); 2: also one line per call
// (tests/fuzz/make_corpus.py).
class Stats {
 public:
  static Stats &get() {
    static Stats s;
    return s;
  }
  void add(const char *op, NVTEStatus st) {
    if (!on_) return;
    auto &c = counts_[op];
    c[static_cast<int>(st) & 3] += 1;
    if (per_call_) std::fprintf(stderr, "fuzz-call %s %d\n", op, static_cast<int>(st));
  }
  ~Stats() {
    if (!on_) return;
    for (const auto &[op, c] : counts_) {
      std::fprintf(stderr, "fuzz-stats %s: %zu ok, %zu invalid, %zu unsupported\n", op.c_str(), c[0],
                   c[1], c[2]);
    }
  }

 private:
  Stats() {
    const char *v = std::getenv("NVTE_FUZZ_STATS");
    on_ = v != nullptr && (std::string(v) == "1" || std::string(v) == "2");
    per_call_ = on_ && std::string(v) == "2";
  }
  bool on_ = false, per_call_ = false;
  std::map<std::string, std::array<size_t, 4>> counts_;
};

// Every handle and buffer of one input; destroys the handles at the end.
class Ctx {
 public:
  explicit Ctx(Input &in) : in_(in) {}
  Ctx(const Ctx &) = delete;
  Ctx &operator=(const Ctx &) = delete;
  ~Ctx() {
    for (NVTETensor t : handles_) nvte_destroy_tensor(t);
  }

  Input &in() { return in_; }
  Arena &arena() { return arena_; }
  // Takes ownership of a handle the harness made itself (destroyed with the others).
  void adopt(NVTETensor t) {
    if (t == nullptr) fail("nvte_create_tensor returned NULL");
    handles_.push_back(t);
  }

  // A handle with the given buffers, each possibly mutated by the input (one mutation byte per
  // buffer and one per handle; 0 = as described). May return NULL (a mutation) — every op must
  // reject a NULL handle where it needs one.
  NVTETensor tensor(NVTEScalingMode mode, std::vector<Buf> bufs) {
    const uint8_t tm = in_.u8();
    switch (tm % 16) {
      case 1: return nullptr;
      case 2: mode = static_cast<NVTEScalingMode>(in_.u8() % 3 == 0 ? 100 : in_.u8() % 4); break;
      case 3: if (!bufs.empty()) bufs.erase(bufs.begin() + in_.u8() % bufs.size()); break;
      case 4: {  // an extra buffer the op does not expect
        const NVTETensorParam p = static_cast<NVTETensorParam>(in_.u8() % kNVTENumTensorParams);
        bufs.push_back({p, static_cast<NVTEDType>(in_.u8() % kNVTENumTypes), {in_.range(0, 4)}});
        break;
      }
      default: break;
    }
    NVTETensor t = nvte_create_tensor(mode);
    if (t == nullptr) fail("nvte_create_tensor returned NULL");
    handles_.push_back(t);
    if (tm % 16 == 5) expect_ok("nvte_set_tensor_device", nvte_set_tensor_device(t, kNVTEDeviceGPU));
    for (Buf &b : bufs) set(t, b);
    return t;
  }

  // Sets one buffer, applying its mutation; the buffer is allocated after the mutation so its
  // memory matches the declared shape and dtype.
  void set(NVTETensor t, Buf b) {
    const uint8_t m = in_.u8();
    const std::vector<size_t> original_shape = b.shape;
    bool null_ptr = b.no_data, overlap = false, alias = false;
    size_t bad_ndim = 0;  // > NVTE_MAX_NDIM when the mutation declares too many dims
    bool wraps = false;   // the declared element count does not fit in size_t
    switch (m % 24) {
      case 0: break;
      case 1: null_ptr = !b.no_data; break;
      case 2: {  // one dim changed, or one appended
        const size_t i = in_.u8() % (b.shape.size() + 1);
        const size_t v = in_.range(0, 5) == 0 ? in_.range(0, 70) : in_.range(0, 3);
        if (i == b.shape.size()) b.shape.push_back(v);
        else b.shape[i] = in_.flag() ? v : b.shape[i] + (in_.flag() ? 1 : size_t(-1));
        break;
      }
      case 3:
        if (!b.shape.empty()) b.shape.erase(b.shape.begin() + in_.u8() % b.shape.size());
        break;
      case 4: b.dtype = static_cast<NVTEDType>(in_.u8() % (kNVTENumTypes + 1)); break;
      case 5: overlap = true; break;
      case 6: alias = true; break;
      case 7: {  // empty, with a huge dim elsewhere
        if (b.shape.empty()) b.shape.push_back(0);
        const size_t z = in_.u8() % b.shape.size();
        b.shape[z] = 0;
        b.shape[in_.u8() % b.shape.size()] = huge_dim(in_);
        b.shape[z] = 0;
        break;
      }
      case 8: bad_ndim = NVTE_MAX_NDIM + 1 + in_.u8() % 4; break;
      case 9: b.dtype = static_cast<NVTEDType>(static_cast<int>(in_.u32())); break;
      case 10: b.shape.clear(); break;  // a 0-d tensor (one element)
      case 11: b.scalar = in_.real(1.0f); break;
      case 12:  // dims whose product overflows size_t (wrapping to twice the real count)
        if (!b.shape.empty() && numel(b.shape) > 0) {
          b.shape[0] += size_t{1} << 63;
          b.shape.push_back(2);
          wraps = true;
        }
        break;
      default: break;  // most bytes: unchanged (the valid path stays likely under mutation)
    }
    size_t n = numel(b.shape);
    if (wraps) {
      if (b.shape.size() > NVTE_MAX_NDIM) {
        b.shape = original_shape;
        wraps = false;
      }
      n = wraps ? 2 * numel(original_shape) : numel(b.shape);  // what a wrapping product gives
    }
    if (!wraps && n > kMaxElems) {  // a mutation asked for more memory than a run should take: undo it
      b.shape = original_shape;
      n = numel(b.shape);
      if (n > kMaxElems) fail("harness: a buffer of more than kMaxElems elements");
    }
    const size_t es = dsize(b.dtype);
    const size_t bytes = n * (es ? es : 1);
    void *p = nullptr;
    size_t alias_idx = 0;
    if (!null_ptr) {
      if (overlap) {
        p = arena_.inside(in_, bytes);
      } else if (alias && !ptrs_.empty() &&
                 ptrs_[alias_idx = ptrs_.size() - 1 - in_.u8() % ptrs_.size()].second >= bytes) {
        p = ptrs_[alias_idx].first;  // the very memory of an earlier buffer (in-place)
      } else {
        p = arena_.fresh(bytes);
        Arena::fill(in_, p, bytes, b.dtype);
        if (b.dtype == kNVTEFloat32 && n == 1 && b.scalar == b.scalar) std::memcpy(p, &b.scalar, 4);
      }
      ptrs_.emplace_back(p, bytes);
    }
    NVTEBasicTensor bt;
    std::memset(&bt, 0, sizeof(bt));
    bt.data_ptr = p;
    bt.dtype = b.dtype;
    const size_t ndim = bad_ndim ? bad_ndim : b.shape.size();
    bt.shape.ndim = ndim;
    for (size_t i = 0; i < b.shape.size() && i < NVTE_MAX_NDIM; ++i) bt.shape.data[i] = b.shape[i];
    const NVTEBasicTensor before = nvte_get_tensor_param(t, b.param);
    const NVTEStatus st = nvte_set_tensor_param(&t, b.param, &bt);
    const bool valid = static_cast<int>(b.dtype) >= 0 && b.dtype < kNVTENumTypes &&
                       ndim <= NVTE_MAX_NDIM && size_fits(b.shape, dsize(b.dtype));
    if (valid) {
      expect_ok("nvte_set_tensor_param", st);
      const NVTEBasicTensor got = nvte_get_tensor_param(t, b.param);
      if (got.data_ptr != p || got.dtype != b.dtype || got.shape.ndim != b.shape.size()) {
        fail("nvte_get_tensor_param does not return what nvte_set_tensor_param stored");
      }
    } else {
      expect_error("nvte_set_tensor_param", st);
      const NVTEBasicTensor got = nvte_get_tensor_param(t, b.param);
      if (!same_param(got, before)) fail("a failed nvte_set_tensor_param changed the handle");
    }
  }

  // An int32 [n] buffer with the given values (cu_seqlens), possibly mutated like any buffer.
  NVTETensor int32_tensor(const std::vector<int32_t> &vals) {
    NVTETensor t = tensor(NVTE_DELAYED_TENSOR_SCALING,
                          {Buf{kNVTERowwiseData, kNVTEInt32, {vals.size()}}});
    if (t == nullptr) return t;
    const NVTEBasicTensor bt = nvte_get_tensor_param(t, kNVTERowwiseData);
    if (bt.data_ptr != nullptr && bt.dtype == kNVTEInt32 && bt.shape.ndim == 1 &&
        bt.shape.data[0] == vals.size() && !vals.empty()) {
      std::memcpy(bt.data_ptr, vals.data(), vals.size() * 4);
    }
    return t;
  }

  // ---- the contract
  static void expect_ok(const char *op, NVTEStatus st) {
    if (st != NVTE_SUCCESS) {
      fail(std::string(op) + " failed on a valid call: " + nvte_get_last_error());
    }
    check_status(op, st);
  }
  static void expect_error(const char *op, NVTEStatus st) {
    if (st == NVTE_SUCCESS) fail(std::string(op) + " accepted an invalid call");
    check_status(op, st);
  }
  // Status, message and last-status agree (see the file comment).
  static void check_status(const char *op, NVTEStatus st) {
    const int s = static_cast<int>(st);
    if (s < NVTE_SUCCESS || s > NVTE_ERROR_INTERNAL) {
      fail(std::string(op) + " returned status " + std::to_string(s) + ", not an NVTEStatus");
    }
    if (nvte_get_last_status() != st) {
      fail(std::string(op) + ": nvte_get_last_status() " +
           std::to_string(static_cast<int>(nvte_get_last_status())) + " != returned " +
           std::to_string(s));
    }
    Stats::get().add(op, st);
    const char *msg = nvte_get_last_error();
    if (msg == nullptr) fail(std::string(op) + ": nvte_get_last_error() returned NULL");
    const std::string m = msg;
    if (st == NVTE_SUCCESS) {
      if (!m.empty()) fail(std::string(op) + " succeeded but left the message '" + m + "'");
      return;
    }
    if (m.rfind(std::string(op) + ": ", 0) != 0 || m.size() <= std::strlen(op) + 2) {
      fail(std::string(op) + " failed (status " + std::to_string(s) +
           ") with a message that does not name it: '" + m + "'");
    }
    if (st == NVTE_ERROR_INTERNAL) fail(std::string(op) + " reported an internal error: " + m);
  }

  // Runs one op: snapshot, call, contract. Returns the status.
  template <typename F>
  NVTEStatus call(const char *op, F &&f) {
    arena_.snapshot();
    const NVTEStatus st = f();
    check_status(op, st);
    if (st != NVTE_SUCCESS) {
      const int blk = arena_.changed_block();
      if (blk >= 0) {
        fail(std::string(op) + " failed ('" + nvte_get_last_error() + "') but wrote into buffer " +
             std::to_string(blk));
      }
    }
    return st;
  }

 private:
  Input &in_;
  Arena arena_;
  std::vector<NVTETensor> handles_;
  std::vector<std::pair<void *, size_t>> ptrs_;
};

// The FP8 dtypes, the high-precision ones, and a pick from each.
constexpr NVTEDType kFp8[] = {kNVTEFloat8E4M3, kNVTEFloat8E5M2, kNVTEFloat8E4M3FNUZ,
                              kNVTEFloat8E5M2FNUZ};
constexpr NVTEDType kHp[] = {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16};
inline NVTEDType pick_fp8(Input &in) { return kFp8[in.u8() % 4]; }
inline NVTEDType pick_hp(Input &in) { return kHp[in.u8() % 3]; }

// The buffers of an output in one of the encodings an FP8-capable op writes, for a result of
// row-wise shape `shape` (2-D view: leading dims into rows): plain HP, per-tensor FP8 (scale, amax,
// scale_inv, optional transposed copy) or MXFP8 (row-wise and/or column-wise with E8M0 scales).
struct OutputChoice {
  NVTEScalingMode mode;
  std::vector<Buf> bufs;
};
inline OutputChoice output_buffers(Input &in, const std::vector<size_t> &shape) {
  size_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  const size_t cols = shape.empty() ? 1 : shape.back();
  const uint8_t kind = in.u8() % 6;
  OutputChoice o{NVTE_DELAYED_TENSOR_SCALING, {}};
  if (kind <= 1) {  // plain high precision (+ optional amax)
    o.bufs.push_back({kNVTERowwiseData, pick_hp(in), shape});
    if (kind == 1) o.bufs.push_back({kNVTEAmax, kNVTEFloat32, {1}});
    return o;
  }
  if (kind <= 3) {  // per-tensor FP8
    const NVTEDType t = pick_fp8(in);
    const uint8_t parts = in.u8();
    if (!(parts & 4)) o.bufs.push_back({kNVTERowwiseData, t, shape});
    if ((parts & 1) || (parts & 4)) o.bufs.push_back({kNVTEColumnwiseData, t, {cols, rows}});
    o.bufs.push_back({kNVTEScale, kNVTEFloat32, {1}, in.real(2.0f)});
    if (!(parts & 2)) o.bufs.push_back({kNVTEAmax, kNVTEFloat32, {1}, 0.0f});
    if (!(parts & 8)) o.bufs.push_back({kNVTERowwiseScaleInv, kNVTEFloat32, {1}});
    return o;
  }
  // MXFP8
  o.mode = NVTE_MXFP8_1D_SCALING;
  const NVTEDType t = pick_fp8(in);
  const uint8_t parts = in.u8() % 3;  // 0 row-wise, 1 column-wise, 2 both
  if (parts != 1) {
    o.bufs.push_back({kNVTERowwiseData, t, shape});
    o.bufs.push_back({kNVTERowwiseScaleInv, kNVTEFloat8E8M0, {rows, (cols + 31) / 32}});
  }
  if (parts != 0) {
    o.bufs.push_back({kNVTEColumnwiseData, t, shape});
    o.bufs.push_back({kNVTEColumnwiseScaleInv, kNVTEFloat8E8M0, {(rows + 31) / 32, cols}});
  }
  return o;
}

// A small shape of `ndim` dims in [lo, hi] each, total elements capped.
inline std::vector<size_t> small_shape(Input &in, size_t ndim, size_t lo, size_t hi) {
  std::vector<size_t> s(ndim);
  size_t total = 1;
  for (size_t i = 0; i < ndim; ++i) {
    s[i] = in.range(lo, hi);
    if (s[i] && total * s[i] > 4096) s[i] = lo;
    total *= s[i] ? s[i] : 1;
  }
  return s;
}

}  // namespace fz
