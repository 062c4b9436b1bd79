// CPU kernels of the cast family: quantize (through the OutputEmitter), dequantize and amax. FP8
// bytes and decodes come from util/fp8.h only; the current-scaling scale is recipe/scaling_math.h.
#include "quantize_cpu.h"

#include <atomic>
#include <cmath>
#include <vector>

#include "../util/dtype_dispatch.h"
#include "../util/parallel.h"

namespace nvte {
namespace {

// Elements per parallel chunk below which threading costs more than it saves.
constexpr size_t kGrainElems = size_t{1} << 15;

// Max of the magnitude bits |x| as an unsigned integer. Positive IEEE floats order like their bit
// patterns, and every NaN pattern is above +Inf's, so one integer max gives both the amax and the
// NaN flag — no conversion to fp32, 32 bf16 lanes per AVX-512 instruction.
template <typename UInt>
NVTE_CPU_KERNEL UInt amax_bits_kernel(const UInt *x, size_t n, UInt mask) {
  UInt m = 0;
  for (size_t i = 0; i < n; ++i) {
    const UInt a = x[i] & mask;
    m = a > m ? a : m;
  }
  return m;
}

template <typename UInt>
UInt parallel_amax_bits(const void *data, size_t n, UInt mask) {
  const UInt *x = static_cast<const UInt *>(data);
  const size_t threads = static_cast<size_t>(max_threads());
  // Chunks handed out on demand (8 per thread, as emit_rows) so a descheduled thread does not hold
  // up a fixed share; the max is order-independent, so the result is too.
  const size_t nchunks = std::max<size_t>(1, std::min(threads * 8, n / kGrainElems));
  std::vector<UInt> part(nchunks, 0);
  std::atomic<size_t> next{0};
  parallel_for(std::min(threads, nchunks), 1, [&](size_t, size_t) {
    for (size_t c = next++; c < nchunks; c = next++) {
      const size_t b = n * c / nchunks, e = n * (c + 1) / nchunks;
      part[c] = NVTE_CPU_DISPATCH(amax_bits_kernel<UInt>(x + b, e - b, mask));
    }
  });
  UInt m = 0;
  for (UInt p : part) m = p > m ? p : m;
  return m;
}

// Dequantize one row into fp32 through `lut`, the 256 decoded values of the format (built from
// util/fp8.h's decoder, the single source of FP8 values): a gather vectorizes where the decoder's
// special-value selects did not (GCC 12 keeps them as branches): MXFP8 8192x4096 -> bf16 on one
// core in 19 ms instead of 62 ms.
// Per-tensor: buf[c] = decode(q[c]) * scale_inv.
NVTE_CPU_KERNEL void dequantize_row_kernel(const uint8_t *q, const float *lut, float *buf, size_t n,
                                           float scale_inv) {
  for (size_t c = 0; c < n; ++c) buf[c] = lut[q[c]] * scale_inv;
}
// MXFP8 row-wise: element c uses the E8M0 scale of its block of 32 along the row.
NVTE_CPU_KERNEL void dequantize_mx_row_kernel(const uint8_t *q, const float *lut, float *buf,
                                              size_t n, const uint8_t *scales) {
  size_t c0 = 0;
  for (; c0 + 32 <= n; c0 += 32) {  // fixed trip count: fully vectorized
    const float m = e8m0_to_float(scales[c0 / 32]);
    for (size_t i = 0; i < 32; ++i) buf[c0 + i] = lut[q[c0 + i]] * m;
  }
  if (c0 < n) {
    const float m = e8m0_to_float(scales[c0 / 32]);
    for (size_t c = c0; c < n; ++c) buf[c] = lut[q[c]] * m;
  }
}
// MXFP8 column-wise: element c uses mult[c], the scale of its column in this block of 32 rows.
NVTE_CPU_KERNEL void dequantize_mx_col_kernel(const uint8_t *q, const float *lut, float *buf,
                                              size_t n, const float *mult) {
  for (size_t c = 0; c < n; ++c) buf[c] = lut[q[c]] * mult[c];
}

}  // namespace

void launch_quantize(const Tensor &in, const OutputEmitter &em) {
  dispatch_dtype<HighPrecisionTypes>(in.data.dtype, "input", [&](auto tag) {
    using IType = typename decltype(tag)::type;
    const IType *src = in.data.ptr<const IType>();
    const size_t cols = em.cols();
    emit_rows(em, [&](size_t row0, size_t nrows, float *vals) {
      load_row(src + row0 * cols, vals, nrows * cols);
    });
  });
}

void launch_dequantize(const Tensor &in, const SimpleTensor &out) {
  const bool mx = in.is_mxfp8(), row = in.data.has_data();
  const SimpleTensor &q = row ? in.data : in.columnwise_data;
  const size_t rows = q.rows(), cols = q.cols();
  if (rows == 0 || cols == 0) return;  // empty: the other dim may be anything, nothing to write
  const uint8_t *qb = q.ptr<const uint8_t>();
  const uint8_t *sb =
      mx ? (row ? in.scale_inv : in.columnwise_scale_inv).ptr<const uint8_t>() : nullptr;
  const size_t scale_cols = row ? (cols + 31) / 32 : cols;
  const float scale_inv = mx ? 1.0f : *in.scale_inv.ptr<const float>();
  float lut[256];
  dispatch_dtype<Fp8Types>(q.dtype, "input", [&](auto itag) {
    using IType = typename decltype(itag)::type;
    for (int c = 0; c < 256; ++c) lut[c] = to_float(IType{static_cast<uint8_t>(c)});
  });
  dispatch_dtype<HighPrecisionTypes>(out.dtype, "output", [&](auto otag) {
    using OType = typename decltype(otag)::type;
    OType *dst = out.ptr<OType>();
    auto rows_body = [&](size_t r0, size_t r1) {
      std::vector<float> buf(cols), mult(mx && !row ? cols : 0);
      for (size_t r = r0; r < r1; ++r) {
        const uint8_t *qr = qb + r * cols;
        if (!mx) {
          NVTE_CPU_DISPATCH(dequantize_row_kernel(qr, lut, buf.data(), cols, scale_inv));
        } else if (row) {
          NVTE_CPU_DISPATCH(
              dequantize_mx_row_kernel(qr, lut, buf.data(), cols, sb + r * scale_cols));
        } else {
          if (r % 32 == 0 || r == r0) {  // a new block of 32 rows: its column scales
            const uint8_t *s = sb + (r / 32) * scale_cols;
            for (size_t c = 0; c < cols; ++c) mult[c] = e8m0_to_float(s[c]);
          }
          NVTE_CPU_DISPATCH(dequantize_mx_col_kernel(qr, lut, buf.data(), cols, mult.data()));
        }
        store_row(buf.data(), dst + r * cols, cols);
      }
    };
    parallel_for(rows, std::max<size_t>(1, kGrainElems / std::max<size_t>(cols, 1)), rows_body);
  });
}

float launch_compute_amax(const SimpleTensor &in) {
  const size_t n = in.numel();
  switch (in.dtype) {
    case kNVTEFloat32: {
      const uint32_t m = parallel_amax_bits<uint32_t>(in.dptr, n, 0x7FFFFFFFu);
      return m > 0x7F800000u ? NAN : bits_float(m);
    }
    case kNVTEBFloat16: {
      const uint16_t m = parallel_amax_bits<uint16_t>(in.dptr, n, 0x7FFFu);
      return m > 0x7F80u ? NAN : bf16_to_float(bf16{m});
    }
    case kNVTEFloat16: {
      const uint16_t m = parallel_amax_bits<uint16_t>(in.dptr, n, 0x7FFFu);
      return m > 0x7C00u ? NAN : fp16_to_float(fp16{m});
    }
    default:
      NVTE_ERROR("argument 'input': expected dtype in {float32, float16, bfloat16}, got ",
                 dtype_name(in.dtype));
  }
}

}  // namespace nvte
