// Attention backend selection through the public C API, everything around the rules: the env
// switches (the 5 CI modes, exact "0", inheritance of NVTE_FUSED_ATTN), this build's platform
// (NULL), errors, logging switches and the name helpers. The eligibility rules and the preference
// order: test_fused_attn_select.cpp; shared platforms, base config and fixture:
// fused_attn_select_common.h.
#include <cmath>
#include <cstdlib>
#include <string>

#include "fused_attn_select_common.h"
#include "test_common.h"

namespace {

using namespace select_test;

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
// GPU builds with AOTriton images (build_info's "aotriton_archs" not empty).
bool this_build_has_aotriton() {
  return std::string(nvte_get_build_info()).find("\"aotriton_archs\": []") == std::string::npos;
}
// For CPU tensors every build lacks aotriton (GPU code only, like the GPU flash kernel).
std::string aotriton_cpu_reason() { return "not built in this build"; }

TEST_F(Select, ThisBuildCpuTensors) {
  NVTEFusedAttnConfig c = base_config();
  c.device = kNVTEDeviceCPU;
  const Result r = select(c, nullptr);
  ASSERT_EQ(r.status, NVTE_SUCCESS) << r.error;
  EXPECT_EQ(r.reasons[NVTE_CK], "not built in this build");
  EXPECT_EQ(r.reasons[NVTE_AOTriton], aotriton_cpu_reason());
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
  if (this_build_has_aotriton()) {  // the device's arch: none here without a device
    const std::string &why = r.reasons[NVTE_AOTriton];
    EXPECT_TRUE(why.rfind("aotriton has no images for GPU arch", 0) == 0 ||
                why.find("no GPU arch is known (no device is visible)") != std::string::npos)
        << why;
  } else {
    EXPECT_EQ(r.reasons[NVTE_AOTriton], "not built in this build");
  }
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
        "ck: not built in this build",
        "aotriton: not built in this build",
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
            "build; aotriton: " + aotriton_cpu_reason() + ")\n");
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
