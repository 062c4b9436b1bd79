// Fuzzes the cast family: nvte_quantize (per-tensor delayed / current scaling and MXFP8 outputs,
// row-wise, column-wise or both), nvte_dequantize, nvte_compute_amax, nvte_compute_scale_from_amax
// (with and without a quantization config), nvte_transpose and nvte_cast_transpose, with arbitrary
// shapes, dtypes, scaling modes, NULL handles and pointers, GPU tags and overlapping buffers.
#include <vector>

#include "fuzz_common.h"
#include "transformer_engine_lite/cast.h"
#include "transformer_engine_lite/transpose.h"

namespace {

using fz::Buf;
using fz::Ctx;
using fz::Input;

std::vector<size_t> data_shape(Input &in) {
  const size_t nd = in.range(1, 3);
  std::vector<size_t> s = fz::small_shape(in, nd - 1, 0, 40);
  s.push_back(in.range(0, 70));
  if (fz::numel(s) > 4096) s.back() = 1;
  fz::maybe_huge_empty(in, s);
  return s;
}

size_t rows_of(const std::vector<size_t> &s) {
  size_t r = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) r *= s[i];
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Input in(data, size);
  Ctx ctx(in);
  const uint8_t op = in.u8() % 6;
  const std::vector<size_t> shape = data_shape(in);
  const size_t rows = rows_of(shape), cols = shape.back();
  void *stream = in.u8() % 16 == 15 ? reinterpret_cast<void *>(0x10) : nullptr;  // ignored on CPU
  switch (op) {
    case 0: {  // quantize
      NVTETensor x = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING,
                                {Buf{kNVTERowwiseData, fz::pick_hp(in), shape}});
      fz::OutputChoice o = fz::output_buffers(in, shape);
      NVTETensor y = ctx.tensor(o.mode, o.bufs);
      ctx.call("nvte_quantize", [&] { return nvte_quantize(x, y, stream); });
      break;
    }
    case 1: {  // dequantize
      const NVTEDType q = fz::pick_fp8(in);
      NVTETensor x;
      if (in.flag()) {
        x = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING,
                       {Buf{kNVTERowwiseData, q, shape},
                        Buf{kNVTERowwiseScaleInv, kNVTEFloat32, {1}, in.real(0.5f)}});
      } else if (in.flag()) {
        x = ctx.tensor(NVTE_MXFP8_1D_SCALING,
                       {Buf{kNVTERowwiseData, q, shape},
                        Buf{kNVTERowwiseScaleInv, kNVTEFloat8E8M0, {rows, (cols + 31) / 32}}});
      } else {
        x = ctx.tensor(NVTE_MXFP8_1D_SCALING,
                       {Buf{kNVTEColumnwiseData, q, shape},
                        Buf{kNVTEColumnwiseScaleInv, kNVTEFloat8E8M0, {(rows + 31) / 32, cols}}});
      }
      NVTETensor y = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING,
                                {Buf{kNVTERowwiseData, fz::pick_hp(in), shape}});
      ctx.call("nvte_dequantize", [&] { return nvte_dequantize(x, y, stream); });
      break;
    }
    case 2: {  // amax
      NVTETensor x = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING,
                                {Buf{kNVTERowwiseData, fz::pick_hp(in), shape}});
      NVTETensor y = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING,
                                {Buf{kNVTERowwiseData, fz::pick_fp8(in), shape, 0.0f, true},
                                 Buf{kNVTEAmax, kNVTEFloat32, {1}}});
      ctx.call("nvte_compute_amax", [&] { return nvte_compute_amax(x, y, stream); });
      break;
    }
    case 3: {  // scale from amax (current scaling)
      std::vector<Buf> bufs = {Buf{kNVTERowwiseData, fz::pick_fp8(in), shape, 0.0f, in.flag()},
                               Buf{kNVTEAmax, kNVTEFloat32, {1}, in.real(3.0f)},
                               Buf{kNVTEScale, kNVTEFloat32, {1}, 1.0f}};
      if (in.flag()) bufs.push_back(Buf{kNVTERowwiseScaleInv, kNVTEFloat32, {1}, 1.0f});
      NVTETensor y = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, bufs);
      NVTEQuantizationConfig cfg = nullptr;
      if (in.flag()) {
        cfg = nvte_create_quantization_config();
        const bool pow2 = in.flag();
        const float eps = in.real(0.0f);
        nvte_set_quantization_config_attribute(cfg, kNVTEQuantizationConfigForcePow2Scales, &pow2,
                                               sizeof(pow2));
        nvte_set_quantization_config_attribute(cfg, kNVTEQuantizationConfigAmaxEpsilon, &eps,
                                               sizeof(eps));
      }
      ctx.call("nvte_compute_scale_from_amax",
               [&] { return nvte_compute_scale_from_amax(y, cfg, stream); });
      nvte_destroy_quantization_config(cfg);
      break;
    }
    case 4: {  // transpose (any dtype)
      const NVTEDType t = static_cast<NVTEDType>(in.u8() % kNVTENumTypes);
      const std::vector<size_t> s2 = {rows, cols};
      NVTETensor x = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, t, s2}});
      NVTETensor y = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING,
                                {Buf{kNVTERowwiseData, t, {cols, rows}}});
      ctx.call("nvte_transpose", [&] { return nvte_transpose(x, y, stream); });
      break;
    }
    default: {  // cast + transpose
      const std::vector<size_t> s2 = {rows, cols};
      const NVTEDType q = fz::pick_fp8(in);
      NVTETensor x = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING,
                                {Buf{kNVTERowwiseData, fz::pick_hp(in), s2}});
      std::vector<Buf> bufs = {Buf{kNVTERowwiseData, q, s2}, Buf{kNVTEColumnwiseData, q, {cols, rows}},
                               Buf{kNVTEScale, kNVTEFloat32, {1}, in.real(1.0f)}};
      if (in.flag()) bufs.push_back(Buf{kNVTEAmax, kNVTEFloat32, {1}});
      if (in.flag()) bufs.push_back(Buf{kNVTERowwiseScaleInv, kNVTEFloat32, {1}});
      NVTETensor y = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, bufs);
      ctx.call("nvte_cast_transpose", [&] { return nvte_cast_transpose(x, y, stream); });
      break;
    }
  }
  return 0;
}
