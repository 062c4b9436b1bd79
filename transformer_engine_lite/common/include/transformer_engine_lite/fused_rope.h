/* Fused rotary position embedding (RoPE), forward and backward (TE's fused_rope.h, C ABI).
 *
 * input / output: [s, b, h, d] (NVTE_SBHD), [b, s, h, d] (NVTE_BSHD) or [t, h, d] (NVTE_THD),
 * dense, one shape and one dtype (fp32, fp16 or bf16). freqs: fp32 [s_max, 1, 1, d2], d2 even,
 * 2 <= d2 <= d; the token at position p (the s index; in thd its index within its sequence) uses
 * freqs[p], so s_max must cover every position. cu_seqlens: int32 [b + 1] token offsets of the thd
 * sequences (cu[0] = 0, non-decreasing, cu[b] <= t); thd tokens at or past cu[b] are copied
 * unchanged. It must be NULL (or a handle without data) for sbhd / bshd.
 *
 * Per token, with f = freqs[p] and for each pair (a, b) of rotated features, (j, j + d2/2) for
 * j < d2/2 when not interleaved, (2i, 2i + 1) when interleaved (TE's rotate_half):
 *   forward   out[a] = x[a] cos f[a] - x[b] sin f[a]      out[b] = x[b] cos f[b] + x[a] sin f[b]
 *   backward  dx[a] = dy[a] cos f[a] + dy[b] sin f[b]     dx[b] = dy[b] cos f[b] - dy[a] sin f[a]
 * (the backward is the exact transpose of the forward, for any freqs). Features d2 .. d - 1 are
 * copied. Math in fp32 with cos/sin of the fp32 angles (on the GPU sincosf, which may differ from
 * the CPU's by an ulp). output may be the very buffer of input (in place) but must not partly
 * overlap it. On the CPU, cu_seqlens values are checked (an error names the offending entry); on
 * the GPU they are not read on the host (that would synchronize the stream): there a sequence
 * longer than s_max gets NaN in its rotated features past s_max, and malformed offsets give
 * unspecified (but in-bounds) results. The GPU kernel takes d2 <= 4096 (NVTE_ERROR_UNSUPPORTED
 * beyond: a position's cos/sin live in shared memory).
 *
 * Differences from TE: calls return NVTEStatus; no context-parallel arguments (TE's cp_size,
 * cp_rank), nor TE's start_positions / stride arguments (tensors are dense).
 */
#ifndef TRANSFORMER_ENGINE_LITE_FUSED_ROPE_H_
#define TRANSFORMER_ENGINE_LITE_FUSED_ROPE_H_

#include "fused_attn.h"
#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! output = rope(input). */
NVTE_API NVTEStatus nvte_fused_rope_forward(const NVTETensor input, const NVTETensor cu_seqlens,
                                            const NVTETensor freqs, NVTETensor output,
                                            NVTE_QKV_Format qkv_format, bool interleaved,
                                            NVTEStream stream);

/*! input_grads = rope^T(output_grads). */
NVTE_API NVTEStatus nvte_fused_rope_backward(const NVTETensor output_grads,
                                             const NVTETensor cu_seqlens, const NVTETensor freqs,
                                             NVTETensor input_grads, NVTE_QKV_Format qkv_format,
                                             bool interleaved, NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_LITE_FUSED_ROPE_H_ */
