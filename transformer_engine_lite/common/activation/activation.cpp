// C API of the activation family (activation.h): argument checks, device routing, CPU/GPU launch.
#include "transformer_engine_lite/activation.h"

#include <cmath>
#include <utility>
#include <vector>

#include "../cast/output_spec.h"
#include "../util/api.h"
#include "activation_cpu.h"
#ifdef NVTE_WITH_GPU
#include "activation_gpu.h"
#endif

namespace nvte {
namespace {

// Gated inputs are [..., 2H]: returns the shape with the last dim halved ([..., H]).
std::vector<size_t> gated_half_shape(const SimpleTensor &input) {
  check_ndim_at_least(input, "input", 1);
  NVTE_CHECK(input.shape.back() % 2 == 0,
             "argument 'input': expected an even last dim (layout [..., 2H] = [a | b]) for a ",
             "gated activation, got shape ", shape_str(input.shape));
  std::vector<size_t> half = input.shape;
  half.back() /= 2;
  return half;
}

// Routes on the tensors' common device (true: run on the GPU). The CPU emitter reads the output's
// per-tensor scale, so it is built only on the CPU path, from the device-agnostic OutputSpec.
bool route(const char *op, const Tensor &a, const char *name_a, const Tensor &b,
           const char *name_b, const Tensor *c = nullptr, const char *name_c = "") {
  return use_gpu(check_same_device({{&a, name_a}, {&b, name_b}, {c, name_c}}), op);
}

// Row blocks are read and written in parallel (column-wise copies scattered over the whole output),
// so no output buffer may share memory with an input, nor the two data copies with each other.
void check_output_disjoint(const Tensor &out, const SimpleTensor &in, const char *arg,
                           const SimpleTensor *in2 = nullptr, const char *arg2 = "") {
  for (const auto &[src, name] : {std::make_pair(&in, arg), std::make_pair(in2, arg2)}) {
    if (src == nullptr) continue;
    check_no_overlap(*src, name, out.data, "output (row-wise data)");
    check_no_overlap(*src, name, out.columnwise_data, "output (column-wise data)");
    check_no_overlap(*src, name, out.scale_inv, "output (scale_inv)");
    check_no_overlap(*src, name, out.columnwise_scale_inv, "output (column-wise scale_inv)");
    check_no_overlap(*src, name, out.amax, "output (amax)");
  }
  check_no_overlap(out.data, "output (row-wise data)", out.columnwise_data,
                   "output (column-wise data)");
}

// Clamped SwiGLU's parameters (nullptr for the parameterless activations).
struct ClampedParams {
  float limit;
  float alpha;
  float offset;  // glu_linear_offset: 1 for nvte_clamped_swiglu
};

void check_clamped(const ClampedParams &p) {
  NVTE_CHECK(std::isfinite(p.limit) && p.limit > 0.0f,
             "argument 'limit': expected a finite number > 0, got ", p.limit);
  NVTE_CHECK(std::isfinite(p.alpha), "argument 'alpha': expected a finite number, got ", p.alpha);
  NVTE_CHECK(std::isfinite(p.offset), "argument 'glu_linear_offset': expected a finite number, got ",
             p.offset);
}

NVTEStatus activation_fwd(const char *op, Activation act, bool gated, const NVTETensor input,
                          NVTETensor output, NVTEStream stream,
                          const ClampedParams *clamped = nullptr) {
  return guarded(op, [&] {
    const Tensor &in = as_tensor(input, "input");
    const Tensor &out = as_tensor(output, "output");
    if (clamped != nullptr) check_clamped(*clamped);
    check_has_data(in, "input");
    check_dtype(in.data, "input", {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
    const std::vector<size_t> out_shape = gated ? gated_half_shape(in.data) : in.data.shape;
    const bool gpu = route(op, in, "input", out, "output");
    const OutputSpec spec = validate_output(out, "output", out_shape);  // every output buffer
    check_output_disjoint(out, in.data, "input");
    if (gpu) {
#ifdef NVTE_WITH_GPU
      if (clamped != nullptr) {
        gpu::launch_clamped_swiglu_fwd(in, clamped->limit, clamped->alpha, clamped->offset, out,
                                       spec, stream);
      } else {
        gpu::launch_activation_fwd(act, gated, in, out, spec, stream);
      }
#endif
      return;
    }
    (void)stream;
    const OutputEmitter em(out, spec);
    if (clamped != nullptr) {
      launch_clamped_swiglu_fwd(in, clamped->limit, clamped->alpha, clamped->offset, em);
    } else if (gated) {
      launch_gated_activation_fwd(act, in, em);
    } else {
      launch_activation_fwd(act, in, em);
    }
  });
}

NVTEStatus activation_bwd(const char *op, Activation act, bool gated, const NVTETensor grad,
                          const NVTETensor input, NVTETensor output, NVTEStream stream,
                          const ClampedParams *clamped = nullptr) {
  return guarded(op, [&] {
    const Tensor &g = as_tensor(grad, "grad");
    const Tensor &in = as_tensor(input, "input");
    const Tensor &out = as_tensor(output, "output");
    if (clamped != nullptr) check_clamped(*clamped);
    check_has_data(g, "grad");
    check_has_data(in, "input");
    check_dtype(in.data, "input", {kNVTEFloat32, kNVTEFloat16, kNVTEBFloat16});
    NVTE_CHECK(g.data.dtype == in.data.dtype, "argument 'grad': expected the dtype of 'input' (",
               dtype_name(in.data.dtype), "), got ", dtype_name(g.data.dtype));
    check_shape(g.data, "grad", gated ? gated_half_shape(in.data) : in.data.shape);
    const bool gpu = route(op, g, "grad", in, "input", &out, "output");
    const OutputSpec spec = validate_output(out, "output", in.data.shape);
    check_output_disjoint(out, in.data, "input", &g.data, "grad");
    if (gpu) {
#ifdef NVTE_WITH_GPU
      if (clamped != nullptr) {
        gpu::launch_clamped_swiglu_bwd(g, in, clamped->limit, clamped->alpha, clamped->offset,
                                       out, spec, stream);
      } else {
        gpu::launch_activation_bwd(act, gated, g, in, out, spec, stream);
      }
#endif
      return;
    }
    (void)stream;
    const OutputEmitter em(out, spec);
    if (clamped != nullptr) {
      launch_clamped_swiglu_bwd(g, in, clamped->limit, clamped->alpha, clamped->offset, em);
    } else if (gated) {
      launch_gated_activation_bwd(act, g, in, em);
    } else {
      launch_activation_bwd(act, g, in, em);
    }
  });
}

}  // namespace
}  // namespace nvte

using nvte::Activation;
using nvte::activation_bwd;
using nvte::activation_fwd;
using nvte::ClampedParams;

// ---------------------------------------------------------------- element-wise
NVTEStatus nvte_gelu(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return activation_fwd("nvte_gelu", Activation::kGelu, false, input, output, stream);
}
NVTEStatus nvte_qgelu(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return activation_fwd("nvte_qgelu", Activation::kQGelu, false, input, output, stream);
}
NVTEStatus nvte_relu(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return activation_fwd("nvte_relu", Activation::kRelu, false, input, output, stream);
}
NVTEStatus nvte_srelu(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return activation_fwd("nvte_srelu", Activation::kSRelu, false, input, output, stream);
}
NVTEStatus nvte_silu(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return activation_fwd("nvte_silu", Activation::kSilu, false, input, output, stream);
}

NVTEStatus nvte_dgelu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                      NVTEStream stream) {
  return activation_bwd("nvte_dgelu", Activation::kGelu, false, grad, input, output, stream);
}
NVTEStatus nvte_dqgelu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                       NVTEStream stream) {
  return activation_bwd("nvte_dqgelu", Activation::kQGelu, false, grad, input, output, stream);
}
NVTEStatus nvte_drelu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                      NVTEStream stream) {
  return activation_bwd("nvte_drelu", Activation::kRelu, false, grad, input, output, stream);
}
NVTEStatus nvte_dsrelu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                       NVTEStream stream) {
  return activation_bwd("nvte_dsrelu", Activation::kSRelu, false, grad, input, output, stream);
}
NVTEStatus nvte_dsilu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                      NVTEStream stream) {
  return activation_bwd("nvte_dsilu", Activation::kSilu, false, grad, input, output, stream);
}

