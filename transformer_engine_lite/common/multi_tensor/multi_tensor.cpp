// C API of the multi-tensor ops (multi_tensor.h): argument checks, device routing, CPU/GPU launch.
#include "transformer_engine_lite/multi_tensor.h"

#include <cmath>
#include <string>
#include <vector>

#include "../util/api.h"
#include "multi_tensor_cpu.h"
#ifdef NVTE_WITH_GPU
#include "multi_tensor_gpu.h"
#endif

namespace nvte {
namespace {

const std::vector<DType> kHp = {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16};
const std::vector<DType> kF32 = {kNVTEFloat32};

// What list i of an op holds: its name in messages, its dtypes, and whether its tensors are fp32
// scalars (FP8 meta) rather than tensors of the set's element count.
struct ListRule {
  const char *name;
  std::vector<DType> dtypes;
  bool scalar = false;
};

void check_dtype_in(const SimpleTensor &t, const std::string &arg, const std::vector<DType> &ok) {
  std::string names;
  for (DType d : ok) {
    if (d == t.dtype) return;
    names += (names.empty() ? "" : ", ") + std::string(dtype_name(d));
  }
  NVTE_ERROR("argument '", arg, "': expected dtype in {", names, "}, got ", dtype_name(t.dtype));
}

std::string list_arg(size_t i, size_t j, const char *name) {
  return "tensor_lists[" + std::to_string(i) + "][" + std::to_string(j) + "] (" + name + ")";
}

// Checks the lists against `rules` (their count among `counts`), every tensor of a list of one
// dtype, element counts per set equal, one device; returns the batch and the device.
MultiTensorBatch collect(int chunk_size, NVTETensor noop_h, NVTETensor **lists, size_t num_lists,
                         size_t per_list, std::initializer_list<size_t> counts,
                         const std::vector<ListRule> &rules, NVTEDevice *device) {
  NVTE_CHECK(chunk_size > 0, "argument 'chunk_size': expected > 0, got ", chunk_size);
  bool count_ok = false;
  std::string expected;
  for (size_t c : counts) {
    count_ok = count_ok || c == num_lists;
    expected += (expected.empty() ? "" : " or ") + std::to_string(c);
  }
  NVTE_CHECK(count_ok, "argument 'num_tensor_lists': expected ", expected, ", got ", num_lists);
  const Tensor &noop = as_tensor(noop_h, "noop_flag");
  check_dtype(noop.data, "noop_flag", {kNVTEInt32});
  NVTE_CHECK(noop.data.numel() == 1, "argument 'noop_flag': expected one element, got ",
             noop.data.describe());
  check_has_data(noop, "noop_flag");
  NVTE_CHECK(per_list == 0 || lists != nullptr, "argument 'tensor_lists': expected ", num_lists,
             " lists, got NULL");
  MultiTensorBatch b;
  b.num_lists = static_cast<int>(num_lists);
  b.noop = noop.data.ptr<int>();
  b.tensors.resize(per_list);
  *device = noop.device;
  for (size_t i = 0; i < num_lists; ++i) {
    NVTE_CHECK(per_list == 0 || lists[i] != nullptr, "argument 'tensor_lists[", i, "]' (",
               rules[i].name, "): expected ", per_list, " tensors, got NULL");
    for (size_t j = 0; j < per_list; ++j) {
      const std::string arg = list_arg(i, j, rules[i].name);
      const Tensor &t = as_tensor(lists[i][j], arg.c_str());
      if (j == 0) {
        check_dtype_in(t.data, arg, rules[i].dtypes);
        b.dtype[i] = t.data.dtype;
      } else {
        check_dtype_in(t.data, arg, {b.dtype[i]});
      }
      NVTE_CHECK(t.device == *device, "argument '", arg, "': expected device ",
                 *device == kNVTEDeviceCPU ? "cpu" : "gpu", " (that of 'noop_flag'), got ",
                 t.device == kNVTEDeviceCPU ? "cpu" : "gpu");
      const size_t n = t.data.numel();
      if (rules[i].scalar) {
        NVTE_CHECK(n == 1, "argument '", arg, "': expected one element, got ", t.data.describe());
      } else if (i == 0) {
        b.tensors[j].numel = n;
      } else {
        NVTE_CHECK(n == b.tensors[j].numel, "argument '", arg, "': expected ", b.tensors[j].numel,
                   " elements (those of tensor_lists[0][", j, "]), got ", t.data.describe());
      }
      if (n > 0) check_has_data(t, arg.c_str());
      b.tensors[j].ptr[i] = t.data.dptr;
    }
  }
  return b;
}

// An fp32 tensor with at least `n` elements and data (outputs, scratch).
float *fp32_buffer(const Tensor &t, const char *arg, size_t n, NVTEDevice device) {
  check_dtype_in(t.data, arg, kF32);
  NVTE_CHECK(t.data.numel() >= n, "argument '", arg, "': expected at least ", n,
             " elements, got ", t.data.describe());
  NVTE_CHECK(t.device == device, "argument '", arg, "': expected the device of 'noop_flag'");
  if (n > 0) check_has_data(t, arg);
  return t.data.ptr<float>();
}

void l2norm(const char *op, int chunk_size, NVTETensor noop_h, NVTETensor **lists, size_t nl,
            size_t per_list, NVTETensor out_h, NVTETensor out_per_h, NVTETensor ret_h,
            NVTETensor ret_per_h, NVTETensor inv_scale_h, int per_tensor, int max_chunks,
            NVTEStream stream) {
  NVTEDevice device;
  const MultiTensorBatch b = collect(chunk_size, noop_h, lists, nl, per_list, {1},
                                     {{"tensors", kHp}}, &device);
  NVTE_CHECK(max_chunks >= 0, "argument 'max_chunks_per_tensor': expected >= 0, got ",
             max_chunks);
  const size_t chunk = static_cast<size_t>(chunk_size), mc = static_cast<size_t>(max_chunks);
  for (size_t j = 0; j < per_list; ++j) {
    const size_t need = (b.tensors[j].numel + chunk - 1) / chunk;
    NVTE_CHECK(need <= mc, "argument 'max_chunks_per_tensor': expected >= ", need,
               " (tensor_lists[0][", j, "] has ", b.tensors[j].numel, " elements in chunks of ",
               chunk, "), got ", max_chunks);
  }
  float *output = fp32_buffer(as_tensor(out_h, "output"), "output", 1, device);
  float *partials = fp32_buffer(as_tensor(out_per_h, "output_per_tensor"), "output_per_tensor",
                                per_list * mc, device);
  float *ret = fp32_buffer(as_tensor(ret_h, "ret"), "ret", 1, device);
  float *ret_per = nullptr;
  if (per_tensor) {
    ret_per = fp32_buffer(as_tensor(ret_per_h, "ret_per_tensor"), "ret_per_tensor", per_list,
                          device);
  }
  const float *inv_scale = nullptr;
  if (inv_scale_h != nullptr) {
    const Tensor &s = as_tensor(inv_scale_h, "inv_scale");
    check_fp32_scalar(s.data, "inv_scale", "the unscale factor");
    inv_scale = fp32_buffer(s, "inv_scale", 1, device);
  }
  if (use_gpu(device, op)) {
#ifdef NVTE_WITH_GPU
    gpu::launch_multi_tensor_l2norm(b, chunk, mc, inv_scale, output, partials, ret, ret_per,
                                    per_tensor != 0, stream);
#endif
    return;
  }
  (void)stream;
  launch_multi_tensor_l2norm(b, chunk, mc, inv_scale, output, partials, ret, ret_per,
                             per_tensor != 0);
}

void check_adam_scalars(float lr, float beta1, float beta2, float eps, int mode,
                        float weight_decay) {
  NVTE_CHECK(std::isfinite(lr), "argument 'lr': expected a finite value, got ", lr);
  NVTE_CHECK(beta1 >= 0.0f && beta1 < 1.0f, "argument 'beta1': expected in [0, 1), got ", beta1);
  NVTE_CHECK(beta2 >= 0.0f && beta2 < 1.0f, "argument 'beta2': expected in [0, 1), got ", beta2);
  NVTE_CHECK(std::isfinite(eps) && eps >= 0.0f, "argument 'epsilon': expected finite and >= 0, "
             "got ", eps);
  NVTE_CHECK(mode == 0 || mode == 1, "argument 'mode': expected 0 (L2) or 1 (AdamW), got ", mode);
  NVTE_CHECK(std::isfinite(weight_decay), "argument 'weight_decay': expected a finite value, got ",
             weight_decay);
}

std::vector<ListRule> adam_rules(AdamKind kind) {
  std::vector<ListRule> r = {{"grads", kHp}, {"params", kHp}, {"exp_avg", kF32},
                             {"exp_avg_sq", kF32}};
  if (kind == AdamKind::kRemainder) {
    r[1] = {"params", {kNVTEBFloat16}};
    r.push_back({"param_remainders", {kNVTEInt16}});
  } else if (kind == AdamKind::kFp8) {
    r[1] = {"params", {kNVTEByte, kNVTEFloat8E4M3, kNVTEFloat8E5M2, kNVTEFloat8E4M3FNUZ,
                       kNVTEFloat8E5M2FNUZ}};
    r.push_back({"master_params", kF32});
    r.push_back({"scales", kF32, true});
    r.push_back({"amaxes", kF32, true});
    r.push_back({"scale_invs", kF32, true});
  } else if (kind == AdamKind::kMaster) {
    r.push_back({"master_params", kF32});
  }
  return r;
}

void adam(const char *op, int chunk_size, NVTETensor noop_h, NVTETensor **lists, size_t nl,
          size_t per_list, AdamParams p, std::initializer_list<size_t> counts,
          NVTEStream stream) {
  if (p.kind == AdamKind::kPlain && nl == 5) p.kind = AdamKind::kMaster;
  NVTEDevice device;
  const MultiTensorBatch b = collect(chunk_size, noop_h, lists, nl, per_list, counts,
                                     adam_rules(p.kind), &device);
  check_adam_scalars(p.lr, p.beta1, p.beta2, p.eps, p.mode, p.weight_decay);
  NVTE_CHECK(p.lr_ptr != nullptr || p.step >= 1, "argument 'step': expected >= 1, got ", p.step);
  if (p.kind == AdamKind::kFp8) {
    NVTE_CHECK(is_fp8(p.fp8_dtype), "argument 'fp8_dtype': expected an FP8 dtype, got ",
               dtype_name(p.fp8_dtype));
    NVTE_CHECK(b.dtype[1] == kNVTEByte || b.dtype[1] == p.fp8_dtype, "argument 'tensor_lists[1]' "
               "(params): expected uint8 or ", dtype_name(p.fp8_dtype), " (fp8_dtype), got ",
               dtype_name(b.dtype[1]));
  }
  if (use_gpu(device, op)) {
#ifdef NVTE_WITH_GPU
    gpu::launch_multi_tensor_adam(b, p, stream);
#endif
    return;
  }
  (void)stream;
  launch_multi_tensor_adam(b, p);
}

// Capturable: lr (fp32 [1]), step (int32 [1]), inv_scale (fp32 [1]) on the device.
void adam_capturable(const char *op, int chunk_size, NVTETensor noop_h, NVTETensor **lists,
                     size_t nl, size_t per_list, NVTETensor lr_h, float beta1, float beta2,
                     float eps, NVTETensor step_h, int mode, int bias_correction, float wd,
                     NVTETensor inv_scale_h, size_t count, NVTEStream stream) {
  const Tensor &lr = as_tensor(lr_h, "lr");
  const Tensor &step = as_tensor(step_h, "step");
  const Tensor &inv_scale = as_tensor(inv_scale_h, "inv_scale");
  check_fp32_scalar(lr.data, "lr", "the learning rate");
  check_fp32_scalar(inv_scale.data, "inv_scale", "the gradient unscale factor");
  check_dtype(step.data, "step", {kNVTEInt32});
  NVTE_CHECK(step.data.numel() == 1, "argument 'step': expected one element, got ",
             step.data.describe());
  check_has_data(step, "step");
  const NVTEDevice device = check_same_device(
      {{&as_tensor(noop_h, "noop_flag"), "noop_flag"}, {&lr, "lr"}, {&step, "step"},
       {&inv_scale, "inv_scale"}});
  (void)device;
  AdamParams p;
  p.lr = 0.0f;
  p.beta1 = beta1;
  p.beta2 = beta2;
  p.eps = eps;
  p.mode = mode;
  p.bias_correction = bias_correction;
  p.weight_decay = wd;
  p.lr_ptr = lr.data.ptr<const float>();
  p.step_ptr = step.data.ptr<const int>();
  p.inv_scale_ptr = inv_scale.data.ptr<const float>();
  adam(op, chunk_size, noop_h, lists, nl, per_list, p, {count}, stream);
}

AdamParams adam_params(float lr, float beta1, float beta2, float eps, int step, int mode,
                       int bias_correction, float wd, AdamKind kind) {
  AdamParams p;
  p.lr = lr;
  p.beta1 = beta1;
  p.beta2 = beta2;
  p.eps = eps;
  p.step = step;
  p.mode = mode;
  p.bias_correction = bias_correction;
  p.weight_decay = wd;
  p.kind = kind;
  return p;
}

}  // namespace
}  // namespace nvte

