// CPU flash attention (fused_attn_cpu.cpp): tiled, online softmax, fp32 accumulation, O(S) extra
// memory per head. Arguments arrive validated by fused_attn.cpp.
#pragma once

#include "attn_params.h"

namespace nvte {

// O (and softmax_lse when p.lse != nullptr) for every sequence / head / query row.
void flash_attn_fwd_cpu(const AttnParams &p);
// dQ, dK, dV (and dBias when p.dbias != nullptr), recomputing the probabilities from p.lse.
// Deterministic: every output element is reduced in a fixed order.
void flash_attn_bwd_cpu(const AttnParams &p);
// uint8 keep mask [b, h, s_q, s_kv] of the dropout p.dropout under (p.seed, p.offset).
void dropout_mask_cpu(const AttnParams &p, uint8_t *mask);

}  // namespace nvte
