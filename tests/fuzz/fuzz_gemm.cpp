// Fuzzes nvte_cublas_gemm: operand shapes and transposes (k mismatches included), dtype pairs
// (high precision, FP8 x FP8 with scale_inv, unsupported mixes, MXFP8 operands), D in every encoding
// (HP, per-tensor FP8 with scale / amax / scale_inv / transposed copy, MXFP8), D with split leading
// dims, bias and pre_gelu_out in forward and backward (dgelu, bias gradient), accumulate, workspace,
// math_sm_count; plus the usual handle / pointer / overlap / device mutations.
#include <vector>

#include "fuzz_common.h"
#include "transformer_engine_lite/gemm.h"

namespace {

using fz::Buf;
using fz::Ctx;
using fz::Input;

// An operand [rows, cols] of dtype t: FP8 operands carry a per-tensor scale_inv.
NVTETensor operand(Ctx &ctx, NVTEDType t, size_t rows, size_t cols) {
  Input &in = ctx.in();
  std::vector<size_t> s = {rows, cols};
  if (in.u8() % 8 == 7 && rows % 2 == 0) s = {2, rows / 2, cols};  // 3-D: leading dims flatten
  if (fz::numel(s) > 0 && t >= kNVTEFloat8E4M3 && t != kNVTEFloat8E8M0) {
    if (in.u8() % 16 == 15) {  // block-scaled: not taken by the CPU GEMM
      return ctx.tensor(NVTE_MXFP8_1D_SCALING,
                        {Buf{kNVTERowwiseData, t, s},
                         Buf{kNVTERowwiseScaleInv, kNVTEFloat8E8M0, {rows, (cols + 31) / 32}}});
    }
    return ctx.tensor(NVTE_DELAYED_TENSOR_SCALING,
                      {Buf{kNVTERowwiseData, t, s}, Buf{kNVTERowwiseScaleInv, kNVTEFloat32, {1}, in.real(0.5f)}});
  }
  return ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, t, s}});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Input in(data, size);
  Ctx ctx(in);
  const size_t m = in.range(0, 40), n = in.range(0, 40), k = in.range(0, 40);
  const bool transa = in.flag(), transb = in.flag(), grad = in.flag(), accumulate = in.flag();
  const bool split = in.flag();
  const int sm = static_cast<int>(in.i64(0));
  // Operand dtypes: the same HP type, two FP8 types, or (rarely) any pair.
  NVTEDType ta, tb;
  const uint8_t pair = in.u8() % 8;
  if (pair < 4) {
    ta = tb = fz::pick_hp(in);
  } else if (pair < 7) {
    ta = fz::pick_fp8(in);
    tb = fz::pick_fp8(in);
  } else {
    ta = static_cast<NVTEDType>(in.u8() % kNVTENumTypes);
    tb = static_cast<NVTEDType>(in.u8() % kNVTENumTypes);
  }
  // Row-major A is [m, k] when transa (op(A) = A^T of [k, m]), else [k, m]; B is [k, n] when transb,
  // else [n, k]; D is [n, m].
  NVTETensor A = transa ? operand(ctx, ta, m, k) : operand(ctx, ta, k, m);
  const size_t kb = in.u8() % 16 == 15 ? in.range(0, 40) : k;  // sometimes a mismatched inner dim
  NVTETensor B = transb ? operand(ctx, tb, kb, n) : operand(ctx, tb, n, kb);
  std::vector<size_t> ds = {n, m};
  if (in.u8() % 8 == 7 && n % 2 == 0 && n > 0) ds = {2, n / 2, m};
  fz::OutputChoice o = fz::output_buffers(in, ds);
  NVTETensor D = ctx.tensor(o.mode, o.bufs);
  const uint8_t epi = in.u8() % 4;  // 0 none, 1 bias, 2 pre_gelu_out, 3 both
  NVTETensor bias = nullptr, pre = nullptr;
  const NVTEDType et = fz::pick_hp(in);
  if (epi & 1) {
    const size_t len = grad && !(epi & 2) ? n : m;
    bias = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, et, {len}}});
  } else if (in.u8() % 8 == 7) {
    bias = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {});  // a handle without data: "empty"
  }
  if (epi & 2) pre = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, et, {n, m}}});
  NVTETensor ws = nullptr;
  if (in.flag()) ws = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEByte, {64}}});
  ctx.call("nvte_cublas_gemm", [&] {
    return nvte_cublas_gemm(A, B, D, bias, pre, transa, transb, grad, ws, accumulate, split, sm,
                            nullptr);
  });
  return 0;
}