using nvte::AdamKind;

NVTEStatus nvte_multi_tensor_l2norm_cuda(int chunk_size, NVTETensor noop_flag,
                                         NVTETensor **tensor_lists, const size_t num_tensor_lists,
                                         const size_t num_tensors_per_list, NVTETensor output,
                                         NVTETensor output_per_tensor, NVTETensor ret,
                                         NVTETensor ret_per_tensor, int per_tensor,
                                         int max_chunks_per_tensor, NVTEStream stream) {
  const char *op = "nvte_multi_tensor_l2norm_cuda";
  return nvte::guarded(op, [&] {
    nvte::l2norm(op, chunk_size, noop_flag, tensor_lists, num_tensor_lists, num_tensors_per_list,
                 output, output_per_tensor, ret, ret_per_tensor, nullptr, per_tensor,
                 max_chunks_per_tensor, stream);
  });
}

NVTEStatus nvte_multi_tensor_unscale_l2norm_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, NVTETensor output, NVTETensor output_per_tensor,
    NVTETensor ret, NVTETensor ret_per_tensor, NVTETensor inv_scale, int per_tensor,
    int max_chunks_per_tensor, NVTEStream stream) {
  const char *op = "nvte_multi_tensor_unscale_l2norm_cuda";
  return nvte::guarded(op, [&] {
    nvte::as_tensor(inv_scale, "inv_scale");
    nvte::l2norm(op, chunk_size, noop_flag, tensor_lists, num_tensor_lists, num_tensors_per_list,
                 output, output_per_tensor, ret, ret_per_tensor, inv_scale, per_tensor,
                 max_chunks_per_tensor, stream);
  });
}

