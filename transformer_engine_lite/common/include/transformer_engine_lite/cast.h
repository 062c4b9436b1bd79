/* Casts between high precision and FP8: quantize (per-tensor and MXFP8), dequantize, amax, scales. */
#ifndef TRANSFORMER_ENGINE_LITE_CAST_H_
#define TRANSFORMER_ENGINE_LITE_CAST_H_

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! Quantizes `input` (fp32/fp16/bf16) into `output` (an FP8 dtype; nothing is written on error).
 *
 *  Per-tensor scaling (output scaling mode NVTE_DELAYED_TENSOR_SCALING): output FP8 row-wise data of
 *  input's shape, q = encode(x * scale) with `scale` read from output's kNVTEScale; if output has
 *  kNVTEAmax it receives max|x| (before scaling); if it has kNVTERowwiseScaleInv it receives 1/scale.
 *  If output has column-wise data ([cols, rows] of a 2-D view), it receives the transposed FP8 copy.
 *
 *  MXFP8 (NVTE_MXFP8_1D_SCALING): row-wise data with E8M0 scale_inv [rows, ceil(cols/32)] and/or
 *  column-wise data (same shape as input) with E8M0 scale_inv [ceil(rows/32), cols]; each scale is
 *  2^ceil(log2(block_amax / fp8_max)), computed exactly and clamped to [2^-127, 2^127] (a NaN block
 *  gets the NaN scale 0xFF and NaN codes, an Inf block 2^127). The 2-D view flattens all leading
 *  dims into rows. x * scale is formed in fp32, then encoded (nearest even, satfinite).
 */
NVTE_API NVTEStatus nvte_quantize(const NVTETensor input, NVTETensor output, NVTEStream stream);

/*! nvte_quantize with options (TE's nvte_quantize_v2). `config` may be NULL (defaults). Block
 *  scaling (NVTE_BLOCK_SCALING_1D / _2D, TE's Float8BlockScaling, GEMM_READY layouts) reads its
 *  kNVTEQuantizationConfigAmaxEpsilon and kNVTEQuantizationConfigForcePow2Scales; other modes ignore
 *  `config` (their scales come from the output tensor).
 *
 *  Block scaling of a [rows, cols] view (leading dims flattened): row-wise data of input's shape
 *  and/or column-wise data holding the transpose, shape [last dim, leading dims...]. 1D: each
 *  1x128 tile along the row gets one fp32 scale_inv; row-wise scale_inv has shape
 *  [ceil(cols/128), roundup(rows, 4)] (entry [tile][row]), column-wise (tiles of 128 rows of the
 *  input, per column) [ceil(rows/128), roundup(cols, 4)]. 2D: one scale per 128x128 block; row-wise
 *  [ceil(rows/128), roundup(ceil(cols/128), 4)], column-wise [ceil(cols/128),
 *  roundup(ceil(rows/128), 4)] (the transposed grid). Padding entries are written as 0.
 *  Scale of a tile: amax = max(tile amax, eps); amax 0 / Inf / NaN -> 1; else fp8_max / amax in
 *  fp32 (an Inf quotient becomes the input dtype's largest finite value), optionally rounded down
 *  to a power of two; scale_inv = 1 / scale; q = encode(x * scale) (fp32 product, nearest even,
 *  satfinite). E4M3 and E5M2 outputs.
 *
 *  NVFP4 (NVTE_NVFP4_1D_SCALING, TE's NVFP4BlockScaling; nvte_quantize = defaults): data is
 *  kNVTEByte of the logical shape with the last dim halved, two E2M1 codes per byte (element 2j in
 *  the low nibble); column-wise data the transpose [last dim, leading dims...] packed the same way.
 *  scale_inv (kNVTEFloat8E4M3 or kNVTEByte) [roundup(rows,128), roundup(ceil(cols/16),4)], the
 *  column-wise grid with rows and cols swapped, padding 0; kNVTEAmax / kNVTEColumnwiseAmax (fp32
 *  [1]) receive each copy's amax (NaN propagates). With S = min(2688 / amax, FLT_MAX) (0 -> 1):
 *  block scale e4m3(min(block_amax * (S * fp32(1/6)), 448)), q = E2M1(clamp(x / (scale / S),
 *  +-6)), nearest even or, with kNVTEQuantizationConfigStochasticRounding, stochastic from the
 *  kNVTEQuantizationConfigRNGState stream (README "NVFP4"). kNVTEQuantizationConfigNVFP42DQuantization:
 *  16x16 blocks; kNVTEQuantizationConfigNVFP4RHT: the column-wise copy is made from the 16-point
 *  random Hadamard transform of each column (groups of 16 rows; signs from
 *  kNVTEQuantizationConfigNVFP4RHTSignMask), rounded to the input dtype, with its own amax. kNVTEQuantizationConfigNVFP4AmaxGiven: the
 *  amaxes are inputs, read from kNVTEAmax / kNVTEColumnwiseAmax (a reduced amax) and kept. */
NVTE_API NVTEStatus nvte_quantize_v2(const NVTETensor input, NVTETensor output,
                                     const NVTEQuantizationConfig config, NVTEStream stream);

/*! Dequantizes FP8 `input` (per-tensor: x = decode(q) * scale_inv; MXFP8 row-wise) into `output`
 *  (fp32/fp16/bf16) of the same shape.
 *
 *  The product is taken in fp32 and rounded once to the output dtype. MXFP8: x = decode(q) *
 *  2^(e - 127) per block; an MXFP8 input with only column-wise data is dequantized from that copy;
 *  a NaN scale (0xFF) gives NaN. Block scaling: x = decode(q) * scale_inv of its tile, from the
 *  row-wise copy when present (output of input's shape), else from the column-wise copy (output of
 *  the column-wise data's transposed shape [last dim, leading dims...]). */
NVTE_API NVTEStatus nvte_dequantize(const NVTETensor input, NVTETensor output, NVTEStream stream);

/*! Writes max|input| into output's kNVTEAmax (fp32 scalar) for an fp32/fp16/bf16 input.
 *  NaN inputs propagate: any NaN element makes amax NaN (which nvte_compute_scale_from_amax then
 *  turns into scale 1). -0 counts as 0; an empty input gives 0. */
NVTE_API NVTEStatus nvte_compute_amax(const NVTETensor input, NVTETensor output, NVTEStream stream);

/*! Current scaling: from output's kNVTEAmax computes output's kNVTEScale (and kNVTERowwiseScaleInv
 *  when present) for output's FP8 dtype: amax = max(amax, eps); amax 0 / Inf / NaN -> scale 1;
 *  scale = fp8_max / amax, Inf -> FLT_MAX; optional power-of-two rounding (down). `config` may be NULL
 *  (eps 0, no power-of-two).
 *
 *  Details: a NaN amax stays NaN through the eps clamp (scale 1); a negative amax counts as below
 *  eps; the division is IEEE fp32 (correctly rounded); scale_inv = 1 / scale in fp32; amax itself is
 *  not rewritten. The output must use per-tensor scaling. */
NVTE_API NVTEStatus nvte_compute_scale_from_amax(NVTETensor output,
                                                 const NVTEQuantizationConfig config,
                                                 NVTEStream stream);

#ifdef __cplusplus
}
#endif

#endif
