// Multi-tensor ops: the validated batch the launchers take and the per-element math, shared by the
// CPU kernels and the GPU kernels so both round alike (plain fp32 operations, no libm beyond sqrtf,
// which is correctly rounded on both; CPU -ffp-contract=off, GPU --fmad=false).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../platform/host_device.h"
#include "../util/fp8.h"
#include "../util/half.h"
#include "../util/tensor.h"

namespace nvte {

// TE's largest list count (adam_fp8: g, p, m, v, master, scale, amax, scale_inv).
constexpr int kMaxTensorLists = 8;

// Tensor j of every list: its element count and one buffer per list.
struct TensorSet {
  size_t numel = 0;
  void *ptr[kMaxTensorLists] = {};
};

// A validated call: the tensors, their lists' dtypes (one per list) and the noop flag.
struct MultiTensorBatch {
  std::vector<TensorSet> tensors;
  int num_lists = 0;
  DType dtype[kMaxTensorLists] = {};
  int *noop = nullptr;  // int32 [1] on the tensors' device
};

// Adam variants by their lists: g, p, m, v (+ master fp32 | + int16 remainders | + master and FP8
// meta).
enum class AdamKind { kPlain = 0, kMaster = 1, kRemainder = 2, kFp8 = 3 };

struct AdamParams {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int mode = 1;              // 0: L2 (Adam), 1: decoupled weight decay (AdamW)
  int bias_correction = 1;   // 1: divide by 1 - beta^step
  int step = 1;              // >= 1 (host value; capturable: step_ptr)
  AdamKind kind = AdamKind::kPlain;
  DType fp8_dtype = kNVTEFloat8E4M3;  // kFp8: the params' format
  // Capturable: read on the device at launch (null otherwise); the launch is skipped when
  // *noop == 1 and grads are multiplied by *inv_scale.
  const float *lr_ptr = nullptr;
  const int *step_ptr = nullptr;
  const float *inv_scale_ptr = nullptr;
};

// The scalars of one Adam launch after lr / step are known.
struct AdamScalars {
  float lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale;
  int mode;
};

// 1 - beta^step in double rounded to fp32 (TE's host computation), 1 without bias correction.
NVTE_HOST_DEVICE float adam_bias_correction(float beta, int step, int enabled) {
  if (!enabled) return 1.0f;
  double powered = 1.0;  // beta^step by squaring: exact enough in double, no libm pow
  double b = static_cast<double>(beta);
  for (int e = step; e > 0; e >>= 1) {
    if (e & 1) powered *= b;
    b *= b;
  }
  return static_cast<float>(1.0 - powered);
}

NVTE_HOST_DEVICE AdamScalars adam_scalars(const AdamParams &p) {
  const int step = p.step_ptr != nullptr ? *p.step_ptr : p.step;
  AdamScalars s;
  s.lr = p.lr_ptr != nullptr ? *p.lr_ptr : p.lr;
  s.beta1 = p.beta1;
  s.beta2 = p.beta2;
  s.eps = p.eps;
  s.weight_decay = p.weight_decay;
  s.bc1 = adam_bias_correction(p.beta1, step, p.bias_correction);
  s.bc2 = adam_bias_correction(p.beta2, step, p.bias_correction);
  s.grad_scale = p.inv_scale_ptr != nullptr ? *p.inv_scale_ptr : 1.0f;
  s.mode = p.mode;
  return s;
}

// One Adam update in TE's order (multi_tensor.h); every operation one fp32 rounding.
NVTE_HOST_DEVICE void adam_update(float &p, float &m, float &v, float g, const AdamScalars &s) {
  if (s.mode == 0) g = g + s.weight_decay * p;
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  const float m_hat = m / s.bc1;
  const float v_hat = v / s.bc2;
  const float denom = sqrtf(v_hat) + s.eps;
  float update = m_hat / denom;
  if (s.mode == 1) update = update + s.weight_decay * p;
  p = p - s.lr * update;
}

// fp32 master <-> bf16 param + int16 remainder (store_param_remainders): the param is the master
// rounded to nearest bf16 (ties away from zero in magnitude bits), the remainder the low 16 bits.
NVTE_HOST_DEVICE float master_from_remainder(uint16_t param_bits, int16_t remainder) {
  uint16_t hi = param_bits;
  if (remainder < 0) hi = static_cast<uint16_t>(hi - 1u);  // undo the round-up
  return bits_float((static_cast<uint32_t>(hi) << 16) | static_cast<uint16_t>(remainder));
}
NVTE_HOST_DEVICE void master_to_remainder(float master, uint16_t &param_bits, int16_t &remainder) {
  const uint32_t bits = float_bits(master);
  remainder = static_cast<int16_t>(static_cast<uint16_t>(bits & 0xFFFFu));
  param_bits = static_cast<uint16_t>(bits >> 16);
  if (remainder < 0) param_bits = static_cast<uint16_t>(param_bits + 1u);  // round up
}

// Adam on element i of tensor set t: G grads, P params (FP8 for kFp8, bf16 for kRemainder).
// Returns |new master| for the FP8 amax (0 otherwise).
template <typename G, typename P>
NVTE_HOST_DEVICE float adam_element(const TensorSet &t, size_t i, AdamKind kind,
                                    const AdamScalars &s, float fp8_scale) {
  const float g = to_float(static_cast<const G *>(t.ptr[0])[i]) * s.grad_scale;
  float *m = static_cast<float *>(t.ptr[2]) + i;
  float *v = static_cast<float *>(t.ptr[3]) + i;
  float mv = *m, vv = *v, p;
  if (kind == AdamKind::kRemainder) {
    uint16_t *pb = static_cast<uint16_t *>(t.ptr[1]) + i;
    int16_t *rem = static_cast<int16_t *>(t.ptr[4]) + i;
    p = master_from_remainder(*pb, *rem);
    adam_update(p, mv, vv, g, s);
    master_to_remainder(p, *pb, *rem);
  } else if (kind == AdamKind::kPlain) {
    P *pp = static_cast<P *>(t.ptr[1]) + i;
    p = to_float(*pp);
    adam_update(p, mv, vv, g, s);
    *pp = from_float<P>(p);
  } else {
    float *master = static_cast<float *>(t.ptr[4]) + i;
    p = *master;
    adam_update(p, mv, vv, g, s);
    *master = p;
    static_cast<P *>(t.ptr[1])[i] = from_float<P>(kind == AdamKind::kFp8 ? p * fp8_scale : p);
  }
  *m = mv;
  *v = vv;
  return kind == AdamKind::kFp8 ? fabsf(p) : 0.0f;
}

struct SgdParams {
  float wd = 0.0f, momentum = 0.0f, dampening = 0.0f, lr = 0.0f, scale = 1.0f;
  bool nesterov = false, first_run = false, wd_after_momentum = false;
};

// SGD on element i (multi_tensor.h): G grads, W weights and momentum, O model weights out (list 3).
template <typename G, typename W, typename O>
NVTE_HOST_DEVICE void sgd_element(const TensorSet &t, size_t i, const SgdParams &s, bool has_out) {
  float g = to_float(static_cast<const G *>(t.ptr[0])[i]) * s.scale;
  W *wp = static_cast<W *>(t.ptr[1]) + i;
  W *mp = static_cast<W *>(t.ptr[2]) + i;
  const float w = to_float(*wp);
  float mom = to_float(*mp);
  if (s.wd != 0.0f && !s.wd_after_momentum) g += s.wd * w;
  if (s.momentum != 0.0f) {
    mom = s.first_run ? g : s.momentum * mom + (1.0f - s.dampening) * g;
    g = s.nesterov ? g + s.momentum * mom : mom;
  }
  if (s.wd != 0.0f && s.wd_after_momentum) g += s.wd * w;
  // fp16 weights: the step -lr * g is rounded to fp16 before the add, as in TE's kernel (its
  // `weight += float` on a half weight converts the float to half first); with a power-of-two lr
  // that is torch.optim.SGD's step from its rounded fp16 momentum buffer. TE has no bf16 weights
  // here; ours take the one-rounding update (closer to fp32, within torch's bf16 error).
  float step = -s.lr * g;
  if constexpr (std::is_same_v<W, fp16>) step = to_float(from_float<fp16>(step));
  const W w_new = from_float<W>(w + step);
  *wp = w_new;
  if (has_out) static_cast<O *>(t.ptr[3])[i] = from_float<O>(to_float(w_new));
  if (s.momentum != 0.0f) *mp = from_float<W>(mom);
}

// x is finite (no Inf, no NaN), by its bits: the same on every device and compiler flag set.
NVTE_HOST_DEVICE bool finite_f32(float x) { return (float_bits(x) & 0x7FFFFFFFu) < 0x7F800000u; }

// The L2 norm's last step, one thread: each tensor's sum over its max_chunks partials in chunk
// order (unused slots hold 0), the total over tensors in order, square roots; noop = 1 when the
// total is not finite.
NVTE_HOST_DEVICE void l2norm_finalize(size_t num_tensors, size_t max_chunks,
                                      const float *partials, float *output,
                                      float *ret, float *ret_per_tensor, bool per_tensor,
                                      int *noop) {
  float total = 0.0f;
  for (size_t j = 0; j < num_tensors; ++j) {
    float sum = 0.0f;
    for (size_t c = 0; c < max_chunks; ++c) sum += partials[j * max_chunks + c];
    total += sum;
    if (per_tensor) ret_per_tensor[j] = sqrtf(sum);
  }
  output[0] = total;
  ret[0] = sqrtf(total);
  if (!finite_f32(total)) *noop = 1;
}

}  // namespace nvte
