/* Multi-tensor ops for fused optimizers: scale with overflow check, L2 norms, Adam (plain, FP32
 * master weights, BF16 + int16 remainders, FP8 parameters, capturable), SGD and the FP8 scale /
 * scale_inv from amax (TE's multi_tensor.h, C ABI; TE's names, which end in _cuda although every op
 * also runs on the CPU: tensors route by their device tag).
 *
 * tensor_lists[i][j] is tensor j of list i (num_tensor_lists lists of num_tensors_per_list dense
 * tensors); tensor j has the same number of elements in every list (shapes may differ).
 * noop_flag: int32, one element, on the tensors' device. chunk_size (> 0) only shapes the L2 norm's
 * partial sums. Math is fp32 whatever the storage dtype (fp32 / fp16 / bf16; FP8 through a scale).
 *
 * Adam, per element (TE's kernel order, each step one fp32 rounding; bc1 = 1 - beta1^step and
 * bc2 = 1 - beta2^step computed in double and rounded to fp32, or 1 without bias_correction):
 *   mode 0 (L2, torch.optim.Adam):   g = g + weight_decay * p
 *   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g * g
 *   update = (m / bc1) / (sqrtf(v / bc2) + epsilon)
 *   mode 1 (AdamW, torch.optim.AdamW): update = update + weight_decay * p
 *   p = p - lr * update
 * This is torch's formula; torch rounds in another order (p * (1 - lr * wd) first, lr / bc1 and
 * sqrt(v) / sqrt(bc2)), so results agree to a few ulps of p, not bit for bit.
 *
 * Differences from TE: calls return NVTEStatus; each tensor is one launch on the GPU (TE batches up
 * to 110 tensors per launch); the L2 norm's `output` holds the total sum of squares in [0] only.
 */
#ifndef TRANSFORMER_ENGINE_LITE_MULTI_TENSOR_H_
#define TRANSFORMER_ENGINE_LITE_MULTI_TENSOR_H_

#include <stddef.h>

#include "transformer_engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/*! Sum of squares of list 0 (fp32 / fp16 / bf16), in fp32 partial sums of chunk_size elements.
 *  output (fp32, >= 1 element): [0] = total sum of squares. output_per_tensor (fp32, >= num_tensors
 *  * max_chunks_per_tensor elements, max_chunks_per_tensor >= ceil(numel / chunk_size) of every
 *  tensor): scratch, the partial sum of chunk c of tensor j at [j * max_chunks_per_tensor + c].
 *  ret (fp32, >= 1): [0] = sqrt(total). ret_per_tensor (fp32, >= num_tensors when per_tensor):
 *  sqrt of each tensor's sum. noop_flag = 1 when the total is not finite. */
NVTE_API NVTEStatus nvte_multi_tensor_l2norm_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, NVTETensor output, NVTETensor output_per_tensor,
    NVTETensor ret, NVTETensor ret_per_tensor, int per_tensor, int max_chunks_per_tensor,
    NVTEStream stream);

/*! As nvte_multi_tensor_l2norm_cuda, of x * inv_scale[0] (inv_scale: fp32, one element). */
NVTE_API NVTEStatus nvte_multi_tensor_unscale_l2norm_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, NVTETensor output, NVTETensor output_per_tensor,
    NVTETensor ret, NVTETensor ret_per_tensor, NVTETensor inv_scale, int per_tensor,
    int max_chunks_per_tensor, NVTEStream stream);

/*! Adam (see above). Lists: grads (fp32/fp16/bf16, one dtype), params (fp32/fp16/bf16, one dtype),
 *  exp_avg, exp_avg_sq (fp32), and optionally master params (fp32): with 5 lists the master is
 *  updated and params = master rounded to their dtype. mode: 0 L2, 1 AdamW. noop_flag not read. */
NVTE_API NVTEStatus nvte_multi_tensor_adam_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, const float lr, const float beta1, const float beta2,
    const float epsilon, const int step, const int mode, const int bias_correction,
    const float weight_decay, NVTEStream stream);

/*! Adam with BF16 params (list 1) and int16 remainders (list 4): the fp32 master is the bf16 bits
 *  (rounded-to-nearest form, undone when the remainder is negative) above the remainder's 16 bits;
 *  the new master is split the same way (params = master rounded to nearest bf16). */
