// te_lite ops of Float8BlockScaling (TE's NVTE_BLOCK_SCALING_1D / _2D): quantize into the GEMM_READY
// row-wise / column-wise (transposed) copies with fp32 scale grids, and dequantize one copy.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <utility>
#include <vector>

#include <transformer_engine_lite/cast.h>
#include <transformer_engine_lite/gemm.h>

#include "common.h"

namespace te_lite {
namespace {

constexpr int64_t kBlock = 128;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up4(int64_t a) { return (a + 3) / 4 * 4; }

// GEMM_READY scale grid of a [rows, cols] view (see cast.h, nvte_quantize_v2).
std::vector<int64_t> scale_shape(int64_t rows, int64_t cols, int64_t dim, bool columnwise) {
  if (dim == 2) {
    return columnwise ? std::vector<int64_t>{ceil_div(cols, kBlock), round_up4(ceil_div(rows, kBlock))}
                      : std::vector<int64_t>{ceil_div(rows, kBlock), round_up4(ceil_div(cols, kBlock))};
  }
  return columnwise ? std::vector<int64_t>{ceil_div(rows, kBlock), round_up4(cols)}
                    : std::vector<int64_t>{ceil_div(cols, kBlock), round_up4(rows)};
}

NVTEScalingMode mode_of(const char *op, int64_t dim) {
  TORCH_CHECK(dim == 1 || dim == 2, op, ": argument 'block_scaling_dim': expected 1 or 2, got ",
              dim);
  return dim == 2 ? NVTE_BLOCK_SCALING_2D : NVTE_BLOCK_SCALING_1D;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_fp8_block(
    const at::Tensor &x_, at::ScalarType fp8_dtype, int64_t block_scaling_dim, bool rowwise,
    bool columnwise, bool force_pow_2_scales, double amax_epsilon) {
  constexpr const char *kOp = "te_lite::quantize_fp8_block";
  check_dtype(kOp, "x", x_, kHighPrecision);
  check_min_ndim(kOp, "x", x_, 1);
  const NVTEScalingMode mode = mode_of(kOp, block_scaling_dim);
  TORCH_CHECK(fp8_dtype == at::ScalarType::Float8_e4m3fn || fp8_dtype == at::ScalarType::Float8_e5m2,
              kOp, ": argument 'fp8_dtype': expected Float8_e4m3fn or Float8_e5m2 for block "
              "scaling, got ", dtype_name(fp8_dtype));
  TORCH_CHECK(rowwise || columnwise, kOp,
              ": arguments 'rowwise' and 'columnwise': expected at least one true, got both false");
  const DeviceContext ctx(x_);
  const at::Tensor x = x_.contiguous();
  const int64_t cols = x.size(-1);
  int64_t rows = 1;  // leading dims flattened (not numel / cols: cols may be 0)
  for (int64_t i = 0; i + 1 < x.dim(); ++i) rows *= x.size(i);
  std::vector<int64_t> tshape{cols};
  for (int64_t i = 0; i + 1 < x.dim(); ++i) tshape.push_back(x.size(i));
  const auto fp8 = x.options().dtype(fp8_dtype), f32 = x.options().dtype(at::kFloat);
  const std::vector<int64_t> none{0};
  at::Tensor row = at::empty(rowwise ? x.sizes() : at::IntArrayRef(none), fp8);
  at::Tensor row_s = at::empty(rowwise ? scale_shape(rows, cols, block_scaling_dim, false) : none, f32);
  at::Tensor col = at::empty(columnwise ? at::IntArrayRef(tshape) : at::IntArrayRef(none), fp8);
  at::Tensor col_s = at::empty(columnwise ? scale_shape(rows, cols, block_scaling_dim, true) : none, f32);
  TensorWrapper in, out(mode);
  in.data(x);
  if (rowwise) out.data(row).scale_inv(row_s);
  if (columnwise) out.columnwise_data(col).columnwise_scale_inv(col_s);
  const QuantizationConfig config = scale_rule_config(kOp, amax_epsilon, force_pow_2_scales);
  check_nvte(nvte_quantize_v2(in.get(), out.get(), config.get(), ctx.stream()), kOp);
  return {row, row_s, col, col_s};
}

// Dequantizes one stored copy as stored: row-wise data -> input's shape; column-wise data ->
// the transposed shape it is stored in ([last dim, leading dims...]).
at::Tensor dequantize_fp8_block(const at::Tensor &data_, const at::Tensor &scale_inv_,
                                int64_t block_scaling_dim, bool columnwise,
                                at::ScalarType out_dtype) {
  constexpr const char *kOp = "te_lite::dequantize_fp8_block";
  check_dtype(kOp, "data", data_, kFP8);
  check_min_ndim(kOp, "data", data_, 1);
  const NVTEScalingMode mode = mode_of(kOp, block_scaling_dim);
  TORCH_CHECK(scale_inv_.scalar_type() == at::kFloat, kOp,
              ": argument 'scale_inv': expected float32 scales, got ",
              dtype_name(scale_inv_.scalar_type()));
  check_same_device(kOp, data_, "data", scale_inv_, "scale_inv");
  check_dtype(kOp, "out_dtype", out_dtype, kHighPrecision);
  const DeviceContext ctx(data_);
  const at::Tensor data = data_.contiguous(), scale_inv = scale_inv_.contiguous();
  at::Tensor out = at::empty(data.sizes(), data.options().dtype(out_dtype));
  TensorWrapper in(mode), o;
  if (columnwise) {
    in.columnwise_data(data).columnwise_scale_inv(scale_inv);
  } else {
    in.data(data).scale_inv(scale_inv);
  }
  o.data(out);
  check_nvte(nvte_dequantize(in.get(), o.get(), ctx.stream()), kOp);
  return out;
}

// One K block of the block-scaled GEMM's accumulation (cpp_extensions/block_gemm.py), in place:
// y = fp32(fp64(y) + fp64(fp32(p * first)) * fp64(second)), `first` and `second` each [m, 1] or
// [1, n] fp32 (per-row or per-column scales). The fp64 product of two fp32 values is exact, so
// this is Python's torch expression step for step, bit for bit, without its six temporaries.
// Host memory only; a GPU caller keeps the torch expression.
void block_gemm_accumulate_(at::Tensor y, const at::Tensor &p, const at::Tensor &first,
                            const at::Tensor &second) {
  constexpr const char *kOp = "te_lite::block_gemm_accumulate_";
  TORCH_CHECK(y.device().is_cpu(), kOp, ": argument 'y': expected a CPU tensor, got ", y.device());
  TORCH_CHECK(y.dim() == 2 && y.scalar_type() == at::kFloat && y.is_contiguous(), kOp,
              ": argument 'y': expected a contiguous fp32 [m, n] tensor, got ", y.scalar_type(),
              " ", y.sizes());
  const int64_t m = y.size(0), n = y.size(1);
  TORCH_CHECK(p.sizes() == y.sizes() && p.scalar_type() == at::kFloat && p.device().is_cpu(), kOp,
              ": argument 'p': expected fp32 ", y.sizes(), " on the CPU, got ", p.scalar_type(),
              " ", p.sizes(), " on ", p.device());
  for (const auto &[t, name] : {std::pair{&first, "first"}, std::pair{&second, "second"}}) {
    const bool ok = t->dim() == 2 && t->scalar_type() == at::kFloat && t->device().is_cpu() &&
                    ((t->size(0) == m && t->size(1) == 1) || (t->size(0) == 1 && t->size(1) == n));
    TORCH_CHECK(ok, kOp, ": argument '", name, "': expected fp32 [", m, ", 1] or [1, ", n,
                "] on the CPU, got ", t->scalar_type(), " ", t->sizes(), " on ", t->device());
  }
  const at::Tensor pc = p.contiguous(), f = first.expand({m, n}), s = second.expand({m, n});
  float *yd = y.data_ptr<float>();
  const float *pd = pc.data_ptr<float>(), *fd = f.data_ptr<float>(), *sd = s.data_ptr<float>();
  const int64_t fs0 = f.stride(0), fs1 = f.stride(1), ss0 = s.stride(0), ss1 = s.stride(1);
  at::parallel_for(0, m, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const float partial = pd[i * n + j] * fd[i * fs0 + j * fs1];
        const double acc = static_cast<double>(yd[i * n + j]) +
                           static_cast<double>(partial) * static_cast<double>(sd[i * ss0 + j * ss1]);
        yd[i * n + j] = static_cast<float>(acc);
      }
    }
  });
}

