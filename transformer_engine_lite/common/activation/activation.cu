// GPU activation kernels: one kernel template over per-op element functors (forward / backward of
// the util/math.h activations, element-wise or gated, and clamped SwiGLU), the CPU kernels'
// formulas term for term: every output byte as on the CPU.
#include <algorithm>

#include "../cast/staged_output_gpu.cuh"
#include "../util/hp_access.h"
#include "activation_gpu.h"

namespace nvte {
namespace gpu {

namespace {

constexpr int kThreads = 256;
// Grid-stride loops bound the grid, and with it the amax atomics (one per block).
constexpr size_t kMaxBlocks = 8192;

// One activation call, as the kernels see it.
struct ActivationParams {
  const void *input = nullptr;  // [rows, in_cols]: x, or [a | b] with a, b of width H (gated)
  const void *grad = nullptr;   // backward only: [rows, cols] (element-wise) or [rows, H] (gated)
  DType dtype = kNVTEFloat32;   // of input and grad (fp32, fp16 or bf16)
  size_t rows = 0;              // product of the output's leading dims
  size_t cols = 0;              // output columns: input cols; H (gated fwd); 2H (gated bwd)
  bool gated = false;           // input rows are [a | b]
  float limit = 0.0f;           // clamped SwiGLU only
  float alpha = 0.0f;
  float offset = 1.0f;          // clamped SwiGLU's glu_linear_offset
};

// The kernel runs a flat grid-stride loop over the rows * cols outputs: every thread is busy
// whatever the row length (a row of 8 elements would idle most of a per-row block), and the
// division into (row, col) costs little next to GELU's ~60 flops.
__device__ __forceinline__ size_t first_index() {
  return blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ size_t grid_stride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

// The value of output element (row, col) per op: the CPU spans' formulas term for term.
// Forward, element-wise or gated: y = act(a), times b when gated (gated_fwd_span).
template <typename Act>
struct ActFwd {
  __device__ static float at(const ActivationParams &p, size_t row, size_t col) {
    const size_t i = row * (p.gated ? 2 * p.cols : p.cols) + col;
    const float y = Act::fwd(load_hp(p.input, p.dtype, i));
    return p.gated ? y * load_hp(p.input, p.dtype, i + p.cols) : y;
  }
};

// Backward. Element-wise: y = grad * act'(x). Gated, output row [da | db] of width 2H from input
// row [a | b] and grad row g of width H: da = g * b * act'(a), db = g * act(a) (gated_bwd_span).
template <typename Act>
struct ActBwd {
  __device__ static float at(const ActivationParams &p, size_t row, size_t col) {
    if (!p.gated) {
      const size_t i = row * p.cols + col;
      return load_hp(p.grad, p.dtype, i) * Act::bwd(load_hp(p.input, p.dtype, i));
    }
    const size_t h = p.cols / 2;
    const bool first = col < h;
    const size_t k = first ? col : col - h;
    const float av = load_hp(p.input, p.dtype, row * p.cols + k);
    const float gv = load_hp(p.grad, p.dtype, row * h + k);
    return first ? gv * load_hp(p.input, p.dtype, row * p.cols + h + k) * Act::bwd(av)
                 : gv * Act::fwd(av);
  }
};

// Clamped SwiGLU (util/math.h ClampedSwiGLU; the CPU's clamped_fwd_span / clamped_bwd_span).
struct ClampedFwd {
  __device__ static float at(const ActivationParams &p, size_t row, size_t col) {
    const size_t i = row * 2 * p.cols + col;
    return ClampedSwiGLU::fwd(load_hp(p.input, p.dtype, i), load_hp(p.input, p.dtype, i + p.cols),
                              p.limit, p.alpha, p.offset);
  }
};

struct ClampedBwd {
  __device__ static float at(const ActivationParams &p, size_t row, size_t col) {
    const size_t h = p.cols / 2;
    const bool first = col < h;
    const size_t k = first ? col : col - h;
    const float av = load_hp(p.input, p.dtype, row * p.cols + k);
    const float bv = load_hp(p.input, p.dtype, row * p.cols + h + k);
    const float gv = load_hp(p.grad, p.dtype, row * h + k);
    return first ? gv * ClampedSwiGLU::linear(bv, p.limit, p.offset) *
                       ClampedSwiGLU::dgate(av, p.limit, p.alpha)
                 : gv * ClampedSwiGLU::gate(av, p.limit, p.alpha) *
                       ClampedSwiGLU::dlinear(bv, p.limit);
  }
};

// One kernel for every op: a flat grid-stride loop over the rows * cols outputs, each computed by
// Op::at and stored through the output (plain, per-tensor FP8 fused, MXFP8 staged) with its amax.
template <typename Op, typename OType>
__global__ void __launch_bounds__(kThreads)
    activation_kernel(const ActivationParams p, const OutputParams out) {
  __shared__ float scratch[kThreads / kWarpSize];
  const float scale = output_scale(out);
  float thread_amax = 0.0f;
  for (size_t e = first_index(); e < p.rows * p.cols; e += grid_stride()) {
    const size_t row = e / p.cols, col = e - row * p.cols;
    const float y = Op::at(p, row, col);
    store_output<OType>(out, row, col, y, scale);
    thread_amax = abs_max_update(thread_amax, y);
  }
  record_amax(out, thread_amax, scratch);  // every thread of the block: it holds barriers
  write_scale_inv(out);
}

unsigned grid_for(const ActivationParams &p) {
  const size_t blocks = (p.rows * p.cols + kThreads - 1) / kThreads;
  // At least one block: the kernel also writes scale_inv, which an empty output still gets.
  return static_cast<unsigned>(std::max<size_t>(1, std::min(blocks, kMaxBlocks)));
}

// Dispatches the stored element type, launches the kernel of Op and finishes the output.
template <typename Op>
void launch(const ActivationParams &p, const Tensor &out, const OutputSpec &spec, void *stream) {
  const cudaStream_t s = as_stream(stream);
  StagedOutput staged(out, spec, s);
  dispatch_dtype<GpuOutputTypes>(staged.store_dtype(), "output", [&](auto tag) {
    using OType = typename decltype(tag)::type;
    activation_kernel<Op, OType><<<grid_for(p), kThreads, 0, s>>>(p, staged.params());
    NVTE_CHECK_LAUNCH();
  });
  staged.finish();
}

ActivationParams make_params(const Tensor &input, const Tensor *grad, const OutputSpec &spec,
                             bool gated, float limit = 0.0f, float alpha = 0.0f,
                             float offset = 1.0f) {
  ActivationParams p;
  p.input = input.data.dptr;
  p.grad = grad != nullptr ? grad->data.dptr : nullptr;
  p.dtype = input.data.dtype;
  p.rows = spec.rows;
  p.cols = spec.cols;
  p.gated = gated;
  p.limit = limit;
  p.alpha = alpha;
  p.offset = offset;
  return p;
}

}  // namespace

void launch_activation_fwd(Activation act, bool gated, const Tensor &input, const Tensor &out,
                           const OutputSpec &spec, void *stream) {
  const ActivationParams p = make_params(input, nullptr, spec, gated);
  dispatch_activation(act, [&](auto atag) {
    launch<ActFwd<typename decltype(atag)::type>>(p, out, spec, stream);
  });
}

void launch_activation_bwd(Activation act, bool gated, const Tensor &grad, const Tensor &input,
                           const Tensor &out, const OutputSpec &spec, void *stream) {
  const ActivationParams p = make_params(input, &grad, spec, gated);
  dispatch_activation(act, [&](auto atag) {
    launch<ActBwd<typename decltype(atag)::type>>(p, out, spec, stream);
  });
}

void launch_clamped_swiglu_fwd(const Tensor &input, float limit, float alpha, float offset,
                               const Tensor &out, const OutputSpec &spec, void *stream) {
  launch<ClampedFwd>(make_params(input, nullptr, spec, true, limit, alpha, offset), out, spec,
                     stream);
}

void launch_clamped_swiglu_bwd(const Tensor &grad, const Tensor &input, float limit, float alpha,
                               float offset, const Tensor &out, const OutputSpec &spec,
                               void *stream) {
  launch<ClampedBwd>(make_params(input, &grad, spec, true, limit, alpha, offset), out, spec,
                     stream);
}

}  // namespace gpu
}  // namespace nvte
