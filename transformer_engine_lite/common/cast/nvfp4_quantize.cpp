// NVFP4 (TE's NVTE_NVFP4_1D_SCALING, the NVFP4BlockScaling recipe) on the CPU. Layouts as TE's
// NVFP4Tensor holds them: E2M1 codes packed two per byte, element 2j in the low nibble ("data" is
// kNVTEByte of the logical shape with the last dim halved); one E4M3 scale per 16 elements along
// the last dim in a [roundup(rows,128), roundup(cols/16,4)] grid (padding zeroed); an fp32 amax per
// copy. The column-wise copy is the transpose ([last dim, leading dims...], last dim halved),
// optionally random-Hadamard-transformed along its rows first; 2D mode shares one scale per 16x16
// block. The arithmetic is nvfp4_math.h's, in TE's reference order.
#include "nvfp4_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../util/dtype_dispatch.h"
#include "../util/parallel.h"
#include "emit_cpu.h"
#include "nvfp4_math.h"

namespace nvte {

namespace {

size_t ceil_div_sz(size_t a, size_t b) { return (a + b - 1) / b; }
size_t round_up(size_t a, size_t m) { return ceil_div_sz(a, m) * m; }

std::vector<size_t> packed(std::vector<size_t> s) {
  s.back() /= 2;
  return s;
}

std::vector<size_t> transposed_shape(const std::vector<size_t> &shape) {
  std::vector<size_t> t{shape.back()};
  t.insert(t.end(), shape.begin(), shape.end() - 1);
  return t;
}

void check_data(const SimpleTensor &d, const char *arg, const char *what,
                const std::vector<size_t> &logical) {
  check_dtype(d, arg, {kNVTEByte});
  NVTE_CHECK(logical.back() % 2 == 0, "argument '", arg, "': expected an even last dimension for ",
             what, " NVFP4 data (two E2M1 values per byte), got logical shape ",
             shape_str(logical));
  const std::vector<size_t> want = packed(logical);
  NVTE_CHECK(d.shape == want, "argument '", arg, "': expected ", what,
             " NVFP4 data (uint8, two E2M1 per byte) of shape ", shape_str(want), ", got ",
             shape_str(d.shape));
}

// Plain NVFP4: an fp32 scalar; row-scaled: fp32 [n], one per row of the copy.
void check_amax(const SimpleTensor &a, const char *arg, const char *what, bool row_scaled,
                size_t n) {
  if (!row_scaled) return check_fp32_scalar(a, arg, what);
  NVTE_CHECK(a.has_data(), "argument '", arg, "': expected ", what, " (fp32 [", n,
             "], row-scaled NVFP4), got a null pointer");
  check_dtype(a, arg, {kNVTEFloat32});
  NVTE_CHECK(a.numel() == n, "argument '", arg, "': expected ", what, " of ", n,
             " fp32 values (one per row, row-scaled NVFP4), got ", a.describe());
}

void check_scales(const SimpleTensor &s, const char *arg, const char *what,
                  const std::vector<size_t> &want) {
  NVTE_CHECK(s.has_data(), "argument '", arg, "': expected ", what,
             " E4M3 scale_inv for NVFP4 data, got a null pointer");
  check_dtype(s, arg, {kNVTEFloat8E4M3, kNVTEByte});
  NVTE_CHECK(s.shape == want, "argument '", arg, "': expected ", what, " scale_inv shape ",
             shape_str(want), ", got ", shape_str(s.shape));
}

size_t prod(const std::vector<size_t> &v, size_t b, size_t e) {
  size_t p = 1;
  for (size_t i = b; i < e; ++i) p *= v[i];
  return p;
}

}  // namespace

std::vector<size_t> nvfp4_scale_shape(size_t rows, size_t cols, bool columnwise) {
  if (columnwise) std::swap(rows, cols);
  return {round_up(rows, 128), round_up(ceil_div_sz(cols, kNvfp4BlockLen), 4)};
}

Nvfp4Spec validate_nvfp4_output(const Tensor &out, const char *arg,
                                const std::vector<size_t> &shape, const QuantizationConfig &cfg) {
  Nvfp4Spec s;
  NVTE_CHECK(!shape.empty(), "argument 'input': expected at least 1 dimension for "
             "NVTE_NVFP4_1D_SCALING, got a 0-d tensor");
  s.cols = shape.back();
  s.rows = prod(shape, 0, shape.size() - 1);
  s.rowwise = out.data.has_data();
  s.colwise = out.columnwise_data.has_data();
  NVTE_CHECK(s.rowwise || s.colwise, "argument '", arg,
             "': expected row-wise and/or column-wise NVFP4 data, got neither (null pointers)");
  s.row_scaled = out.row_scaled_nvfp4;
  s.e4m3_max = out.nvfp4_e4m3_max;
  s.four_over_six = cfg.nvfp4_4over6_mode;
  s.fast_err = cfg.nvfp4_4over6_err_fast_math;
  NVTE_CHECK(s.e4m3_max == 448 || s.four_over_six != kNVTENVFP44Over6Disabled, "argument '", arg,
             "': an NVFP4 E4M3 max of ", s.e4m3_max, " needs 4over6 "
             "(kNVTEQuantizationConfigNVFP44Over6Mode); plain NVFP4 expects 448");
  NVTE_CHECK(!s.row_scaled || s.rowwise, "argument '", arg,
             "': row-scaled NVFP4 expects row-wise data, got only a column-wise copy");
  NVTE_CHECK(!s.row_scaled || !cfg.nvfp4_2d_quantization, "argument 'config': row-scaled NVFP4 "
             "expects 1x16 blocks, got 2D (16x16) quantization");
  s.amax_given = cfg.nvfp4_amax_given;
  NVTE_CHECK(!s.amax_given || !s.row_scaled, "argument 'config': a given NVFP4 amax "
             "(kNVTEQuantizationConfigNVFP4AmaxGiven) expects plain NVFP4, got row-scaled (one "
             "amax per row, computed by the kernel)");
  NVTE_CHECK(s.four_over_six == kNVTENVFP44Over6Disabled || !cfg.stochastic_rounding,
             "argument 'config': NVFP4 4over6 does not support stochastic rounding");
  if (s.rowwise) {
    check_data(out.data, arg, "row-wise", shape);
    check_scales(out.scale_inv, arg, "row-wise", nvfp4_scale_shape(s.rows, s.cols, false));
    check_amax(out.amax, arg, "amax (row-wise)", s.row_scaled, s.rows);
  }
  if (s.colwise) {
    NVTE_CHECK(shape.size() >= 2, "argument 'input': expected at least 2 dimensions for a "
               "column-wise NVFP4 copy (it packs pairs of rows), got shape ", shape_str(shape));
    check_data(out.columnwise_data, arg, "column-wise (transposed)", transposed_shape(shape));
    check_scales(out.columnwise_scale_inv, arg, "column-wise",
                 nvfp4_scale_shape(s.rows, s.cols, true));
    check_amax(out.columnwise_amax, arg, "columnwise_amax", s.row_scaled, s.cols);
  }
  s.two_d = cfg.nvfp4_2d_quantization;
  s.rht = cfg.nvfp4_rht;
  s.rht_sign_mask = cfg.nvfp4_rht_sign_mask;
  NVTE_CHECK(!s.rht || !s.colwise || s.rows % kNvfp4BlockLen == 0,
             "argument 'input': the random Hadamard transform runs over 16 rows at a time; "
             "expected rows (product of the leading dims) divisible by 16, got ", s.rows);
  s.stochastic = cfg.stochastic_rounding;
  if (s.stochastic) {
    NVTE_CHECK(cfg.rng_state != nullptr, "argument 'config': stochastic rounding needs "
               "kNVTEQuantizationConfigRNGState (int64 [2]: seed, offset), got none");
    const Tensor &rng = as_tensor(cfg.rng_state, "config (rng_state)");
    NVTE_CHECK(rng.data.has_data() && rng.data.dtype == kNVTEInt64 && rng.data.numel() == 2,
               "argument 'config': expected an RNG state of int64 [2] (seed, offset), got ",
               rng.data.describe());
    if (rng.device == kNVTEDeviceCPU) {
      s.seed = static_cast<uint64_t>(rng.data.ptr<const int64_t>()[0]);
      s.offset = static_cast<uint64_t>(rng.data.ptr<const int64_t>()[1]);
    } else {  // device memory: read by the GPU kernel, which only a gpu output reaches
      NVTE_CHECK(out.device != kNVTEDeviceCPU, "argument 'config': expected the RNG state in "
                 "host memory for a cpu output, got it on the gpu");
      s.rng_device = rng.data.ptr<const int64_t>();
    }
  }
  return s;
}

Nvfp4Spec validate_nvfp4_input(const Tensor &in, const char *arg,
                               const std::vector<size_t> &out_shape) {
  Nvfp4Spec s;
  s.rowwise = in.data.has_data();
  NVTE_CHECK(s.rowwise || in.columnwise_data.has_data(), "argument '", arg,
             "': expected NVFP4 row-wise or column-wise data, got neither (null pointers)");
  NVTE_CHECK(!out_shape.empty(), "argument 'output': expected at least 1 dimension for "
             "NVTE_NVFP4_1D_SCALING, got a 0-d tensor");
  // The output has the stored copy's logical shape. A row-wise copy is the [rows, cols] view of
  // it; a column-wise one ([last dim, leading dims...]) is a [last dim, the rest] matrix.
  if (s.rowwise) {
    s.cols = out_shape.back();
    s.rows = prod(out_shape, 0, out_shape.size() - 1);
  } else {
    s.rows = out_shape[0];
    s.cols = prod(out_shape, 1, out_shape.size());
  }
  const char *what = s.rowwise ? "row-wise" : "column-wise (as stored, transposed)";
  check_data(s.rowwise ? in.data : in.columnwise_data, arg, what, out_shape);
  // The column-wise grid of an [R, C] tensor is the row-wise grid of its stored [C, R] copy.
  check_scales(s.rowwise ? in.scale_inv : in.columnwise_scale_inv, arg, what,
               nvfp4_scale_shape(s.rows, s.cols, false));
  s.row_scaled = in.row_scaled_nvfp4;
  s.e4m3_max = in.nvfp4_e4m3_max;
  check_amax(s.rowwise ? in.amax : in.columnwise_amax, arg,
             s.rowwise ? "amax (row-wise)" : "columnwise_amax", s.row_scaled, s.rows);
  s.colwise = !s.rowwise;
  return s;
}

namespace {

// One 16-element block of a row (c1 - c0 <= 16 values of x from c0) quantized with both 4over6
// candidates; returns each candidate's summed error. The reference pads a short block with zeros,
// whose terms are added too (zero unless a scale or amax is NaN / Inf).
struct Nvfp4Cand {
  Nvfp4BlockScale sc[2];  // [0] map-to-6, [1] map-to-4
  uint8_t codes[2][kNvfp4BlockLen];
  float err[2];
};
void fourover6_block(const float *x, size_t len, float block_amax, const Nvfp4Global &g,
                     const Nvfp4Spec &s, Nvfp4Cand &out) {
  const float denom = kNvfp4E2M1Max * static_cast<float>(s.e4m3_max);
  const bool mse = s.four_over_six == kNVTENVFP44Over6MinMSE;
  for (int k = 0; k < 2; ++k) {
    out.sc[k] = nvfp4_4over6_scale(block_amax, g, k == 1);
    float err = 0.0f;
    for (size_t i = 0; i < kNvfp4BlockLen; ++i) {
      const float xi = i < len ? x[i] : 0.0f;
      const uint8_t code = e2m1_rne(nvfp4_scaled(xi, out.sc[k].enc));
      out.codes[k][i] = code;
      err += nvfp4_4over6_err_term(xi, code, out.sc[k].e4m3, g, denom, s.fast_err, mse);
    }
    out.err[k] = err;
  }
}

// Quantizes a panel of `nr` rows (starting at matrix row r0) of a [*, C] fp32 matrix into codes and
// scales. In 2D mode the panel is one 16-row block (or the last, shorter one). `g` holds the copy's
// global scales; row-scaled NVFP4 derives them per row instead and writes each row's amax to
// row_amax[row].
void quantize_panel(const float *buf, size_t nr, size_t r0, size_t C, bool two_d,
                    const Nvfp4Global &g_tensor, const Nvfp4Spec &s, int copy, uint8_t *q,
                    uint8_t *sc, size_t sld, float *row_amax) {
  const size_t n = kNvfp4BlockLen;
  const size_t nb = ceil_div_sz(C, n);
  const bool fos = s.four_over_six != kNVTENVFP44Over6Disabled;
  std::vector<uint8_t> codes(nr * C);
  std::vector<float> benc(nb);
  std::vector<uint8_t> bsc(nb);
  if (two_d) {  // one scale per 16x16 block (never row-scaled)
    for (size_t b = 0; b < nb; ++b) {
      const size_t c0 = b * n, c1 = std::min(C, c0 + n);
      float amax = 0.0f;
      for (size_t r = 0; r < nr; ++r)
        for (size_t c = c0; c < c1; ++c) amax = nvfp4_amax_acc(amax, buf[r * C + c]);
      if (!fos) {
        const Nvfp4BlockScale bs = nvfp4_block_scale(amax, g_tensor);
        benc[b] = bs.enc;
        bsc[b] = bs.e4m3;
        continue;
      }
      // 4over6 in 2D: one choice per 16x16 block from the 16 rows' errors, summed in TE's warp
      // tree order (rows i and i+8, then i and i+4, i and i+2, i and i+1); missing rows are the
      // reference's zero padding.
      float e[2][16];
      Nvfp4Cand cand;
      const float zeros[kNvfp4BlockLen] = {};
      for (size_t r = 0; r < n; ++r) {
        const float *x = r < nr ? buf + r * C + c0 : zeros;
        fourover6_block(x, r < nr ? c1 - c0 : n, amax, g_tensor, s, cand);
        for (int k = 0; k < 2; ++k) e[k][r] = cand.err[k];
      }
      float tot[2];
      for (int k = 0; k < 2; ++k) {
        for (int w = 8; w >= 1; w /= 2)
          for (int i = 0; i < w; ++i) e[k][i] = e[k][i] + e[k][i + w];
        tot[k] = e[k][0];
      }
      const int pick = tot[1] < tot[0] ? 1 : 0;  // ties keep map-to-6
      bsc[b] = cand.sc[pick].e4m3;              // the scales do not depend on the row
      for (size_t r = 0; r < nr; ++r)
        for (size_t c = c0; c < c1; ++c)
          codes[r * C + c] = e2m1_rne(nvfp4_scaled(buf[r * C + c], cand.sc[pick].enc));
    }
  }
  // Stochastic rounding: one Philox4x32 call yields the words of four consecutive elements
  // (lanes idx % 4 of counter idx / 4), so the last call is kept and reused while idx / 4 is
  // unchanged. Same words per element as one call each, a quarter of the calls.
  uint64_t sr_q = ~uint64_t{0};
  Philox4 sr_rnd{};
  for (size_t r = 0; r < nr; ++r) {
    const float *x = buf + r * C;
    const size_t row = r0 + r;
    Nvfp4Global g = g_tensor;
    if (row_amax != nullptr) {  // row-scaled: this row's amax and global scales
      float amax = 0.0f;
      for (size_t c = 0; c < C; ++c) amax = nvfp4_amax_acc(amax, x[c]);
      row_amax[row] = amax;
      g = nvfp4_global(amax, s.e4m3_max);
    }
    uint8_t *cr = codes.data() + r * C;
    for (size_t b = 0; b < nb; ++b) {
      const size_t c0 = b * n, c1 = std::min(C, c0 + n);
      if (two_d) {
        sc[row * sld + b] = bsc[b];
        if (fos) continue;  // codes chosen above
      } else {
        float amax = 0.0f;
        for (size_t c = c0; c < c1; ++c) amax = nvfp4_amax_acc(amax, x[c]);
        if (fos) {
          Nvfp4Cand cand;
          fourover6_block(x + c0, c1 - c0, amax, g, s, cand);
          const int pick = cand.err[1] < cand.err[0] ? 1 : 0;  // ties keep map-to-6
          sc[row * sld + b] = cand.sc[pick].e4m3;
          for (size_t c = c0; c < c1; ++c) cr[c] = cand.codes[pick][c - c0];
          continue;
        }
        const Nvfp4BlockScale bs = nvfp4_block_scale(amax, g);
        benc[b] = bs.enc;
        bsc[b] = bs.e4m3;
        sc[row * sld + b] = bs.e4m3;
      }
      for (size_t c = c0; c < c1; ++c) {
        const float v = nvfp4_scaled(x[c], benc[b]);
        if (!s.stochastic) {
          cr[c] = e2m1_rne(v);
        } else {
          const uint64_t idx = static_cast<uint64_t>(row) * C + c;
          if (idx / 4 != sr_q) {
            sr_q = idx / 4;
            sr_rnd = nvfp4_sr_block(s.seed, s.offset, copy, sr_q);
          }
          cr[c] = e2m1_stochastic(v, sr_rnd.v[idx % 4] >> 8);
        }
      }
    }
    uint8_t *dst = q + row * (C / 2);
    for (size_t j = 0; j < C / 2; ++j)
      dst[j] = static_cast<uint8_t>(cr[2 * j] | (cr[2 * j + 1] << 4));
  }
}

// Rows c0..c1 of the column-wise source matrix T = x^T ([C, R]), Hadamard-transformed along each
// row in groups of 16 and rounded to the input dtype (as TE's RHT, which works in that dtype)
// when spec.rht; written to buf as [c1 - c0, R].
template <typename IType>
void colwise_rows(const IType *src, size_t R, size_t C, size_t c0, size_t c1, const Nvfp4Spec &s,
                  float *buf) {
  const size_t w = c1 - c0;
  std::vector<float> tmp(w);
  for (size_t r = 0; r < R; ++r) {
    load_row(src + r * C + c0, tmp.data(), w);
    for (size_t i = 0; i < w; ++i) buf[i * R + r] = tmp[i];
  }
  if (!s.rht) return;
  std::vector<float> y(R);
  std::vector<IType> rounded(R);
  for (size_t i = 0; i < w; ++i) {
    float *t = buf + i * R;
    for (size_t r = 0; r < R; r += kNvfp4BlockLen)
      nvfp4_rht16(t + r, s.rht_sign_mask, y.data() + r);
    store_row(y.data(), rounded.data(), R);
    load_row(rounded.data(), t, R);
  }
}

template <typename IType>
void quantize_typed(const IType *src, const Tensor &out, const Nvfp4Spec &s) {
  const size_t R = s.rows, C = s.cols, n = kNvfp4BlockLen;
  const size_t panels_r = ceil_div_sz(R, n), panels_c = ceil_div_sz(C, n);
  // Global amaxes first: every scale depends on them.
  float amax_row = 0.0f, amax_col = 0.0f;
  // Given amaxes (a reduction over shards, say) replace the input's own.
  if (s.amax_given) {
    if (s.rowwise) amax_row = *out.amax.ptr<const float>();
    if (s.colwise) amax_col = *out.columnwise_amax.ptr<const float>();
  }
  if (!s.row_scaled && !s.amax_given) {  // row-scaled copies take their amaxes row by row in the panels
    std::vector<float> part(std::max<size_t>(1, panels_r), 0.0f);
    parallel_for(panels_r, 1, [&](size_t b0, size_t b1) {
      std::vector<float> buf(C);
      for (size_t b = b0; b < b1; ++b)
        for (size_t r = b * n; r < std::min(R, b * n + n); ++r) {
          load_row(src + r * C, buf.data(), C);
          for (size_t c = 0; c < C; ++c) part[b] = nvfp4_amax_acc(part[b], buf[c]);
        }
    });
    for (float p : part) amax_row = nvfp4_amax_acc(amax_row, p);  // NaN-sticky max
  }
  if (!s.amax_given) amax_col = amax_row;
  // The column-wise copy is scaled by the amax after the transform.
  if (s.colwise && s.rht && !s.row_scaled && !s.amax_given) {
    std::vector<float> part(std::max<size_t>(1, panels_c), 0.0f);
    parallel_for(panels_c, 1, [&](size_t b0, size_t b1) {
      std::vector<float> buf(n * R);
      for (size_t b = b0; b < b1; ++b) {
        const size_t c0 = b * n, c1 = std::min(C, c0 + n);
        colwise_rows(src, R, C, c0, c1, s, buf.data());
        for (size_t i = 0; i < (c1 - c0) * R; ++i) part[b] = nvfp4_amax_acc(part[b], buf[i]);
      }
    });
    amax_col = 0.0f;
    for (float p : part) amax_col = nvfp4_amax_acc(amax_col, p);
  }
  if (s.rowwise) {
    float *row_amax = s.row_scaled ? out.amax.ptr<float>() : nullptr;
    if (!s.row_scaled && !s.amax_given) *out.amax.ptr<float>() = amax_row;
    const Nvfp4Global g = nvfp4_global(amax_row, s.e4m3_max);
    uint8_t *q = out.data.ptr<uint8_t>(), *sc = out.scale_inv.ptr<uint8_t>();
    const size_t sld = out.scale_inv.shape[1];
    parallel_for(panels_r, 1, [&](size_t b0, size_t b1) {
      std::vector<float> buf(n * C);
      for (size_t b = b0; b < b1; ++b) {
        const size_t r0 = b * n, nr = std::min(n, R - r0);
        load_row(src + r0 * C, buf.data(), nr * C);
        quantize_panel(buf.data(), nr, r0, C, s.two_d, g, s, 0, q, sc, sld, row_amax);
      }
    });
  }
  if (s.colwise) {
    float *row_amax = s.row_scaled ? out.columnwise_amax.ptr<float>() : nullptr;
    if (!s.row_scaled && !s.amax_given) *out.columnwise_amax.ptr<float>() = amax_col;
    const Nvfp4Global g = nvfp4_global(amax_col, s.e4m3_max);
    uint8_t *q = out.columnwise_data.ptr<uint8_t>(), *sc = out.columnwise_scale_inv.ptr<uint8_t>();
    const size_t sld = out.columnwise_scale_inv.shape[1];
    parallel_for(panels_c, 1, [&](size_t b0, size_t b1) {
      std::vector<float> buf(n * R);
      for (size_t b = b0; b < b1; ++b) {
        const size_t c0 = b * n, c1 = std::min(C, c0 + n);
        colwise_rows(src, R, C, c0, c1, s, buf.data());
        quantize_panel(buf.data(), c1 - c0, c0, R, s.two_d, g, s, 1, q, sc, sld, row_amax);
      }
    });
  }
}

}  // namespace

void launch_nvfp4_quantize(const Tensor &in, const Tensor &out, const Nvfp4Spec &s) {
  // Padding entries of the scale grids are zeroed (TE leaves them unwritten; GEMMs ignore them).
  if (s.rowwise) std::memset(out.scale_inv.dptr, 0, out.scale_inv.numel());
  if (s.colwise) std::memset(out.columnwise_scale_inv.dptr, 0, out.columnwise_scale_inv.numel());
  if (s.rows == 0 || s.cols == 0) {  // empty tensor: amax 0, as a max over nothing
    if (s.amax_given) return;         // (a given one stays)
    if (s.rowwise) std::fill_n(out.amax.ptr<float>(), s.row_scaled ? s.rows : 1, 0.0f);
    if (s.colwise) std::fill_n(out.columnwise_amax.ptr<float>(), s.row_scaled ? s.cols : 1, 0.0f);
    return;
  }
  dispatch_dtype<HighPrecisionTypes>(in.data.dtype, "input", [&](auto itag) {
    using IType = typename decltype(itag)::type;
    quantize_typed(in.data.ptr<const IType>(), out, s);
  });
}

void launch_nvfp4_dequantize(const Tensor &in, const Nvfp4Spec &s, const SimpleTensor &out) {
  const size_t R = s.rows, C = s.cols, n = kNvfp4BlockLen;
  if (R == 0 || C == 0) return;
  const bool row = s.rowwise;
  const uint8_t *q = (row ? in.data : in.columnwise_data).ptr<const uint8_t>();
  const SimpleTensor &st = row ? in.scale_inv : in.columnwise_scale_inv;
  const uint8_t *sc = st.ptr<const uint8_t>();
  const size_t sld = st.shape[1];
  // Row-scaled: one amax per row of the stored copy.
  const float *amaxes = (row ? in.amax : in.columnwise_amax).ptr<const float>();
  dispatch_dtype<HighPrecisionTypes>(out.dtype, "output", [&](auto otag) {
    using OType = typename decltype(otag)::type;
    OType *dst = out.ptr<OType>();
    parallel_for(R, std::max<size_t>(1, 32768 / C), [&](size_t r0, size_t r1) {
      std::vector<float> buf(C);
      for (size_t r = r0; r < r1; ++r) {
        const float amax = amaxes[s.row_scaled ? r : 0];
        for (size_t c = 0; c < C; ++c) {
          const uint8_t byte = q[r * (C / 2) + c / 2];
          const uint8_t code = (c % 2) ? (byte >> 4) : (byte & 0xF);
          buf[c] = e2m1_value(code) * nvfp4_dequant_factor(sc[r * sld + c / n], amax, s.e4m3_max);
        }
        store_row(buf.data(), dst + r * C, C);
      }
    });
  });
}

}  // namespace nvte