// The NVFP4 GEMM in the FP4 tensor core's order (cpp_extensions/nvfp4_gemm.py), through the
// core's nvte_nvfp4_block_gemm (gemm.h, the same call as the JAX handler): y [m, n] fp32 = sum
// over 16-element K blocks, in K order from 0, of the exact block terms of b . a^T. b and a are
// the NVFP4 copies whose blocks run along K: packed E2M1 data uint8 [rows, K / 2] and their E4M3
// scale grids (uint8 or float8_e4m3fn, at least [rows, ceil(K / 16)]). CPU or CUDA tensors, all on
// one device (the GPU kernel gives the CPU's bits).
at::Tensor nvfp4_block_gemm(const at::Tensor &b_data, const at::Tensor &b_scale,
                            const at::Tensor &a_data, const at::Tensor &a_scale) {
  constexpr const char *kOp = "te_lite::nvfp4_block_gemm";
  for (const auto &[t, name] : {std::pair{&b_data, "b_data"}, std::pair{&a_data, "a_data"}}) {
    TORCH_CHECK(t->dim() == 2 && t->scalar_type() == at::kByte, kOp, ": argument '", name,
                "': expected a 2-D uint8 tensor (two E2M1 codes per byte), got ",
                t->scalar_type(), " ", t->sizes());
  }
  for (const auto &[t, name] : {std::pair{&b_scale, "b_scale"}, std::pair{&a_scale, "a_scale"}}) {
    TORCH_CHECK(t->dim() == 2 && (t->scalar_type() == at::kByte ||
                                  t->scalar_type() == at::ScalarType::Float8_e4m3fn),
                kOp, ": argument '", name, "': expected a 2-D uint8 or float8_e4m3fn tensor "
                "(E4M3 scales), got ", t->scalar_type(), " ", t->sizes());
    check_same_device(kOp, b_data, "b_data", *t, name);
  }
  check_same_device(kOp, b_data, "b_data", a_data, "a_data");
  const DeviceContext ctx(b_data);
  const at::Tensor bd = b_data.contiguous(), bs = b_scale.contiguous();
  const at::Tensor ad = a_data.contiguous(), as = a_scale.contiguous();
  at::Tensor y = at::empty({bd.size(0), ad.size(0)}, bd.options().dtype(at::kFloat));
  TensorWrapper tb(NVTE_NVFP4_1D_SCALING), ta(NVTE_NVFP4_1D_SCALING), td;
  tb.data(bd).scale_inv(bs, kNVTEFloat8E4M3);
  ta.data(ad).scale_inv(as, kNVTEFloat8E4M3);
  td.data(y);
  check_nvte(nvte_nvfp4_block_gemm(tb.get(), ta.get(), td.get(), ctx.stream()), kOp);
  return y;
}

void register_impls(torch::Library &m) {
  m.impl("quantize_fp8_block", &quantize_fp8_block);
  m.impl("dequantize_fp8_block", &dequantize_fp8_block);
}

}  // namespace
}  // namespace te_lite

TORCH_LIBRARY_IMPL(te_lite, CPU, m) {
  te_lite::register_impls(m);
  m.impl("block_gemm_accumulate_", &te_lite::block_gemm_accumulate_);
  m.impl("nvfp4_block_gemm", &te_lite::nvfp4_block_gemm);
}
#ifdef NVTE_TORCH_CUDA
TORCH_LIBRARY_IMPL(te_lite, CUDA, m) {
  te_lite::register_impls(m);
  m.impl("nvfp4_block_gemm", &te_lite::nvfp4_block_gemm);
}
#endif

// Not differentiable: quantization outputs never require grad (as cast.cpp's ops).
TORCH_LIBRARY_IMPL(te_lite, Autograd, m) {
  for (const char *op : {"quantize_fp8_block", "dequantize_fp8_block", "block_gemm_accumulate_",
                         "nvfp4_block_gemm"}) {
    m.impl(op, torch::CppFunction::makeFallthrough());
  }
}
