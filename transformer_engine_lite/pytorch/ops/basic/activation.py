"""Activation ops (TE's ops.GELU, GEGLU, QGELU, QGEGLU, ReLU, ReGLU, SReLU, SReGLU, SiLU, SwiGLU)
on the core's activation kernels.

Gated ops split the last dim into halves [a | b] and return act(a) * b: TE's convention (the
activation applies to the first half; torch's GLU gates with the second).
"""

from __future__ import annotations

from typing import Any

import torch

from ...quantization import ops as te_ops
from .._common import compute_dtype
from ..op import BasicOperation
from .quantize import active_recipe, fp8_round_trip

__all__ = [
    "GEGLU", "GELU", "QGEGLU", "QGELU", "ReGLU", "ReLU", "SReGLU", "SReLU", "SiLU", "SwiGLU",
]


class _CachedQuantizedInputFn(torch.autograd.Function):
    """act(x) whose backward reads x as FP8 values (cache_quantized_input under fp8_autocast: TE
    saves the FP8 cast of the input instead of the input, a quarter of the bytes of fp32)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, name: str, recipe: Any):  # type: ignore[override]
        ctx.name = name
        ctx.save_for_backward(fp8_round_trip(x, recipe, True))
        return te_ops().activation_fwd(x, name)[0]

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):  # type: ignore[override]
        (xq,) = ctx.saved_tensors
        return te_ops().activation_bwd(dy.contiguous(), xq, ctx.name), None, None


class _ActivationOperation(BasicOperation):
    """y = act(x) with the core's kernel; backward by the kernel's registered autograd.

    cache_quantized_input: under fp8_autocast the backward uses the FP8 values of the input (the
    active recipe's forward format); outside it, no effect.
    """

    _name = ""  # the core's activation name
    gated = False

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__()
        self.cache_quantized_input = bool(cache_quantized_input)

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        owner = type(self).__name__
        x = input_.to(compute_dtype(owner, input_, None)).contiguous()
        if self.gated and (x.dim() < 1 or x.shape[-1] % 2):
            raise ValueError(
                f"{owner}: input: expected an even last dim ([linear | gate] halves), got shape "
                f"{tuple(x.shape)}"
            )
        recipe = active_recipe() if self.cache_quantized_input else None
        if recipe is not None:
            return _CachedQuantizedInputFn.apply(x, self._name, recipe), ()
        return te_ops().activation_fwd(x, self._name)[0], ()


def _make(cls_name: str, name: str, gated: bool, doc: str) -> type[_ActivationOperation]:
    return type(cls_name, (_ActivationOperation,), {"_name": name, "gated": gated, "__doc__": doc,
                                                    "__module__": __name__})


GELU = _make("GELU", "gelu", False, "GELU (tanh approximation, as TE).")
GEGLU = _make("GEGLU", "geglu", True, "GELU(a) * b for input halves [a | b].")
QGELU = _make("QGELU", "qgelu", False, "Quick GELU: x * sigmoid(1.702 x).")
QGEGLU = _make("QGEGLU", "qgeglu", True, "QGELU(a) * b for input halves [a | b].")
ReLU = _make("ReLU", "relu", False, "ReLU.")
ReGLU = _make("ReGLU", "reglu", True, "ReLU(a) * b for input halves [a | b].")
SReLU = _make("SReLU", "srelu", False, "Squared ReLU: relu(x)^2.")
SReGLU = _make("SReGLU", "sreglu", True, "SReLU(a) * b for input halves [a | b].")
SiLU = _make("SiLU", "silu", False, "SiLU: x * sigmoid(x).")
SwiGLU = _make("SwiGLU", "swiglu", True, "SiLU(a) * b for input halves [a | b].")