NVTEStatus nvte_multi_tensor_adam_cuda(int chunk_size, NVTETensor noop_flag,
                                       NVTETensor **tensor_lists, const size_t num_tensor_lists,
                                       const size_t num_tensors_per_list, const float lr,
                                       const float beta1, const float beta2, const float epsilon,
                                       const int step, const int mode, const int bias_correction,
                                       const float weight_decay, NVTEStream stream) {
  const char *op = "nvte_multi_tensor_adam_cuda";
  return nvte::guarded(op, [&] {
    nvte::adam(op, chunk_size, noop_flag, tensor_lists, num_tensor_lists, num_tensors_per_list,
               nvte::adam_params(lr, beta1, beta2, epsilon, step, mode, bias_correction,
                                 weight_decay, AdamKind::kPlain),
               {4, 5}, stream);
  });
}

NVTEStatus nvte_multi_tensor_adam_param_remainder_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, const float lr, const float beta1, const float beta2,
    const float epsilon, const int step, const int mode, const int bias_correction,
    const float weight_decay, NVTEStream stream) {
  const char *op = "nvte_multi_tensor_adam_param_remainder_cuda";
  return nvte::guarded(op, [&] {
    nvte::adam(op, chunk_size, noop_flag, tensor_lists, num_tensor_lists, num_tensors_per_list,
               nvte::adam_params(lr, beta1, beta2, epsilon, step, mode, bias_correction,
                                 weight_decay, AdamKind::kRemainder),
               {5}, stream);
  });
}

