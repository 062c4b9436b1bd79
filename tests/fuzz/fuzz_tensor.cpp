// Fuzzes the handle half of the C API: nvte_create_tensor / nvte_destroy_tensor with any scaling
// mode, nvte_set_tensor_param / nvte_get_tensor_param with any param name, dtype, rank, dims (huge
// ones included) and NULL pointers, the accessors, device tags, dtype names and sizes, quantization
// configs and the enum-name helpers. A model of every handle checks that gets return what the last
// successful set stored and that a failed set changes nothing.
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "transformer_engine_lite/fused_attn.h"

namespace {

using fz::Ctx;
using fz::Input;

struct Model {
  NVTETensor h = nullptr;
  int scaling_mode = 0;
  NVTEDevice device = kNVTEDeviceCPU;
  std::array<NVTEBasicTensor, kNVTENumTensorParams> params{};
};

bool same(const NVTEBasicTensor &a, const NVTEBasicTensor &b) { return fz::same_param(a, b); }

NVTEBasicTensor zero_param() {
  NVTEBasicTensor z;
  std::memset(&z, 0, sizeof(z));
  z.dtype = kNVTEFloat32;  // a fresh buffer's dtype (util/tensor.h)
  return z;
}

int any_int(Input &in, int valid_count) {
  const uint8_t k = in.u8();
  if (k < 200) return k % valid_count;
  switch (k % 6) {
    case 0: return valid_count;
    case 1: return -1;
    case 2: return 100;
    case 3: return 0x7FFFFFFF;
    case 4: return static_cast<int>(0x80000000u);
    default: return static_cast<int>(in.u32());
  }
}

void check_model(const Model &m) {
  for (int p = 0; p < kNVTENumTensorParams; ++p) {
    const NVTEBasicTensor got = nvte_get_tensor_param(m.h, static_cast<NVTETensorParam>(p));
    if (!same(got, m.params[p])) {
      fz::fail("nvte_get_tensor_param(" + std::to_string(p) + ") differs from the model");
    }
  }
  if (static_cast<int>(nvte_tensor_scaling_mode(m.h)) != m.scaling_mode) {
    fz::fail("nvte_tensor_scaling_mode differs from the mode the handle was created with");
  }
  if (nvte_tensor_device(m.h) != m.device) fz::fail("nvte_tensor_device differs from the last set");
  const NVTEBasicTensor &row = m.params[kNVTERowwiseData];
  size_t n = 1;  // wrapping product, as the library's numel
  for (size_t i = 0; i < row.shape.ndim; ++i) n *= row.shape.data[i];
  if (nvte_tensor_numel(m.h) != n) fz::fail("nvte_tensor_numel is not the product of the dims");
  if (nvte_tensor_data(m.h) != row.data_ptr || nvte_tensor_type(m.h) != row.dtype) {
    fz::fail("nvte_tensor_data / nvte_tensor_type disagree with the row-wise param");
  }
  const NVTEShape s = nvte_tensor_shape(m.h);
  if (s.ndim != row.shape.ndim) fz::fail("nvte_tensor_shape disagrees with the row-wise param");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Input in(data, size);
  Ctx ctx(in);
  std::vector<Model> hs;
  std::vector<NVTEQuantizationConfig> cfgs;
  for (int step = 0; step < 48 && in.remaining() > 0; ++step) {
    switch (in.u8() % 12) {
      case 0: {  // create
        if (hs.size() >= 8) break;
        const int mode = any_int(in, 2);
        Model m;
        m.h = nvte_create_tensor(static_cast<NVTEScalingMode>(mode));
        if (m.h == nullptr) fz::fail("nvte_create_tensor returned NULL");
        m.scaling_mode = mode;
        for (auto &p : m.params) p = zero_param();
        hs.push_back(m);
        check_model(hs.back());
        break;
      }
      case 1: {  // destroy (NULL is ignored)
        if (hs.empty() || in.flag()) {
          nvte_destroy_tensor(nullptr);
          break;
        }
        const size_t i = in.u8() % hs.size();
        nvte_destroy_tensor(hs[i].h);
        hs.erase(hs.begin() + i);
        break;
      }
      case 2:
      case 3:
      case 4: {  // set a param
        const int pn = any_int(in, kNVTENumTensorParams);
        const int dt = any_int(in, kNVTENumTypes);
        const size_t ndim = in.u8() < 240 ? in.range(0, 4) : in.range(0, NVTE_MAX_NDIM + 3);
        NVTEBasicTensor bt;
        std::memset(&bt, 0, sizeof(bt));
        bt.dtype = static_cast<NVTEDType>(dt);
        bt.shape.ndim = ndim;
        std::vector<size_t> dims;
        for (size_t i = 0; i < ndim && i < NVTE_MAX_NDIM; ++i) {
          bt.shape.data[i] = in.u8() < 230 ? in.range(0, 9) : in.size(3);
          dims.push_back(bt.shape.data[i]);
        }
        const size_t n = fz::numel(dims), es = fz::dsize(bt.dtype);
        if (!in.flag() && n <= fz::kMaxElems) bt.data_ptr = ctx.arena().fresh(n * (es ? es : 1));
        const uint8_t who = in.u8() % 16;
        if (who == 0) {  // NULL pointer to a handle
          ctx.expect_error("nvte_set_tensor_param", nvte_set_tensor_param(nullptr, kNVTEScale, &bt));
          break;
        }
        if (who == 1 || hs.empty()) {  // NULL handle
          NVTETensor null_handle = nullptr;
          ctx.expect_error("nvte_set_tensor_param",
                           nvte_set_tensor_param(&null_handle, kNVTEScale, &bt));
          break;
        }
        Model &m = hs[in.u8() % hs.size()];
        if (who == 2) {  // NULL description
          ctx.expect_error("nvte_set_tensor_param",
                           nvte_set_tensor_param(&m.h, static_cast<NVTETensorParam>(pn), nullptr));
          check_model(m);
          break;
        }
        const NVTEStatus st = nvte_set_tensor_param(&m.h, static_cast<NVTETensorParam>(pn), &bt);
        const bool valid = pn >= 0 && pn < kNVTENumTensorParams && dt >= 0 && dt < kNVTENumTypes &&
                           ndim <= NVTE_MAX_NDIM && fz::size_fits(dims, es);
        if (valid) {
          Ctx::expect_ok("nvte_set_tensor_param", st);
          m.params[pn] = bt;
        } else {
          ctx.expect_error("nvte_set_tensor_param", st);
        }
        check_model(m);
        break;
      }
      case 5: {  // get with any param name (out of range: a zeroed struct)
        if (hs.empty()) break;
        const int pn = any_int(in, kNVTENumTensorParams);
        const Model &m = hs[in.u8() % hs.size()];
        const NVTEBasicTensor got = nvte_get_tensor_param(m.h, static_cast<NVTETensorParam>(pn));
        if (pn >= 0 && pn < kNVTENumTensorParams) {
          if (!same(got, m.params[pn])) fz::fail("nvte_get_tensor_param differs from the model");
        } else {
          NVTEBasicTensor z;
          std::memset(&z, 0, sizeof(z));
          if (!same(got, z)) {
            fz::fail("nvte_get_tensor_param with an unknown name returned a non-zero struct");
          }
        }
        break;
      }
      case 6: {  // NULL-handle accessors
        const NVTEBasicTensor got = nvte_get_tensor_param(nullptr, kNVTERowwiseData);
        if (got.data_ptr != nullptr || got.shape.ndim != 0) fz::fail("NULL handle gave a buffer");
        if (nvte_tensor_numel(nullptr) != 0 || nvte_tensor_data(nullptr) != nullptr ||
            nvte_tensor_scaling_mode(nullptr) != NVTE_INVALID_SCALING ||
            nvte_tensor_device(nullptr) != kNVTEDeviceCPU || nvte_tensor_shape(nullptr).ndim != 0) {
          fz::fail("NULL-handle accessors are not the documented zeros");
        }
        break;
      }
      case 7: {  // device tags
        const int dev = any_int(in, 2);
        if (hs.empty() || in.u8() % 8 == 7) {
          ctx.expect_error("nvte_set_tensor_device",
                           nvte_set_tensor_device(nullptr, static_cast<NVTEDevice>(dev)));
          break;
        }
        Model &m = hs[in.u8() % hs.size()];
        const NVTEStatus st = nvte_set_tensor_device(m.h, static_cast<NVTEDevice>(dev));
        if (dev == 0 || dev == 1) {
          Ctx::expect_ok("nvte_set_tensor_device", st);
          m.device = static_cast<NVTEDevice>(dev);
        } else {
          ctx.expect_error("nvte_set_tensor_device", st);
        }
        check_model(m);
        break;
      }
      case 8: {  // dtype names and sizes of any value
        const int dt = any_int(in, kNVTENumTypes);
        const NVTEDType t = static_cast<NVTEDType>(dt);
        const char *name = nvte_dtype_name(t);
        if (name == nullptr || *name == '\0') fz::fail("nvte_dtype_name returned NULL or \"\"");
        const bool known = dt >= 0 && dt < kNVTENumTypes;
        if (nvte_dtype_size(t) != fz::dsize(t)) fz::fail("nvte_dtype_size differs from the table");
        if (known == (std::string(name) == "unknown")) fz::fail("nvte_dtype_name of " + std::to_string(dt));
        break;
      }
      case 9: {  // quantization configs
        const uint8_t what = in.u8() % 4;
        if (what == 0 && cfgs.size() < 4) {
          NVTEQuantizationConfig c = nvte_create_quantization_config();
          if (c == nullptr) fz::fail("nvte_create_quantization_config returned NULL");
          cfgs.push_back(c);
        } else if (what == 1 && !cfgs.empty()) {
          const size_t i = in.u8() % cfgs.size();
          nvte_destroy_quantization_config(cfgs[i]);
          cfgs.erase(cfgs.begin() + i);
        } else if (what == 2) {
          nvte_destroy_quantization_config(nullptr);
        } else {
          const int attr = any_int(in, kNVTEQuantizationConfigNumAttributes);
          const float f = in.real(0.5f);
          const bool b = in.flag();
          const uint8_t sz_pick = in.u8() % 8;
          const size_t sz = sz_pick == 0 ? 0 : sz_pick <= 3 ? sizeof(float) : sz_pick <= 5 ? sizeof(bool) : in.size(4);
          unsigned char buf[16] = {};
          const bool bool_attr = attr == kNVTEQuantizationConfigForcePow2Scales ||
                                 attr == kNVTEQuantizationConfigNVFP42DQuantization ||
                                 attr == kNVTEQuantizationConfigStochasticRounding ||
                                 attr == kNVTEQuantizationConfigNVFP44Over6ErrUseFastMath;
          // The 4over6 mode: one byte, 0 disabled, 1 MAE, 2 MSE.
          const bool mode_attr = attr == kNVTEQuantizationConfigNVFP44Over6Mode;
          const uint8_t mode = mode_attr ? static_cast<uint8_t>(in.u8() % 4) : 0;
          // The RNG-state attribute takes a handle: buf stays zero (a NULL handle) so no garbage
          // pointer is ever stored.
          if (bool_attr) std::memcpy(buf, &b, sizeof(b));
          else if (mode_attr) buf[0] = mode;
          else if (attr != kNVTEQuantizationConfigRNGState) std::memcpy(buf, &f, sizeof(f));
          NVTEQuantizationConfig c = cfgs.empty() || in.u8() % 8 == 7 ? nullptr : cfgs[in.u8() % cfgs.size()];
          const bool null_buf = in.u8() % 8 == 7;
          const NVTEStatus st = nvte_set_quantization_config_attribute(
              c, static_cast<NVTEQuantizationConfigAttribute>(attr), null_buf ? nullptr : buf, sz);
          Ctx::check_status("nvte_set_quantization_config_attribute", st);
          bool valid = c != nullptr && !null_buf;
          if (bool_attr) valid = valid && sz == sizeof(bool);
          else if (mode_attr) valid = valid && sz == sizeof(uint8_t) && mode <= 2;
          else if (attr == kNVTEQuantizationConfigAmaxEpsilon) valid = valid && sz == sizeof(float) && f >= 0.0f;
          else if (attr == kNVTEQuantizationConfigRNGState) valid = valid && sz == sizeof(NVTETensor);
          else valid = false;
          if (valid != (st == NVTE_SUCCESS)) {
            fz::fail("nvte_set_quantization_config_attribute: status " +
                     std::to_string(static_cast<int>(st)) + " for attr " + std::to_string(attr) +
                     " size " + std::to_string(sz));
          }
        }
        break;
      }
      case 10: {  // attention enum helpers of any value
        const int v = any_int(in, 16);
        const char *names[] = {nvte_qkv_layout_name(static_cast<NVTE_QKV_Layout>(v)),
                               nvte_mask_type_name(static_cast<NVTE_Mask_Type>(v)),
                               nvte_bias_type_name(static_cast<NVTE_Bias_Type>(v)),
                               nvte_fused_attn_backend_name(static_cast<NVTE_Fused_Attn_Backend>(v))};
        for (const char *n : names) {
          if (n == nullptr || *n == '\0') fz::fail("an attention name helper returned NULL or \"\"");
        }
        const int g = static_cast<int>(nvte_get_qkv_layout_group(static_cast<NVTE_QKV_Layout>(v)));
        const int f = static_cast<int>(nvte_get_qkv_format(static_cast<NVTE_QKV_Layout>(v)));
        if (g < NVTE_3HD || g > NVTE_HD_HD_HD || f < NVTE_SBHD || f > NVTE_THD) {
          fz::fail("layout group / format out of range for layout " + std::to_string(v));
        }
        break;
      }
      default: {  // version and build info
        const char *v = nvte_get_version();
        const char *b = nvte_get_build_info();
        if (v == nullptr || *v == '\0' || b == nullptr || b[0] != '{') {
          fz::fail("nvte_get_version / nvte_get_build_info returned nothing useful");
        }
        break;
      }
    }
  }
  for (Model &m : hs) nvte_destroy_tensor(m.h);
  for (NVTEQuantizationConfig c : cfgs) nvte_destroy_quantization_config(c);
  return 0;
}
