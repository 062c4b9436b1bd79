// OutputEmitter: validation of FP8-capable outputs and the fp32 -> output-dtype row writers.
#include "emit_cpu.h"

#include <algorithm>
#include <cstring>

#include "mx_scale.h"
#include "transpose_tile.h"

namespace nvte {

// ---------------------------------------------------------------- row conversion
template <typename T>
NVTE_CPU_KERNEL void load_row_impl(const T *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}
template <typename T>
NVTE_CPU_KERNEL void store_row_impl(const float *src, T *dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = from_float<T>(src[i]);
}

// n == 0 returns before memcpy: an empty row may come with null pointers (an empty std::vector's
// data()), and memcpy's pointers must be valid even for 0 bytes (UBSan: nonnull-attribute).
template <typename T>
void load_row(const T *src, float *dst, size_t n) {
  if (n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    NVTE_CPU_DISPATCH(load_row_impl(src, dst, n));
  }
}
template <typename T>
void store_row(const float *src, T *dst, size_t n) {
  if (n == 0) return;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    NVTE_CPU_DISPATCH(store_row_impl(src, dst, n));
  }
}

#define NVTE_INSTANTIATE_ROW_IO(T)                          \
  template void load_row<T>(const T *, float *, size_t); \
  template void store_row<T>(const float *, T *, size_t);
NVTE_INSTANTIATE_ROW_IO(float)
NVTE_INSTANTIATE_ROW_IO(fp16)
NVTE_INSTANTIATE_ROW_IO(bf16)
NVTE_INSTANTIATE_ROW_IO(fp8e4m3)
NVTE_INSTANTIATE_ROW_IO(fp8e5m2)
NVTE_INSTANTIATE_ROW_IO(fp8e4m3fnuz)
NVTE_INSTANTIATE_ROW_IO(fp8e5m2fnuz)
#undef NVTE_INSTANTIATE_ROW_IO