NVTEStatus nvte_multi_tensor_adam_fp8_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, const float lr, const float beta1, const float beta2,
    const float epsilon, const int step, const int mode, const int bias_correction,
    const float weight_decay, const NVTEDType fp8_dtype, NVTEStream stream) {
  const char *op = "nvte_multi_tensor_adam_fp8_cuda";
  return nvte::guarded(op, [&] {
    nvte::AdamParams p = nvte::adam_params(lr, beta1, beta2, epsilon, step, mode,
                                           bias_correction, weight_decay, AdamKind::kFp8);
    p.fp8_dtype = fp8_dtype;
    nvte::adam(op, chunk_size, noop_flag, tensor_lists, num_tensor_lists, num_tensors_per_list, p,
               {8}, stream);
  });
}

NVTEStatus nvte_multi_tensor_adam_capturable_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, NVTETensor lr, const float beta1, const float beta2,
    const float epsilon, NVTETensor step, const int mode, const int bias_correction,
    const float weight_decay, NVTETensor inv_scale, NVTEStream stream) {
  const char *op = "nvte_multi_tensor_adam_capturable_cuda";
  return nvte::guarded(op, [&] {
    nvte::adam_capturable(op, chunk_size, noop_flag, tensor_lists, num_tensor_lists,
                          num_tensors_per_list, lr, beta1, beta2, epsilon, step, mode,
                          bias_correction, weight_decay, inv_scale, 4, stream);
  });
}

