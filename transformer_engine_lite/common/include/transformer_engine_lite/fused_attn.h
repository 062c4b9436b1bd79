/* Fused attention: backend selection, forward and backward (TE's fused_attn.h, C ABI).
 *
 * Names and enum values follow TransformerEngine (the backend enum follows ROCm TE's HIP values and
 * adds ours). Differences from TE, all because of the C ABI or the CPU backend:
 *  - every call returns NVTEStatus; nvte_get_fused_attn_backend returns the backend and, when nothing
 *    is eligible, NVTE_No_Backend with an error (nvte_get_last_error) listing every backend and why;
 *  - the auxiliary tensors are explicit arguments (softmax_lse, rng_state) instead of an
 *    NVTETensorPack; the selection takes the tensors' device as its last argument.
 *
 * Tensor conventions (all tensors on one device):
 *  - Q [b, s_q, h, d_qk] (bshd), [s_q, b, h, d_qk] (sbhd), [t_q, h, d_qk] (thd); K like Q with
 *    h_kv = num_gqa_groups heads; V like K with d_v. The data pointers are the first element of each;
 *    the distance between tokens / heads follows from the layout (e.g. in bs3hd, Q, K and V are views
 *    of one [b, s, 3, h, d] buffer: token stride 3*h*d, K starts h*d after Q). O has Q's format with
 *    d_v and is always dense. Dtypes: fp16, bf16 (fp32 on the CPU); Q, K, V, O and Bias share one.
 *    No output (O, softmax_lse, dQ, dK, dV, dBias) may share memory with an input (Q, K, V, O, dO,
 *    softmax_lse, cu_seqlens, Bias or ALiBi slopes, rng_state): such calls are refused.
 *  - thd: cu_seqlens_q / cu_seqlens_kv int32 [b + 1] are token offsets (cu[0] = 0, non-decreasing,
 *    cu[b] <= t). bshd/sbhd with a padding mask: they give each sequence's actual length (cu[i+1] -
 *    cu[i] <= s); the tokens after it are padding. Other masks: may be NULL (ignored).
 *  - softmax_lse: fp32 [b, h, max_seqlen_q], log-sum-exp of the scaled, biased, masked logits per
 *    query row (natural log); -inf for a row with no key kept (its output and gradients are 0).
 *    Written by the forward when is_training, read by the backward.
 *  - rng_state: int64 [2] = {seed, offset}, read when dropout > 0 (may be NULL otherwise); in host
 *    memory (any call) or, for GPU calls, in device memory (read by the kernels). The keep
 *    decision of logit (batch, head, i, j) is a pure function of (seed, offset, batch, head, i, j)
 *    (Philox4x32-10, util/philox.h), so the backward regenerates the forward's mask on any device.
 *    Kept probabilities are scaled by 1 / (1 - dropout).
 *  - Bias (post_scale_bias): [1 or b, 1 or h, s_q, s_kv] (TE's 11ss, 1hss, b1ss, bhss), added after
 *    attn_scale. Bias (alibi): NULL for TE's default slopes 2^(-8 (i+1) / h), else fp32 [h] or [b, h];
 *    the bias of (i, j) is -slope * |i + s_kv - s_q - j| (bottom-right aligned, per sequence lengths).
 *  - Masks (per sequence, with its actual lengths sq, skv): causal keeps j <= i; causal_bottom_right
 *    keeps j <= i + skv - sq; padding drops padded rows/columns. Window (left, right), -1 = unbounded:
 *    keeps i + off - left <= j <= i + off + right, off = 0 for causal/padding_causal, skv - sq
 *    otherwise. Causal masks imply right = 0.
 */
