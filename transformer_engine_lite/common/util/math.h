// Activation functions and their derivatives in fp32, shared by CPU and GPU kernels.
#pragma once

#include <cmath>

#include "../platform/host_device.h"

namespace nvte {

struct Gelu {  // tanh approximation, as TE
  static NVTE_HOST_DEVICE float fwd(float x) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(k0 * (x + k1 * x * x * x)));
  }
  static NVTE_HOST_DEVICE float bwd(float x) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    const float t = tanhf(k0 * (x + k1 * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * x * x);
  }
};

NVTE_HOST_DEVICE float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

struct QGelu {  // x * sigmoid(1.702 x)
  static NVTE_HOST_DEVICE float fwd(float x) { return x * sigmoidf(1.702f * x); }
  static NVTE_HOST_DEVICE float bwd(float x) {
    const float s = sigmoidf(1.702f * x);
    return s + 1.702f * x * s * (1.0f - s);
  }
};

struct Relu {
  static NVTE_HOST_DEVICE float fwd(float x) { return x > 0.0f ? x : 0.0f; }
  static NVTE_HOST_DEVICE float bwd(float x) { return x > 0.0f ? 1.0f : 0.0f; }
};

struct SRelu {  // squared ReLU
  static NVTE_HOST_DEVICE float fwd(float x) { return x > 0.0f ? x * x : 0.0f; }
  static NVTE_HOST_DEVICE float bwd(float x) { return x > 0.0f ? 2.0f * x : 0.0f; }
};

struct Silu {  // x * sigmoid(x)
  static NVTE_HOST_DEVICE float fwd(float x) { return x * sigmoidf(x); }
  static NVTE_HOST_DEVICE float bwd(float x) {
    const float s = sigmoidf(x);
    return s + x * s * (1.0f - s);
  }
};

}  // namespace nvte
