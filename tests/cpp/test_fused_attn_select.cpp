// Attention backend selection through the public C API: every eligibility rule of every backend
// (accepted and rejected side) on explicit platforms (ROCm+CK gfx942, ROCm+AOTriton gfx90a, CPU),
// the env switches (the 5 CI modes, exact "0", inheritance of NVTE_FUSED_ATTN), this build's
// platform, errors, logging switches and the name helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "test_common.h"
#include "transformer_engine_lite/fused_attn.h"

namespace {

// ---------------------------------------------------------------- platforms and configs
const NVTEFusedAttnPlatform kRocmCk{true, true, false, true, "gfx942"};
const NVTEFusedAttnPlatform kRocmCkGfx90a{true, true, false, true, "gfx90a"};
const NVTEFusedAttnPlatform kRocmCkGfx950{true, true, false, true, "gfx950:sramecc+:xnack-"};
const NVTEFusedAttnPlatform kRocmCkRdna{true, true, false, true, "gfx1100"};
const NVTEFusedAttnPlatform kRocmCkNoArch{true, true, false, true, ""};
const NVTEFusedAttnPlatform kCudaWithCk{false, true, false, true, "sm_90"};  // CK needs ROCm
const NVTEFusedAttnPlatform kRocmAot{true, false, true, true, "gfx90a"};
const NVTEFusedAttnPlatform kRocmAotGfx942{true, false, true, true, "gfx942"};
const NVTEFusedAttnPlatform kRocmAotGfx908{true, false, true, true, "gfx908"};
const NVTEFusedAttnPlatform kCudaAotSm80{false, false, true, true, "sm_80"};
const NVTEFusedAttnPlatform kCudaAotSm90a{false, false, true, true, "sm_90a"};
const NVTEFusedAttnPlatform kCudaAotSm75{false, false, true, true, "sm_75"};
const NVTEFusedAttnPlatform kCpu{false, false, false, true, ""};
const NVTEFusedAttnPlatform kNoFlash{false, false, false, false, ""};
const NVTEFusedAttnPlatform kGpuFlash{false, false, false, true, "sm_90"};
const NVTEFusedAttnPlatform kAll{true, true, true, true, "gfx942"};  // every backend present

// A config every backend accepts on its platform (GPU tensors; flash/unfused cases switch to CPU).
NVTEFusedAttnConfig base_config() {
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

Result select(const NVTEFusedAttnConfig &c, const NVTEFusedAttnPlatform *pf) {
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

void set_env(const char *name, const char *value) {
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

// ---------------------------------------------------------------- one rule per case
using Mutate = void (*)(NVTEFusedAttnConfig &);

struct RuleCase {
  const char *name;
  NVTE_Fused_Attn_Backend backend;
  const NVTEFusedAttnPlatform *platform;
  Mutate mutate;
  const char *expect;  // nullptr: accepted; otherwise a substring of the reason
};

void cpu(NVTEFusedAttnConfig &c) { c.device = kNVTEDeviceCPU; }

// clang-format off
const RuleCase kRuleCases[] = {
  // ---- ck: build, device, arch
  {"ck_base", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"ck_not_built", NVTE_CK, &kRocmAot, [](NVTEFusedAttnConfig &) {}, "not built in this build"},
  {"ck_needs_rocm", NVTE_CK, &kCudaWithCk, [](NVTEFusedAttnConfig &) {}, "not built in this build"},
  {"ck_cpu_tensors", NVTE_CK, &kRocmCk, cpu, "GPU tensors only, got CPU"},
  {"ck_gfx90a", NVTE_CK, &kRocmCkGfx90a, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"ck_gfx950_with_features", NVTE_CK, &kRocmCkGfx950, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"ck_rdna_arch", NVTE_CK, &kRocmCkRdna, [](NVTEFusedAttnConfig &) {}, "got 'gfx1100'"},
  {"ck_unknown_arch", NVTE_CK, &kRocmCkNoArch, [](NVTEFusedAttnConfig &) {}, "(gfx90a, gfx94x, gfx95x), got ''"},
  // dtype
  {"ck_fp16", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.q_dtype = c.kv_dtype = kNVTEFloat16; }, nullptr},
  {"ck_fp32", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.q_dtype = c.kv_dtype = kNVTEFloat32; }, "float16 or bfloat16, got float32"},
  {"ck_fp8", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.q_dtype = c.kv_dtype = kNVTEFloat8E4M3FNUZ; }, "got float8_e4m3fnuz"},
  {"ck_mixed_dtypes", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.kv_dtype = kNVTEFloat16; }, "Q and KV dtypes must match, got bfloat16 and float16"},
  // bias
  {"ck_post_scale_bias", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.bias_type = NVTE_POST_SCALE_BIAS; }, nullptr},
  {"ck_alibi", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.bias_type = NVTE_ALIBI; }, nullptr},
  {"ck_pre_scale_bias", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.bias_type = NVTE_PRE_SCALE_BIAS; }, "pre_scale_bias is not supported by ck"},
  // masks (all six) and windows
  {"ck_padding", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_PADDING_MASK; }, nullptr},
  {"ck_causal", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_CAUSAL_MASK; c.window_size_right = 0; }, nullptr},
  {"ck_padding_causal", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_PADDING_CAUSAL_MASK; c.window_size_right = 0; }, nullptr},
  {"ck_causal_bottom_right_sq_ne_skv", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_CAUSAL_BOTTOM_RIGHT_MASK; c.window_size_right = 0; c.max_seqlen_kv = 200; }, nullptr},
  {"ck_padding_causal_bottom_right", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK; c.window_size_right = 0; }, nullptr},
  {"ck_causal_sliding_window", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_CAUSAL_MASK; c.window_size_left = 16; c.window_size_right = 0; }, nullptr},
  {"ck_causal_right_unbounded", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_CAUSAL_MASK; }, "needs window (-1 or >= 0, 0) in ck, got (-1, -1)"},
  {"ck_causal_right_positive", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_CAUSAL_MASK; c.window_size_left = 4; c.window_size_right = 2; }, "got (4, 2)"},
  {"ck_no_mask_window_both", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.window_size_left = 8; c.window_size_right = 8; }, nullptr},
  {"ck_no_mask_window_half_open", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.window_size_right = 4; }, "(-1, -1) or both sides >= 0 in ck, got (-1, 4)"},
  {"ck_padding_window_left_only", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_PADDING_MASK; c.window_size_left = 4; }, "got (4, -1)"},
  // layouts
  {"ck_sbhd", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_SBHD_SBHD_SBHD; }, nullptr},
  {"ck_kv_packed", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_BSHD_BS2HD; c.max_seqlen_kv = 64; c.num_gqa_groups = 2; }, nullptr},
  {"ck_thd_padding", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_THD_THD_THD; c.attn_mask_type = NVTE_PADDING_MASK; }, nullptr},
  {"ck_thd_padding_causal", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_THD_T2HD; c.attn_mask_type = NVTE_PADDING_CAUSAL_MASK; c.window_size_right = 0; }, nullptr},
  {"ck_thd_no_mask", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_THD_THD_THD; }, "thd layout thd_thd_thd needs a padding mask in ck"},
  {"ck_thd_causal", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_T3HD; c.attn_mask_type = NVTE_CAUSAL_MASK; c.window_size_right = 0; }, "got causal"},
  {"ck_qkv_packed", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_BS3HD; }, nullptr},
  {"ck_qkv_packed_sq_ne_skv", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_SBH3D; c.max_seqlen_kv = 256; }, "packed QKV layout sbh3d needs max_seqlen_q == max_seqlen_kv, got 128 and 256"},
  {"ck_qkv_packed_gqa", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_BSH3D; c.num_gqa_groups = 2; }, "cannot hold GQA/MQA in ck"},
  // GQA, head dims, padding + bias, dropout
  {"ck_gqa", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.num_gqa_groups = 2; }, nullptr},
  {"ck_mqa", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.num_gqa_groups = 1; }, nullptr},
  {"ck_gqa_uneven", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.num_attn_heads = 6; c.num_gqa_groups = 4; }, "GQA needs num_attn_heads % num_gqa_groups == 0, got 6 and 4"},
  {"ck_head_dim_511", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.head_dim_qk = 511; c.head_dim_v = 511; }, nullptr},
  {"ck_head_dim_qk_512", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.head_dim_qk = 512; }, "head_dim_qk < 512 and head_dim_v < 512, got 512 and 64"},
  {"ck_head_dim_v_512", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.head_dim_v = 512; }, "got 64 and 512"},
  {"ck_head_dim_0", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.head_dim_v = 0; }, "head dims must be at least 1"},
  {"ck_padding_with_bias", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_PADDING_MASK; c.bias_type = NVTE_POST_SCALE_BIAS; }, "padding mask with a bias, got mask padding and bias post_scale_bias"},
  {"ck_padding_causal_with_alibi", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_PADDING_CAUSAL_MASK; c.window_size_right = 0; c.bias_type = NVTE_ALIBI; }, "bias alibi"},
  {"ck_dropout", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.dropout = 0.1f; }, nullptr},
  {"ck_dropout_one", NVTE_CK, &kRocmCk, [](NVTEFusedAttnConfig &c) { c.dropout = 1.0f; }, "dropout must be in [0, 1), got 1"},

  // ---- aotriton
  {"aot_base", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"aot_not_built", NVTE_AOTriton, &kRocmCk, [](NVTEFusedAttnConfig &) {}, "not built in this build"},
  {"aot_cpu_tensors", NVTE_AOTriton, &kRocmAot, cpu, "GPU tensors only, got CPU"},
  {"aot_gfx942", NVTE_AOTriton, &kRocmAotGfx942, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"aot_gfx908", NVTE_AOTriton, &kRocmAotGfx908, [](NVTEFusedAttnConfig &) {}, "gfx942 and gfx90a only, got 'gfx908'"},
  {"aot_cuda_sm80", NVTE_AOTriton, &kCudaAotSm80, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"aot_cuda_sm90a", NVTE_AOTriton, &kCudaAotSm90a, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"aot_cuda_sm75", NVTE_AOTriton, &kCudaAotSm75, [](NVTEFusedAttnConfig &) {}, "sm_80 or newer on CUDA, got 'sm_75'"},
  {"aot_fp16", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.q_dtype = c.kv_dtype = kNVTEFloat16; }, nullptr},
  {"aot_fp32", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.q_dtype = c.kv_dtype = kNVTEFloat32; }, "float16 or bfloat16, got float32"},
  {"aot_mixed_dtypes", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.q_dtype = kNVTEFloat16; }, "Q and KV dtypes must match"},
  {"aot_post_scale_bias", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.bias_type = NVTE_POST_SCALE_BIAS; }, "no_bias only, got post_scale_bias"},
  {"aot_alibi", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.bias_type = NVTE_ALIBI; }, "no_bias only, got alibi"},
  {"aot_causal", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_CAUSAL_MASK; c.window_size_right = 0; }, nullptr},
  {"aot_causal_unbounded_window", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_CAUSAL_MASK; }, nullptr},
  {"aot_padding", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_PADDING_MASK; }, "no_mask and causal only, got padding"},
  {"aot_causal_bottom_right", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_CAUSAL_BOTTOM_RIGHT_MASK; c.window_size_right = 0; }, "got causal_bottom_right"},
  {"aot_causal_sq_ne_skv", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.attn_mask_type = NVTE_CAUSAL_MASK; c.window_size_right = 0; c.max_seqlen_kv = 64; }, "causal mask needs max_seqlen_q == max_seqlen_kv in aotriton, got 128 and 64"},
  {"aot_no_mask_sq_ne_skv", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.max_seqlen_kv = 64; }, nullptr},
  {"aot_window_causal_form", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.window_size_right = 0; }, nullptr},
  {"aot_window_sliding", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.window_size_left = 8; c.window_size_right = 0; }, "(-1, -1) or (-1, 0) only, got (8, 0)"},
  {"aot_window_right", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.window_size_right = 4; }, "got (-1, 4)"},
  {"aot_sbhd", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_SBHD_SBH2D; }, nullptr},
  {"aot_thd", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_THD_THD_THD; }, "bshd and sbhd layouts only, got thd_thd_thd"},
  {"aot_qkv_packed", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_SB3HD; }, nullptr},
  {"aot_qkv_packed_sq_ne_skv", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.qkv_layout = NVTE_BS3HD; c.max_seqlen_kv = 64; }, "packed QKV layout bs3hd needs max_seqlen_q == max_seqlen_kv"},
  {"aot_gqa", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.num_gqa_groups = 2; }, "no GQA/MQA (needs num_attn_heads == num_gqa_groups), got 8 and 2"},
  {"aot_head_dim_0", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.head_dim_qk = 0; }, "head dims must be at least 1"},
  {"aot_dropout", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.dropout = 0.2f; }, nullptr},
  {"aot_dropout_above_one", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.dropout = 1.5f; }, "dropout must be in [0, 1), got 1.5"},

  // ---- flash (CPU tensors unless said otherwise)
  {"flash_base", NVTE_Flash, &kCpu, cpu, nullptr},
  {"flash_not_built", NVTE_Flash, &kNoFlash, cpu, "not built in this build"},
  {"flash_gpu", NVTE_Flash, &kGpuFlash, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"flash_fp16", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.q_dtype = c.kv_dtype = kNVTEFloat16; }, nullptr},
  {"flash_fp32_cpu", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.q_dtype = c.kv_dtype = kNVTEFloat32; }, nullptr},
  {"flash_fp32_gpu", NVTE_Flash, &kGpuFlash, [](NVTEFusedAttnConfig &c) { c.q_dtype = c.kv_dtype = kNVTEFloat32; }, "float32 is supported by flash on CPU tensors only"},
  {"flash_fp8", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.q_dtype = c.kv_dtype = kNVTEFloat8E4M3; }, "FP8 attention is not supported by flash, got float8_e4m3"},
  {"flash_fp8_kv", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.kv_dtype = kNVTEFloat8E5M2; }, "FP8 attention"},
  {"flash_int32", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.q_dtype = c.kv_dtype = kNVTEInt32; }, "float16, bfloat16 or float32 (CPU), got int32"},
  {"flash_mixed_dtypes", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.kv_dtype = kNVTEFloat32; }, "Q and KV dtypes must match, got bfloat16 and float32"},
  {"flash_post_scale_bias", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.bias_type = NVTE_POST_SCALE_BIAS; }, nullptr},
  {"flash_alibi", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.bias_type = NVTE_ALIBI; }, nullptr},
  {"flash_pre_scale_bias", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.bias_type = NVTE_PRE_SCALE_BIAS; }, "not supported by flash (use unfused)"},
  {"flash_padding_causal_bottom_right", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.attn_mask_type = NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK; }, nullptr},
  {"flash_gqa", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.num_gqa_groups = 2; }, nullptr},
  {"flash_mqa", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.num_gqa_groups = 1; }, nullptr},
  {"flash_gqa_uneven", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.num_attn_heads = 6; c.num_gqa_groups = 4; }, "GQA needs num_attn_heads % num_gqa_groups == 0, got 6 and 4"},
  {"flash_head_dim_1", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.head_dim_qk = c.head_dim_v = 1; }, nullptr},
  {"flash_head_dim_256_mixed", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.head_dim_qk = 256; c.head_dim_v = 40; }, nullptr},
  {"flash_head_dim_257", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.head_dim_qk = 257; }, "head dims in [1, 256], got head_dim_qk 257 and head_dim_v 64"},
  {"flash_head_dim_v_0", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.head_dim_v = 0; }, "got head_dim_qk 64 and head_dim_v 0"},
  {"flash_window_sliding", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.window_size_left = 8; c.window_size_right = 3; }, nullptr},
  {"flash_causal_right_unbounded", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.attn_mask_type = NVTE_CAUSAL_MASK; }, nullptr},
  {"flash_causal_sliding", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.attn_mask_type = NVTE_PADDING_CAUSAL_MASK; c.window_size_left = 16; c.window_size_right = 0; }, nullptr},
  {"flash_causal_right_positive", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.attn_mask_type = NVTE_CAUSAL_BOTTOM_RIGHT_MASK; c.window_size_right = 4; }, "mask causal_bottom_right needs window right -1 or 0 in flash"},
  {"flash_dropout", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.dropout = 0.5f; }, nullptr},
  {"flash_dropout_one", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.dropout = 1.0f; }, "dropout must be in [0, 1)"},
  {"flash_dropout_negative", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.dropout = -0.1f; }, "got -0.1"},
  {"flash_dropout_inf", NVTE_Flash, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.dropout = std::numeric_limits<float>::infinity(); }, "dropout must be in [0, 1)"},

  // ---- unfused
  {"unfused_base", NVTE_Unfused, &kNoFlash, cpu, nullptr},
  {"unfused_gpu", NVTE_Unfused, &kNoFlash, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"unfused_pre_scale_bias", NVTE_Unfused, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.bias_type = NVTE_PRE_SCALE_BIAS; }, nullptr},
  {"unfused_fp32_gpu", NVTE_Unfused, &kGpuFlash, [](NVTEFusedAttnConfig &c) { c.q_dtype = c.kv_dtype = kNVTEFloat32; }, nullptr},
  {"unfused_large_head_dim", NVTE_Unfused, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.head_dim_qk = c.head_dim_v = 1024; }, nullptr},
  {"unfused_causal_window_right", NVTE_Unfused, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.attn_mask_type = NVTE_CAUSAL_MASK; c.window_size_right = 4; }, nullptr},
  {"unfused_fp8", NVTE_Unfused, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.q_dtype = c.kv_dtype = kNVTEFloat8E4M3; }, "float16, bfloat16 or float32, got float8_e4m3"},
  {"unfused_int64_kv", NVTE_Unfused, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.kv_dtype = kNVTEInt64; }, "got int64"},
  {"unfused_head_dim_0", NVTE_Unfused, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.head_dim_qk = 0; }, "head dims must be at least 1, got head_dim_qk 0"},
  {"unfused_gqa_uneven", NVTE_Unfused, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.num_attn_heads = 7; c.num_gqa_groups = 2; }, "got 7 and 2"},
  {"unfused_dropout", NVTE_Unfused, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.dropout = 0.9f; }, nullptr},
  {"unfused_dropout_one", NVTE_Unfused, &kCpu, [](NVTEFusedAttnConfig &c) { cpu(c); c.dropout = 1.0f; }, "dropout must be in [0, 1)"},
};
// clang-format on