#ifndef TRANSFORMER_ENGINE_LITE_FUSED_ATTN_H_
#define TRANSFORMER_ENGINE_LITE_FUSED_ATTN_H_

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! Memory layouts of Q, K, V (TE's NVTE_QKV_Layout, same values). */
typedef enum NVTE_QKV_Layout NVTE_ENUM_INT {
  NVTE_SB3HD = 0,
  NVTE_SBH3D = 1,
  NVTE_SBHD_SB2HD = 2,
  NVTE_SBHD_SBH2D = 3,
  NVTE_SBHD_SBHD_SBHD = 4,
  NVTE_BS3HD = 5,
  NVTE_BSH3D = 6,
  NVTE_BSHD_BS2HD = 7,
  NVTE_BSHD_BSH2D = 8,
  NVTE_BSHD_BSHD_BSHD = 9,
  NVTE_T3HD = 10,
  NVTE_TH3D = 11,
  NVTE_THD_T2HD = 12,
  NVTE_THD_TH2D = 13,
  NVTE_THD_THD_THD = 14
} NVTE_QKV_Layout;

/*! How Q, K and V share memory (TE's NVTE_QKV_Layout_Group). */
typedef enum NVTE_QKV_Layout_Group NVTE_ENUM_INT {
  NVTE_3HD = 0,
  NVTE_H3D = 1,
  NVTE_HD_2HD = 2,
  NVTE_HD_H2D = 3,
  NVTE_HD_HD_HD = 4
} NVTE_QKV_Layout_Group;

/*! Token order (TE's NVTE_QKV_Format). */
typedef enum NVTE_QKV_Format NVTE_ENUM_INT {
  NVTE_SBHD = 0,
  NVTE_BSHD = 1,
  NVTE_THD = 2
} NVTE_QKV_Format;

/*! Bias (TE's NVTE_Bias_Type). pre_scale_bias exists for TE compatibility; no fused backend of ours
 *  takes it (the unfused path does). */
typedef enum NVTE_Bias_Type NVTE_ENUM_INT {
  NVTE_NO_BIAS = 0,
  NVTE_PRE_SCALE_BIAS = 1,
  NVTE_POST_SCALE_BIAS = 2,
  NVTE_ALIBI = 3
} NVTE_Bias_Type;

/*! Masks (TE's NVTE_Mask_Type). */
typedef enum NVTE_Mask_Type NVTE_ENUM_INT {
  NVTE_NO_MASK = 0,
  NVTE_PADDING_MASK = 1,
  NVTE_CAUSAL_MASK = 2,
  NVTE_PADDING_CAUSAL_MASK = 3,
  NVTE_CAUSAL_BOTTOM_RIGHT_MASK = 4,
  NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK = 5
} NVTE_Mask_Type;

/*! Softmax flavours (TE's NVTE_Softmax_Type, same values; attention sinks, arXiv 2309.17453).
 *  Per query row of head h, over the kept keys j with logits x_j:
 *  vanilla      p_j = exp(x_j) / sum_k exp(x_k);
 *  off-by-one   p_j = exp(x_j) / (1 + sum_k exp(x_k))       (a sink logit 0);
 *  learnable    p_j = exp(x_j) / (exp(a_h) + sum_k exp(x_k)) (a sink logit a_h = softmax_offset[h]).
 *  The sink takes probability mass but has no value row; it is neither scaled, biased, masked nor
 *  dropped. softmax_lse then includes it: lse = log(exp(sink) + sum_k exp(x_k)), so a row with no
 *  kept key has lse = sink (not -inf) and output 0. */
typedef enum NVTE_Softmax_Type NVTE_ENUM_INT {
  NVTE_VANILLA_SOFTMAX = 0,
  NVTE_OFF_BY_ONE_SOFTMAX = 1,
  NVTE_LEARNABLE_SOFTMAX = 2
} NVTE_Softmax_Type;

/*! Attention backends, in order of preference ck > aotriton > flash > unfused. The first three
 *  values are ROCm TE's; flash and unfused are ours. */
typedef enum NVTE_Fused_Attn_Backend NVTE_ENUM_INT {
  NVTE_No_Backend = -1,
  NVTE_AOTriton = 0, /*!< Triton flash kernels compiled ahead of time (GPU) */
  NVTE_CK = 1,       /*!< Composable Kernel fmha (ROCm) */
  NVTE_Flash = 2,    /*!< this library's tiled online-softmax kernel (CPU, CUDA, ROCm) */
  NVTE_Unfused = 3   /*!< framework GEMMs + the fused softmax kernels (front ends) */
} NVTE_Fused_Attn_Backend;

#define NVTE_NUM_FUSED_ATTN_BACKENDS 4

/*! Layout helpers (TE's). Out-of-range values give NVTE_HD_HD_HD / NVTE_BSHD. */
NVTE_API NVTE_QKV_Layout_Group nvte_get_qkv_layout_group(NVTE_QKV_Layout qkv_layout);
NVTE_API NVTE_QKV_Format nvte_get_qkv_format(NVTE_QKV_Layout qkv_layout);
/*! Names as in TE's Python ("bshd_bshd_bshd", "causal_bottom_right", "post_scale_bias", "flash",
 *  ...); "unknown" for values out of range. */
NVTE_API const char *nvte_qkv_layout_name(NVTE_QKV_Layout qkv_layout);
NVTE_API const char *nvte_mask_type_name(NVTE_Mask_Type mask_type);
NVTE_API const char *nvte_bias_type_name(NVTE_Bias_Type bias_type);
NVTE_API const char *nvte_fused_attn_backend_name(NVTE_Fused_Attn_Backend backend);
/*! "vanilla", "off-by-one", "learnable" (TE's Python spelling); "unknown" out of range. */
NVTE_API const char *nvte_softmax_type_name(NVTE_Softmax_Type softmax_type);

/*! One attention problem, as the selection sees it. */
typedef struct NVTEFusedAttnConfig {
  NVTEDevice device;
  NVTEDType q_dtype;
  NVTEDType kv_dtype;
  NVTE_QKV_Layout qkv_layout;
  NVTE_Bias_Type bias_type;
  NVTE_Mask_Type attn_mask_type;
  float dropout;
  size_t num_attn_heads;
  size_t num_gqa_groups;
  size_t max_seqlen_q;
  size_t max_seqlen_kv;
  size_t head_dim_qk;
  size_t head_dim_v;
  int64_t window_size_left;
  int64_t window_size_right;
} NVTEFusedAttnConfig;

/*! The platform the selection assumes: which backends exist and the GPU arch ("gfx942", "sm_90",
 *  "" for the CPU). Pass NULL to the calls below for this build and the config's device; pass one to
 *  ask what a different build would pick (e.g. a ROCm build with CK on gfx942). aotriton_archs: the
 *  archs the build has AOTriton images for, comma-separated ("gfx90a,gfx942"); NULL = every arch
 *  the kernels target (gfx90a, gfx942, gfx950, sm_80, sm_90). */
typedef struct NVTEFusedAttnPlatform {
  bool is_rocm;
  bool has_ck;
  bool has_aotriton;
  bool has_flash;
  const char *gpu_arch;
  const char *aotriton_archs;
} NVTEFusedAttnPlatform;

/*! TE's selection call (TE's arguments + the tensors' device). Applies the env switches
 *  (NVTE_FUSED_ATTN, NVTE_FUSED_ATTN_CK, NVTE_FUSED_ATTN_AOTRITON, NVTE_FLASH_ATTN, NVTE_UNFUSED_ATTN;
 *  only the exact string "0" disables; CK and AOTriton inherit NVTE_FUSED_ATTN) and every backend's
 *  eligibility rules, then prefers ck > aotriton > flash > unfused. NVTE_LOG_FUSED_ATTN_CONFIG=1 logs
 *  the config and the choice to stderr. Nothing eligible: NVTE_No_Backend, and the last error
 *  (NVTE_ERROR_UNSUPPORTED) lists every backend with its reason. */
NVTE_API NVTE_Fused_Attn_Backend nvte_get_fused_attn_backend(
    NVTEDType q_dtype, NVTEDType kv_dtype, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
    NVTE_Mask_Type attn_mask_type, float dropout, size_t num_attn_heads, size_t num_gqa_groups,
    size_t max_seqlen_q, size_t max_seqlen_kv, size_t head_dim_qk, size_t head_dim_v,
    int64_t window_size_left, int64_t window_size_right, NVTEDevice device);

/*! The selection with its reasons: *selected gets the backend (NVTE_No_Backend if none);
 *  reasons[backend] (NVTE_NUM_FUSED_ATTN_BACKENDS entries, indexed by the enum value) gets "" for an
 *  eligible backend and otherwise why it was rejected ("not built in this build", "disabled by
 *  NVTE_FUSED_ATTN_CK=0", "GQA needs h % h_kv == 0, got h=6 h_kv=4", ...). The strings live until the
 *  next call on this thread. Returns NVTE_SUCCESS even when nothing is eligible (then *selected is
 *  NVTE_No_Backend); errors only for a NULL or malformed config. platform may be NULL (this build). */
NVTE_API NVTEStatus nvte_fused_attn_backend_reasons(const NVTEFusedAttnConfig *config,
                                                    const NVTEFusedAttnPlatform *platform,
                                                    NVTE_Fused_Attn_Backend *selected,
                                                    const char **reasons);

/*! Forward. O is written; softmax_lse is written when is_training (may be NULL otherwise).
 *  workspace: TE's query protocol; this library needs none on the CPU (a handle without data gets
 *  shape [0]) and may be passed as NULL. Runs the flash kernel; fails with NVTE_ERROR_UNSUPPORTED,
 *  naming the rule, for a config the flash kernel does not take. */
NVTE_API NVTEStatus nvte_fused_attn_fwd(
    const NVTETensor Q, const NVTETensor K, const NVTETensor V, const NVTETensor Bias, NVTETensor O,
    NVTETensor softmax_lse, const NVTETensor cu_seqlens_q, const NVTETensor cu_seqlens_kv,
    const NVTETensor rng_state, size_t max_seqlen_q, size_t max_seqlen_kv, bool is_training,
    float attn_scale, float dropout, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
    NVTE_Mask_Type attn_mask_type, int64_t window_size_left, int64_t window_size_right,
    NVTETensor workspace, NVTEStream stream);

/*! Backward: recomputes the probabilities from softmax_lse. dQ, dK, dV have the shapes of Q, K, V
 *  and are written densely in the layout's format (a packed layout's gradients are written as three
 *  separate dense tensors). dBias (post_scale_bias only, may be NULL): Bias's shape, the gradient
 *  summed over the broadcast dims. Deterministic on the CPU. */
NVTE_API NVTEStatus nvte_fused_attn_bwd(
    const NVTETensor Q, const NVTETensor K, const NVTETensor V, const NVTETensor O,
    const NVTETensor dO, const NVTETensor softmax_lse, const NVTETensor Bias, NVTETensor dQ,
    NVTETensor dK, NVTETensor dV, NVTETensor dBias, const NVTETensor cu_seqlens_q,
    const NVTETensor cu_seqlens_kv, const NVTETensor rng_state, size_t max_seqlen_q,
    size_t max_seqlen_kv, float attn_scale, float dropout, NVTE_QKV_Layout qkv_layout,
    NVTE_Bias_Type bias_type, NVTE_Mask_Type attn_mask_type, int64_t window_size_left,
    int64_t window_size_right, bool deterministic, NVTETensor workspace, NVTEStream stream);

/*! nvte_fused_attn_fwd / _bwd with TE's softmax_type and its tensors, in TE's argument positions
 *  (SoftmaxOffset after Bias, dSoftmaxOffset after dBias, softmax_type after attn_mask_type).
 *  SoftmaxOffset: fp32, h elements ([h] or TE's [1, h, 1, 1]), on the inputs' device; required for
 *  learnable, may be NULL otherwise (off-by-one's sink is 0 and a given offset is not read).
 *  dSoftmaxOffset (backward, learnable only; may be NULL): SoftmaxOffset's shape, written (not
 *  accumulated) with d loss / d a_h = -sum over batch and query rows of exp(a_h - lse) * delta,
 *  delta = rowsum(dO * O), accumulated in fp64 in a fixed order (deterministic on every device).
 *  Vanilla calls are exactly the plain entry points. The flash kernels (CPU, CUDA, ROCm) take every
 *  flavour; AOTriton takes vanilla only (a sink call runs on the flash kernel). */
NVTE_API NVTEStatus nvte_fused_attn_fwd_softmax(
    const NVTETensor Q, const NVTETensor K, const NVTETensor V, const NVTETensor Bias,
    const NVTETensor SoftmaxOffset, NVTETensor O, NVTETensor softmax_lse,
    const NVTETensor cu_seqlens_q, const NVTETensor cu_seqlens_kv, const NVTETensor rng_state,
    size_t max_seqlen_q, size_t max_seqlen_kv, bool is_training, float attn_scale, float dropout,
    NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type, NVTE_Mask_Type attn_mask_type,
    NVTE_Softmax_Type softmax_type, int64_t window_size_left, int64_t window_size_right,
    NVTETensor workspace, NVTEStream stream);
NVTE_API NVTEStatus nvte_fused_attn_bwd_softmax(
    const NVTETensor Q, const NVTETensor K, const NVTETensor V, const NVTETensor O,
    const NVTETensor dO, const NVTETensor softmax_lse, const NVTETensor Bias,
    const NVTETensor SoftmaxOffset, NVTETensor dQ, NVTETensor dK, NVTETensor dV, NVTETensor dBias,
    NVTETensor dSoftmaxOffset, const NVTETensor cu_seqlens_q, const NVTETensor cu_seqlens_kv,
    const NVTETensor rng_state, size_t max_seqlen_q, size_t max_seqlen_kv, float attn_scale,
    float dropout, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
    NVTE_Mask_Type attn_mask_type, NVTE_Softmax_Type softmax_type, int64_t window_size_left,
    int64_t window_size_right, bool deterministic, NVTETensor workspace, NVTEStream stream);

/*! Packed forms. QKV: [b, s, 3, h, d] (bs3hd), [b, s, h, 3, d] (bsh3d), [s, b, 3, h, d], [s, b, h, 3,
 *  d], [t, 3, h, d], [t, h, 3, d]; qkv_layout must be of the 3hd / h3d group. dQKV has QKV's shape
 *  and layout. */
NVTE_API NVTEStatus nvte_fused_attn_fwd_qkvpacked(
    const NVTETensor QKV, const NVTETensor Bias, NVTETensor O, NVTETensor softmax_lse,
    const NVTETensor cu_seqlens, const NVTETensor rng_state, size_t max_seqlen, bool is_training,
    float attn_scale, float dropout, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
    NVTE_Mask_Type attn_mask_type, int64_t window_size_left, int64_t window_size_right,
    NVTETensor workspace, NVTEStream stream);
NVTE_API NVTEStatus nvte_fused_attn_bwd_qkvpacked(
    const NVTETensor QKV, const NVTETensor O, const NVTETensor dO, const NVTETensor softmax_lse,
    const NVTETensor Bias, NVTETensor dQKV, NVTETensor dBias, const NVTETensor cu_seqlens,
    const NVTETensor rng_state, size_t max_seqlen, float attn_scale, float dropout,
    NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type, NVTE_Mask_Type attn_mask_type,
    int64_t window_size_left, int64_t window_size_right, bool deterministic, NVTETensor workspace,
    NVTEStream stream);

/*! KV packed: Q dense ([b, s_q, h, d] etc.), KV [b, s_kv, 2, h_kv, d] (hd_2hd group) or
 *  [b, s_kv, h_kv, 2, d] (hd_h2d group) and the sbhd/thd counterparts; d_qk == d_v. dKV has KV's
 *  shape and layout. */
NVTE_API NVTEStatus nvte_fused_attn_fwd_kvpacked(
    const NVTETensor Q, const NVTETensor KV, const NVTETensor Bias, NVTETensor O,
    NVTETensor softmax_lse, const NVTETensor cu_seqlens_q, const NVTETensor cu_seqlens_kv,
    const NVTETensor rng_state, size_t max_seqlen_q, size_t max_seqlen_kv, bool is_training,
    float attn_scale, float dropout, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
    NVTE_Mask_Type attn_mask_type, int64_t window_size_left, int64_t window_size_right,
    NVTETensor workspace, NVTEStream stream);
NVTE_API NVTEStatus nvte_fused_attn_bwd_kvpacked(
    const NVTETensor Q, const NVTETensor KV, const NVTETensor O, const NVTETensor dO,
    const NVTETensor softmax_lse, const NVTETensor Bias, NVTETensor dQ, NVTETensor dKV,
    NVTETensor dBias, const NVTETensor cu_seqlens_q, const NVTETensor cu_seqlens_kv,
    const NVTETensor rng_state, size_t max_seqlen_q, size_t max_seqlen_kv, float attn_scale,
    float dropout, NVTE_QKV_Layout qkv_layout, NVTE_Bias_Type bias_type,
    NVTE_Mask_Type attn_mask_type, int64_t window_size_left, int64_t window_size_right,
    bool deterministic, NVTETensor workspace, NVTEStream stream);

/*! The dropout keep mask the flash kernel applies, materialised for tests and for the unfused path
 *  (so both paths drop the same logits): mask uint8 [b, h, max_seqlen_q, max_seqlen_kv], 1 = kept. */
NVTE_API NVTEStatus nvte_fused_attn_dropout_mask(const NVTETensor rng_state, float dropout,
                                                 NVTETensor mask, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_LITE_FUSED_ATTN_H_ */
