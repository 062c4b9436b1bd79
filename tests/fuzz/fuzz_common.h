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

#include "fuzz_input.h"

namespace fz {

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
