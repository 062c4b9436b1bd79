"""Quantize op: round activations (forward) and/or gradients (backward) to the active FP8 recipe's
values; outside fp8_autocast an identity (TE's ops.Quantize)."""

from __future__ import annotations

from typing import Any

import torch

from ....common.recipe import MXFP8BlockScaling, Recipe
from ...fp8 import FP8GlobalStateManager, get_fp8_torch_dtype
from ...quantization import ops as te_ops
from ..op import BasicOperation

__all__ = ["Quantize", "fp8_round_trip"]


@torch.no_grad()
def fp8_round_trip(x: torch.Tensor, recipe: Recipe, forward: bool) -> torch.Tensor:
    """x quantized and dequantized with the recipe's format (E4M3 forward, E5M2 backward for
    HYBRID): MXFP8 row-wise 1x32 blocks; per-tensor recipes with a scale from x's own amax.
    Between ops there is no FP8 tensor type here (te.Linear keeps none either), so quantization
    is expressed as its effect on the values; delayed scaling uses the current amax because this
    op keeps no amax history."""
    te = te_ops()
    dtype = get_fp8_torch_dtype(recipe.fp8_format, forward)
    x2 = x.reshape(-1, x.shape[-1]).contiguous() if x.dim() else x.reshape(1, 1)
    if isinstance(recipe, MXFP8BlockScaling):
        row, row_s, _, _ = te.quantize_mxfp8(x2, dtype, True, False)
        out = te.dequantize_mxfp8(row, row_s, False, x.dtype)
    else:
        amax = te.compute_amax(x2)
        scale, _ = te.compute_scale_from_amax(amax, dtype, 0.0, False)
        data, _, scale_inv = te.quantize(x2, scale, dtype)
        out = te.dequantize(data, scale_inv, x.dtype)
    return out.reshape(x.shape)


def active_recipe() -> Recipe | None:
    m = FP8GlobalStateManager
    return m.get_fp8_recipe() if m.is_fp8_enabled() else None


class _QuantizeFn(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, recipe: Recipe | None, fwd: bool, bwd: bool
    ) -> torch.Tensor:
        ctx.recipe, ctx.bwd = recipe, bwd
        return fp8_round_trip(x, recipe, True) if (fwd and recipe is not None) else x.clone()

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):  # type: ignore[override]
        if ctx.bwd and ctx.recipe is not None:
            dy = fp8_round_trip(dy, ctx.recipe, False)
        return dy, None, None, None


class Quantize(BasicOperation):
    """forward=True: the output holds FP8 values of the active recipe; backward=True: so does the
    gradient (the recipe's backward format). Outside fp8_autocast: identity."""

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
