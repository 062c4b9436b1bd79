// GPU kernels of the multi-tensor ops: one grid-stride launch per tensor (TE packs up to 110
// tensors per launch; per-tensor launches cost a launch each, not measured yet), each element by
// the CPU's math (multi_tensor_params.h), so results match the CPU bit for bit except the L2 norm's
// partial sums (block-tree fp32 sums here, double sums on the CPU). The L2 norm: one block per
// chunk writes its partial, one thread sums them in the CPU's order.
#include <algorithm>

#include "../platform/device.h"
#include "../platform/runtime.h"
#include "../recipe/scaling_math.h"
#include "../util/dtype_dispatch.h"
#include "multi_tensor_gpu.h"
#include "multi_tensor_types.h"

namespace nvte {
namespace gpu {

namespace {

constexpr int kThreads = 256;
// Grid-stride loops bound the grid.
constexpr size_t kMaxBlocks = 65536;

unsigned grid_for(size_t items) {
  const size_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min(blocks, kMaxBlocks)));
}

__device__ __forceinline__ size_t global_thread() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t global_stride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

template <typename I, typename O>
__global__ void __launch_bounds__(kThreads)
    multi_tensor_scale_kernel(const TensorSet t, float scale, int *noop) {
  const I *in = static_cast<const I *>(t.ptr[0]);
  O *out = static_cast<O *>(t.ptr[1]);
  bool ok = true;
  for (size_t i = global_thread(); i < t.numel; i += global_stride()) {
    const float x = to_float(in[i]);
    ok = ok && finite_f32(x);
    out[i] = from_float<O>(x * scale);
  }
  if (!ok) atomicMax(noop, 1);  // any thread of any block: the flag only ever goes to 1
}

// Block c (grid-stride over chunks) sums the squares of chunk c into partials[c].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    multi_tensor_l2norm_kernel(const T *x, size_t n, size_t chunk, const float *inv_scale,
                               float *partials) {
  __shared__ float scratch[kThreads / kWarpSize];
  const float unscale = inv_scale != nullptr ? *inv_scale : 1.0f;
  const size_t chunks = (n + chunk - 1) / chunk;
  for (size_t c = blockIdx.x; c < chunks; c += gridDim.x) {  // uniform per block
    const size_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
    float sum = 0.0f;
    for (size_t i = c * chunk + threadIdx.x; i < end; i += blockDim.x) {
      const float v = to_float(x[i]) * unscale;
      sum += v * v;
    }
    sum = block_reduce<false>(sum, scratch);
    if (threadIdx.x == 0) partials[c] = sum;
  }
}

__global__ void multi_tensor_l2norm_finalize_kernel(size_t num_tensors, size_t max_chunks,
                                                    const float *partials, float *output,
                                                    float *ret, float *ret_per_tensor,
                                                    bool per_tensor, int *noop) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    l2norm_finalize(num_tensors, max_chunks, partials, output, ret, ret_per_tensor, per_tensor,
                    noop);
  }
}

template <typename G, typename P>
__global__ void __launch_bounds__(kThreads)
    multi_tensor_adam_kernel(const TensorSet t, const AdamParams p, const int *noop) {
  __shared__ float scratch[kThreads / kWarpSize];
  if (p.lr_ptr != nullptr && *noop == 1) return;  // capturable, skipped step: the whole grid
  const AdamScalars s = adam_scalars(p);
  const bool fp8 = p.kind == AdamKind::kFp8;
  const float scale = fp8 ? *static_cast<const float *>(t.ptr[5]) : 1.0f;
  float amax = 0.0f;
  for (size_t i = global_thread(); i < t.numel; i += global_stride()) {
    const float a = adam_element<G, P>(t, i, p.kind, s, scale);
    amax = (a > amax || a != a) ? a : amax;
  }
  if (fp8) {  // uniform: every thread reaches the barriers in block_reduce
    amax = block_reduce<true>(amax, scratch);
    if (threadIdx.x == 0) {
      atomic_max_abs(static_cast<float *>(t.ptr[6]), amax);
      if (blockIdx.x == 0) *static_cast<float *>(t.ptr[7]) = 1.0f / scale;
    }
  }
}

template <typename G, typename W, typename O>
__global__ void __launch_bounds__(kThreads)
    multi_tensor_sgd_kernel(const TensorSet t, const SgdParams p, bool has_out, const int *noop) {
  if (*noop != 0) return;
  for (size_t i = global_thread(); i < t.numel; i += global_stride()) {
    sgd_element<G, W, O>(t, i, p, has_out);
  }
}

__global__ void __launch_bounds__(kThreads)
    multi_tensor_compute_scale_kernel(const TensorSet t, float max_fp8, bool pow2, float eps) {
  const float *amax = static_cast<const float *>(t.ptr[0]);
  float *scale = static_cast<float *>(t.ptr[1]);
  float *scale_inv = static_cast<float *>(t.ptr[2]);
  for (size_t i = global_thread(); i < t.numel; i += global_stride()) {
    const float sc = compute_scale_from_amax(amax[i], max_fp8, eps, pow2);
    scale[i] = sc;
    scale_inv[i] = 1.0f / sc;
  }
}

}  // namespace

