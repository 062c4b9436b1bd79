"""Quantize op: cast activations (forward) and/or gradients (backward) to the active FP8 recipe's
quantized tensor type (Float8Tensor, MXFP8Tensor), as TE's ops.Quantize; outside fp8_autocast an
identity. The ops after it take the quantized tensor as it is (a GEMM) or its values."""

from __future__ import annotations

from typing import Any

import torch

from ....common.recipe import MXFP8BlockScaling, Recipe
from ...fp8 import FP8GlobalStateManager, get_fp8_torch_dtype
from ...tensor import Float8CurrentScalingQuantizer, MXFP8Quantizer, QuantizedTensor, Quantizer
from ..op import BasicOperation

__all__ = ["Quantize", "fp8_round_trip"]


def _quantizer(recipe: Recipe, forward: bool) -> Quantizer:
    """The quantizer of the recipe's format (E4M3 forward, E5M2 backward for HYBRID): MXFP8 1x32
    blocks (both usages, as TE's quantizers default); Float8BlockScaling's tiles; per-tensor recipes with a scale from the
    tensor's own amax (delayed scaling too: this op keeps no amax history)."""
    dtype = get_fp8_torch_dtype(recipe.fp8_format, forward)
    if isinstance(recipe, MXFP8BlockScaling):
        return MXFP8Quantizer(dtype)
    if recipe.nvfp4():  # activations / gradients: the recipe's NVFP4 options
        from ...quantization import block_spec, nvfp4_quantizer

        return nvfp4_quantizer(block_spec(recipe, "input" if forward else "grad"))
    if recipe.float8_block_scaling():  # activations / gradients: the recipe's 1D or 2D tiles
        from ...quantization import block_spec
        from ...tensor import Float8BlockQuantizer

        spec = block_spec(recipe, "input" if forward else "grad")
        return Float8BlockQuantizer(dtype, rowwise=True, columnwise=True, amax_epsilon=spec.eps,
                                    force_pow_2_scales=spec.pow2, block_scaling_dim=spec.block_dim)
    return Float8CurrentScalingQuantizer(dtype)


@torch.no_grad()
def fp8_round_trip(x: torch.Tensor, recipe: Recipe, forward: bool) -> torch.Tensor:
    """x quantized and dequantized with the recipe's format (see _quantizer)."""
    return _quantizer(recipe, forward)(x).dequantize(dtype=x.dtype)


@torch.no_grad()
def _quantize(x: torch.Tensor, recipe: Recipe, forward: bool) -> torch.Tensor:
    if isinstance(x, QuantizedTensor):
        x = x.dequantize()
    return _quantizer(recipe, forward)(x)


def active_recipe() -> Recipe | None:
    m = FP8GlobalStateManager
    return m.get_fp8_recipe() if m.is_fp8_enabled() else None


class _QuantizeFn(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, recipe: Recipe | None, fwd: bool, bwd: bool
    ) -> torch.Tensor:
        ctx.recipe, ctx.bwd = recipe, bwd
        return _quantize(x, recipe, True) if (fwd and recipe is not None) else x.clone()

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):  # type: ignore[override]
        # A recipe's backward_override ("high_precision" / "dequantized") keeps the backward in
        # high precision, so the gradient is not quantized here either (TE's Quantize op).
        override = getattr(ctx.recipe, "backward_override", None)
        if ctx.bwd and ctx.recipe is not None and override is None:
            dy = _quantize(dy, ctx.recipe, False)
        return dy, None, None, None


class Quantize(BasicOperation):
    """forward=True: the output is a quantized tensor of the active recipe; backward=True: so is
    the gradient (the recipe's backward format). Outside fp8_autocast: identity."""

    def __init__(self, forward: bool = True, backward: bool = False) -> None:
        super().__init__()
        self._quantize_forward = bool(forward)
        self._quantize_backward = bool(backward)

    def num_quantizers(self, mode: str) -> int:
        if mode not in ("forward", "backward"):
            raise ValueError(f"Quantize: mode: expected 'forward' or 'backward', got {mode!r}")
        on = self._quantize_forward if mode == "forward" else self._quantize_backward
        return int(on)

    def fuser_forward(
        self, input_: torch.Tensor, extra_inputs: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        recipe = active_recipe()
        if recipe is None:
            return input_, ()
        return _QuantizeFn.apply(
            input_, recipe, self._quantize_forward, self._quantize_backward
        ), ()
