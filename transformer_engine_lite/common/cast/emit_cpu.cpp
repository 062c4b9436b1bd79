// OutputEmitter: validation of FP8-capable outputs and the fp32 -> output-dtype row writers.
#include "emit_cpu.h"

#include <algorithm>
#include <cstring>

namespace nvte {

// ---------------------------------------------------------------- row conversion
template <typename T>
NVTE_CPU_CLONES void load_row_impl(const T *src, float *dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}
template <typename T>
NVTE_CPU_CLONES void store_row_impl(const float *src, T *dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = from_float<T>(src[i]);
}

template <typename T>
void load_row(const T *src, float *dst, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    load_row_impl(src, dst, n);
  }
}
template <typename T>
void store_row(const float *src, T *dst, size_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    store_row_impl(src, dst, n);
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

NVTE_CPU_CLONES AbsMax absmax_row(const float *v, size_t n) {
  float m = 0.0f;
  bool nan = false;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    m = a > m ? a : m;
    nan |= v[i] != v[i];
  }
  AbsMax r;
  r.m = m;
  r.nan = nan;
  return r;
}

// q[i] = encode(v[i] * scale)
template <typename OType>
NVTE_CPU_CLONES void scale_encode_row(const float *v, OType *q, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) q[i] = from_float<OType>(v[i] * scale);
}

template <typename OType>
uint8_t mx_scale_byte(float block_amax) {
  using F = typename Fp8Traits<OType>::format;
  return e8m0_ceil_from_float(block_amax / fp8_max_value<F>());
}

// MXFP8 row-wise: one E8M0 scale per 32 consecutive elements of each row.
template <typename OType>
void mx_rowwise(const float *vals, size_t nrows, size_t cols, OType *q, uint8_t *scales,
                size_t scale_cols) {
  for (size_t r = 0; r < nrows; ++r) {
    const float *v = vals + r * cols;
    for (size_t c0 = 0, b = 0; c0 < cols; c0 += OutputEmitter::kBlock, ++b) {
      const size_t n = std::min(OutputEmitter::kBlock, cols - c0);
      const uint8_t s = mx_scale_byte<OType>(absmax_row(v + c0, n).value());
      scales[r * scale_cols + b] = s;
      scale_encode_row(v + c0, q + r * cols + c0, n, e8m0_inverse_to_float(s));
    }
  }
}

// MXFP8 column-wise: one E8M0 scale per 32 consecutive rows of each column (a whole block of rows).
template <typename OType>
void mx_colwise(const float *vals, size_t nrows, size_t cols, OType *q, uint8_t *scales) {
  std::vector<float> amax(cols, 0.0f);
  std::vector<uint8_t> nan(cols, 0);
  for (size_t r = 0; r < nrows; ++r) {
    const float *v = vals + r * cols;
    for (size_t c = 0; c < cols; ++c) {
      const float a = std::fabs(v[c]);
      amax[c] = a > amax[c] ? a : amax[c];
      nan[c] |= v[c] != v[c];
    }
  }
  std::vector<float> mult(cols);
  for (size_t c = 0; c < cols; ++c) {
    const uint8_t s = mx_scale_byte<OType>(nan[c] ? NAN : amax[c]);
    scales[c] = s;
    mult[c] = e8m0_inverse_to_float(s);
  }
  for (size_t r = 0; r < nrows; ++r) {
    const float *v = vals + r * cols;
    OType *out = q + r * cols;
    for (size_t c = 0; c < cols; ++c) out[c] = from_float<OType>(v[c] * mult[c]);
  }
}

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace

