// Attention backend selection through the public C API, the rules: every eligibility rule of every
// backend (accepted and rejected side) on explicit platforms (ROCm+CK gfx942, ROCm+AOTriton gfx90a,
// CPU) and the preference order among the eligible ones. Env switches, this build's platform,
// errors, logging and the name helpers: test_fused_attn_select_env.cpp; shared platforms, base
// config and fixture: fused_attn_select_common.h.
#include <limits>
#include <string>

#include "fused_attn_select_common.h"

namespace {

using namespace select_test;

// ---------------------------------------------------------------- one rule per case
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
  {"aot_gfx908", NVTE_AOTriton, &kRocmAotGfx908, [](NVTEFusedAttnConfig &) {}, "no images for GPU arch 'gfx908' in this build (built: gfx90a,gfx942,gfx950,sm_80,sm_90)"},
  {"aot_cuda_sm80", NVTE_AOTriton, &kCudaAotSm80, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"aot_cuda_sm90a", NVTE_AOTriton, &kCudaAotSm90a, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"aot_cuda_sm75", NVTE_AOTriton, &kCudaAotSm75, [](NVTEFusedAttnConfig &) {}, "no images for GPU arch 'sm_75'"},
  {"aot_cuda_sm86_runs_sm80", NVTE_AOTriton, &kCudaAotSm86, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"aot_images_for_this_arch", NVTE_AOTriton, &kRocmImagesGfx942OnGfx942, [](NVTEFusedAttnConfig &) {}, nullptr},
  {"aot_images_for_another_arch", NVTE_AOTriton, &kRocmImagesGfx942OnGfx90a, [](NVTEFusedAttnConfig &) {}, "aotriton has no images for GPU arch 'gfx90a' in this build (built: gfx942)"},
  {"aot_no_images", NVTE_AOTriton, &kRocmNoImages, [](NVTEFusedAttnConfig &) {}, "(built: none)"},
  {"aot_sm90_needs_sm90_images", NVTE_AOTriton, &kCudaImagesSm80OnSm90, [](NVTEFusedAttnConfig &) {}, "no images for GPU arch 'sm_90' in this build (built: sm_80)"},
  {"aot_no_device_no_arch", NVTE_AOTriton, &kCudaAotNoDevice, [](NVTEFusedAttnConfig &) {}, "no GPU arch is known (no device is visible)"},
  {"aot_rocm_build_cuda_arch", NVTE_AOTriton, &kRocmAotCudaArch, [](NVTEFusedAttnConfig &) {}, "needs a gfx GPU arch in a ROCm build, got 'sm_90'"},
  {"aot_head_dim_80_padded", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.head_dim_qk = c.head_dim_v = 80; }, nullptr},
  {"aot_head_dim_128", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.head_dim_qk = c.head_dim_v = 128; }, nullptr},
  {"aot_head_dim_129", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.head_dim_qk = c.head_dim_v = 129; }, "head_dim_qk == head_dim_v <= 128, got 129 and 129"},
  {"aot_head_dims_differ", NVTE_AOTriton, &kRocmAot, [](NVTEFusedAttnConfig &c) { c.head_dim_v = 32; }, "head_dim_qk == head_dim_v <= 128, got 64 and 32"},
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
  c.window_size_right = 0;  // no_mask with window (-1, 0): ck needs (-1, -1) or both sides >= 0
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

// A ROCm build with AOTriton images for gfx942 only: aotriton on gfx942, flash on gfx90a (with the
// reason), whatever the device's feature suffix.
TEST_F(Select, AotritonWhereTheBuildHasImages) {
  const NVTEFusedAttnConfig c = base_config();
  const Result on = select(c, &kRocmImagesGfx942OnGfx942);
  EXPECT_EQ(on.selected, NVTE_AOTriton) << on.reasons[NVTE_AOTriton];
  const Result off = select(c, &kRocmImagesGfx942OnGfx90a);
  EXPECT_EQ(off.selected, NVTE_Flash);
  EXPECT_EQ(off.reasons[NVTE_AOTriton],
            "aotriton has no images for GPU arch 'gfx90a' in this build (built: gfx942)");
  EXPECT_EQ(select(c, &kCudaImagesSm80OnSm90).selected, NVTE_Flash);
  EXPECT_EQ(select(c, &kCudaAotSm86).selected, NVTE_AOTriton);  // sm_80 images run on sm_86
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

}  // namespace
