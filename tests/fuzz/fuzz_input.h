// Input decoding and memory of the libFuzzer harnesses (fuzz_common.h includes this): the byte
// reader every decision comes from, shape helpers, and the arena of exactly-sized heap blocks whose
// bounds ASan watches.
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

}  // namespace fz
