// Attention backend selection (backend_select.h) and the selection half of the C API (fused_attn.h):
// config validation, each backend's eligibility rules, the env switches, the preference
// ck > aotriton > flash > unfused, and the stderr logging switches.
#include "backend_select.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../fused_attn_rocm/aotriton_arch.h"
#include "../util/api.h"
#include "../util/env.h"
#include "../util/tensor.h"
#ifdef NVTE_WITH_AOTRITON
#include "../fused_attn_rocm/aotriton_index.h"
#include "../util/gpu_device.h"
#endif

namespace nvte {
namespace {

using detail::concat;

#ifdef NVTE_WITH_ROCM
constexpr bool kRocmBuild = true;
#else
constexpr bool kRocmBuild = false;
#endif

// Highest preference first.
constexpr NVTE_Fused_Attn_Backend kPreference[] = {NVTE_CK, NVTE_AOTriton, NVTE_Flash, NVTE_Unfused};

constexpr const char *kLayoutNames[] = {
    "sb3hd", "sbh3d", "sbhd_sb2hd", "sbhd_sbh2d", "sbhd_sbhd_sbhd",
    "bs3hd", "bsh3d", "bshd_bs2hd", "bshd_bsh2d", "bshd_bshd_bshd",
    "t3hd",  "th3d",  "thd_t2hd",   "thd_th2d",   "thd_thd_thd"};
constexpr const char *kMaskNames[] = {"no_mask",        "padding",
                                      "causal",         "padding_causal",
                                      "causal_bottom_right", "padding_causal_bottom_right"};
constexpr const char *kBiasNames[] = {"no_bias", "pre_scale_bias", "post_scale_bias", "alibi"};
constexpr const char *kBackendNames[] = {"aotriton", "ck", "flash", "unfused"};  // by enum value

constexpr long long kNumLayouts = sizeof(kLayoutNames) / sizeof(kLayoutNames[0]);
constexpr long long kNumMasks = sizeof(kMaskNames) / sizeof(kMaskNames[0]);
constexpr long long kNumBias = sizeof(kBiasNames) / sizeof(kBiasNames[0]);

// C enums may have an unsigned underlying type; compare their values as signed integers.
template <typename E>
long long ival(E e) {
  return static_cast<long long>(e);
}

const char *layout_name(NVTE_QKV_Layout l) { return nvte_qkv_layout_name(l); }
const char *mask_name(NVTE_Mask_Type m) { return nvte_mask_type_name(m); }
const char *bias_name(NVTE_Bias_Type b) { return nvte_bias_type_name(b); }
const char *device_name(NVTEDevice d) { return d == kNVTEDeviceGPU ? "GPU" : "CPU"; }

bool is_padding(NVTE_Mask_Type m) {
  return m == NVTE_PADDING_MASK || m == NVTE_PADDING_CAUSAL_MASK ||
         m == NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
}
bool is_causal(NVTE_Mask_Type m) {
  return m == NVTE_CAUSAL_MASK || m == NVTE_PADDING_CAUSAL_MASK ||
         m == NVTE_CAUSAL_BOTTOM_RIGHT_MASK || m == NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK;
}
bool is_packed_qkv(NVTE_QKV_Layout l) {
  const NVTE_QKV_Layout_Group g = nvte_get_qkv_layout_group(l);
  return g == NVTE_3HD || g == NVTE_H3D;
}
bool is_half(DType t) { return t == kNVTEFloat16 || t == kNVTEBFloat16; }

std::string window_str(const NVTEFusedAttnConfig &c) {
  return concat("(", c.window_size_left, ", ", c.window_size_right, ")");
}

// GPU arch without its feature suffix ("gfx942:sramecc+:xnack-" -> "gfx942"); "" when unknown.
std::string base_arch(const NVTEFusedAttnPlatform &pf) {
  const std::string a = pf.gpu_arch ? pf.gpu_arch : "";
  return a.substr(0, a.find(':'));
}
bool starts_with(const std::string &s, const char *prefix) {
  return s.compare(0, std::strlen(prefix), prefix) == 0;
}

// Values no backend could ever take are caller errors (NVTE_ERROR_INVALID_ARGUMENT), not rejections.
void check_config(const NVTEFusedAttnConfig &c) {
  NVTE_CHECK(c.device == kNVTEDeviceCPU || c.device == kNVTEDeviceGPU,
             "config.device: expected kNVTEDeviceCPU (0) or kNVTEDeviceGPU (1), got ", ival(c.device));
  NVTE_CHECK(ival(c.q_dtype) >= 0 && ival(c.q_dtype) < kNVTENumTypes,
             "config.q_dtype: expected an NVTEDType value in [0, ", ival(kNVTENumTypes), "), got ",
             ival(c.q_dtype));
  NVTE_CHECK(ival(c.kv_dtype) >= 0 && ival(c.kv_dtype) < kNVTENumTypes,
             "config.kv_dtype: expected an NVTEDType value in [0, ", ival(kNVTENumTypes), "), got ",
             ival(c.kv_dtype));
  NVTE_CHECK(ival(c.qkv_layout) >= 0 && ival(c.qkv_layout) < kNumLayouts,
             "config.qkv_layout: expected an NVTE_QKV_Layout value in [0, ", kNumLayouts, "), got ",
             ival(c.qkv_layout));
  NVTE_CHECK(ival(c.bias_type) >= 0 && ival(c.bias_type) < kNumBias,
             "config.bias_type: expected an NVTE_Bias_Type value in [0, ", kNumBias, "), got ",
             ival(c.bias_type));
  NVTE_CHECK(ival(c.attn_mask_type) >= 0 && ival(c.attn_mask_type) < kNumMasks,
             "config.attn_mask_type: expected an NVTE_Mask_Type value in [0, ", kNumMasks, "), got ",
             ival(c.attn_mask_type));
  NVTE_CHECK(c.num_attn_heads >= 1, "config.num_attn_heads: expected at least 1 head, got ",
             c.num_attn_heads);
  NVTE_CHECK(c.num_gqa_groups >= 1,
             "config.num_gqa_groups: expected at least 1 KV head (group), got ", c.num_gqa_groups);
  NVTE_CHECK(c.window_size_left >= -1,
             "config.window_size_left: expected -1 (unbounded) or a size >= 0, got ",
             c.window_size_left);
  NVTE_CHECK(c.window_size_right >= -1,
             "config.window_size_right: expected -1 (unbounded) or a size >= 0, got ",
             c.window_size_right);
  NVTE_CHECK(!std::isnan(c.dropout), "config.dropout: expected a probability in [0, 1), got NaN");
}

// ---- rules every backend shares (kept per backend so each reason names the first broken rule) ----
std::string gqa_reason(const NVTEFusedAttnConfig &c) {
  if (c.num_attn_heads % c.num_gqa_groups != 0) {
    return concat("GQA needs num_attn_heads % num_gqa_groups == 0, got ", c.num_attn_heads, " and ",
                  c.num_gqa_groups);
  }
  return "";
}
std::string head_dim_reason(const NVTEFusedAttnConfig &c) {
  if (c.head_dim_qk == 0 || c.head_dim_v == 0) {
    return concat("head dims must be at least 1, got head_dim_qk ", c.head_dim_qk, " and head_dim_v ",
                  c.head_dim_v);
  }
  return "";
}
std::string dropout_reason(const NVTEFusedAttnConfig &c) {
  if (!(c.dropout >= 0.0f && c.dropout < 1.0f)) {
    return concat("dropout must be in [0, 1), got ", c.dropout);
  }
  return "";
}
std::string half_dtype_reason(const NVTEFusedAttnConfig &c) {
  if (!is_half(c.q_dtype)) {
    return concat("dtype must be float16 or bfloat16, got ", dtype_name(c.q_dtype));
  }
  if (c.kv_dtype != c.q_dtype) {
    return concat("Q and KV dtypes must match, got ", dtype_name(c.q_dtype), " and ",
                  dtype_name(c.kv_dtype));
  }
  return "";
}
std::string packed_seqlen_reason(const NVTEFusedAttnConfig &c) {
  if (is_packed_qkv(c.qkv_layout) && c.max_seqlen_q != c.max_seqlen_kv) {
    return concat("packed QKV layout ", layout_name(c.qkv_layout),
                  " needs max_seqlen_q == max_seqlen_kv, got ", c.max_seqlen_q, " and ",
                  c.max_seqlen_kv);
  }
  return "";
}
std::string gpu_only_reason(const NVTEFusedAttnConfig &c) {
  return c.device == kNVTEDeviceGPU ? "" : "runs on GPU tensors only, got CPU tensors";
}

// Returns the first non-empty reason of a list of rule checks, evaluated in order.
template <typename... Rules>
std::string first_of(Rules &&...rules) {
  std::string r;
  ((r.empty() ? (void)(r = rules()) : (void)0), ...);
  return r;
}

// ---- per-backend rules (reference/attention_dispatch.md for ck and aotriton) ----
std::string ck_rules(const NVTEFusedAttnConfig &c, const NVTEFusedAttnPlatform &pf) {
  return first_of(
      [&] { return gpu_only_reason(c); },
      [&]() -> std::string {
        // CK runs on any CDNA arch it was compiled for; ROCm TE builds it for these families.
        const std::string a = base_arch(pf);
        if (a == "gfx90a" || starts_with(a, "gfx94") || starts_with(a, "gfx95")) return "";
        return concat("GPU arch must be one CK is built for (gfx90a, gfx94x, gfx95x), got '", a,
                      "'");
      },
      [&] { return half_dtype_reason(c); },
      [&]() -> std::string {
        if (c.bias_type != NVTE_PRE_SCALE_BIAS) return "";
        return "pre_scale_bias is not supported by ck (no_bias, post_scale_bias and alibi are)";
      },
      [&]() -> std::string {
        const int64_t l = c.window_size_left, r = c.window_size_right;
        if (is_causal(c.attn_mask_type)) {
          if (r == 0) return "";  // left is -1 or >= 0 after check_config
          return concat("mask ", mask_name(c.attn_mask_type),
                        " needs window (-1 or >= 0, 0) in ck, got ", window_str(c));
        }
        if ((l == -1 && r == -1) || (l >= 0 && r >= 0)) return "";
        return concat("mask ", mask_name(c.attn_mask_type),
                      " needs window (-1, -1) or both sides >= 0 in ck, got ", window_str(c));
      },
      [&]() -> std::string {
        if (nvte_get_qkv_format(c.qkv_layout) != NVTE_THD || is_padding(c.attn_mask_type)) return "";
        return concat("thd layout ", layout_name(c.qkv_layout),
                      " needs a padding mask in ck (padding, padding_causal, "
                      "padding_causal_bottom_right), got ",
                      mask_name(c.attn_mask_type));
      },
      [&] { return packed_seqlen_reason(c); },
      [&]() -> std::string {
        if (!is_packed_qkv(c.qkv_layout) || c.num_attn_heads == c.num_gqa_groups) return "";
        return concat("packed QKV layout ", layout_name(c.qkv_layout),
                      " cannot hold GQA/MQA in ck (needs num_attn_heads == num_gqa_groups), got ",
                      c.num_attn_heads, " and ", c.num_gqa_groups);
      },
      [&] { return gqa_reason(c); },
      [&] { return head_dim_reason(c); },
      [&]() -> std::string {
        if (c.head_dim_qk < 512 && c.head_dim_v < 512) return "";
        return concat("ck needs head_dim_qk < 512 and head_dim_v < 512, got ", c.head_dim_qk,
                      " and ", c.head_dim_v);
      },
      [&]() -> std::string {
        if (!is_padding(c.attn_mask_type) || c.bias_type == NVTE_NO_BIAS) return "";
        return concat("ck cannot combine a padding mask with a bias, got mask ",
                      mask_name(c.attn_mask_type), " and bias ", bias_name(c.bias_type));
      },
      [&] { return dropout_reason(c); });
}

std::string aotriton_rules(const NVTEFusedAttnConfig &c, const NVTEFusedAttnPlatform &pf) {
  return first_of(
      [&] { return gpu_only_reason(c); },
      [&]() -> std::string {
        // Images exist per arch (build_tools/aotriton.py); an arch the build has none for falls
        // back. The kernels themselves are built for CDNA2/3 (gfx90a, gfx942, gfx950) and
        // Ampere/Hopper.
        const std::string a = pf.gpu_arch ? pf.gpu_arch : "";
        if (a.empty()) {
          return "aotriton cannot tell which images to run: no GPU arch is known (no device is "
                 "visible)";
        }
        const bool amd = starts_with(a, "gfx");
        if (pf.is_rocm != amd) {
          return concat("aotriton needs a ", pf.is_rocm ? "gfx" : "sm_", " GPU arch in a ",
                        pf.is_rocm ? "ROCm" : "CUDA", " build, got '", a, "'");
        }
        const std::string archs = pf.aotriton_archs ? pf.aotriton_archs : aotriton::kTargetArchs;
        if (!aotriton::image_arch_for(a, archs).empty()) return "";
        return concat("aotriton has no images for GPU arch '", a, "' in this build (built: ",
                      archs.empty() ? "none" : archs, ")");
      },
      [&] { return half_dtype_reason(c); },
      [&]() -> std::string {
        if (c.bias_type == NVTE_NO_BIAS) return "";
        return concat("aotriton supports no_bias only, got ", bias_name(c.bias_type));
      },
      [&]() -> std::string {
        if (c.attn_mask_type == NVTE_NO_MASK || c.attn_mask_type == NVTE_CAUSAL_MASK) return "";
        return concat("aotriton supports masks no_mask and causal only, got ",
                      mask_name(c.attn_mask_type));
      },
      [&]() -> std::string {
        if (c.attn_mask_type != NVTE_CAUSAL_MASK || c.max_seqlen_q == c.max_seqlen_kv) return "";
        return concat("causal mask needs max_seqlen_q == max_seqlen_kv in aotriton, got ",
                      c.max_seqlen_q, " and ", c.max_seqlen_kv);
      },
      [&]() -> std::string {
        const int64_t l = c.window_size_left, r = c.window_size_right;
        if (l == -1 && (r == -1 || r == 0)) return "";
        return concat("aotriton supports window (-1, -1) or (-1, 0) only, got ", window_str(c));
      },
      [&]() -> std::string {
        if (nvte_get_qkv_format(c.qkv_layout) != NVTE_THD) return "";
        return concat("aotriton supports bshd and sbhd layouts only, got ",
                      layout_name(c.qkv_layout));
      },
      [&] { return packed_seqlen_reason(c); },
      [&]() -> std::string {
        if (c.num_attn_heads == c.num_gqa_groups) return "";
        return concat("aotriton has no GQA/MQA (needs num_attn_heads == num_gqa_groups), got ",
                      c.num_attn_heads, " and ", c.num_gqa_groups);
      },
      [&] { return head_dim_reason(c); },
      [&]() -> std::string {
        // The compiled variants: BLOCK_D 64 and 128, smaller head dims padded to the next one.
        if (c.head_dim_qk == c.head_dim_v && c.head_dim_qk <= 128) return "";
        return concat("aotriton kernels need head_dim_qk == head_dim_v <= 128, got ",
                      c.head_dim_qk, " and ", c.head_dim_v);
      },
      [&] { return dropout_reason(c); });
}

std::string flash_rules(const NVTEFusedAttnConfig &c) {
  return first_of(
      [&]() -> std::string {
        if (is_fp8(c.q_dtype) || is_fp8(c.kv_dtype)) {
          return concat("FP8 attention is not supported by flash, got ", dtype_name(c.q_dtype),
                        " and ", dtype_name(c.kv_dtype));
        }
        if (c.q_dtype == kNVTEFloat32 && c.device == kNVTEDeviceGPU) {
          return "float32 is supported by flash on CPU tensors only, got GPU tensors";
        }
        if (!is_half(c.q_dtype) && c.q_dtype != kNVTEFloat32) {
          return concat("dtype must be float16, bfloat16 or float32 (CPU), got ",
                        dtype_name(c.q_dtype));
        }
        if (c.kv_dtype != c.q_dtype) {
          return concat("Q and KV dtypes must match, got ", dtype_name(c.q_dtype), " and ",
                        dtype_name(c.kv_dtype));
        }
        return "";
      },
      [&]() -> std::string {
        if (c.bias_type != NVTE_PRE_SCALE_BIAS) return "";
        return "pre_scale_bias is not supported by flash (use unfused)";
      },
      [&] { return gqa_reason(c); },
      [&]() -> std::string {
        if (c.head_dim_qk >= 1 && c.head_dim_qk <= 256 && c.head_dim_v >= 1 && c.head_dim_v <= 256) {
          return "";
        }
        return concat("flash needs head dims in [1, 256], got head_dim_qk ", c.head_dim_qk,
                      " and head_dim_v ", c.head_dim_v);
      },
      [&]() -> std::string {
        const int64_t r = c.window_size_right;
        if (!is_causal(c.attn_mask_type) || r == -1 || r == 0) return "";
        return concat("mask ", mask_name(c.attn_mask_type),
                      " needs window right -1 or 0 in flash (the mask ends at the diagonal), got ",
                      window_str(c));
      },
      [&] { return dropout_reason(c); });
}

// The front ends' framework math: every layout, mask and bias; only what no math can do is out.
std::string unfused_rules(const NVTEFusedAttnConfig &c) {
  return first_of(
      [&]() -> std::string {
        for (DType t : {c.q_dtype, c.kv_dtype}) {
          if (!is_half(t) && t != kNVTEFloat32) {
            return concat("dtype must be float16, bfloat16 or float32, got ", dtype_name(t));
          }
        }
        return "";
      },
      [&] { return head_dim_reason(c); }, [&] { return gqa_reason(c); },
      [&] { return dropout_reason(c); });
}

std::string build_reason(NVTE_Fused_Attn_Backend b, const NVTEFusedAttnPlatform &pf) {
  bool built = true;
  switch (b) {
    case NVTE_CK: built = pf.is_rocm && pf.has_ck; break;
    case NVTE_AOTriton: built = pf.has_aotriton; break;
    case NVTE_Flash: built = pf.has_flash; break;
    default: break;  // unfused lives in the front ends: always there
  }
  return built ? "" : "not built in this build";
}

std::string backend_rules(NVTE_Fused_Attn_Backend b, const NVTEFusedAttnConfig &c,
                          const NVTEFusedAttnPlatform &pf) {
  switch (b) {
    case NVTE_CK: return ck_rules(c, pf);
    case NVTE_AOTriton: return aotriton_rules(c, pf);
    case NVTE_Flash: return flash_rules(c);
    case NVTE_Unfused: return unfused_rules(c);
    default: NVTE_ERROR("backend: expected ck, aotriton, flash or unfused, got ", ival(b));
  }
}

void check_backend(NVTE_Fused_Attn_Backend b) {
  NVTE_CHECK(ival(b) >= 0 && ival(b) < NVTE_NUM_FUSED_ATTN_BACKENDS,
             "backend: expected ck, aotriton, flash or unfused, got ", ival(b));
}

std::string describe_config(const NVTEFusedAttnConfig &c, const NVTEFusedAttnPlatform *pf) {
  std::string arch = pf && pf->gpu_arch && *pf->gpu_arch ? concat(" arch=", pf->gpu_arch) : "";
  return concat("device=", device_name(c.device), arch, " dtype=", dtype_name(c.q_dtype), "/",
                dtype_name(c.kv_dtype), " layout=", layout_name(c.qkv_layout),
                " bias=", bias_name(c.bias_type), " mask=", mask_name(c.attn_mask_type),
                " h=", c.num_attn_heads, " h_kv=", c.num_gqa_groups, " s_q=", c.max_seqlen_q,
                " s_kv=", c.max_seqlen_kv, " d_qk=", c.head_dim_qk, " d_v=", c.head_dim_v,
                " window=", window_str(c), " dropout=", c.dropout);
}

// One write per line, so lines of concurrent threads do not interleave.
void log_line(const std::string &line) { std::fprintf(stderr, "[NVTE] %s\n", line.c_str()); }

void log_selection(const NVTEFusedAttnConfig &c, const NVTEFusedAttnPlatform &pf,
                   const Selection &s) {
  if (env_is_one("NVTE_LOG_FUSED_ATTN_CONFIG")) {
    std::string rejected;
    for (NVTE_Fused_Attn_Backend b : kPreference) {
      if (s.reasons[b].empty()) continue;
      rejected += concat(rejected.empty() ? "" : "; ", kBackendNames[b], ": ", s.reasons[b]);
    }
    log_line(concat("fused_attn selection: ", describe_config(c, &pf), " -> selected ",
                    nvte_fused_attn_backend_name(s.backend),
                    rejected.empty() ? "" : concat(" (rejected: ", rejected, ")")));
  }
  // Per-backend switches: only meaningful where the backend is part of the platform.
  const auto backend_log = [&](NVTE_Fused_Attn_Backend b) {
    const std::string &r = s.reasons[b];
    log_line(concat(kBackendNames[b], ": ", r.empty() ? "eligible" : concat("rejected: ", r),
                    " for ", describe_config(c, &pf)));
  };
  if (pf.has_ck && env_is_one("NVTE_LOG_CK_CONFIG")) backend_log(NVTE_CK);
  if (pf.has_aotriton && env_is_one("NVTE_LOG_AOTRITON_CONFIG")) backend_log(NVTE_AOTriton);
}

}  // namespace

NVTEFusedAttnPlatform this_platform(NVTEDevice device) {
  NVTEFusedAttnPlatform pf{};
  pf.is_rocm = kRocmBuild;
  // No build of ours compiles CK (ck_tile needs a ROCm >= 6 compiler, none reachable); AOTriton is
  // there when the build compiled its images (build_tools/aotriton.py). The flash kernel is always
  // there for CPU tensors and in GPU builds for GPU tensors.
  pf.has_ck = false;
  pf.has_flash = device == kNVTEDeviceCPU ? true : kGpuBuild;
  pf.gpu_arch = "";
#ifdef NVTE_WITH_AOTRITON
  // GPU code only: for CPU tensors this build has no aotriton, as a CPU-only build has no GPU flash.
  pf.has_aotriton = device == kNVTEDeviceGPU;
  pf.aotriton_archs = aotriton::kArchs;
  // The arch only matters to the CK and AOTriton rules: asked of the runtime only here.
  if (device == kNVTEDeviceGPU) pf.gpu_arch = gpu_device_arch(nullptr);
#else
  pf.has_aotriton = false;
  pf.aotriton_archs = "";
#endif
  return pf;
}

std::string rule_reason(NVTE_Fused_Attn_Backend backend, const NVTEFusedAttnConfig &cfg,
                        const NVTEFusedAttnPlatform &pf) {
  check_backend(backend);
  check_config(cfg);
  const std::string built = build_reason(backend, pf);
  return built.empty() ? backend_rules(backend, cfg, pf) : built;
}

std::string env_reason(NVTE_Fused_Attn_Backend backend) {
  check_backend(backend);
  const auto fused_switch = [](const char *own, bool own_zero, const char *own_name) -> std::string {
    if (own != nullptr) return own_zero ? concat("disabled by ", own_name, "=0") : "";
    if (env_is_zero("NVTE_FUSED_ATTN")) {
      return concat("disabled by NVTE_FUSED_ATTN=0 (", own_name, " is unset and inherits it)");
    }
    return "";
  };
  switch (backend) {
    case NVTE_CK:
      return fused_switch(env_value("NVTE_FUSED_ATTN_CK"), env_is_zero("NVTE_FUSED_ATTN_CK"),
                          "NVTE_FUSED_ATTN_CK");
    case NVTE_AOTriton:
      return fused_switch(env_value("NVTE_FUSED_ATTN_AOTRITON"),
                          env_is_zero("NVTE_FUSED_ATTN_AOTRITON"), "NVTE_FUSED_ATTN_AOTRITON");
    case NVTE_Flash:
      return env_is_zero("NVTE_FLASH_ATTN") ? "disabled by NVTE_FLASH_ATTN=0" : "";
    default:
      return env_is_zero("NVTE_UNFUSED_ATTN") ? "disabled by NVTE_UNFUSED_ATTN=0" : "";
  }
}

Selection select_backend(const NVTEFusedAttnConfig &cfg, const NVTEFusedAttnPlatform &pf) {
  check_config(cfg);
  Selection s;
  for (NVTE_Fused_Attn_Backend b : kPreference) {
    // A missing backend says so before a switch or a rule could; a disabled one before its rules.
    std::string r = build_reason(b, pf);
    if (r.empty()) r = env_reason(b);
    if (r.empty()) r = backend_rules(b, cfg, pf);
    if (r.empty() && s.backend == NVTE_No_Backend) s.backend = b;
    s.reasons[b] = std::move(r);
  }
  log_selection(cfg, pf, s);
  return s;
}

std::string describe_reasons(const Selection &s) {
  std::string out;
  for (NVTE_Fused_Attn_Backend b : kPreference) {
    out += concat(out.empty() ? "" : "; ", kBackendNames[b], ": ",
                  s.reasons[b].empty() ? "eligible" : s.reasons[b]);
  }
  return out;
}

void log_attn_call(const char *what, size_t batch, const NVTEFusedAttnConfig &cfg) {
  if (!env_is_one("NVTE_LOG_FUSED_ATTN_CONFIG")) return;
  log_line(concat(what, ": b=", batch, " ", describe_config(cfg, nullptr)));
}

}  // namespace nvte