NVTEStatus nvte_multi_tensor_adam_capturable_master_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, NVTETensor lr, const float beta1, const float beta2,
    const float epsilon, NVTETensor step, const int mode, const int bias_correction,
    const float weight_decay, NVTETensor inv_scale, NVTEStream stream) {
  const char *op = "nvte_multi_tensor_adam_capturable_master_cuda";
  return nvte::guarded(op, [&] {
    nvte::adam_capturable(op, chunk_size, noop_flag, tensor_lists, num_tensor_lists,
                          num_tensors_per_list, lr, beta1, beta2, epsilon, step, mode,
                          bias_correction, weight_decay, inv_scale, 5, stream);
  });
}

NVTEStatus nvte_multi_tensor_sgd_cuda(int chunk_size, NVTETensor noop_flag,
                                      NVTETensor **tensor_lists, const size_t num_tensor_lists,
                                      const size_t num_tensors_per_list, float wd, float momentum,
                                      float dampening, float lr, int nesterov, int first_run,
                                      int wd_after_momentum, float scale, NVTEStream stream) {
  const char *op = "nvte_multi_tensor_sgd_cuda";
  return nvte::guarded(op, [&] {
    NVTEDevice device;
    const std::vector<nvte::ListRule> rules = {{"grads", nvte::kHp},
                                               {"weights", nvte::kHp},
                                               {"momentum_buffers", nvte::kHp},
                                               {"model_weights", {kNVTEFloat16, kNVTEBFloat16}}};
    const nvte::MultiTensorBatch b =
        nvte::collect(chunk_size, noop_flag, tensor_lists, num_tensor_lists, num_tensors_per_list,
                      {3, 4}, rules, &device);
    NVTE_CHECK(num_tensors_per_list == 0 || b.dtype[2] == b.dtype[1],
               "argument 'tensor_lists[2]' (momentum_buffers): expected the weights' dtype ",
               nvte::dtype_name(b.dtype[1]), ", got ", nvte::dtype_name(b.dtype[2]));
    for (const auto &[v, name] : {std::make_pair(wd, "wd"), std::make_pair(momentum, "momentum"),
                                  std::make_pair(dampening, "dampening"),
                                  std::make_pair(lr, "lr"), std::make_pair(scale, "scale")}) {
      NVTE_CHECK(std::isfinite(v), "argument '", name, "': expected a finite value, got ", v);
    }
    nvte::SgdParams p;
    p.wd = wd;
    p.momentum = momentum;
    p.dampening = dampening;
    p.lr = lr;
    p.scale = scale;
    p.nesterov = nesterov != 0;
    p.first_run = first_run != 0;
    p.wd_after_momentum = wd_after_momentum != 0;
    if (nvte::use_gpu(device, op)) {
#ifdef NVTE_WITH_GPU
      nvte::gpu::launch_multi_tensor_sgd(b, p, stream);
#endif
      return;
    }
    (void)stream;
    nvte::launch_multi_tensor_sgd(b, p);
  });
}

