/* Fused rotary position embedding (RoPE), forward and backward (TE's fused_rope.h, C ABI).
 *
 * input / output: [s, b, h, d] (NVTE_SBHD), [b, s, h, d] (NVTE_BSHD) or [t, h, d] (NVTE_THD),
 * dense, one shape and one dtype (fp32, fp16 or bf16). freqs: fp32 [s_max, 1, 1, d2], d2 even,
 * 2 <= d2 <= d. cu_seqlens: int32 [b + 1] token offsets of the thd sequences (cu[0] = 0,
 * non-decreasing; with context parallelism the offsets of the whole sequences, this rank's tokens
 * of sequence i being cu[i] / cp_size .. cu[i + 1] / cp_size - 1, and cu[b] / cp_size <= t); thd
 * tokens at or past cu[b] / cp_size are copied unchanged. It must be NULL (or a handle without
 * data) for sbhd / bshd. start_positions: NULL (or a handle without data) or int32 [b], one
 * offset per batch entry (sbhd / bshd) or per thd sequence (KV-cache decoding).
 *
 * The token at local index p of a sequence of local length L (L = s for sbhd / bshd) uses the row
 *   r = p + start_positions[seq] + (cp_size == 1 ? 0 :
 *       p < L/2 ? cp_rank * L/2 : cp_size * L - (cp_rank + 1) * L/2 - L/2)
 * of freqs (TE's dual-chunk context parallelism: the rank holds chunks cp_rank and
 * 2 cp_size - 1 - cp_rank of the full sequence of cp_size * L tokens; L must be even when
 * cp_size > 1). Every sequence must satisfy start_positions[seq] >= 0 and
 * start_positions[seq] + cp_size * L <= s_max.
 *
 * Per token, with f = freqs[r] and for each pair (a, b) of rotated features, (j, j + d2/2) for
 * j < d2/2 when not interleaved, (2i, 2i + 1) when interleaved (TE's rotate_half):
 *   forward   out[a] = x[a] cos f[a] - x[b] sin f[a]      out[b] = x[b] cos f[b] + x[a] sin f[b]
 *   backward  dx[a] = dy[a] cos f[a] + dy[b] sin f[b]     dx[b] = dy[b] cos f[b] - dy[a] sin f[a]
 * (the backward is the exact transpose of the forward, for any freqs). Features d2 .. d - 1 are
 * copied. Math in fp32 with cos/sin of the fp32 angles (on the GPU sincosf, which may differ from
 * the CPU's by an ulp). output may be the very buffer of input (in place) but must not partly
 * overlap it. On the CPU, cu_seqlens and start_positions values are checked (an error names the
 * offending entry); on the GPU they are not read on the host (that would synchronize the stream):
 * there a token whose row r falls outside freqs gets NaN in its rotated features, and malformed
 * offsets give unspecified (but in-bounds) results. The GPU kernel takes d2 <= 4096
 * (NVTE_ERROR_UNSUPPORTED beyond: a position's cos/sin live in shared memory).
 *
 * Differences from TE: calls return NVTEStatus; the dims and strides (TE's s, b, h, d, d2,
 * stride_*) are taken from the tensors, which are dense. The argument order is TE's, with the
 * backward's start_positions where TE's main branch has it (TE 2.8's backward has none).
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
                                            const NVTETensor freqs,
                                            const NVTETensor start_positions, NVTETensor output,
                                            NVTE_QKV_Format qkv_format, bool interleaved,
                                            int cp_size, int cp_rank, NVTEStream stream);

/*! input_grads = rope^T(output_grads), with the forward's start_positions and context split. */
NVTE_API NVTEStatus nvte_fused_rope_backward(const NVTETensor output_grads,
                                             const NVTETensor cu_seqlens, const NVTETensor freqs,
                                             const NVTETensor start_positions,
                                             NVTETensor input_grads, NVTE_QKV_Format qkv_format,
                                             bool interleaved, int cp_size, int cp_rank,
                                             NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif /* TRANSFORMER_ENGINE_LITE_FUSED_ROPE_H_ */