// ---------------------------------------------------------------- validation
OutputEmitter::OutputEmitter(const Tensor &out, const char *arg, const std::vector<size_t> &shape)
    : out_(out) {
  SimpleTensor view;
  view.shape = shape;
  rows_ = view.rows();
  cols_ = view.cols();
  const bool has_row = out.data.has_data(), has_col = out.columnwise_data.has_data();
  NVTE_CHECK(has_row || has_col, "argument '", arg,
             "': expected row-wise and/or column-wise data, got neither (null pointers)");
  const DType t = has_row ? out.data.dtype : out.columnwise_data.dtype;
  fp8_ = nvte::is_fp8(t);
  if (out.amax.has_data()) check_fp32_scalar(out.amax, arg, "amax");

  if (out.scaling_mode == NVTE_MXFP8_1D_SCALING) {
    NVTE_CHECK(fp8_, "argument '", arg, "': expected an FP8 dtype with MXFP8 scaling, got ",
               dtype_name(t));
    mx_ = true;
    if (has_row) {
      check_shape(out.data, arg, shape);
      NVTE_CHECK(out.scale_inv.has_data(), "argument '", arg,
                 "': expected row-wise E8M0 scale_inv for MXFP8 row-wise data, got a null pointer");
      check_dtype(out.scale_inv, arg, {kNVTEFloat8E8M0, kNVTEByte});
      NVTE_CHECK(out.scale_inv.shape == std::vector<size_t>({rows_, ceil_div(cols_, kBlock)}),
                 "argument '", arg, "': expected row-wise scale_inv shape ",
                 shape_str({rows_, ceil_div(cols_, kBlock)}), ", got ",
                 shape_str(out.scale_inv.shape));
      rowwise_ = true;
    }
    if (has_col) {
      check_shape(out.columnwise_data, arg, shape);
      NVTE_CHECK(!has_row || out.columnwise_data.dtype == t, "argument '", arg,
                 "': expected column-wise data of dtype ", dtype_name(t), ", got ",
                 dtype_name(out.columnwise_data.dtype));
      NVTE_CHECK(out.columnwise_scale_inv.has_data(), "argument '", arg,
                 "': expected column-wise E8M0 scale_inv for MXFP8 column-wise data, got a null "
                 "pointer");
      check_dtype(out.columnwise_scale_inv, arg, {kNVTEFloat8E8M0, kNVTEByte});
      NVTE_CHECK(
          out.columnwise_scale_inv.shape == std::vector<size_t>({ceil_div(rows_, kBlock), cols_}),
          "argument '", arg, "': expected column-wise scale_inv shape ",
          shape_str({ceil_div(rows_, kBlock), cols_}), ", got ",
          shape_str(out.columnwise_scale_inv.shape));
      colwise_ = true;
    }
    return;
  }

  NVTE_CHECK(out.scaling_mode == NVTE_DELAYED_TENSOR_SCALING, "argument '", arg,
             "': expected scaling mode NVTE_DELAYED_TENSOR_SCALING or NVTE_MXFP8_1D_SCALING, got ",
             static_cast<int>(out.scaling_mode));
  if (!fp8_) {
    NVTE_CHECK(has_row, "argument '", arg, "': expected row-wise data for a ", dtype_name(t),
               " output, got only column-wise data");
    check_dtype(out.data, arg, {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
    check_shape(out.data, arg, shape);
    NVTE_CHECK(!has_col, "argument '", arg,
               "': column-wise data is only produced for FP8 outputs, got a ", dtype_name(t),
               " output with column-wise data");
    rowwise_ = true;
    return;
  }
  check_fp32_scalar(out.scale, arg, "scale");
  if (out.scale_inv.has_data()) check_fp32_scalar(out.scale_inv, arg, "scale_inv");
  if (has_row) {
    check_shape(out.data, arg, shape);
    rowwise_ = true;
  }
  if (has_col) {
    NVTE_CHECK(out.columnwise_data.dtype == t, "argument '", arg,
               "': expected column-wise data of dtype ", dtype_name(t), ", got ",
               dtype_name(out.columnwise_data.dtype));
    NVTE_CHECK(out.columnwise_data.shape == std::vector<size_t>({cols_, rows_}), "argument '", arg,
               "': expected column-wise (transposed) data of shape ", shape_str({cols_, rows_}),
               ", got ", shape_str(out.columnwise_data.shape));
    colwise_ = true;
  }
  scale_ = *out.scale.ptr<const float>();
}

// ---------------------------------------------------------------- writers
AbsMax OutputEmitter::emit(const float *vals, size_t row0, size_t nrows) const {
  AbsMax amax;
  // amax is recorded whenever the output has an amax buffer (FP8 or not, so a bf16 producer can feed
  // current scaling), and is always needed for per-tensor FP8.
  if (out_.amax.has_data() || (fp8_ && !mx_)) {
    for (size_t r = 0; r < nrows; ++r) amax.merge(absmax_row(vals + r * cols_, cols_));
  }
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
        mx_colwise(vals, nrows, cols_, out_.columnwise_data.ptr<OType>() + row0 * cols_,
                   out_.columnwise_scale_inv.ptr<uint8_t>() + (row0 / kBlock) * cols_);
      }
    } else {
      if (rowwise_) {
        scale_encode_row(vals, out_.data.ptr<OType>() + row0 * cols_, nrows * cols_, scale_);
      }
      if (colwise_) {
        // Transposed copy: column c of this row block becomes a contiguous run of row c.
        OType *t_out = out_.columnwise_data.ptr<OType>();
        for (size_t c = 0; c < cols_; ++c) {
          OType *dst = t_out + c * rows_ + row0;
          for (size_t r = 0; r < nrows; ++r) dst[r] = from_float<OType>(vals[r * cols_ + c] * scale_);
        }
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
