// Shared support of the backend-selection tests (test_fused_attn_select.cpp: the eligibility rules
// and the preference order; test_fused_attn_select_env.cpp: env switches, this build, errors,
// logging, names): explicit platforms, a config every backend accepts, the reasons call, and a
// fixture that isolates every env variable the selection reads. Public C API only.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "transformer_engine_lite/fused_attn.h"

namespace select_test {

// ---------------------------------------------------------------- platforms and configs
const NVTEFusedAttnPlatform kRocmCk{true, true, false, true, "gfx942", nullptr};
const NVTEFusedAttnPlatform kRocmCkGfx90a{true, true, false, true, "gfx90a", nullptr};
const NVTEFusedAttnPlatform kRocmCkGfx950{true, true, false, true, "gfx950:sramecc+:xnack-", nullptr};
const NVTEFusedAttnPlatform kRocmCkRdna{true, true, false, true, "gfx1100", nullptr};
const NVTEFusedAttnPlatform kRocmCkNoArch{true, true, false, true, "", nullptr};
const NVTEFusedAttnPlatform kCudaWithCk{false, true, false, true, "sm_90", nullptr};  // CK needs ROCm
const NVTEFusedAttnPlatform kRocmAot{true, false, true, true, "gfx90a", nullptr};
const NVTEFusedAttnPlatform kRocmAotGfx942{true, false, true, true, "gfx942", nullptr};
const NVTEFusedAttnPlatform kRocmAotGfx908{true, false, true, true, "gfx908", nullptr};
const NVTEFusedAttnPlatform kCudaAotSm80{false, false, true, true, "sm_80", nullptr};
const NVTEFusedAttnPlatform kCudaAotSm90a{false, false, true, true, "sm_90a", nullptr};
const NVTEFusedAttnPlatform kCudaAotSm75{false, false, true, true, "sm_75", nullptr};
const NVTEFusedAttnPlatform kCudaAotSm86{false, false, true, true, "sm_86", nullptr};
// Builds with AOTriton images for some archs only (aotriton_archs).
const NVTEFusedAttnPlatform kRocmImagesGfx942OnGfx942{true, false, true, true, "gfx942:sramecc+:xnack-", "gfx942"};
const NVTEFusedAttnPlatform kRocmImagesGfx942OnGfx90a{true, false, true, true, "gfx90a", "gfx942"};
const NVTEFusedAttnPlatform kRocmNoImages{true, false, true, true, "gfx942", ""};
const NVTEFusedAttnPlatform kCudaImagesSm80OnSm90{false, false, true, true, "sm_90", "sm_80"};
const NVTEFusedAttnPlatform kRocmAotCudaArch{true, false, true, true, "sm_90", nullptr};
const NVTEFusedAttnPlatform kCudaAotNoDevice{false, false, true, true, "", "sm_80,sm_90"};
const NVTEFusedAttnPlatform kCpu{false, false, false, true, "", nullptr};
const NVTEFusedAttnPlatform kNoFlash{false, false, false, false, "", nullptr};
const NVTEFusedAttnPlatform kGpuFlash{false, false, false, true, "sm_90", nullptr};
const NVTEFusedAttnPlatform kAll{true, true, true, true, "gfx942", nullptr};  // every backend present

// A config every backend accepts on its platform (GPU tensors; flash/unfused cases switch to CPU).
inline NVTEFusedAttnConfig base_config() {
  NVTEFusedAttnConfig c{};
  c.device = kNVTEDeviceGPU;
  c.q_dtype = c.kv_dtype = kNVTEBFloat16;
  c.qkv_layout = NVTE_BSHD_BSHD_BSHD;
  c.bias_type = NVTE_NO_BIAS;
  c.attn_mask_type = NVTE_NO_MASK;
  c.dropout = 0.0f;
  c.num_attn_heads = c.num_gqa_groups = 8;
  c.max_seqlen_q = c.max_seqlen_kv = 128;
  c.head_dim_qk = c.head_dim_v = 64;
  c.window_size_left = c.window_size_right = -1;
  return c;
}

struct Result {
  NVTEStatus status = NVTE_ERROR_INTERNAL;
  NVTE_Fused_Attn_Backend selected = NVTE_No_Backend;
  std::string reasons[NVTE_NUM_FUSED_ATTN_BACKENDS];
  std::string error;
};

inline Result select(const NVTEFusedAttnConfig &c, const NVTEFusedAttnPlatform *pf) {
  Result r;
  const char *reasons[NVTE_NUM_FUSED_ATTN_BACKENDS] = {};
  r.status = nvte_fused_attn_backend_reasons(&c, pf, &r.selected, reasons);
  r.error = nvte_get_last_error();
  if (r.status == NVTE_SUCCESS) {
    for (int b = 0; b < NVTE_NUM_FUSED_ATTN_BACKENDS; ++b) r.reasons[b] = reasons[b];
  }
  return r;
}

// Every variable the selection reads: cleared before each test, restored after.
const char *const kEnvVars[] = {"NVTE_FUSED_ATTN",          "NVTE_FUSED_ATTN_CK",
                                "NVTE_FUSED_ATTN_AOTRITON", "NVTE_FLASH_ATTN",
                                "NVTE_UNFUSED_ATTN",        "NVTE_LOG_FUSED_ATTN_CONFIG",
                                "NVTE_LOG_CK_CONFIG",       "NVTE_LOG_AOTRITON_CONFIG"};

inline void set_env(const char *name, const char *value) {
  if (value) {
    setenv(name, value, 1);
  } else {
    unsetenv(name);
  }
}

class Select : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char *v : kEnvVars) {
      const char *cur = std::getenv(v);
      if (cur) saved_[v] = cur;
      unsetenv(v);
    }
  }
  void TearDown() override {
    for (const char *v : kEnvVars) set_env(v, saved_.count(v) ? saved_[v].c_str() : nullptr);
  }

 private:
  std::map<std::string, std::string> saved_;
};

// A change to the config that one case applies on top of base_config().
using Mutate = void (*)(NVTEFusedAttnConfig &);

}  // namespace select_test
