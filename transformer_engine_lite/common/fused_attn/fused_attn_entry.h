// Internals shared by the fused-attention entry points (fused_attn.cpp: separate Q, K, V;
// fused_attn_packed.cpp: packed QKV / KV and the dropout mask): the arguments of a call, validated
// and run by run_fwd / run_bwd.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../util/tensor.h"
#include "attn_params.h"
#include "transformer_engine_lite/fused_attn.h"

namespace nvte {

struct CallArgs {
  const Tensor *q, *k, *v, *bias, *cu_q, *cu_kv, *rng;
  size_t max_q, max_kv;
  float scale, dropout;
  NVTE_QKV_Layout layout;
  NVTE_Bias_Type bias_type;
  NVTE_Mask_Type mask;
  int64_t left, right;
  // Packed entry points: the whole QKV / KV tensor that q/k/v (or k/v) are strided views of. A
  // view's own extent covers only a dense-sized part of the packed buffer, so overlap checks of
  // the outputs are made against this whole tensor too.
  const Tensor *packed = nullptr;
  const char *packed_name = nullptr;
  // nvte_fused_attn_*_softmax: the softmax flavour and its offset (fp32, h elements).
  NVTE_Softmax_Type softmax_type = NVTE_VANILLA_SOFTMAX;
  const Tensor *softmax_offset = nullptr;
};

struct BwdTensors {
  const Tensor *o, *d_o, *lse;
  Tensor *dq, *dk, *dv, *dbias;
  bool packed_grads;  // dQ/dK/dV are views of one packed buffer (the *_packed entry points)
  const Tensor *packed_grad = nullptr;  // that whole dQKV / dKV buffer (see CallArgs::packed)
  const char *packed_grad_name = nullptr;
  Tensor *d_softmax_offset = nullptr;  // learnable softmax: d offset (fp32, h elements), may be null
};

// Validates everything, then runs the flash kernel on the tensors' device.
// fused_attn_params.cpp: every argument check of a call, then its kernel parameters; the device
// the tensors live on and the config the backend selection sees. Throws before anything is written.
AttnParams make_params(const CallArgs &c, NVTEDevice *device_out, NVTEFusedAttnConfig *cfg_out);
// A tensor whose dims leave room for the kernels' 64-bit element offsets (fused_attn_params.cpp).
void check_offsets_fit(const SimpleTensor &t, const char *arg);

void run_fwd(const CallArgs &c, const Tensor *o, Tensor *lse, bool is_training,
             NVTETensor workspace, NVTEStream stream);
void run_bwd(const CallArgs &c, const BwdTensors &t, bool deterministic, NVTETensor workspace,
             NVTEStream stream);

// Validates the softmax flavour and its offset (fused_attn_sinks.cpp) and sets p's sink fields;
// d_offset (backward) may be null. Both the CPU and the GPU flash kernels take sinks.
void set_softmax(const CallArgs &c, const Tensor *d_offset, NVTEDevice device, AttnParams *p);
// CPU: d softmax_offset of a learnable softmax from O, dO and the LSE (fp64 accumulation).
void softmax_offset_grad_cpu(const AttnParams &p);

// {seed, offset} of an int64 [2] rng_state: read on the host when it is in host memory; a
// GPU-tagged one stays in device memory (p->rng_state) and the GPU kernels read it there.
inline void read_rng_state(const Tensor &rng, AttnParams *p) {
  const int64_t *r = rng.data.ptr<const int64_t>();
  if (rng.device == kNVTEDeviceGPU) {
    p->rng_state = r;
    return;
  }
  p->seed = static_cast<uint64_t>(r[0]);
  p->offset = static_cast<uint64_t>(r[1]);
}

// Slice `which` (0 = Q or K, 1 = K or V, 2 = V) of a packed QKV ([.., 3, h, d] / [.., h, 3, d]) or KV
// ([.., 2, h, d] / [.., h, 2, d]) tensor, as a view with that dim removed.
Tensor packed_view(const Tensor &packed, const char *arg, NVTE_QKV_Layout_Group grp, int which,
                   bool thd);

}  // namespace nvte
