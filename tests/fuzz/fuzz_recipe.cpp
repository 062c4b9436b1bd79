// Fuzzes nvte_delayed_scaling_recipe_amax_and_scale_update: arbitrary history lengths and scale
// counts (0 included), histories and scales holding NaN / Inf / negatives / denormals / huge
// values, in-place updates and partial overlaps, any amax_compute_algo string (NULL included), any
// fp8_dtype value and any margin. A successful update is also checked against the documented rule
// (recipe.h) computed here in double precision where that is exact.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "transformer_engine_lite/recipe.h"

namespace {

using fz::Buf;
using fz::Ctx;
using fz::Input;

float value(Input &in) {
  const uint8_t k = in.u8();
  if (k < 128) return static_cast<float>(k) / 8.0f;  // 0 .. 16 in steps of 1/8
  return in.real(1.0f);
}

// Writes fuzz values into a tensor's fp32 row-wise buffer (when it is one).
void write_values(Input &in, NVTETensor t) {
  if (t == nullptr) return;
  const NVTEBasicTensor bt = nvte_get_tensor_param(t, kNVTERowwiseData);
  if (bt.data_ptr == nullptr || bt.dtype != kNVTEFloat32) return;
  size_t n = 1;
  for (size_t i = 0; i < bt.shape.ndim; ++i) n *= bt.shape.data[i];
  if (n > fz::kMaxElems) return;
  float *p = static_cast<float *>(bt.data_ptr);
  for (size_t i = 0; i < n; ++i) p[i] = value(in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Input in(data, size);
  Ctx ctx(in);
  const size_t len = in.range(0, 20), num = in.range(0, 24);
  const bool in_place = in.flag();
  std::string algo = in.flag() ? "most_recent" : "max";
  const uint8_t algo_mut = in.u8() % 16;
  const char *algo_ptr = algo.c_str();
  if (algo_mut == 1) algo_ptr = nullptr;
  if (algo_mut == 2) algo = "MAX";
  if (algo_mut == 3) algo = "";
  if (algo_mut == 4) algo = std::string("max\0junk", 8);  // a C string: still "max"
  if (algo_mut == 5) algo = "most_recent_";
  if (algo_mut > 1) algo_ptr = algo.c_str();
  const uint8_t dt = in.u8();
  const NVTEDType fp8 = dt < 200 ? fz::pick_fp8(in) : static_cast<NVTEDType>(static_cast<int>(in.i64(7)));
  const float margin = in.u8() < 200 ? static_cast<float>(in.range(0, 8)) : in.real(0.0f);

  NVTETensor hist = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEFloat32, {len, num}}});
  write_values(in, hist);
  NVTETensor scale = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEFloat32, {num}}});
  write_values(in, scale);
  // The expected result, from a copy of the inputs taken before the call.
  std::vector<float> h0, s0;
  const NVTEBasicTensor hb = hist ? nvte_get_tensor_param(hist, kNVTERowwiseData) : NVTEBasicTensor{};
  const NVTEBasicTensor sb = scale ? nvte_get_tensor_param(scale, kNVTERowwiseData) : NVTEBasicTensor{};
  NVTETensor uhist, uscale;
  if (in_place) {
    uhist = hist;
    uscale = scale;
  } else {
    uhist = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEFloat32, {len, num}}});
    uscale = ctx.tensor(NVTE_DELAYED_TENSOR_SCALING, {Buf{kNVTERowwiseData, kNVTEFloat32, {num}}});
  }
  const bool shapes_as_meant = hb.data_ptr && sb.data_ptr && hb.dtype == kNVTEFloat32 &&
                               hb.shape.ndim == 2 && hb.shape.data[0] == len && hb.shape.data[1] == num &&
                               sb.dtype == kNVTEFloat32 && sb.shape.ndim == 1 && sb.shape.data[0] == num;
  if (shapes_as_meant) {
    h0.assign(static_cast<float *>(hb.data_ptr), static_cast<float *>(hb.data_ptr) + len * num);
    s0.assign(static_cast<float *>(sb.data_ptr), static_cast<float *>(sb.data_ptr) + num);
  }
  const NVTEStatus st = ctx.call("nvte_delayed_scaling_recipe_amax_and_scale_update", [&] {
    return nvte_delayed_scaling_recipe_amax_and_scale_update(hist, scale, uhist, uscale, algo_ptr,
                                                             fp8, margin, nullptr);
  });
  if (st != NVTE_SUCCESS || !shapes_as_meant || len == 0) return 0;
  // The rule of recipe.h, where the output handles are the ones the harness meant.
  const NVTEBasicTensor ub = nvte_get_tensor_param(uhist, kNVTERowwiseData);
  const NVTEBasicTensor us = nvte_get_tensor_param(uscale, kNVTERowwiseData);
  if (ub.shape.ndim != 2 || us.shape.ndim != 1) return 0;
  const float *uh = static_cast<const float *>(ub.data_ptr);
  const float *usv = static_cast<const float *>(us.data_ptr);
  const float fmax = fp8 == kNVTEFloat8E4M3 ? 448.0f : fp8 == kNVTEFloat8E4M3FNUZ ? 240.0f : 57344.0f;
  const bool most_recent = std::string(algo_ptr) == "most_recent";
  for (size_t c = 0; c < num; ++c) {
    float amax = 0.0f;
    if (most_recent) {
      amax = h0[c];
    } else {
      for (size_t r = 0; r < len; ++r) {
        const float v = h0[r * num + c];
        if (v > amax) amax = v;  // NaN never compares greater: ignored
      }
    }
    float s = s0[c];
    if (std::isfinite(amax) && amax > 0.0f) {
      s = (fmax / amax) / static_cast<float>(std::exp2(static_cast<double>(margin)));
    }
    if (std::isinf(s)) s = 3.4028235e38f;  // FLT_MAX, for either sign (recipe.h)
    if (std::memcmp(&s, &usv[c], 4) != 0 && !(std::isnan(s) && std::isnan(usv[c]))) {
      fz::fail("delayed scaling: scale[" + std::to_string(c) + "] = " + std::to_string(usv[c]) +
               ", the rule gives " + std::to_string(s));
    }
    // The roll by -1: row r <- row r + 1, the last row <- the old row 0, then row 0 <- 0.
    for (size_t r = 0; r < len; ++r) {
      const float want = r == 0 ? 0.0f : r == len - 1 ? h0[c] : h0[(r + 1) * num + c];
      const float got = uh[r * num + c];
      if (std::memcmp(&want, &got, 4) != 0 && !(std::isnan(want) && std::isnan(got))) {
        fz::fail("delayed scaling: updated history [" + std::to_string(r) + ", " + std::to_string(c) +
                 "] = " + std::to_string(got) + ", the roll gives " + std::to_string(want));
      }
    }
  }
  return 0;
}
