// The activation functions of util/math.h named at run time, and the one dispatch from that name to
// the functor type, shared by the CPU and GPU launchers.
#pragma once

#include "../util/dtype_dispatch.h"
#include "../util/error.h"
#include "../util/math.h"

namespace nvte {

enum class Activation { kGelu, kQGelu, kRelu, kSRelu, kSilu, kSigmoid };

// dispatch_activation(act, [&](auto atag) { using Act = typename decltype(atag)::type; ... }) runs
// the lambda with the functor of `act` (the lambda-style dispatch used with dispatch_dtype).
template <typename F>
void dispatch_activation(Activation act, F &&f) {
  switch (act) {
    case Activation::kGelu: f(TypeTag<Gelu>{}); return;
    case Activation::kQGelu: f(TypeTag<QGelu>{}); return;
    case Activation::kRelu: f(TypeTag<Relu>{}); return;
    case Activation::kSRelu: f(TypeTag<SRelu>{}); return;
    case Activation::kSilu: f(TypeTag<Silu>{}); return;
    case Activation::kSigmoid: f(TypeTag<Sigmoid>{}); return;
  }
  NVTE_ERROR("activation: expected one of gelu, qgelu, relu, srelu, silu, sigmoid, got enum value ",
             static_cast<int>(act));
}

}  // namespace nvte
