// te_lite ops of NVFP4BlockScaling (TE's NVTE_NVFP4_1D_SCALING): quantize into TE's NVFP4Tensor
// buffers (uint8 data with two E2M1 per byte, uint8 E4M3 scale grids padded to [128, 4] multiples,
// fp32 amax per copy), with 2D blocks, the random Hadamard transform of the column-wise copy and
// stochastic rounding, 4over6 and row scaling as options; dequantize one stored copy.
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include <transformer_engine_lite/cast.h>

#include "common.h"

namespace te_lite {
namespace {

int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

std::vector<int64_t> scale_shape(int64_t rows, int64_t cols) {
  return {round_up(rows, 128), round_up((cols + 15) / 16, 4)};
}

// Row scaling and the E4M3 bound travel on the tensor (TE's kNVTERowScaledNVFP4 /
// kNVTENVFP4E4M3Max); quantize, dequantize and GEMM read them there.
void set_nvfp4_params(TensorWrapper &t, bool row_scaled, int64_t e4m3_max, const char *op) {
  const uint8_t rs = row_scaled ? 1 : 0;
  const int32_t em = static_cast<int32_t>(e4m3_max);
  check_nvte(nvte_set_tensor_param_v2(t.get(), kNVTERowScaledNVFP4, &rs, sizeof(rs)), op);
  check_nvte(nvte_set_tensor_param_v2(t.get(), kNVTENVFP4E4M3Max, &em, sizeof(em)), op);
}

template <typename T>
void set_attr(const QuantizationConfig &c, NVTEQuantizationConfigAttribute a, const T &v,
              const char *op) {
  check_nvte(nvte_set_quantization_config_attribute(c.get(), a, &v, sizeof(T)), op);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_nvfp4(
    const at::Tensor &x_, bool rowwise, bool columnwise, bool two_d, bool rht,
    int64_t rht_sign_mask, bool stochastic_rounding, int64_t seed, int64_t offset,
    bool row_scaled, int64_t four_over_six, int64_t e4m3_max, bool err_fast_math,
    const std::optional<at::Tensor> &row_amax_in, const std::optional<at::Tensor> &col_amax_in) {
  constexpr const char *kOp = "te_lite::quantize_nvfp4";
  check_dtype(kOp, "x", x_, kHighPrecision);
  check_min_ndim(kOp, "x", x_, 1);
  TORCH_CHECK(rowwise || columnwise, kOp,
              ": arguments 'rowwise' and 'columnwise': expected at least one true, got both false");
  TORCH_CHECK(rht_sign_mask >= 0 && rht_sign_mask <= 0xFFFF, kOp,
              ": argument 'rht_sign_mask': expected a 16-bit mask, got ", rht_sign_mask);
  TORCH_CHECK(four_over_six >= 0 && four_over_six <= 2, kOp, ": argument 'four_over_six': "
              "expected 0 (disabled), 1 (MAE) or 2 (MSE), got ", four_over_six);
  TORCH_CHECK(e4m3_max == 448 || e4m3_max == 256, kOp,
              ": argument 'e4m3_max': expected 448 or 256, got ", e4m3_max);
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous();
  const int64_t cols = x.size(-1);
  int64_t rows = 1;
  for (int64_t i = 0; i + 1 < x.dim(); ++i) rows *= x.size(i);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  std::vector<int64_t> tshape{cols};
  for (int64_t i = 0; i + 1 < x.dim(); ++i) tshape.push_back(x.size(i));
  // Odd last dims are refused by the core with the argument named; halve only even ones here.
  shape.back() /= 2;
  tshape.back() /= 2;
  const auto u8 = x.options().dtype(at::kByte), f32 = x.options().dtype(at::kFloat);
  const std::vector<int64_t> none{0};
  at::Tensor row = at::empty(rowwise ? shape : none, u8);
  at::Tensor row_s = at::empty(rowwise ? scale_shape(rows, cols) : none, u8);
  // Row-scaled: one amax per row of each copy.
  at::Tensor row_a = at::empty(rowwise ? std::vector<int64_t>{row_scaled ? rows : 1} : none, f32);
  at::Tensor col = at::empty(columnwise ? tshape : none, u8);
  at::Tensor col_s = at::empty(columnwise ? scale_shape(cols, rows) : none, u8);
  at::Tensor col_a =
      at::empty(columnwise ? std::vector<int64_t>{row_scaled ? cols : 1} : none, f32);
  // Given amaxes (TE's amax all-reduced over amax_reduction_group before the cast): copied into
  // the results, which the core then reads instead of computing x's own.
  const bool given = row_amax_in.has_value() || col_amax_in.has_value();
  if (given) {
    TORCH_CHECK(!row_scaled, kOp, ": arguments 'row_amax_in', 'col_amax_in': a given amax "
                "expects plain NVFP4, got row_scaled=True (one amax per row)");
    for (const auto &[t, want, name] :
         {std::tuple{&row_amax_in, rowwise, "row_amax_in"},
          std::tuple{&col_amax_in, columnwise, "col_amax_in"}}) {
      TORCH_CHECK(t->has_value() == want, kOp, ": argument '", name, "': expected ",
                  want ? "float32 [1] (its copy is requested)" : "None (its copy is not requested)",
                  ", got ", t->has_value() ? "a tensor" : "None");
      if (!want) continue;
      check_dtype(kOp, name, **t, {at::kFloat});
      TORCH_CHECK((*t)->numel() == 1, kOp, ": argument '", name, "': expected one float32, got "
                  "shape ", (*t)->sizes());
      check_same_device(kOp, x_, "x", **t, name);
    }
    if (rowwise) row_a.copy_(row_amax_in->reshape({1}));
    if (columnwise) col_a.copy_(col_amax_in->reshape({1}));
  }
  TensorWrapper in, out(NVTE_NVFP4_1D_SCALING);
  set_nvfp4_params(out, row_scaled, e4m3_max, kOp);
  in.data(x);
  if (rowwise) out.data(row).scale_inv(row_s, kNVTEFloat8E4M3).amax(row_a);
  if (columnwise)
    out.columnwise_data(col)
        .columnwise_scale_inv(col_s, kNVTEFloat8E4M3)
        .set(kNVTEColumnwiseAmax, col_a);
  // The RNG state lives in host memory (the core reads seed and offset when quantizing).
  at::Tensor rng = at::empty({2}, at::TensorOptions().dtype(at::kLong));
  rng.data_ptr<int64_t>()[0] = seed;
  rng.data_ptr<int64_t>()[1] = offset;
  TensorWrapper rng_w;
  rng_w.data(rng);
  NVTETensor rng_h = rng_w.get();
  QuantizationConfig config(nvte_create_quantization_config());
  TORCH_CHECK(config != nullptr, kOp, ": nvte_create_quantization_config: out of memory");
  const uint32_t mask = static_cast<uint32_t>(rht_sign_mask);
  set_attr(config, kNVTEQuantizationConfigNVFP42DQuantization, two_d, kOp);
  set_attr(config, kNVTEQuantizationConfigNVFP4RHT, rht, kOp);
  set_attr(config, kNVTEQuantizationConfigNVFP4RHTSignMask, mask, kOp);
  set_attr(config, kNVTEQuantizationConfigStochasticRounding, stochastic_rounding, kOp);
  set_attr(config, kNVTEQuantizationConfigRNGState, rng_h, kOp);
  const uint8_t fos = static_cast<uint8_t>(four_over_six);
  set_attr(config, kNVTEQuantizationConfigNVFP44Over6Mode, fos, kOp);
  set_attr(config, kNVTEQuantizationConfigNVFP44Over6ErrUseFastMath, err_fast_math, kOp);
  set_attr(config, kNVTEQuantizationConfigNVFP4AmaxGiven, given, kOp);
  check_nvte(nvte_quantize_v2(in.get(), out.get(), config.get(), ctx.stream()), kOp);
  return {row, row_s, row_a, col, col_s, col_a};
}

// Dequantizes one stored copy as stored: packed [..., n/2] data -> [..., n].
at::Tensor dequantize_nvfp4(const at::Tensor &data_, const at::Tensor &scale_inv_,
                            const at::Tensor &amax_, at::ScalarType out_dtype, bool row_scaled,
                            int64_t e4m3_max) {
  constexpr const char *kOp = "te_lite::dequantize_nvfp4";
  check_dtype(kOp, "data", data_, {at::kByte});
  check_dtype(kOp, "scale_inv", scale_inv_, {at::kByte, at::ScalarType::Float8_e4m3fn});
  check_dtype(kOp, "amax", amax_, {at::kFloat});
  check_min_ndim(kOp, "data", data_, 1);
  check_same_device(kOp, data_, "data", scale_inv_, "scale_inv");
  check_same_device(kOp, data_, "data", amax_, "amax");
  check_dtype(kOp, "out_dtype", out_dtype, kHighPrecision);
  const DeviceContext ctx(data_);
  const at::Tensor data = data_.contiguous(), s = scale_inv_.contiguous(), a = amax_.contiguous();
  std::vector<int64_t> shape(data.sizes().begin(), data.sizes().end());
  shape.back() *= 2;
  at::Tensor out = at::empty(shape, data.options().dtype(out_dtype));
  TensorWrapper in(NVTE_NVFP4_1D_SCALING), o;
  in.data(data).scale_inv(s, kNVTEFloat8E4M3).amax(a);
  TORCH_CHECK(e4m3_max == 448 || e4m3_max == 256, kOp,
              ": argument 'e4m3_max': expected 448 or 256, got ", e4m3_max);
  set_nvfp4_params(in, row_scaled, e4m3_max, kOp);
  o.data(out);
  check_nvte(nvte_dequantize(in.get(), o.get(), ctx.stream()), kOp);
  return out;
}

void register_impls(torch::Library &m) {
  m.impl("quantize_nvfp4", &quantize_nvfp4);
  m.impl("dequantize_nvfp4", &dequantize_nvfp4);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) { te_lite::register_impls(m); }
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) { te_lite::register_impls(m); }
#endif

// Not differentiable: quantization outputs never require grad.
TORCH_LIBRARY_IMPL(te_lite, Autograd, m) {
  for (const char *op : {"quantize_nvfp4", "dequantize_nvfp4"}) {
    m.impl(op, torch::CppFunction::makeFallthrough());
  }
}