void launch_multi_tensor_scale(const MultiTensorBatch &b, float scale, void *stream) {
  dispatch_dtype<HighPrecisionTypes>(b.dtype[0], "tensor_lists[0]", [&](auto in_tag) {
    using I = typename decltype(in_tag)::type;
    dispatch_dtype<HighPrecisionTypes>(b.dtype[1], "tensor_lists[1]", [&](auto out_tag) {
      using O = typename decltype(out_tag)::type;
      for (const TensorSet &t : b.tensors) {
        if (t.numel == 0) continue;
        multi_tensor_scale_kernel<I, O>
            <<<grid_for(t.numel), kThreads, 0, as_stream(stream)>>>(t, scale, b.noop);
        NVTE_CHECK_LAUNCH();
      }
    });
  });
}

void launch_multi_tensor_l2norm(const MultiTensorBatch &b, size_t chunk_size, size_t max_chunks,
                                const float *inv_scale, float *output, float *partials,
                                float *ret, float *ret_per_tensor, bool per_tensor,
                                void *stream) {
  const size_t slots = b.tensors.size() * max_chunks;
  if (slots > 0) {
    NVTE_CHECK_CUDA(cudaMemsetAsync(partials, 0, slots * sizeof(float), as_stream(stream)));
  }
  dispatch_dtype<HighPrecisionTypes>(b.dtype[0], "tensor_lists[0]", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (size_t j = 0; j < b.tensors.size(); ++j) {
      const TensorSet &t = b.tensors[j];
      if (t.numel == 0) continue;
      const size_t chunks = (t.numel + chunk_size - 1) / chunk_size;
      const unsigned grid = static_cast<unsigned>(std::min(chunks, kMaxBlocks));
      multi_tensor_l2norm_kernel<T><<<grid, kThreads, 0, as_stream(stream)>>>(
          static_cast<const T *>(t.ptr[0]), t.numel, chunk_size, inv_scale,
          partials + j * max_chunks);
      NVTE_CHECK_LAUNCH();
    }
  });
  multi_tensor_l2norm_finalize_kernel<<<1, 1, 0, as_stream(stream)>>>(
      b.tensors.size(), max_chunks, partials, output, ret, ret_per_tensor, per_tensor, b.noop);
  NVTE_CHECK_LAUNCH();
}

void launch_multi_tensor_adam(const MultiTensorBatch &b, const AdamParams &p, void *stream) {
  auto run = [&](auto g_tag, auto p_tag) {
    using G = typename decltype(g_tag)::type;
    using P = typename decltype(p_tag)::type;
    for (const TensorSet &t : b.tensors) {
      if (t.numel == 0) continue;
      multi_tensor_adam_kernel<G, P>
          <<<grid_for(t.numel), kThreads, 0, as_stream(stream)>>>(t, p, b.noop);
      NVTE_CHECK_LAUNCH();
    }
  };
  dispatch_dtype<HighPrecisionTypes>(b.dtype[0], "tensor_lists[0]", [&](auto g_tag) {
    if (p.kind == AdamKind::kRemainder) {
      run(g_tag, TypeTag<bf16>{});
    } else if (p.kind == AdamKind::kFp8) {
      dispatch_dtype<Fp8Types>(p.fp8_dtype, "fp8_dtype", [&](auto p_tag) { run(g_tag, p_tag); });
    } else {
      dispatch_dtype<HighPrecisionTypes>(b.dtype[1], "tensor_lists[1]",
                                         [&](auto p_tag) { run(g_tag, p_tag); });
    }
  });
}

void launch_multi_tensor_sgd(const MultiTensorBatch &b, const SgdParams &p, void *stream) {
  const bool has_out = b.num_lists == 4;
  const DType out_dtype = has_out ? b.dtype[3] : kNVTEFloat16;
  dispatch_dtype<HighPrecisionTypes>(b.dtype[0], "tensor_lists[0]", [&](auto g_tag) {
    using G = typename decltype(g_tag)::type;
    dispatch_dtype<HighPrecisionTypes>(b.dtype[1], "tensor_lists[1]", [&](auto w_tag) {
      using W = typename decltype(w_tag)::type;
      dispatch_dtype<SgdModelOutTypes>(out_dtype, "tensor_lists[3]", [&](auto o_tag) {
        using O = typename decltype(o_tag)::type;
        for (const TensorSet &t : b.tensors) {
          if (t.numel == 0) continue;
          multi_tensor_sgd_kernel<G, W, O>
              <<<grid_for(t.numel), kThreads, 0, as_stream(stream)>>>(t, p, has_out, b.noop);
          NVTE_CHECK_LAUNCH();
        }
      });
    });
  });
}

void launch_multi_tensor_compute_scale(const MultiTensorBatch &b, float max_fp8, bool pow2,
                                       float epsilon, void *stream) {
  for (const TensorSet &t : b.tensors) {
    if (t.numel == 0) continue;
    multi_tensor_compute_scale_kernel<<<grid_for(t.numel), kThreads, 0, as_stream(stream)>>>(
        t, max_fp8, pow2, epsilon);
    NVTE_CHECK_LAUNCH();
  }
}

}  // namespace gpu
}  // namespace nvte
