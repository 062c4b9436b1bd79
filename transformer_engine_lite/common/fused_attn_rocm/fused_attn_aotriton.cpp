// AOTriton backend: attention on the Triton kernels of common/aotriton/kernels, compiled ahead of
// time by build_tools/aotriton.py for every target arch and embedded in the library (the index).
// A call picks its image by (kernel, arch, dtype, head dim), packs the kernel's arguments by name in
// the order the index gives (the kernels' non-constexpr params, then Triton's two scratch pointers),
// and launches through the driver's module API. No Python at run time.
#include "fused_attn_aotriton.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "../util/env.h"
#include "../util/error.h"
#include "aotriton_arch.h"
#include "aotriton_driver.h"

namespace nvte {
namespace aotriton {
namespace {

using detail::concat;

const char *dtype_key(NVTEDType t) {
  return t == kNVTEBFloat16 ? "bf16" : t == kNVTEFloat16 ? "fp16" : "";
}

// The variant's dtype name, or the enum value for a dtype without variants (messages only; the
// glue uses no library entry point, so tests/cpp/aotriton can build it alone).
std::string dtype_label(NVTEDType t) {
  const char *k = dtype_key(t);
  return *k ? std::string(k) : concat("dtype #", static_cast<int>(t));
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

const AttnStrides *strides_of(const AttnParams &p, const std::string &t) {
  if (t == "q") return &p.sq_;
  if (t == "k") return &p.sk_;
  if (t == "v") return &p.sv_;
  if (t == "o") return &p.so_;
  if (t == "do") return &p.sdo_;
  if (t == "dq") return &p.sdq_;
  if (t == "dk") return &p.sdk_;
  if (t == "dv") return &p.sdv_;
  return nullptr;
}

// The value of a named parameter (the ABI vocabulary of kernels/variants.py); false if unknown.
bool value_of(const std::string &name, const AttnParams &p, float *delta, uint64_t *bits) {
  const auto ptr = [&](const void *x) { *bits = reinterpret_cast<uintptr_t>(x); return true; };
  const auto i64 = [&](int64_t x) { *bits = static_cast<uint64_t>(x); return true; };
  const auto f32 = [&](float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    *bits = u;
    return true;
  };
  if (name == "Q") return ptr(p.q);
  if (name == "K") return ptr(p.k);
  if (name == "V") return ptr(p.v);
  if (name == "Out") return ptr(p.o);
  if (name == "dO") return ptr(p.d_o);
  if (name == "LSE") return ptr(p.lse);
  if (name == "Delta") return ptr(delta);
  if (name == "dQ") return ptr(p.dq);
  if (name == "dK") return ptr(p.dk);
  if (name == "dV") return ptr(p.dv);
  if (name == "CuSeqlensQ") return ptr(p.cu_q);
  if (name == "CuSeqlensKV") return ptr(p.cu_kv);
  if (name == "RngState") return ptr(p.dropout > 0.0f ? p.rng_state : nullptr);
  if (name == "global_scratch" || name == "profile_scratch") return ptr(nullptr);
  if (name == "sm_scale") return f32(p.scale);
  if (name == "keep_scale") return f32(p.dropout > 0.0f ? 1.0f / (1.0f - p.dropout) : 1.0f);
  if (name == "dropout_threshold") return i64(p.dropout > 0.0f ? p.dropout_thresh : 0);
  if (name == "num_heads") return i64(p.h);
  if (name == "num_heads_kv") return i64(p.h_kv);
  if (name == "max_seqlen_q") return i64(p.s_q);
  if (name == "max_seqlen_kv") return i64(p.s_kv);
  if (name == "head_dim") return i64(p.d_qk);
  if (name == "varlen") return i64(p.cu_q != nullptr ? 1 : 0);
  if (name == "is_thd") return i64(p.format == NVTE_THD ? 1 : 0);
  // i32 in the kernels: a window longer than any sequence (here: > 2^31 - 1) masks nothing more.
  if (name == "window_left") return i64(std::min<int64_t>(p.win_left, INT32_MAX));
  if (name == "window_right") return i64(std::min<int64_t>(p.win_right, INT32_MAX));
  if (name == "bottom_right") return i64(p.bottom_right ? 1 : 0);
  if (name.rfind("stride_", 0) == 0) {  // stride_<tensor>_<b|h|s>
    const size_t us = name.rfind('_');
    const AttnStrides *st = strides_of(p, name.substr(7, us - 7));
    const std::string which = name.substr(us + 1);
    if (st == nullptr) return false;
    if (which == "b") return i64(st->batch);
    if (which == "h") return i64(st->head);
    if (which == "s") return i64(st->tok);
  }
  return false;
}

bool log_enabled() { return env_is_one("NVTE_LOG_AOTRITON_CONFIG"); }

void log_launch(const KernelImage &k, const unsigned grid[3]) {
  if (!log_enabled()) return;
  std::fprintf(stderr,
               "[aotriton] launch %s %s BLOCK_D=%d stride_align=%d on %s: entry %s grid (%u, %u, "
               "%u) block %d shared %u B image %zu B sha256 %.12s\n",
               k.kernel, k.dtype, k.block_d, k.stride_align, k.arch, k.entry, grid[0], grid[1], grid[2],
               k.num_warps * k.warp_size, k.shared, k.image_size, k.sha256);
}

const KernelImage &require(const char *kernel, const AttnParams &p, const std::string &arch) {
  const KernelImage *k = find_kernel(kernel, arch, p.dtype, p.d_qk, strides_aligned16(p));
  NVTE_CHECK_SUPPORTED(k != nullptr, "aotriton: no image of ", kernel, " for arch '", arch,
                       "', dtype ", dtype_label(p.dtype), ", head_dim ", p.d_qk, " in this build");
  return *k;
}

void launch_one(const KernelImage &k, const AttnParams &p, float *delta, int device,
                void *stream) {
  std::vector<Arg> args = pack_args(k, p, delta);
  std::vector<void *> params(args.size());
  for (size_t i = 0; i < args.size(); ++i) params[i] = &args[i].bits;  // little-endian: low bytes
  unsigned grid[3];
  grid_of(k, p, grid);
  log_launch(k, grid);
  launch(k, device, grid, stream, params.data());
}

}  // namespace

const KernelImage *find_kernel(const char *kernel, const std::string &arch, NVTEDType dtype,
                               int64_t head_dim, bool strides16) {
  const KernelImage *best = nullptr;
  for (size_t i = 0; i < kKernelCount; ++i) {
    const KernelImage &k = kKernels[i];
    if (std::strcmp(k.kernel, kernel) != 0 || arch != k.arch ||
        std::strcmp(k.dtype, dtype_key(dtype)) != 0 || k.block_d < head_dim ||
        (k.stride_align == 16 && !strides16))
      continue;
    // Smallest BLOCK_D first, then the aligned variant where the call allows it.
    if (best == nullptr || k.block_d < best->block_d ||
        (k.block_d == best->block_d && k.stride_align > best->stride_align))
      best = &k;
  }
  return best;
}

bool strides_aligned16(const AttnParams &p) {
  for (const AttnStrides *st : {&p.sq_, &p.sk_, &p.sv_, &p.so_, &p.sdo_, &p.sdq_, &p.sdk_, &p.sdv_})
    if (st->batch % 16 != 0 || st->head % 16 != 0 || st->tok % 16 != 0) return false;
  return true;
}

std::string unsupported_reason(const AttnParams &p, const std::string &device_arch) {
  const std::string arch = image_arch_for(device_arch, kArchs);
  if (arch.empty()) {
    return concat("no AOTriton images for GPU arch '", device_arch, "' in this build (built: ",
                  kArchs, ")");
  }
  if (p.d_qk != p.d_v) {
    return concat("the aotriton kernels need head_dim_qk == head_dim_v, got ", p.d_qk, " and ",
                  p.d_v);
  }
  for (const char *kernel : {"attn_fwd", "attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"}) {
    if (find_kernel(kernel, arch, p.dtype, p.d_qk) == nullptr) {
      return concat("no ", kernel, " image for ", arch, " ", dtype_label(p.dtype), " head_dim ",
                    p.d_qk);
    }
  }
  if (p.bias_type != NVTE_NO_BIAS) {
    return concat("the aotriton kernels take no bias, got bias type ", static_cast<int>(p.bias_type));
  }
  // attn_fwd stores LSE for every row it owns; an inference forward (is_training = false) has
  // none to give, and the kernel would write through a null pointer (an illegal address on an
  // H200, bench_gpu.py's attn_fwd_aotriton). The flash kernel, which skips it, runs such calls.
  if (p.lse == nullptr) {
    return "the aotriton kernels write softmax_lse, got none (an inference forward)";
  }
  if (p.dropout > 0.0f && p.rng_state == nullptr) {
    return "the aotriton kernels read rng_state on the device, got a host rng_state";
  }
  // The images assume 16-byte aligned pointers (vector loads), as PyTorch's and JAX's allocators
  // give; a packed layout's K or V view can start in between.
  const std::pair<const void *, const char *> ptrs[] = {
      {p.q, "Q"}, {p.k, "K"}, {p.v, "V"}, {p.o, "O"}, {p.lse, "softmax_lse"}, {p.d_o, "dO"},
      {p.dq, "dQ"}, {p.dk, "dK"}, {p.dv, "dV"}, {p.cu_q, "cu_seqlens_q"},
      {p.cu_kv, "cu_seqlens_kv"}, {p.rng_state, "rng_state"}};
  for (const auto &[ptr, name] : ptrs) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
      return concat("the aotriton kernels need 16-byte aligned tensors, got ", name, " at ", ptr);
    }
  }
  // Sizes are i32 kernel arguments (positions inside are 64-bit).
  if (p.b * p.h > 0x7FFFFFFF || p.s_q > 0x7FFFFFFF || p.s_kv > 0x7FFFFFFF) {
    return concat("the aotriton kernels take sizes below 2^31, got b*h ", p.b * p.h, ", s_q ", p.s_q,
                  ", s_kv ", p.s_kv);
  }
  return "";
}

std::vector<Arg> pack_args(const KernelImage &k, const AttnParams &p, float *delta) {
  std::vector<Arg> args;
  for (const std::string &param : split_list(k.params)) {
    const size_t colon = param.find(':');
    NVTE_CHECK(colon != std::string::npos, "aotriton: index entry of ", k.kernel,
               ": expected 'name:type' parameters, got '", param, "'");
    Arg a;
    a.name = param.substr(0, colon);
    const std::string type = param.substr(colon + 1);
    if (type[0] == '*' || type == "i64" || type == "u64" || type == "fp64") {
      a.size = 8;
    } else if (type == "i32" || type == "u32" || type == "fp32") {
      a.size = 4;
    } else {
      NVTE_ERROR("aotriton: parameter '", a.name, "' of ", k.kernel,
                 ": expected a pointer, i32, u32, i64 or fp32 type, got '", type, "'");
    }
    NVTE_CHECK(value_of(a.name, p, delta, &a.bits), "aotriton: parameter '", a.name, "' of ",
               k.kernel, " is not in the launcher's vocabulary (kernels/variants.py ABI_NAMES)");
    if (a.size == 4) a.bits &= 0xFFFFFFFFu;
    args.push_back(a);
  }
  return args;
}

void grid_of(const KernelImage &k, const AttnParams &p, unsigned grid[3]) {
  const std::vector<std::string> rule = split_list(k.grid);
  NVTE_CHECK(rule.size() == 2, "aotriton: grid rule of ", k.kernel, ": expected 2 terms, got '",
             k.grid, "'");
  const int64_t x = rule[0] == "q_blocks" ? cdiv(p.s_q, k.block_m) : cdiv(p.s_kv, k.block_n);
  const int64_t y = p.b * (rule[1] == "batch_heads" ? p.h : p.h_kv);
  NVTE_CHECK_SUPPORTED(x <= 0x7FFFFFFF && y <= 65535, "aotriton: grid (", x, ", ", y,
                       ") of ", k.kernel, " exceeds the launch limits (x < 2^31, y <= 65535)");
  grid[0] = static_cast<unsigned>(x);
  grid[1] = static_cast<unsigned>(y);
  grid[2] = 1;
}

size_t bwd_workspace_bytes(const AttnParams &p) {
  return static_cast<size_t>(p.b * p.h * p.s_q) * sizeof(float);
}

void run_fwd(const AttnParams &p, int device, const std::string &device_arch, void *stream) {
  const std::string arch = image_arch_for(device_arch, kArchs);
  launch_one(require("attn_fwd", p, arch), p, nullptr, device, stream);
}

void run_bwd(const AttnParams &p, int device, const std::string &device_arch, void *workspace,
             void *stream) {
  const std::string arch = image_arch_for(device_arch, kArchs);
  float *delta = static_cast<float *>(workspace);
  // Deterministic by construction: dK/dV per kv block loop over their q rows, dQ per q block over
  // its keys; nothing is accumulated with atomics.
  for (const char *kernel : {"attn_bwd_preprocess", "attn_bwd_dkdv", "attn_bwd_dq"})
    launch_one(require(kernel, p, arch), p, delta, device, stream);
}

}  // namespace aotriton
}  // namespace nvte