using nvte::guarded;

NVTE_QKV_Layout_Group nvte_get_qkv_layout_group(NVTE_QKV_Layout qkv_layout) {
  switch (qkv_layout) {
    case NVTE_SB3HD: case NVTE_BS3HD: case NVTE_T3HD: return NVTE_3HD;
    case NVTE_SBH3D: case NVTE_BSH3D: case NVTE_TH3D: return NVTE_H3D;
    case NVTE_SBHD_SB2HD: case NVTE_BSHD_BS2HD: case NVTE_THD_T2HD: return NVTE_HD_2HD;
    case NVTE_SBHD_SBH2D: case NVTE_BSHD_BSH2D: case NVTE_THD_TH2D: return NVTE_HD_H2D;
    default: return NVTE_HD_HD_HD;
  }
}

NVTE_QKV_Format nvte_get_qkv_format(NVTE_QKV_Layout qkv_layout) {
  const long long l = nvte::ival(qkv_layout);
  if (l >= NVTE_SB3HD && l <= NVTE_SBHD_SBHD_SBHD) return NVTE_SBHD;
  if (l >= NVTE_T3HD && l <= NVTE_THD_THD_THD) return NVTE_THD;
  return NVTE_BSHD;
}

const char *nvte_qkv_layout_name(NVTE_QKV_Layout qkv_layout) {
  const long long l = nvte::ival(qkv_layout);
  return l >= 0 && l < nvte::kNumLayouts ? nvte::kLayoutNames[l] : "unknown";
}