// ---------------------------------------------------------------- gated
NVTEStatus nvte_geglu(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return activation_fwd("nvte_geglu", Activation::kGelu, true, input, output, stream);
}
NVTEStatus nvte_qgeglu(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return activation_fwd("nvte_qgeglu", Activation::kQGelu, true, input, output, stream);
}
NVTEStatus nvte_reglu(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return activation_fwd("nvte_reglu", Activation::kRelu, true, input, output, stream);
}
NVTEStatus nvte_sreglu(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return activation_fwd("nvte_sreglu", Activation::kSRelu, true, input, output, stream);
}
NVTEStatus nvte_swiglu(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return activation_fwd("nvte_swiglu", Activation::kSilu, true, input, output, stream);
}
NVTEStatus nvte_glu(const NVTETensor input, NVTETensor output, NVTEStream stream) {
  return activation_fwd("nvte_glu", Activation::kSigmoid, true, input, output, stream);
}

NVTEStatus nvte_dgeglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                       NVTEStream stream) {
  return activation_bwd("nvte_dgeglu", Activation::kGelu, true, grad, input, output, stream);
}
NVTEStatus nvte_dqgeglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                        NVTEStream stream) {
  return activation_bwd("nvte_dqgeglu", Activation::kQGelu, true, grad, input, output, stream);
}
NVTEStatus nvte_dreglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                       NVTEStream stream) {
  return activation_bwd("nvte_dreglu", Activation::kRelu, true, grad, input, output, stream);
}
NVTEStatus nvte_dsreglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                        NVTEStream stream) {
  return activation_bwd("nvte_dsreglu", Activation::kSRelu, true, grad, input, output, stream);
}
NVTEStatus nvte_dswiglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                        NVTEStream stream) {
  return activation_bwd("nvte_dswiglu", Activation::kSilu, true, grad, input, output, stream);
}
NVTEStatus nvte_dglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                     NVTEStream stream) {
  return activation_bwd("nvte_dglu", Activation::kSigmoid, true, grad, input, output, stream);
}

