// te_lite NVFP4 handlers (TE-JAX's ScalingMode.NVFP4_1D_SCALING / NVFP4_2D_SCALING, the
// NVFP4BlockScaling recipe): quantize a 2-D [rows, cols] view into the core's NVFP4 buffers,
// dequantize one stored copy, and the tensor-core-order block GEMM: the same core calls as
// torch.ops.te_lite.quantize_nvfp4 / dequantize_nvfp4 / nvfp4_block_gemm (pytorch/csrc/), so both
// front ends write the same bytes and get the same GEMM bits.
//
// Buffers are the core's: data uint8 with two E2M1 codes per byte (element 2j in the low nibble),
// the column-wise copy transposed ([cols, rows/2]); E4M3 scale bytes (uint8) in grids padded to
// [roundup(rows, 128), roundup(cols/16, 4)]; an fp32 amax per copy (the column-wise one after the
// Hadamard transform when it is applied). The Python side unpads and re-types them (float4_e2m1fn,
// float8_e4m3fn) into TE-JAX's ScaledTensor1x layout.
#include <memory>

#include <transformer_engine_lite/cast.h>
#include <transformer_engine_lite/gemm.h>

#include "handler.h"

namespace te_lite {
namespace {

int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

Shape scale_shape(int64_t rows, int64_t cols) {
  return {round_up(rows, 128), round_up((cols + 15) / 16, 4)};
}

struct ConfigDeleter {
  void operator()(void *c) const { nvte_destroy_quantization_config(c); }
};

template <typename T>
ffi::Error set_attr(const char *op, void *config, NVTEQuantizationConfigAttribute a, const T &v) {
  return check_nvte(op, nvte_set_quantization_config_attribute(config, a, &v, sizeof(T)));
}

// rng_state: TE-JAX's stochastic-rounding state, uint32 with at least 4 elements (its
// [num_devices, 4] array, or one device's slice); the first 16 bytes are read as int64 [2] = (seed,
// offset), as TE-JAX's handler reads them. Ignored (any shape, [0] by convention) without
// stochastic rounding.
//
// row_amax_in / col_amax_in: the per-tensor amaxes to scale with (float32 [1] each for the copies
// requested, e.g. max-reduced over an AmaxScope's mesh axes; the column-wise one after the RHT),
// or [0] each: the core takes them from x. Given ones are read in place by the core
// (kNVTEQuantizationConfigNVFP4AmaxGiven), so the matching results are then [0] (the caller
// has them already).
ffi::Error quantize_nvfp4(const Device &dev, Buffer x, Buffer rng_state, Buffer row_amax_in,
                          Buffer col_amax_in, Buffer row, Buffer row_s, Buffer row_a, Buffer col,
                          Buffer col_s, Buffer col_a, bool rowwise, bool columnwise, bool two_d,
                          bool rht, int64_t rht_sign_mask, bool stochastic_rounding) {
  constexpr const char *kOp = "te_lite::quantize_nvfp4";
  TE_LITE_TRY(check_dtype(kOp, "x", x, kHighPrecision));
  TE_LITE_TRY(check_ndim(kOp, "x", x, 2));
  TE_LITE_CHECK(rowwise || columnwise, kOp,
                ": arguments 'rowwise' and 'columnwise': expected at least one true, got both "
                "false");
  TE_LITE_CHECK(rht_sign_mask >= 0 && rht_sign_mask <= 0xFFFF, kOp,
                ": argument 'rht_sign_mask': expected a 16-bit mask, got ", rht_sign_mask);
  const int64_t rows = dim(x, 0), cols = dim(x, 1);
  const char *kNotRequested = "copy not requested";
  const bool given = numel(row_amax_in) != 0 || numel(col_amax_in) != 0;
  if (given) {
    TE_LITE_CHECK(numel(row_amax_in) == (rowwise ? 1 : 0) &&
                  numel(col_amax_in) == (columnwise ? 1 : 0), kOp,
                  ": arguments 'row_amax_in' and 'col_amax_in': expected float32 [1] for each "
                  "requested copy (rowwise=", rowwise ? "true" : "false", ", columnwise=",
                  columnwise ? "true" : "false",
                  ") or [0] for both, got shapes ", shape_str(row_amax_in), " and ",
                  shape_str(col_amax_in));
    if (rowwise) TE_LITE_TRY(check_fp32_scalar(kOp, "row_amax_in", row_amax_in));
    if (columnwise) TE_LITE_TRY(check_fp32_scalar(kOp, "col_amax_in", col_amax_in));
  }
  const char *kGiven = "amax given (row_amax_in / col_amax_in)";
  // Odd dims are refused by the core with the argument named; halve only even ones here.
  if (rowwise) {
    TE_LITE_TRY(check_result(kOp, "row_data", row, DataType::U8, {rows, cols / 2}));
    TE_LITE_TRY(check_result(kOp, "row_scale_inv", row_s, DataType::U8, scale_shape(rows, cols)));
    if (given) {
      TE_LITE_TRY(check_absent(kOp, "row_amax", row_a, kGiven));
    } else {
      TE_LITE_TRY(check_result(kOp, "row_amax", row_a, DataType::F32, {1}));
    }
  } else {
    TE_LITE_TRY(check_absent(kOp, "row_data", row, kNotRequested));
    TE_LITE_TRY(check_absent(kOp, "row_scale_inv", row_s, kNotRequested));
    TE_LITE_TRY(check_absent(kOp, "row_amax", row_a, kNotRequested));
  }
  if (columnwise) {
    TE_LITE_TRY(check_result(kOp, "col_data", col, DataType::U8, {cols, rows / 2}));
    TE_LITE_TRY(check_result(kOp, "col_scale_inv", col_s, DataType::U8, scale_shape(cols, rows)));
    if (given) {
      TE_LITE_TRY(check_absent(kOp, "col_amax", col_a, kGiven));
    } else {
      TE_LITE_TRY(check_result(kOp, "col_amax", col_a, DataType::F32, {1}));
    }
  } else {
    TE_LITE_TRY(check_absent(kOp, "col_data", col, kNotRequested));
    TE_LITE_TRY(check_absent(kOp, "col_scale_inv", col_s, kNotRequested));
    TE_LITE_TRY(check_absent(kOp, "col_amax", col_a, kNotRequested));
  }
  TensorWrapper in(dev), out(dev, NVTE_NVFP4_1D_SCALING);
  in.data(x);
  // A given amax is read, never written, by the core: the argument buffer serves as the output's.
  if (rowwise) out.data(row).scale_inv(row_s, kNVTEFloat8E4M3).amax(given ? row_amax_in : row_a);
  if (columnwise) {
    out.columnwise_data(col).columnwise_scale_inv(col_s, kNVTEFloat8E4M3);
    out.set(kNVTEColumnwiseAmax, given ? col_amax_in : col_a);
  }
  std::unique_ptr<void, ConfigDeleter> config(nvte_create_quantization_config());
  if (config == nullptr) throw std::bad_alloc();
  // The core reads (seed, offset) from an int64 [2] tensor in host memory: the CPU handler's
  // buffers are host memory (on a GPU the core refuses this state, and NVFP4 has no GPU kernel).
  TensorWrapper rng(dev);
  if (stochastic_rounding) {
    TE_LITE_CHECK(rng_state.element_type() == DataType::U32 && rng_state.element_count() >= 4,
                  kOp, ": argument 'rng_state': expected uint32 with at least 4 elements "
                  "(seed, offset as two int64) for stochastic rounding, got ",
                  dtype_name(rng_state.element_type()), " of shape ", shape_str(rng_state));
    NVTEBasicTensor bt{};
    bt.data_ptr = rng_state.untyped_data();
    bt.dtype = kNVTEInt64;
    bt.shape.ndim = 1;
    bt.shape.data[0] = 2;
    rng.set(kNVTERowwiseData, bt);
    NVTETensor h = rng.get();
    TE_LITE_TRY(set_attr(kOp, config.get(), kNVTEQuantizationConfigRNGState, h));
  }
  const uint32_t mask = static_cast<uint32_t>(rht_sign_mask);
  TE_LITE_TRY(set_attr(kOp, config.get(), kNVTEQuantizationConfigNVFP42DQuantization, two_d));
  TE_LITE_TRY(set_attr(kOp, config.get(), kNVTEQuantizationConfigNVFP4RHT, rht));
  TE_LITE_TRY(set_attr(kOp, config.get(), kNVTEQuantizationConfigNVFP4RHTSignMask, mask));
  TE_LITE_TRY(set_attr(kOp, config.get(), kNVTEQuantizationConfigStochasticRounding,
                       stochastic_rounding));
  TE_LITE_TRY(set_attr(kOp, config.get(), kNVTEQuantizationConfigNVFP4AmaxGiven, given));
  return check_nvte(kOp, nvte_quantize_v2(in.get(), out.get(), config.get(), dev.stream));
}

// One stored copy as stored: packed [rows, cols/2] data -> [rows, cols] (a column-wise copy is
// passed as its transposed [cols, rows/2] data with its own scales and amax).
ffi::Error dequantize_nvfp4(const Device &dev, Buffer data, Buffer scale_inv, Buffer amax,
                            Buffer out) {
  constexpr const char *kOp = "te_lite::dequantize_nvfp4";
  TE_LITE_TRY(check_dtype(kOp, "data", data, {DataType::U8}));
  TE_LITE_TRY(check_ndim(kOp, "data", data, 2));
  TE_LITE_TRY(check_dtype(kOp, "scale_inv", scale_inv, {DataType::U8}));
  TE_LITE_TRY(check_fp32_scalar(kOp, "amax", amax));
  TE_LITE_TRY(check_dtype(kOp, "out_dtype", out, kHighPrecision));
  TE_LITE_TRY(check_result(kOp, "out", out, out.element_type(), {dim(data, 0), 2 * dim(data, 1)}));
  TensorWrapper in(dev, NVTE_NVFP4_1D_SCALING), o(dev);
  in.data(data).scale_inv(scale_inv, kNVTEFloat8E4M3).amax(amax);
  o.data(out);
  return check_nvte(kOp, nvte_dequantize(in.get(), o.get(), dev.stream));
}

// The NVFP4 GEMM in the FP4 tensor core's order: out [m, n] fp32 = the K-ordered sum of the exact
// 16-block terms of b . a^T through nvte_nvfp4_block_gemm (gemm.h), as
// torch.ops.te_lite.nvfp4_block_gemm, so both front ends give the same bits; then, when K > 0 and
// the amaxes are given (float32 [1] each, else [0]), times (amax_b * amax_a) / (6 * 6 * 448 *
// 448) in fp32, as the PyTorch front end's _scaled. The factor is formed here because XLA's CPU
// backend divides through a reciprocal (a / c != RN(a / c) for about one value in six), and TE's
// reference divides. b and a are the copies whose blocks run along K: packed uint8 [rows, K / 2]
// and uint8 E4M3 scales, at least [rows, ceil(K / 16)] (padded grids or TE-JAX's unpadded ones).
ffi::Error nvfp4_block_gemm(const Device &dev, Buffer b_data, Buffer b_scale, Buffer a_data,
                            Buffer a_scale, Buffer amax_b, Buffer amax_a, Buffer out) {
  constexpr const char *kOp = "te_lite::nvfp4_block_gemm";
  for (const auto &[t, name] : {std::pair{&b_data, "b_data"}, std::pair{&a_data, "a_data"},
                                std::pair{&b_scale, "b_scale"}, std::pair{&a_scale, "a_scale"}}) {
    TE_LITE_TRY(check_dtype(kOp, name, *t, {DataType::U8}));
    TE_LITE_TRY(check_ndim(kOp, name, *t, 2));
  }
  const bool scaled = numel(amax_b) != 0;
  TE_LITE_CHECK(scaled == (numel(amax_a) != 0), kOp, ": arguments 'amax_b' and 'amax_a': expected "
                "both (float32 [1]) or neither ([0]), got shapes ", shape_str(amax_b), " and ",
                shape_str(amax_a));
  if (scaled) {
    TE_LITE_TRY(check_fp32_scalar(kOp, "amax_b", amax_b));
    TE_LITE_TRY(check_fp32_scalar(kOp, "amax_a", amax_a));
  }
  TE_LITE_CHECK(!dev.is_gpu(), kOp, ": expected CPU buffers (the NVFP4 block GEMM "
                "runs on the CPU only), got GPU ones");
  TE_LITE_TRY(check_result(kOp, "out", out, DataType::F32, {dim(b_data, 0), dim(a_data, 0)}));
  TensorWrapper tb(dev, NVTE_NVFP4_1D_SCALING), ta(dev, NVTE_NVFP4_1D_SCALING), d(dev);
  tb.data(b_data).scale_inv(b_scale, kNVTEFloat8E4M3);
  ta.data(a_data).scale_inv(a_scale, kNVTEFloat8E4M3);
  d.data(out);
  TE_LITE_TRY(check_nvte(kOp, nvte_nvfp4_block_gemm(tb.get(), ta.get(), d.get(), dev.stream)));
  if (scaled && dim(b_data, 1) > 0) {  // an empty K leaves the zeros unscaled (as PyTorch's)
    const float part = *static_cast<const float *>(amax_b.untyped_data()) *
                       *static_cast<const float *>(amax_a.untyped_data());
    const float factor = part / (36.0f * 448.0f * 448.0f);
    float *y = static_cast<float *>(out.untyped_data());
    for (int64_t i = 0, e = numel(out); i < e; ++i) y[i] = factor * y[i];
  }
  return ffi::Error::Success();
}

}  // namespace

TE_LITE_FFI_HANDLERS(quantize_nvfp4, quantize_nvfp4,
                     .Arg<Buffer>()  // x: [rows, cols], float32 / float16 / bfloat16
                     .Arg<Buffer>()  // rng_state: uint32 [>= 4] (stochastic rounding) or [0]
                     .Arg<Buffer>()  // row_amax_in: float32 [1] (a given amax) or [0]
                     .Arg<Buffer>()  // col_amax_in: float32 [1] (given, post-RHT) or [0]
                     .Ret<Buffer>()  // row_data: uint8 [rows, cols/2] (or [0])
                     .Ret<Buffer>()  // row_scale_inv: uint8 E4M3 [rows, cols/16] padded
                     .Ret<Buffer>()  // row_amax: float32 [1] ([0] when given)
                     .Ret<Buffer>()  // col_data: uint8 [cols, rows/2] (or [0])
                     .Ret<Buffer>()  // col_scale_inv: uint8 E4M3 [cols, rows/16] padded
                     .Ret<Buffer>()  // col_amax: float32 [1] (post-RHT; [0] when given)
                     .Attr<bool>("rowwise")              // write the row-wise copy
                     .Attr<bool>("columnwise")           // write the column-wise copy
                     .Attr<bool>("two_d")                // 16x16 blocks (weights)
                     .Attr<bool>("rht")                  // Hadamard-transform the column-wise copy
                     .Attr<int64_t>("rht_sign_mask")     // RHT signs, bit i = sign of row i
                     .Attr<bool>("stochastic_rounding")  // SR from rng_state
);

TE_LITE_FFI_HANDLERS(dequantize_nvfp4, dequantize_nvfp4,
                     .Arg<Buffer>()  // data: uint8 [rows, cols/2]
                     .Arg<Buffer>()  // scale_inv: uint8 E4M3 (padded grid)
                     .Arg<Buffer>()  // amax: float32 [1]
                     .Ret<Buffer>()  // out: [rows, cols], high precision (out_dtype)
);

TE_LITE_FFI_HANDLERS(nvfp4_block_gemm, nvfp4_block_gemm,
                     .Arg<Buffer>()  // b_data: uint8 [m, K/2], blocks along K
                     .Arg<Buffer>()  // b_scale: uint8 E4M3 [>= m, >= K/16]
                     .Arg<Buffer>()  // a_data: uint8 [n, K/2]
                     .Arg<Buffer>()  // a_scale: uint8 E4M3 [>= n, >= K/16]
                     .Arg<Buffer>()  // amax_b: float32 [1], or [0]: no per-tensor factor
                     .Arg<Buffer>()  // amax_a: float32 [1], or [0]
                     .Ret<Buffer>()  // out: float32 [m, n]
);

}  // namespace te_lite