class SelectRule : public Select, public ::testing::WithParamInterface<RuleCase> {};

TEST_P(SelectRule, Reason) {
  const RuleCase &rc = GetParam();
  NVTEFusedAttnConfig c = base_config();
  rc.mutate(c);
  const Result r = select(c, rc.platform);
  ASSERT_EQ(r.status, NVTE_SUCCESS) << r.error;
  const std::string &reason = r.reasons[rc.backend];
  if (rc.expect == nullptr) {
    EXPECT_EQ(reason, "") << nvte_fused_attn_backend_name(rc.backend) << " rejected: " << reason;
  } else {
    EXPECT_NE(reason.find(rc.expect), std::string::npos)
        << nvte_fused_attn_backend_name(rc.backend) << " reason '" << reason << "' lacks '"
        << rc.expect << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, SelectRule, ::testing::ValuesIn(kRuleCases),
                         [](const ::testing::TestParamInfo<RuleCase> &info) {
                           return std::string(info.param.name);
                         });

TEST_F(Select, FlashAndUnfusedTakeEveryLayoutAndMask) {
  for (int l = NVTE_SB3HD; l <= NVTE_THD_THD_THD; ++l) {
    for (int m = NVTE_NO_MASK; m <= NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK; ++m) {
      NVTEFusedAttnConfig c = base_config();
      c.device = kNVTEDeviceCPU;
      c.qkv_layout = static_cast<NVTE_QKV_Layout>(l);
      c.attn_mask_type = static_cast<NVTE_Mask_Type>(m);
      const Result r = select(c, &kCpu);
      ASSERT_EQ(r.status, NVTE_SUCCESS) << r.error;
      EXPECT_EQ(r.reasons[NVTE_Flash], "") << nvte_qkv_layout_name(c.qkv_layout) << " " << m;
      EXPECT_EQ(r.reasons[NVTE_Unfused], "") << nvte_qkv_layout_name(c.qkv_layout) << " " << m;
      EXPECT_EQ(r.selected, NVTE_Flash);
    }
  }
}

// ---------------------------------------------------------------- preference
TEST_F(Select, PrefersCkThenAotritonThenFlashThenUnfused) {
  NVTEFusedAttnConfig c = base_config();
  EXPECT_EQ(select(c, &kAll).selected, NVTE_CK);
  c.head_dim_qk = 512;  // ck: d >= 512; aotriton has no head-dim rule
  c.head_dim_v = 128;
  EXPECT_EQ(select(c, &kAll).selected, NVTE_AOTriton);
  c = base_config();
  c.attn_mask_type = NVTE_PADDING_MASK;  // ck: padding + bias; aotriton: bias and mask
  c.bias_type = NVTE_POST_SCALE_BIAS;
  EXPECT_EQ(select(c, &kAll).selected, NVTE_Flash);
  c.bias_type = NVTE_PRE_SCALE_BIAS;  // only the unfused path takes it
  const Result r = select(c, &kAll);
  EXPECT_EQ(r.selected, NVTE_Unfused);
  for (int b : {NVTE_CK, NVTE_AOTriton, NVTE_Flash}) EXPECT_NE(r.reasons[b], "") << b;
}

TEST_F(Select, NothingEligibleIsNotAnErrorForTheReasonsCall) {
  NVTEFusedAttnConfig c = base_config();
  c.num_attn_heads = 6;
  c.num_gqa_groups = 4;
  const Result r = select(c, &kAll);
  ASSERT_EQ(r.status, NVTE_SUCCESS) << r.error;
  EXPECT_EQ(r.selected, NVTE_No_Backend);
  for (int b = 0; b < NVTE_NUM_FUSED_ATTN_BACKENDS; ++b) {
    EXPECT_NE(r.reasons[b].find("got 6 and 4"), std::string::npos) << r.reasons[b];
  }
}

// ---------------------------------------------------------------- env switches
struct CiMode {
  const char *name;
  const char *flash, *fused, *ck, *aotriton;  // nullptr = unset (reference table)
  NVTE_Fused_Attn_Backend selected;
  bool enabled[NVTE_NUM_FUSED_ATTN_BACKENDS];  // by enum value: aotriton, ck, flash, unfused
};
const CiMode kCiModes[] = {
    {"auto", nullptr, nullptr, nullptr, nullptr, NVTE_CK, {true, true, true, true}},
    {"aotriton", "0", nullptr, "0", nullptr, NVTE_AOTriton, {true, false, false, true}},
    {"ck", "0", nullptr, nullptr, "0", NVTE_CK, {false, true, false, true}},
    {"flash", nullptr, "0", "0", "0", NVTE_Flash, {false, false, true, true}},
    {"unfused", "0", "0", nullptr, nullptr, NVTE_Unfused, {false, false, false, true}},
};

TEST_F(Select, CiModes) {
  for (const CiMode &m : kCiModes) {
    SCOPED_TRACE(m.name);
    set_env("NVTE_FLASH_ATTN", m.flash);
    set_env("NVTE_FUSED_ATTN", m.fused);
    set_env("NVTE_FUSED_ATTN_CK", m.ck);
    set_env("NVTE_FUSED_ATTN_AOTRITON", m.aotriton);
    const Result r = select(base_config(), &kAll);
    ASSERT_EQ(r.status, NVTE_SUCCESS) << r.error;
    EXPECT_EQ(r.selected, m.selected);
    for (int b = 0; b < NVTE_NUM_FUSED_ATTN_BACKENDS; ++b) {
      if (m.enabled[b]) {
        EXPECT_EQ(r.reasons[b], "") << nvte_fused_attn_backend_name(NVTE_Fused_Attn_Backend(b));
      } else {
        EXPECT_EQ(r.reasons[b].rfind("disabled by NVTE_", 0), 0u) << r.reasons[b];
      }
    }
  }
}

TEST_F(Select, OnlyTheExactStringZeroDisables) {
  const struct {
    const char *var;
    NVTE_Fused_Attn_Backend backend;
  } switches[] = {{"NVTE_FLASH_ATTN", NVTE_Flash},
                  {"NVTE_UNFUSED_ATTN", NVTE_Unfused},
                  {"NVTE_FUSED_ATTN_CK", NVTE_CK},
                  {"NVTE_FUSED_ATTN_AOTRITON", NVTE_AOTriton},
                  {"NVTE_FUSED_ATTN", NVTE_CK}};
  for (const auto &s : switches) {
    for (const char *value : {"1", "false", "", "00", " 0", "0 ", "no"}) {
      set_env(s.var, value);
      EXPECT_EQ(select(base_config(), &kAll).reasons[s.backend], "") << s.var << "='" << value << "'";
    }
    set_env(s.var, "0");
    EXPECT_EQ(select(base_config(), &kAll).reasons[s.backend],
              std::string("disabled by ") + s.var + "=0" +
                  (std::string(s.var) == "NVTE_FUSED_ATTN"
                       ? " (NVTE_FUSED_ATTN_CK is unset and inherits it)"
                       : ""));
    unsetenv(s.var);
  }
}

TEST_F(Select, CkAndAotritonInheritTheMasterSwitch) {
  setenv("NVTE_FUSED_ATTN", "0", 1);
  Result r = select(base_config(), &kAll);
  EXPECT_EQ(r.reasons[NVTE_CK], "disabled by NVTE_FUSED_ATTN=0 (NVTE_FUSED_ATTN_CK is unset and inherits it)");
  EXPECT_EQ(r.reasons[NVTE_AOTriton],
            "disabled by NVTE_FUSED_ATTN=0 (NVTE_FUSED_ATTN_AOTRITON is unset and inherits it)");
  EXPECT_EQ(r.reasons[NVTE_Flash], "");  // the master covers ck and aotriton only
  EXPECT_EQ(r.selected, NVTE_Flash);

  setenv("NVTE_FUSED_ATTN_CK", "1", 1);  // an explicit per-backend value wins over the master
  r = select(base_config(), &kAll);
  EXPECT_EQ(r.reasons[NVTE_CK], "");
  EXPECT_NE(r.reasons[NVTE_AOTriton], "");
  EXPECT_EQ(r.selected, NVTE_CK);

  setenv("NVTE_FUSED_ATTN_CK", "", 1);  // empty counts as unset, as in config.py: inherits
  EXPECT_NE(select(base_config(), &kAll).reasons[NVTE_CK].find("NVTE_FUSED_ATTN=0"),
            std::string::npos);

  setenv("NVTE_FUSED_ATTN", "1", 1);
  setenv("NVTE_FUSED_ATTN_AOTRITON", "0", 1);
  r = select(base_config(), &kAll);
  EXPECT_EQ(r.reasons[NVTE_AOTriton], "disabled by NVTE_FUSED_ATTN_AOTRITON=0");
  EXPECT_EQ(r.reasons[NVTE_CK], "");
}

TEST_F(Select, EnvIsReadAtEveryCall) {
  NVTEFusedAttnConfig c = base_config();
  c.device = kNVTEDeviceCPU;
  EXPECT_EQ(select(c, nullptr).selected, NVTE_Flash);
  setenv("NVTE_FLASH_ATTN", "0", 1);
  EXPECT_EQ(select(c, nullptr).selected, NVTE_Unfused);
  unsetenv("NVTE_FLASH_ATTN");
  EXPECT_EQ(select(c, nullptr).selected, NVTE_Flash);
}

// ---------------------------------------------------------------- this build (NULL platform)
bool this_build_has_gpu() {
  const std::string info = nvte_get_build_info();
  return info.find("\"cuda\"") != std::string::npos || info.find("\"rocm\"") != std::string::npos;
}

TEST_F(Select, ThisBuildCpuTensors) {
  NVTEFusedAttnConfig c = base_config();
  c.device = kNVTEDeviceCPU;
  const Result r = select(c, nullptr);
  ASSERT_EQ(r.status, NVTE_SUCCESS) << r.error;
  EXPECT_EQ(r.reasons[NVTE_CK], "not built in this build");
  EXPECT_EQ(r.reasons[NVTE_AOTriton], "not built in this build");
  EXPECT_EQ(r.reasons[NVTE_Flash], "");
  EXPECT_EQ(r.reasons[NVTE_Unfused], "");
  EXPECT_EQ(r.selected, NVTE_Flash);
  setenv("NVTE_FUSED_ATTN_CK", "0", 1);  // a missing backend says so before its switch does
  EXPECT_EQ(select(c, nullptr).reasons[NVTE_CK], "not built in this build");
}

TEST_F(Select, ThisBuildGpuTensors) {
  const Result r = select(base_config(), nullptr);
  ASSERT_EQ(r.status, NVTE_SUCCESS) << r.error;
  EXPECT_EQ(r.reasons[NVTE_CK], "not built in this build");
  EXPECT_EQ(r.reasons[NVTE_AOTriton], "not built in this build");
  if (this_build_has_gpu()) {
    EXPECT_EQ(r.reasons[NVTE_Flash], "");
    EXPECT_EQ(r.selected, NVTE_Flash);
  } else {
    EXPECT_EQ(r.reasons[NVTE_Flash], "not built in this build");
    EXPECT_EQ(r.selected, NVTE_Unfused);
  }
}

TEST_F(Select, GetBackendReturnsTheChoiceAndClearsTheError) {
  EXPECT_EQ(nvte_get_fused_attn_backend(kNVTEBFloat16, kNVTEBFloat16, NVTE_BSHD_BSHD_BSHD,
                                        NVTE_NO_BIAS, NVTE_NO_MASK, 0.0f, 0, 1, 16, 16, 64, 64,
                                        -1, -1, kNVTEDeviceCPU),
            NVTE_No_Backend);
  EXPECT_EQ(nvte_get_last_status(), NVTE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(nvte_get_fused_attn_backend(kNVTEFloat32, kNVTEFloat32, NVTE_SBHD_SB2HD,
                                        NVTE_POST_SCALE_BIAS, NVTE_CAUSAL_MASK, 0.1f, 8, 2, 16, 32,
                                        64, 64, -1, 0, kNVTEDeviceCPU),
            NVTE_Flash);
  EXPECT_EQ(nvte_get_last_status(), NVTE_SUCCESS);
  EXPECT_STREQ(nvte_get_last_error(), "");
  EXPECT_EQ(nvte_get_fused_attn_backend(kNVTEBFloat16, kNVTEBFloat16, NVTE_BSHD_BSHD_BSHD,
                                        NVTE_PRE_SCALE_BIAS, NVTE_NO_MASK, 0.0f, 8, 8, 16, 16, 64,
                                        64, -1, -1, kNVTEDeviceCPU),
            NVTE_Unfused);
}

TEST_F(Select, NothingEligibleListsEveryBackend) {
  for (const char *v : {"NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN"}) setenv(v, "0", 1);
  EXPECT_EQ(nvte_get_fused_attn_backend(kNVTEBFloat16, kNVTEBFloat16, NVTE_BSHD_BSHD_BSHD,
                                        NVTE_NO_BIAS, NVTE_CAUSAL_MASK, 0.0f, 8, 8, 16, 16, 64, 64,
                                        -1, 0, kNVTEDeviceCPU),
            NVTE_No_Backend);
  EXPECT_EQ(nvte_get_last_status(), NVTE_ERROR_UNSUPPORTED);
  const std::string msg = nvte_get_last_error();
  for (const char *needle :
       {"nvte_get_fused_attn_backend", "no attention backend can run", "mask=causal",
        "ck: not built in this build", "aotriton: not built in this build",
        "flash: disabled by NVTE_FLASH_ATTN=0", "unfused: disabled by NVTE_UNFUSED_ATTN=0"}) {
    EXPECT_NE(msg.find(needle), std::string::npos) << "lacks '" << needle << "': " << msg;
  }
  // The rules' reasons appear too when the switches are on.
  for (const char *v : {"NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN"}) unsetenv(v);
  EXPECT_EQ(nvte_get_fused_attn_backend(kNVTEBFloat16, kNVTEBFloat16, NVTE_BSHD_BSHD_BSHD,
                                        NVTE_NO_BIAS, NVTE_NO_MASK, 0.0f, 6, 4, 16, 16, 64, 64, -1,
                                        -1, kNVTEDeviceCPU),
            NVTE_No_Backend);
  EXPECT_NE(std::string(nvte_get_last_error()).find("unfused: GQA needs"), std::string::npos)
      << nvte_get_last_error();
}

// ---------------------------------------------------------------- invalid configs
struct InvalidCase {
  const char *name;
  Mutate mutate;
  const char *expect;
};
const InvalidCase kInvalidCases[] = {
    {"device", [](NVTEFusedAttnConfig &c) { c.device = static_cast<NVTEDevice>(7); }, "config.device"},
    {"q_dtype", [](NVTEFusedAttnConfig &c) { c.q_dtype = kNVTENumTypes; }, "config.q_dtype"},
    {"kv_dtype", [](NVTEFusedAttnConfig &c) { c.kv_dtype = static_cast<NVTEDType>(-1); }, "config.kv_dtype"},
    {"layout", [](NVTEFusedAttnConfig &c) { c.qkv_layout = static_cast<NVTE_QKV_Layout>(15); }, "config.qkv_layout: expected an NVTE_QKV_Layout value in [0, 15), got 15"},
    {"bias", [](NVTEFusedAttnConfig &c) { c.bias_type = static_cast<NVTE_Bias_Type>(4); }, "config.bias_type"},
    {"mask", [](NVTEFusedAttnConfig &c) { c.attn_mask_type = static_cast<NVTE_Mask_Type>(6); }, "config.attn_mask_type"},
    {"zero_heads", [](NVTEFusedAttnConfig &c) { c.num_attn_heads = 0; }, "config.num_attn_heads: expected at least 1 head, got 0"},
    {"zero_kv_heads", [](NVTEFusedAttnConfig &c) { c.num_gqa_groups = 0; }, "config.num_gqa_groups"},
    {"window_left", [](NVTEFusedAttnConfig &c) { c.window_size_left = -2; }, "config.window_size_left: expected -1 (unbounded) or a size >= 0, got -2"},
    {"window_right", [](NVTEFusedAttnConfig &c) { c.window_size_right = -5; }, "config.window_size_right"},
    {"nan_dropout", [](NVTEFusedAttnConfig &c) { c.dropout = std::nanf(""); }, "config.dropout: expected a probability in [0, 1), got NaN"},
};

TEST_F(Select, InvalidConfigsAreErrorsAndWriteNothing) {
  for (const InvalidCase &ic : kInvalidCases) {
    SCOPED_TRACE(ic.name);
    NVTEFusedAttnConfig c = base_config();
    ic.mutate(c);
    NVTE_Fused_Attn_Backend selected = static_cast<NVTE_Fused_Attn_Backend>(42);
    const char *sentinel = "untouched";
    const char *reasons[NVTE_NUM_FUSED_ATTN_BACKENDS] = {sentinel, sentinel, sentinel, sentinel};
    EXPECT_NVTE_ERROR(nvte_fused_attn_backend_reasons(&c, &kAll, &selected, reasons),
                      NVTE_ERROR_INVALID_ARGUMENT, "nvte_fused_attn_backend_reasons", ic.expect);
    EXPECT_EQ(static_cast<int>(selected), 42);
    for (const char *r : reasons) EXPECT_EQ(r, sentinel);
    EXPECT_EQ(nvte_get_fused_attn_backend(c.q_dtype, c.kv_dtype, c.qkv_layout, c.bias_type,
                                          c.attn_mask_type, c.dropout, c.num_attn_heads,
                                          c.num_gqa_groups, c.max_seqlen_q, c.max_seqlen_kv,
                                          c.head_dim_qk, c.head_dim_v, c.window_size_left,
                                          c.window_size_right, c.device),
              NVTE_No_Backend);
    EXPECT_EQ(nvte_get_last_status(), NVTE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(nvte_get_last_error()).find(ic.expect), std::string::npos)
        << nvte_get_last_error();
  }
}

TEST_F(Select, NullConfigIsAnErrorAndOutputsAreOptional) {
  NVTE_Fused_Attn_Backend selected = NVTE_CK;
  EXPECT_NVTE_ERROR(nvte_fused_attn_backend_reasons(nullptr, nullptr, &selected, nullptr),
                    NVTE_ERROR_INVALID_ARGUMENT, "argument 'config'");
  EXPECT_EQ(selected, NVTE_CK);
  NVTEFusedAttnConfig c = base_config();
  c.device = kNVTEDeviceCPU;
  ASSERT_NVTE_OK(nvte_fused_attn_backend_reasons(&c, nullptr, &selected, nullptr));
  EXPECT_EQ(selected, NVTE_Flash);
  const char *reasons[NVTE_NUM_FUSED_ATTN_BACKENDS] = {};
  ASSERT_NVTE_OK(nvte_fused_attn_backend_reasons(&c, nullptr, nullptr, reasons));
  EXPECT_STREQ(reasons[NVTE_CK], "not built in this build");
}

// ---------------------------------------------------------------- logging switches
std::string captured_log(const NVTEFusedAttnConfig &c, const NVTEFusedAttnPlatform *pf) {
  ::testing::internal::CaptureStderr();
  const Result r = select(c, pf);
  EXPECT_EQ(r.status, NVTE_SUCCESS) << r.error;
  return ::testing::internal::GetCapturedStderr();
}

TEST_F(Select, CkAndAotritonLogsNeedExactlyOneAndTheBackendOnThePlatform) {
  NVTEFusedAttnConfig c = base_config();
  c.bias_type = NVTE_PRE_SCALE_BIAS;
  EXPECT_EQ(captured_log(c, &kAll), "");
  setenv("NVTE_LOG_CK_CONFIG", "true", 1);
  EXPECT_EQ(captured_log(c, &kAll), "");
  setenv("NVTE_LOG_CK_CONFIG", "1", 1);
  std::string log = captured_log(c, &kAll);
  EXPECT_NE(log.find("[NVTE] ck: rejected: pre_scale_bias is not supported by ck"),
            std::string::npos) << log;
  EXPECT_NE(log.find("bias=pre_scale_bias"), std::string::npos) << log;
  EXPECT_EQ(log.find("aotriton"), std::string::npos) << log;
  EXPECT_EQ(captured_log(c, &kRocmAot), "");  // CK not part of that platform

  unsetenv("NVTE_LOG_CK_CONFIG");
  setenv("NVTE_LOG_AOTRITON_CONFIG", "1", 1);
  c.bias_type = NVTE_NO_BIAS;
  log = captured_log(c, &kRocmAot);
  EXPECT_NE(log.find("[NVTE] aotriton: eligible for device=GPU arch=gfx90a"), std::string::npos)
      << log;
  EXPECT_EQ(captured_log(c, &kRocmCk), "");
}

TEST_F(Select, SelectionLogLine) {
  NVTEFusedAttnConfig c = base_config();
  c.device = kNVTEDeviceCPU;
  c.attn_mask_type = NVTE_CAUSAL_MASK;
  c.num_gqa_groups = 2;
  c.window_size_right = 0;
  setenv("NVTE_LOG_FUSED_ATTN_CONFIG", "1", 1);
  const std::string log = captured_log(c, nullptr);
  EXPECT_EQ(log,
            "[NVTE] fused_attn selection: device=CPU dtype=bfloat16/bfloat16 "
            "layout=bshd_bshd_bshd bias=no_bias mask=causal h=8 h_kv=2 s_q=128 s_kv=128 d_qk=64 "
            "d_v=64 window=(-1, 0) dropout=0 -> selected flash (rejected: ck: not built in this "
            "build; aotriton: not built in this build)\n");
  setenv("NVTE_LOG_FUSED_ATTN_CONFIG", "01", 1);
  EXPECT_EQ(captured_log(c, nullptr), "");
}

// ---------------------------------------------------------------- names and layout helpers
TEST(SelectNames, LayoutsGroupsFormats) {
  // TE orders the layouts format by format (sbhd, bshd, thd), each in group order
  // (3hd, h3d, hd_2hd, hd_h2d, hd_hd_hd): group = value % 5, format = value / 5.
  const char *names[] = {"sb3hd", "sbh3d", "sbhd_sb2hd", "sbhd_sbh2d", "sbhd_sbhd_sbhd",
                         "bs3hd", "bsh3d", "bshd_bs2hd", "bshd_bsh2d", "bshd_bshd_bshd",
                         "t3hd",  "th3d",  "thd_t2hd",   "thd_th2d",   "thd_thd_thd"};
  for (int l = 0; l < 15; ++l) {
    const auto layout = static_cast<NVTE_QKV_Layout>(l);
    EXPECT_STREQ(nvte_qkv_layout_name(layout), names[l]);
    EXPECT_EQ(nvte_get_qkv_layout_group(layout), static_cast<NVTE_QKV_Layout_Group>(l % 5)) << l;
    EXPECT_EQ(nvte_get_qkv_format(layout), static_cast<NVTE_QKV_Format>(l / 5)) << l;
  }
  EXPECT_EQ(nvte_get_qkv_layout_group(NVTE_BSHD_BS2HD), NVTE_HD_2HD);  // spot checks by name
  EXPECT_EQ(nvte_get_qkv_format(NVTE_THD_TH2D), NVTE_THD);
  const auto bad = static_cast<NVTE_QKV_Layout>(99);
  EXPECT_STREQ(nvte_qkv_layout_name(bad), "unknown");
  EXPECT_EQ(nvte_get_qkv_layout_group(bad), NVTE_HD_HD_HD);
  EXPECT_EQ(nvte_get_qkv_format(bad), NVTE_BSHD);
}

TEST(SelectNames, MasksBiasesBackends) {
  const char *masks[] = {"no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
                         "padding_causal_bottom_right"};
  for (int m = 0; m < 6; ++m) EXPECT_STREQ(nvte_mask_type_name(NVTE_Mask_Type(m)), masks[m]);
  EXPECT_STREQ(nvte_mask_type_name(NVTE_Mask_Type(6)), "unknown");
  const char *biases[] = {"no_bias", "pre_scale_bias", "post_scale_bias", "alibi"};
  for (int b = 0; b < 4; ++b) EXPECT_STREQ(nvte_bias_type_name(NVTE_Bias_Type(b)), biases[b]);
  EXPECT_STREQ(nvte_bias_type_name(NVTE_Bias_Type(-3)), "unknown");
  EXPECT_STREQ(nvte_fused_attn_backend_name(NVTE_AOTriton), "aotriton");
  EXPECT_STREQ(nvte_fused_attn_backend_name(NVTE_CK), "ck");
  EXPECT_STREQ(nvte_fused_attn_backend_name(NVTE_Flash), "flash");
  EXPECT_STREQ(nvte_fused_attn_backend_name(NVTE_Unfused), "unfused");
  EXPECT_STREQ(nvte_fused_attn_backend_name(NVTE_No_Backend), "no_backend");
  EXPECT_STREQ(nvte_fused_attn_backend_name(NVTE_Fused_Attn_Backend(4)), "unknown");
}

}  // namespace