NVTEStatus nvte_multi_tensor_scale_cuda(int chunk_size, NVTETensor noop_flag,
                                        NVTETensor **tensor_lists, const size_t num_tensor_lists,
                                        const size_t num_tensors_per_list, float scale,
                                        NVTEStream stream) {
  const char *op = "nvte_multi_tensor_scale_cuda";
  return nvte::guarded(op, [&] {
    NVTEDevice device;
    const nvte::MultiTensorBatch b =
        nvte::collect(chunk_size, noop_flag, tensor_lists, num_tensor_lists, num_tensors_per_list,
                      {2}, {{"inputs", nvte::kHp}, {"outputs", nvte::kHp}}, &device);
    if (nvte::use_gpu(device, op)) {
#ifdef NVTE_WITH_GPU
      nvte::gpu::launch_multi_tensor_scale(b, scale, stream);
#endif
      return;
    }
    (void)stream;
    nvte::launch_multi_tensor_scale(b, scale);
  });
}

NVTEStatus nvte_multi_tensor_compute_scale_and_scale_inv_cuda(
    int chunk_size, NVTETensor noop_flag, NVTETensor **tensor_lists, const size_t num_tensor_lists,
    const size_t num_tensors_per_list, float max_fp8, int force_pow_2_scales, float epsilon,
    NVTEStream stream) {
  const char *op = "nvte_multi_tensor_compute_scale_and_scale_inv_cuda";
  return nvte::guarded(op, [&] {
    NVTEDevice device;
    const nvte::MultiTensorBatch b = nvte::collect(
        chunk_size, noop_flag, tensor_lists, num_tensor_lists, num_tensors_per_list, {3},
        {{"amaxes", nvte::kF32}, {"scales", nvte::kF32}, {"scale_invs", nvte::kF32}}, &device);
    NVTE_CHECK(std::isfinite(max_fp8) && max_fp8 > 0.0f,
               "argument 'max_fp8': expected finite and > 0, got ", max_fp8);
    NVTE_CHECK(epsilon >= 0.0f, "argument 'epsilon': expected >= 0, got ", epsilon);
    if (nvte::use_gpu(device, op)) {
#ifdef NVTE_WITH_GPU
      nvte::gpu::launch_multi_tensor_compute_scale(b, max_fp8, force_pow_2_scales != 0, epsilon,
                                                   stream);
#endif
      return;
    }
    (void)stream;
    nvte::launch_multi_tensor_compute_scale(b, max_fp8, force_pow_2_scales != 0, epsilon);
  });
}
