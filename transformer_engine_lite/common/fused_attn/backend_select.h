// Attention backend selection (backend_select.cpp): per-backend eligibility rules, env switches,
// preference ck > aotriton > flash > unfused, logging. Used by the C API (nvte_get_fused_attn_backend,
// nvte_fused_attn_backend_reasons) and by fused_attn.cpp, which runs the flash kernel only for
// configs the flash rules accept.
#pragma once

#include <array>
#include <string>

#include "transformer_engine_lite/fused_attn.h"

namespace nvte {

// The platform of this build for tensors on `device`: backends compiled in, GPU arch of the current
// device ("" on the CPU or when no device is visible).
NVTEFusedAttnPlatform this_platform(NVTEDevice device);

// Why `backend` cannot run `cfg` on `pf` ("" = it can). Build presence and the backend's own rules,
// not the env switches.
std::string rule_reason(NVTE_Fused_Attn_Backend backend, const NVTEFusedAttnConfig &cfg,
                        const NVTEFusedAttnPlatform &pf);

// Reason the env switches disable `backend` ("" = enabled), e.g. "disabled by NVTE_FUSED_ATTN_CK=0".
std::string env_reason(NVTE_Fused_Attn_Backend backend);

struct Selection {
  NVTE_Fused_Attn_Backend backend = NVTE_No_Backend;
  std::array<std::string, NVTE_NUM_FUSED_ATTN_BACKENDS> reasons;  // "" = eligible
};

// Full selection (rules + env + preference); logs when NVTE_LOG_FUSED_ATTN_CONFIG=1.
Selection select_backend(const NVTEFusedAttnConfig &cfg, const NVTEFusedAttnPlatform &pf);

// "ck: <reason>; aotriton: <reason>; flash: <reason>; unfused: <reason>" for error messages.
std::string describe_reasons(const Selection &s);

// rule_reason and select_backend raise NVTE_ERROR_INVALID_ARGUMENT for a malformed config (enum out
// of range, zero heads, window < -1, NaN dropout) and env_reason / rule_reason for a backend out of
// range.

// Per-call log of an op (e.g. what = "nvte_fused_attn_fwd") with its batch size and config, one
// stderr line when NVTE_LOG_FUSED_ATTN_CONFIG=1 (exactly "1"); nothing otherwise.
void log_attn_call(const char *what, size_t batch, const NVTEFusedAttnConfig &cfg);

}  // namespace nvte
