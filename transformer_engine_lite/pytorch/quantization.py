"""How a GEMM operand is quantized under each recipe, on top of torch.ops.te_lite.

One place for the per-recipe casting rules the modules share (ARCHITECTURE.md §5):
- delayed: `quantize(x, scale)` with the module's stored scale; the op also returns amax(x).
- current: `compute_amax` -> `compute_scale_from_amax(eps, pow2)` -> `quantize`, per tensor per step.
- MXFP8: `quantize_mxfp8` (1x32 blocks, E8M0 scales) then `dequantize_mxfp8` to bf16. The core GEMM
  takes per-tensor FP8 operands only, so block-scaled operands enter it as bf16; this is exact
  (an E4M3/E5M2 value times a power of two is representable in bf16) and the GEMM accumulates in
  FP32, so the result equals a native MXFP8 GEMM up to summation order.
Everything here is tensor ops with static Python branching, so it traces under torch.compile.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..common.recipe import MXFP8BlockScaling, QParams, Recipe
from .fp8 import (  # noqa: F401  TE 2.x serves the autocast API from pytorch.quantization
    FP8GlobalStateManager,
    autocast,
    fp8_autocast,
    fp8_model_init,
    get_default_fp8_recipe,
    get_fp8_torch_dtype,
    is_fp8_available,
    is_fp8_block_scaling_available,
    is_mxfp8_available,
    is_nvfp4_available,
    quantized_model_init,
)

__all__ = [
    "FP8GlobalStateManager",
    "Operand",
    "QuantSpec",
    "autocast",
    "fake_quantize",
    "fp8_autocast",
    "fp8_model_init",
    "get_align_size_for_quantization",
    "ops",
    "quantize_operand",
    "quantized_model_init",
]


def ops():
    """torch.ops.te_lite, with a clear error when the extension is not built."""
    try:
        return torch.ops.te_lite
    except (AttributeError, RuntimeError) as e:  # pragma: no cover - depends on the build
        raise ImportError(
            "torch.ops.te_lite is not available: build the PyTorch extension "
            "(pip install --no-build-isolation -e .)"
        ) from e


class QuantSpec(NamedTuple):
    """Static description of how one operand is cast (hashable: a compile-time constant).

    mode: "hp" (no cast), "delayed", "current" or "mxfp8".
    dtype: FP8 torch dtype (None for "hp").
    pow2, eps: current-scaling options.
    """

    mode: str = "hp"
    dtype: torch.dtype | None = None
    pow2: bool = False
    eps: float = 0.0


class Operand(NamedTuple):
    """A GEMM operand ready for torch.ops.te_lite.gemm: data (FP8 or high precision) and its
    scale_inv ([1] fp32 for FP8, None otherwise)."""

    data: torch.Tensor
    scale_inv: torch.Tensor | None


def spec_for(recipe: Recipe, mode: str, forward: bool, qparams: QParams | None = None) -> QuantSpec:
    """The QuantSpec of one operand role under `recipe` (mode already decided by the caller)."""
    if mode == "hp":
        return QuantSpec()
    dtype = get_fp8_torch_dtype(recipe.fp8_format, forward)
    if mode == "current" and qparams is not None:
        return QuantSpec(mode, dtype, bool(qparams.power_2_scale), float(qparams.amax_epsilon))
    return QuantSpec(mode, dtype)


def quantize_per_tensor(
    x: torch.Tensor, spec: QuantSpec, scale: torch.Tensor | None
) -> tuple[Operand, torch.Tensor]:
    """Per-tensor FP8 cast. Returns (operand, amax [1]). Delayed mode uses `scale` (a [1] view of
    the module's scale buffer); current mode computes the scale from x itself."""
    te = ops()
    x = x.contiguous()
    if spec.mode == "current":
        amax = te.compute_amax(x)
        scale, _ = te.compute_scale_from_amax(amax, spec.dtype, spec.eps, spec.pow2)
    data, amax, scale_inv = te.quantize(x, scale, spec.dtype)
    return Operand(data, scale_inv), amax


def mx_dequantized(
    x2d: torch.Tensor, dtype: torch.dtype, rowwise: bool, columnwise: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """MXFP8 round trip of a 2-D tensor: row-wise blocks (along dim 1) and/or column-wise blocks
    (along dim 0), each quantized from x and dequantized to bf16 for the per-tensor GEMM."""
    te = ops()
    row, row_s, col, col_s = te.quantize_mxfp8(x2d.contiguous(), dtype, rowwise, columnwise)
    r = te.dequantize_mxfp8(row, row_s, False, torch.bfloat16) if rowwise else None
    c = te.dequantize_mxfp8(col, col_s, True, torch.bfloat16) if columnwise else None
    return r, c


def quantize_operand(
    x: torch.Tensor, spec: QuantSpec, scale: torch.Tensor | None = None
) -> tuple[Operand, torch.Tensor | None]:
    """Operand for a per-tensor or high-precision GEMM; amax is returned in delayed mode."""
    if spec.mode == "hp":
        return Operand(x.contiguous(), None), None
    op, amax = quantize_per_tensor(x, spec, scale)
    return op, amax


@torch.no_grad()
def fake_quantize(w: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """w rounded to the values the recipe's forward FP8 format can hold (used by
    quantized_model_init): MXFP8 row-wise blocks; delayed scaling: the weight's delayed-scaling
    scale at initialization, 1.0 (TE's FP8 parameters start with it, so the first FP8 forward
    reproduces these values exactly); current scaling: per-tensor current scaling."""
    te = ops()
    dtype = get_fp8_torch_dtype(recipe.fp8_format, True)
    w2 = w.reshape(-1, w.shape[-1]).contiguous()
    if isinstance(recipe, MXFP8BlockScaling):
        row, row_s, _, _ = te.quantize_mxfp8(w2, dtype, True, False)
        out = te.dequantize_mxfp8(row, row_s, False, w.dtype)
    elif recipe.delayed():
        data, _, scale_inv = te.quantize(w2, torch.ones(1, device=w.device), dtype)
        out = te.dequantize(data, scale_inv, w.dtype)
    else:
        amax = te.compute_amax(w2)
        scale, _ = te.compute_scale_from_amax(amax, dtype, 0.0, False)
        data, _, scale_inv = te.quantize(w2, scale, dtype)
        out = te.dequantize(data, scale_inv, w.dtype)
    return out.reshape(w.shape)


def get_align_size_for_quantization(recipe: Recipe) -> int:
    """Row alignment of grouped quantized GEMM splits (Fp8Padding / Fp8Unpadding): 32 for MXFP8
    (one scale block along the tokens), 16 for per-tensor FP8 (TE's GEMM leading-dim rule), a
    CustomRecipe's declared quantization_alignment (its qfactory is not called)."""
    if not isinstance(recipe, Recipe):
        raise TypeError(f"get_align_size_for_quantization: recipe: expected a Recipe, got "
                        f"{type(recipe).__name__}")
    if getattr(recipe, "custom", lambda: False)():
        return int(recipe.quantization_alignment)
    if recipe.mxfp8():
        return 32
    if recipe.nvfp4():
        return 128
    return 16