// ---------------------------------------------------------------- clamped SwiGLU (GPT-OSS)
NVTEStatus nvte_clamped_swiglu(const NVTETensor input, NVTETensor output, float limit, float alpha,
                               NVTEStream stream) {
  const ClampedParams p{limit, alpha, 1.0f};
  return activation_fwd("nvte_clamped_swiglu", Activation::kSilu, true, input, output, stream, &p);
}
NVTEStatus nvte_clamped_dswiglu(const NVTETensor grad, const NVTETensor input, NVTETensor output,
                                float limit, float alpha, NVTEStream stream) {
  const ClampedParams p{limit, alpha, 1.0f};
  return activation_bwd("nvte_clamped_dswiglu", Activation::kSilu, true, grad, input, output,
                        stream, &p);
}
NVTEStatus nvte_clamped_swiglu_v2(const NVTETensor input, NVTETensor output, float limit,
                                  float alpha, float glu_linear_offset, NVTEStream stream) {
  const ClampedParams p{limit, alpha, glu_linear_offset};
  return activation_fwd("nvte_clamped_swiglu_v2", Activation::kSilu, true, input, output, stream,
                        &p);
}
NVTEStatus nvte_clamped_dswiglu_v2(const NVTETensor grad, const NVTETensor input,
                                   NVTETensor output, float limit, float alpha,
                                   float glu_linear_offset, NVTEStream stream) {
  const ClampedParams p{limit, alpha, glu_linear_offset};
  return activation_bwd("nvte_clamped_dswiglu_v2", Activation::kSilu, true, grad, input, output,
                        stream, &p);
}