const char *nvte_mask_type_name(NVTE_Mask_Type mask_type) {
  const long long m = nvte::ival(mask_type);
  return m >= 0 && m < nvte::kNumMasks ? nvte::kMaskNames[m] : "unknown";
}

const char *nvte_bias_type_name(NVTE_Bias_Type bias_type) {
  const long long b = nvte::ival(bias_type);
  return b >= 0 && b < nvte::kNumBias ? nvte::kBiasNames[b] : "unknown";
}

const char *nvte_fused_attn_backend_name(NVTE_Fused_Attn_Backend backend) {
  const long long b = nvte::ival(backend);
  if (b == NVTE_No_Backend) return "no_backend";
  return b >= 0 && b < NVTE_NUM_FUSED_ATTN_BACKENDS ? nvte::kBackendNames[b] : "unknown";
}

NVTE_Fused_Attn_Backend nvte_get_fused_attn_backend(
    NVTEDType q_dtype, NVTEDType kv_dtype, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
    NVTE_Mask_Type attn_mask_type, float dropout, size_t num_attn_heads, size_t num_gqa_groups,
    size_t max_seqlen_q, size_t max_seqlen_kv, size_t head_dim_qk, size_t head_dim_v,
    int64_t window_size_left, int64_t window_size_right, NVTEDevice device) {
  NVTE_Fused_Attn_Backend result = NVTE_No_Backend;
  guarded("nvte_get_fused_attn_backend", [&] {
    const NVTEFusedAttnConfig cfg{device,         q_dtype,        kv_dtype,     qkv_layout,
                                  bias_type,      attn_mask_type, dropout,      num_attn_heads,
                                  num_gqa_groups, max_seqlen_q,   max_seqlen_kv, head_dim_qk,
                                  head_dim_v,     window_size_left, window_size_right};
    nvte::check_config(cfg);
    const NVTEFusedAttnPlatform pf = nvte::this_platform(device);
    const nvte::Selection s = nvte::select_backend(cfg, pf);
    NVTE_CHECK_SUPPORTED(s.backend != NVTE_No_Backend, "no attention backend can run ",
                         nvte::describe_config(cfg, &pf), "; ", nvte::describe_reasons(s));
    result = s.backend;
  });
  return result;
}

NVTEStatus nvte_fused_attn_backend_reasons(const NVTEFusedAttnConfig *config,
                                           const NVTEFusedAttnPlatform *platform,
                                           NVTE_Fused_Attn_Backend *selected,
                                           const char **reasons) {
  return guarded("nvte_fused_attn_backend_reasons", [&] {
    NVTE_CHECK(config != nullptr, "argument 'config': expected an NVTEFusedAttnConfig, got NULL");
    nvte::check_config(*config);
    const NVTEFusedAttnPlatform pf = platform ? *platform : nvte::this_platform(config->device);
    nvte::Selection s = nvte::select_backend(*config, pf);
    // The strings the caller gets stay valid until the next call on this thread.
    thread_local std::array<std::string, NVTE_NUM_FUSED_ATTN_BACKENDS> kept;
    kept = std::move(s.reasons);
    if (selected) *selected = s.backend;
    if (reasons) {
      for (int b = 0; b < NVTE_NUM_FUSED_ATTN_BACKENDS; ++b) reasons[b] = kept[b].c_str();
    }
  });
}