NVTE_API NVTEStatus nvte_multi_tensor_adam_param_remainder_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, const float lr, const float beta1, const float beta2,
    const float epsilon, const int step, const int mode, const int bias_correction,
    const float weight_decay, NVTEStream stream);

/*! Adam with FP8 params: 8 lists: grads, params (FP8 bytes of fp8_dtype, uint8 or that dtype),
 *  exp_avg, exp_avg_sq, master (fp32), scale, amax, scale_inv (fp32, one element each). The
 *  master is updated; params = fp8(master * scale) (nearest even, satfinite);
 *  amax = max(amax, |master|); scale_inv = 1 / scale. */
NVTE_API NVTEStatus nvte_multi_tensor_adam_fp8_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, const float lr, const float beta1, const float beta2,
    const float epsilon, const int step, const int mode, const int bias_correction,
    const float weight_decay, const NVTEDType fp8_dtype, NVTEStream stream);

/*! Adam reading lr (fp32, one element), step (int32, one element) and inv_scale (fp32, one
 *  element; grads are multiplied by it) from tensors on the device, and doing nothing when
 *  noop_flag[0] == 1 (CUDA-graph capturable). 4 lists, as nvte_multi_tensor_adam_cuda. */
NVTE_API NVTEStatus nvte_multi_tensor_adam_capturable_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, NVTETensor lr, const float beta1, const float beta2,
    const float epsilon, NVTETensor step, const int mode, const int bias_correction,
    const float weight_decay, NVTETensor inv_scale, NVTEStream stream);

/*! As nvte_multi_tensor_adam_capturable_cuda with 5 lists (fp32 master params). */
NVTE_API NVTEStatus nvte_multi_tensor_adam_capturable_master_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, NVTETensor lr, const float beta1, const float beta2,
    const float epsilon, NVTETensor step, const int mode, const int bias_correction,
    const float weight_decay, NVTETensor inv_scale, NVTEStream stream);

/*! SGD (torch.optim.SGD's formula; TE's order), skipped when noop_flag[0] != 0. Lists: grads
 *  (fp32/fp16/bf16), weights (fp32/fp16/bf16), momentum buffers (the weights' dtype), optionally
 *  model weights out (fp16/bf16, written with the new weights). Per element, in fp32:
 *    g = g * scale;  if (wd != 0 && !wd_after_momentum) g += wd * w
 *    if (momentum != 0) { mom = first_run ? g : momentum * mom + (1 - dampening) * g;
 *                         g = nesterov ? g + momentum * mom : mom }
 *    if (wd != 0 && wd_after_momentum) g += wd * w;   w = w + W(-lr * g)
 *  where W() rounds to fp16 for fp16 weights (TE's kernel) and is the identity otherwise. */
NVTE_API NVTEStatus nvte_multi_tensor_sgd_cuda(int chunk_size, NVTETensor noop_flag,
                                               NVTETensor **tensor_lists,
                                               const size_t num_tensor_lists,
                                               const size_t num_tensors_per_list, float wd,
                                               float momentum, float dampening, float lr,
                                               int nesterov, int first_run, int wd_after_momentum,
                                               float scale, NVTEStream stream);

/*! out = in * scale (list 0 in, list 1 out; fp32/fp16/bf16 each; in place when they are the same
 *  buffers). noop_flag = 1 when any input element is not finite (the outputs are still written). */
NVTE_API NVTEStatus nvte_multi_tensor_scale_cuda(int chunk_size, NVTETensor noop_flag,
                                                 NVTETensor **tensor_lists,
                                                 const size_t num_tensor_lists,
                                                 const size_t num_tensors_per_list, float scale,
                                                 NVTEStream stream);

/*! Lists amax, scale, scale_inv (fp32, elementwise): scale = the current-scaling scale of amax
 *  (nvte_compute_scale_from_amax's rule with fp8_max = max_fp8), scale_inv = 1 / scale. */
NVTE_API NVTEStatus nvte_multi_tensor_compute_scale_and_scale_inv_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, float max_fp8, int force_pow_2_scales, float epsilon,
    NVTEStream stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TRANSFORMER_ENGINE_LITE_MULTI_TENSOR_H_
