// Float8BlockScaling (TE's NVTE_BLOCK_SCALING_1D / _2D, DeepSeek-V3's recipe) on the CPU: argument
// checks shared with any device, and the quantize / dequantize kernels. The layouts are TE's
// GEMM_READY ones (block_scale.h): row-wise data as the input, column-wise data transposed
// ([last dim, leading dims...]), fp32 scale_inv grids padded to a multiple of 4 in the inner dim.
#include "block_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../util/dtype_dispatch.h"
#include "../util/fp8.h"
#include "../util/parallel.h"
#include "block_scale.h"
#include "emit_cpu.h"

namespace nvte {

bool is_block_scaling(NVTEScalingMode m) {
  return m == NVTE_BLOCK_SCALING_1D || m == NVTE_BLOCK_SCALING_2D;
}

namespace {

const char *mode_name(bool two_d) {
  return two_d ? "NVTE_BLOCK_SCALING_2D" : "NVTE_BLOCK_SCALING_1D";
}

// Block scaling is defined by TE for the OCP formats only (its kernels and references take E4M3 and
// E5M2); the FNUZ flavours are refused rather than given scales nobody specified.
void check_block_fp8_dtype(DType t, const char *arg, const char *what) {
  NVTE_CHECK(t == kNVTEFloat8E4M3 || t == kNVTEFloat8E5M2, "argument '", arg, "': expected ", what,
             " of dtype ", dtype_name(kNVTEFloat8E4M3), " or ", dtype_name(kNVTEFloat8E5M2),
             " for block scaling, got ", dtype_name(t));
}

void check_scale(const SimpleTensor &s, const char *arg, const char *what, BlockScaleShape want) {
  NVTE_CHECK(s.has_data(), "argument '", arg, "': expected fp32 ", what,
             " for block-scaled data, got a null pointer");
  check_dtype(s, arg, {kNVTEFloat32});
  const std::vector<size_t> w{want.d0, want.d1};
  NVTE_CHECK(s.shape == w, "argument '", arg, "': expected ", what, " shape ", shape_str(w),
             ", got ", shape_str(s.shape));
}

// [last dim, leading dims...]: the column-wise (transposed) shape of `shape`.
std::vector<size_t> transposed_shape(const std::vector<size_t> &shape) {
  std::vector<size_t> t{shape.back()};
  t.insert(t.end(), shape.begin(), shape.end() - 1);
  return t;
}

size_t prod(const std::vector<size_t> &v, size_t b, size_t e) {
  size_t p = 1;
  for (size_t i = b; i < e; ++i) p *= v[i];
  return p;
}

}  // namespace

float block_value_for_inf(DType t) {
  if (t == kNVTEFloat16) return 65504.0f;
  if (t == kNVTEBFloat16) return bits_float(0x7F7F0000u);
  return bits_float(kFloatMaxBits);
}

BlockSpec validate_block_output(const Tensor &out, const char *arg,
                                const std::vector<size_t> &shape) {
  BlockSpec spec;
  spec.two_d = out.scaling_mode == NVTE_BLOCK_SCALING_2D;
  NVTE_CHECK(!shape.empty(), "argument 'input': expected at least 1 dimension for ",
             mode_name(spec.two_d), ", got a 0-d tensor");
  spec.cols = shape.back();
  spec.rows = prod(shape, 0, shape.size() - 1);
  const bool has_row = out.data.has_data(), has_col = out.columnwise_data.has_data();
  NVTE_CHECK(has_row || has_col, "argument '", arg,
             "': expected row-wise and/or column-wise data, got neither (null pointers)");
  spec.dtype = has_row ? out.data.dtype : out.columnwise_data.dtype;
  if (has_row) {
    check_block_fp8_dtype(out.data.dtype, arg, "row-wise data");
    check_shape(out.data, arg, shape);
    check_scale(out.scale_inv, arg, "row-wise scale_inv",
                block_scale_shape(spec.rows, spec.cols, spec.two_d, false));
    spec.rowwise = true;
  }
  if (has_col) {
    check_block_fp8_dtype(out.columnwise_data.dtype, arg, "column-wise data");
    NVTE_CHECK(!has_row || out.columnwise_data.dtype == spec.dtype, "argument '", arg,
               "': expected column-wise data of dtype ", dtype_name(spec.dtype), ", got ",
               dtype_name(out.columnwise_data.dtype));
    const std::vector<size_t> t = transposed_shape(shape);
    NVTE_CHECK(out.columnwise_data.shape == t, "argument '", arg,
               "': expected column-wise (transposed) data of shape ", shape_str(t), ", got ",
               shape_str(out.columnwise_data.shape));
    check_scale(out.columnwise_scale_inv, arg, "column-wise scale_inv",
                block_scale_shape(spec.rows, spec.cols, spec.two_d, true));
    spec.colwise = true;
  }
  return spec;
}

BlockSpec validate_block_input(const Tensor &in, const char *arg) {
  BlockSpec spec;
  spec.two_d = in.scaling_mode == NVTE_BLOCK_SCALING_2D;
  const bool has_row = in.data.has_data();
  NVTE_CHECK(has_row || in.columnwise_data.has_data(), "argument '", arg,
             "': expected block-scaled row-wise or column-wise data, got neither (null pointers)");
  const SimpleTensor &q = has_row ? in.data : in.columnwise_data;
  NVTE_CHECK(!q.shape.empty(), "argument '", arg, "': expected at least 1 dimension for ",
             mode_name(spec.two_d), ", got a 0-d tensor");
  check_block_fp8_dtype(q.dtype, arg, has_row ? "row-wise data" : "column-wise data");
  spec.dtype = q.dtype;
  if (has_row) {
    spec.rows = prod(q.shape, 0, q.shape.size() - 1);
    spec.cols = q.shape.back();
    check_scale(in.scale_inv, arg, "row-wise scale_inv",
                block_scale_shape(spec.rows, spec.cols, spec.two_d, false));
    spec.rowwise = true;
  } else {  // column-wise data is [cols, leading dims...] of the original [rows, cols] view
    spec.cols = q.shape[0];
    spec.rows = prod(q.shape, 1, q.shape.size());
    check_scale(in.columnwise_scale_inv, arg, "column-wise scale_inv",
                block_scale_shape(spec.rows, spec.cols, spec.two_d, true));
    spec.colwise = true;
  }
  return spec;
}

namespace {

template <typename F>
void quantize_rows(const float *buf, size_t nr, size_t r0, const BlockSpec &s, float eps,
                   bool pow2, float vinf, uint8_t *q, float *sinv, uint8_t *qt, float *sinv_t) {
  const size_t C = s.cols, R = s.rows, n = kBlockScaleLen;
  const float fp8_max = fp8_max_value<F>();
  const size_t rb = r0 / n;
  const BlockScaleShape rs = block_scale_shape(R, C, s.two_d, false);
  const BlockScaleShape cs = block_scale_shape(R, C, s.two_d, true);
  if (s.two_d) {
    for (size_t c0 = 0; c0 < C; c0 += n) {
      const size_t c1 = std::min(C, c0 + n), kb = c0 / n;
      float amax = 0.0f;  // NaN never wins (TE's fmaxf): a NaN element does not set the scale
      for (size_t r = 0; r < nr; ++r)
        for (size_t c = c0; c < c1; ++c) {
          const float a = std::fabs(buf[r * C + c]);
          amax = a > amax ? a : amax;
        }
      const float scale = block_scale_from_amax(amax, fp8_max, eps, pow2, vinf);
      if (sinv) sinv[rb * rs.d1 + kb] = 1.0f / scale;
      if (sinv_t) sinv_t[kb * cs.d1 + rb] = 1.0f / scale;
      for (size_t r = 0; r < nr; ++r)
        for (size_t c = c0; c < c1; ++c) {
          const uint8_t b = fp8_encode<F>(buf[r * C + c] * scale);
          if (q) q[(r0 + r) * C + c] = b;
          if (qt) qt[c * R + r0 + r] = b;
        }
    }
    return;
  }
  if (q) {  // 1x128 tiles along each row
    for (size_t r = 0; r < nr; ++r) {
      const float *x = buf + r * C;
      for (size_t c0 = 0; c0 < C; c0 += n) {
        const size_t c1 = std::min(C, c0 + n);
        float amax = 0.0f;
        for (size_t c = c0; c < c1; ++c) {
          const float a = std::fabs(x[c]);
          amax = a > amax ? a : amax;
        }
        const float scale = block_scale_from_amax(amax, fp8_max, eps, pow2, vinf);
        sinv[(c0 / n) * rs.d1 + r0 + r] = 1.0f / scale;
        for (size_t c = c0; c < c1; ++c) q[(r0 + r) * C + c] = fp8_encode<F>(x[c] * scale);
      }
    }
  }
  if (qt) {  // 128x1 tiles down each column: rows r0..r0+nr of the input, one scale per column
    std::vector<float> amax(C, 0.0f), scale(C);
    for (size_t r = 0; r < nr; ++r)
      for (size_t c = 0; c < C; ++c) {
        const float a = std::fabs(buf[r * C + c]);
        amax[c] = a > amax[c] ? a : amax[c];
      }
    for (size_t c = 0; c < C; ++c) {
      scale[c] = block_scale_from_amax(amax[c], fp8_max, eps, pow2, vinf);
      sinv_t[rb * cs.d1 + c] = 1.0f / scale[c];
    }
    for (size_t c = 0; c < C; ++c)
      for (size_t r = 0; r < nr; ++r) qt[c * R + r0 + r] = fp8_encode<F>(buf[r * C + c] * scale[c]);
  }
}

}  // namespace

void launch_block_quantize(const Tensor &in, const Tensor &out, const BlockSpec &s,
                           const QuantizationConfig &cfg) {
  // Padding entries of the scale grids are zeroed (TE leaves them unwritten; cuBLAS ignores them).
  if (s.rowwise) std::memset(out.scale_inv.dptr, 0, out.scale_inv.numel() * sizeof(float));
  if (s.colwise)
    std::memset(out.columnwise_scale_inv.dptr, 0, out.columnwise_scale_inv.numel() * sizeof(float));
  const size_t R = s.rows, C = s.cols, n = kBlockScaleLen;
  if (R == 0 || C == 0) return;
  uint8_t *q = s.rowwise ? static_cast<uint8_t *>(out.data.dptr) : nullptr;
  uint8_t *qt = s.colwise ? static_cast<uint8_t *>(out.columnwise_data.dptr) : nullptr;
  float *sinv = s.rowwise ? static_cast<float *>(out.scale_inv.dptr) : nullptr;
  float *sinv_t = s.colwise ? static_cast<float *>(out.columnwise_scale_inv.dptr) : nullptr;
  const float vinf = block_value_for_inf(in.data.dtype);
  dispatch_dtype<HighPrecisionTypes>(in.data.dtype, "input", [&](auto itag) {
    using IType = typename decltype(itag)::type;
    const IType *src = in.data.ptr<const IType>();
    parallel_for(block_ceil_div(R, n), 1, [&](size_t b0, size_t b1) {
      std::vector<float> buf(n * C);
      for (size_t rb = b0; rb < b1; ++rb) {
        const size_t r0 = rb * n, nr = std::min(n, R - r0);
        load_row(src + r0 * C, buf.data(), nr * C);
        if (s.dtype == kNVTEFloat8E4M3)
          quantize_rows<FormatE4M3>(buf.data(), nr, r0, s, cfg.amax_epsilon,
                                    cfg.force_pow_2_scales, vinf, q, sinv, qt, sinv_t);
        else
          quantize_rows<FormatE5M2>(buf.data(), nr, r0, s, cfg.amax_epsilon,
                                    cfg.force_pow_2_scales, vinf, q, sinv, qt, sinv_t);
      }
    });
  });
}

void launch_block_dequantize(const Tensor &in, const BlockSpec &s, const SimpleTensor &out) {
  const size_t R = s.rows, C = s.cols, n = kBlockScaleLen;
  if (R == 0 || C == 0) return;
  const bool row = s.rowwise;
  const uint8_t *q = (row ? in.data : in.columnwise_data).ptr<const uint8_t>();
  const float *sc = (row ? in.scale_inv : in.columnwise_scale_inv).ptr<const float>();
  const BlockScaleShape ss = block_scale_shape(R, C, s.two_d, !row);
  float lut[256];
  for (int c = 0; c < 256; ++c)
    lut[c] = s.dtype == kNVTEFloat8E4M3 ? fp8_decode<FormatE4M3>(static_cast<uint8_t>(c))
                                        : fp8_decode<FormatE5M2>(static_cast<uint8_t>(c));
  // The stored copy is [R, C] (row-wise) or [C, R] (column-wise); it is dequantized as stored.
  const size_t outer = row ? R : C, inner = row ? C : R;
  dispatch_dtype<HighPrecisionTypes>(out.dtype, "output", [&](auto otag) {
    using OType = typename decltype(otag)::type;
    OType *dst = out.ptr<OType>();
    parallel_for(outer, std::max<size_t>(1, 32768 / inner), [&](size_t i0, size_t i1) {
      std::vector<float> buf(inner);
      for (size_t i = i0; i < i1; ++i) {
        for (size_t j = 0; j < inner; ++j) {
          // (r, c) of the element in the original [R, C] view, and its scale.
          const size_t r = row ? i : j, c = row ? j : i;
          float m;
          if (s.two_d)
            m = row ? sc[(r / n) * ss.d1 + c / n] : sc[(c / n) * ss.d1 + r / n];
          else
            m = row ? sc[(c / n) * ss.d1 + r] : sc[(r / n) * ss.d1 + c];
          buf[j] = lut[q[i * inner + j]] * m;
        }
        store_row(buf.data(), dst + i * inner, inner);
      }
    });
  });
}

}  // namespace nvte