namespace {

// Max |v| over v[0, n) as the integer max of the magnitude bits: positive floats order like their
// bit patterns and every NaN pattern lies above +Inf's, so one vectorizable integer max (vpmaxud)
// gives both the amax and the NaN flag; a float compare-select reduction does not vectorize
// without -ffast-math.
inline uint32_t amax_bits(const float *v, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t a = float_bits(v[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return m;
}

inline AbsMax absmax_from_bits(uint32_t m) {
  AbsMax r;
  r.nan = m > 0x7F800000u;
  r.m = r.nan ? 0.0f : bits_float(m);
  return r;
}

NVTE_CPU_KERNEL AbsMax absmax_row(const float *v, size_t n) {
  return absmax_from_bits(amax_bits(v, n));
}

// q[i] = encode(v[i] * scale), returning max |v| (taken before scaling) from the same pass: one
// read of the block instead of two.
template <typename OType>
NVTE_CPU_KERNEL AbsMax scale_encode_row(const float *v, OType *q, size_t n, float scale) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t a = float_bits(v[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
    q[i] = from_float<OType>(v[i] * scale);
  }
  return absmax_from_bits(m);
}

// q[i] = encode(v[i] * mult[i])
template <typename OType>
NVTE_CPU_KERNEL void mul_encode_row(const float *v, const float *mult, OType *q, size_t n) {
  for (size_t i = 0; i < n; ++i) q[i] = from_float<OType>(v[i] * mult[i]);
}

// Scales of the row-wise blocks of one row, and each element's multiplier 1 / scale (exact: a power
// of two) expanded into mult[0, cols).
template <typename OType>
NVTE_CPU_KERNEL void mx_row_scales(const float *v, size_t cols, uint8_t *scales, float *mult) {
  constexpr size_t kB = OutputEmitter::kBlock;
  size_t c0 = 0;
  for (; c0 + kB <= cols; c0 += kB) {  // fixed trip counts vectorize without remainder code
    const uint8_t s = mx_scale_byte<OType>(amax_bits(v + c0, kB));
    scales[c0 / kB] = s;
    const float m = e8m0_inverse_to_float(s);
    for (size_t i = 0; i < kB; ++i) mult[c0 + i] = m;
  }
  if (c0 < cols) {
    const uint8_t s = mx_scale_byte<OType>(amax_bits(v + c0, cols - c0));
    scales[c0 / kB] = s;
    const float m = e8m0_inverse_to_float(s);
    for (size_t c = c0; c < cols; ++c) mult[c] = m;
  }
}

// MXFP8 row-wise: one E8M0 scale per 32 consecutive elements of each row. Per row: block scales,
// then one long encode loop with the expanded multipliers, which runs at full vector width (bf16
// 8192x4096 on one core: 12 ms, against 35 ms block by block with the encode inside).
template <typename OType>
void mx_rowwise(const float *vals, size_t nrows, size_t cols, OType *q, uint8_t *scales,
                size_t scale_cols) {
  thread_local std::vector<float> mult;
  mult.resize(cols);
  for (size_t r = 0; r < nrows; ++r) {
    NVTE_CPU_DISPATCH(
        mx_row_scales<OType>(vals + r * cols, cols, scales + r * scale_cols, mult.data()));
    NVTE_CPU_DISPATCH(mul_encode_row(vals + r * cols, mult.data(), q + r * cols, cols));
  }
}

// MXFP8 column-wise: one E8M0 scale per 32 consecutive rows of each column (a whole block of rows).
// Column amaxes are running integer maxima of the magnitude bits (NaN patterns sort above Inf).
template <typename OType>
NVTE_CPU_KERNEL void mx_colwise(const float *vals, size_t nrows, size_t cols, OType *q,
                                uint8_t *scales) {
  thread_local std::vector<uint32_t> amax;
  thread_local std::vector<float> mult;
  amax.assign(cols, 0u);
  mult.resize(cols);
  uint32_t *am = amax.data();
  float *mu = mult.data();
  for (size_t r = 0; r < nrows; ++r) {  // element-wise maxima across rows: vectorizes over c
    const float *v = vals + r * cols;
    for (size_t c = 0; c < cols; ++c) {
      const uint32_t a = float_bits(v[c]) & 0x7FFFFFFFu;
      am[c] = a > am[c] ? a : am[c];
    }
  }
  for (size_t c = 0; c < cols; ++c) {
    const uint8_t s = mx_scale_byte<OType>(am[c]);
    scales[c] = s;
    mu[c] = e8m0_inverse_to_float(s);
  }
  for (size_t r = 0; r < nrows; ++r) {
    const float *v = vals + r * cols;
    OType *out = q + r * cols;
    for (size_t c = 0; c < cols; ++c) out[c] = from_float<OType>(v[c] * mu[c]);
  }
}

// dst[c * ld + r] = src[r * cols + c] for a block of nrows (<= 32) encoded rows. Bytes, not values:
// the transposed copy is the row-wise encoding moved, so both copies agree by construction.
NVTE_CPU_KERNEL void transpose_bytes(const uint8_t *src, size_t nrows, size_t cols, uint8_t *dst,
                                     size_t ld) {
  transpose_rect<uint8_t, OutputEmitter::kBlock, 64>(src, cols, nrows, 0, cols, dst, ld);
}

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace

// ---------------------------------------------------------------- construction
OutputEmitter::OutputEmitter(const Tensor &out, const OutputSpec &spec)
    : out_(out),
      rows_(spec.rows),
      cols_(spec.cols),
      fp8_(spec.fp8),
      mx_(spec.mx),
      rowwise_(spec.rowwise),
      colwise_(spec.colwise) {
  // Host memory only: CPU kernels read the per-tensor scale once here.
  if (fp8_ && !mx_) scale_ = *out.scale.ptr<const float>();
}

OutputEmitter::OutputEmitter(const Tensor &out, const char *arg, const std::vector<size_t> &shape)
    : OutputEmitter(out, validate_output(out, arg, shape)) {}

// ---------------------------------------------------------------- writers
AbsMax OutputEmitter::emit(const float *vals, size_t row0, size_t nrows) const {
  AbsMax amax;
  // amax is recorded whenever the output has an amax buffer (FP8 or not, so a bf16 producer can feed
  // current scaling); per-tensor FP8 takes it in the encoding pass below.
  if (out_.amax.has_data() && !(fp8_ && !mx_)) amax = NVTE_CPU_DISPATCH(
      absmax_row(vals, nrows * cols_));
  const DType t = rowwise_ ? out_.data.dtype : out_.columnwise_data.dtype;
  dispatch_dtype<OutputTypes>(t, "output", [&](auto tag) {
    using OType = typename decltype(tag)::type;
    if constexpr (!is_fp8_v<OType>) {
      OType *dst = out_.data.ptr<OType>() + row0 * cols_;
      store_row(vals, dst, nrows * cols_);
    } else if (mx_) {
      if (rowwise_) {
        const size_t sc = ceil_div(cols_, kBlock);
        mx_rowwise(vals, nrows, cols_, out_.data.ptr<OType>() + row0 * cols_,
                   out_.scale_inv.ptr<uint8_t>() + row0 * sc, sc);
      }
      if (colwise_) {
        NVTE_CPU_DISPATCH(
            mx_colwise(vals, nrows, cols_, out_.columnwise_data.ptr<OType>() + row0 * cols_,
                       out_.columnwise_scale_inv.ptr<uint8_t>() + (row0 / kBlock) * cols_));
      }
    } else {
      // Encode the block row-major once (into the output, or into scratch when only the transposed
      // copy is wanted), then move its bytes: a strided encode of each column would gather.
      thread_local std::vector<OType> scratch;
      // No offset is applied to an absent (null) row-wise buffer: that is UB even if unused.
      OType *q = rowwise_ ? out_.data.ptr<OType>() + row0 * cols_ : nullptr;
      if (!rowwise_) {
        scratch.resize(nrows * cols_);
        q = scratch.data();
      }
      amax = NVTE_CPU_DISPATCH(scale_encode_row(vals, q, nrows * cols_, scale_));
      if (colwise_) {
        // Column c of this row block becomes a contiguous run of row c of the transposed copy.
        NVTE_CPU_DISPATCH(
            transpose_bytes(reinterpret_cast<const uint8_t *>(q), nrows, cols_,
                            reinterpret_cast<uint8_t *>(out_.columnwise_data.ptr<OType>()) + row0,
                            rows_));
      }
    }
  });
  return amax;
}

void OutputEmitter::finish(const AbsMax &amax) const {
  if (out_.amax.has_data()) *out_.amax.ptr<float>() = amax.value();
  if (fp8_ && !mx_ && out_.scale_inv.has_data()) *out_.scale_inv.ptr<float>() = 1.0f / scale_;
}

}  // namespace nvte
