"""What a module's forward checks when it runs under a recipe (TE's init_fp8_metadata /
_check_weight_tensor_recipe_correspondence / _update_weight_quantizers):
- a recipe of another type than the last forward's: a warning (cached weight casts are dropped);
- an FP8 weight parameter (quantized_model_init) under a recipe of another type than its
  quantizer's: RuntimeError, as TE (its bytes are not that recipe's);
- under a recipe of the same type with other settings (margin, formats, QParams, history
  length): the parameter's quantizer is rebuilt from the new recipe (scale and amax carried
  over), with TE's warning, so later re-quantizations follow the recipe in use."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ...common.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
    Recipe,
)
from ..tensor import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensor,
)

__all__ = ["check_recipe_change"]

# quantizer class -> the recipe class whose forward consumes its bytes as they are
_COMPATIBLE = (
    (Float8Quantizer, DelayedScaling),
    (Float8CurrentScalingQuantizer, Float8CurrentScaling),
    (MXFP8Quantizer, MXFP8BlockScaling),
    (Float8BlockQuantizer, Float8BlockScaling),
    (NVFP4Quantizer, NVFP4BlockScaling),
)


def _compatible_recipe(quantizer: Any) -> type | None:
    for qcls, rcls in _COMPATIBLE:
        if type(quantizer) is qcls:
            return rcls
    return None


def _related(a: Recipe, b: Recipe) -> bool:
    return isinstance(a, type(b)) or isinstance(b, type(a))


@torch.no_grad()
def check_recipe_change(module: Any, recipe: Recipe) -> None:
    previous = getattr(module, "_last_recipe_obj", None)
    if previous is not None and not _related(previous, recipe):
        warnings.warn(
            f"{type(module).__name__}: Recipe type changed from {type(previous).__name__} to "
            f"{type(recipe).__name__}. This may affect model behavior.", stacklevel=4)
        module._fp8_workspaces.clear()  # TE's: casts of the old recipe
    fp8_params = [(n, p) for n, p in module._parameters.items()
                  if isinstance(p, QuantizedTensor) and p._quantizer is not None]
    if not fp8_params:
        return
    for name, p in fp8_params:
        compatible = _compatible_recipe(p._quantizer)
        if compatible is not None and not isinstance(recipe, compatible):
            raise RuntimeError(
                f"Recipe mismatch for '{name}': tensor supports recipe {compatible.__name__}, but "
                f"got {type(recipe).__name__}. Please check the recipes assigned during "
                "quantized_model_init() and autocast() calls."
            )
    built_for = getattr(module, "_fp8_init_recipe", None)
    if built_for is None or recipe is built_for or recipe == built_for:
        return
    from .base import weight_param_quantizer

    for name, p in fp8_params:
        old = p._quantizer
        new = weight_param_quantizer(type(module).__name__, recipe, p)
        if isinstance(old, Float8Quantizer) and isinstance(new, Float8Quantizer):
            new.scale.copy_(old.scale.reshape(new.scale.shape))
            new.amax.copy_(old.amax.reshape(new.amax.shape))
        warnings.warn(f"{type(module).__name__}.{name}: Quantizer is being updated, this may "
                      "affect model behavior", stacklevel=4)
        p._quantizer = new
    module._fp8_init_recipe = recipe
