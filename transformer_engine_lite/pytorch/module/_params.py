"""Parameter helpers of the modules: the quantizer of an FP8 weight parameter
(quantized_model_init), an FP8 parameter's device move, and TE's deferred initialization
(parameters created on "meta" are allocated by reset_parameters())."""

from __future__ import annotations

import torch

from ...common.recipe import Recipe
from ..fp8 import get_fp8_torch_dtype
from ..tensor import (
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    QuantizedTensor,
    Quantizer,
)

__all__ = ["materialize_params", "weight_param_quantizer"]


def weight_param_quantizer(owner: str, recipe: Recipe, weight: torch.Tensor) -> Quantizer:
    """The quantizer of an FP8 weight parameter under quantized_model_init(recipe): the bytes it
    produces are those the recipe's forward would quantize the weight to (delayed scaling: TE's
    initial scale 1.0; current scaling: the recipe's fp8_quant_fwd_weight options). It is also
    what re-quantizes the parameter after an in-place update (optimizer step, copy_); under
    delayed scaling each re-quantization uses the scale (with the recipe's margin) computed from
    the previous one's amax, as TE's weight amax history would give."""
    fmt = getattr(recipe, "fp8_format", None)
    if recipe.delayed():
        dt = get_fp8_torch_dtype(fmt, True)
        one = torch.ones(1, dtype=torch.float32, device=weight.device)
        return Float8Quantizer(one, torch.zeros_like(one), dt, update_margin=float(recipe.margin))
    if recipe.float8_current_scaling():
        qp = recipe.fp8_quant_fwd_weight
        dt = get_fp8_torch_dtype(fmt, True)
        return Float8CurrentScalingQuantizer(
            dt,
            weight.device,
            force_pow_2_scales=bool(qp.power_2_scale),
            amax_epsilon=float(qp.amax_epsilon),
        )
    if recipe.mxfp8():
        return MXFP8Quantizer(get_fp8_torch_dtype(fmt, True))
    if recipe.float8_block_scaling():
        from ..tensor import Float8BlockQuantizer

        qp = recipe.fp8_quant_fwd_weight
        return Float8BlockQuantizer(
            get_fp8_torch_dtype(fmt, True), rowwise=True, columnwise=True,
            amax_epsilon=float(qp.amax_epsilon), force_pow_2_scales=bool(qp.power_2_scale),
            block_scaling_dim=recipe.w_block_scaling_dim)
    if recipe.nvfp4():  # the recipe's weight cast: 16x16 blocks unless disabled, no RHT
        from ..quantization import block_spec, nvfp4_quantizer

        return nvfp4_quantizer(block_spec(recipe, "weight"))
    raise ValueError(
        f"{owner}: quantized_model_init recipe: expected DelayedScaling, Float8CurrentScaling, "
        f"MXFP8BlockScaling, Float8BlockScaling or NVFP4BlockScaling for FP8 weight parameters, got "
        f"{type(recipe).__name__}"
    )


def _moved(param: QuantizedTensor, device: torch.device) -> torch.nn.Parameter:
    """An FP8 parameter's copy on `device` (inner tensors and the quantizer's scale / amax)."""
    new = param._shallow_copy()
    for name in new._inner_names():
        t = getattr(new, name)
        setattr(new, name, None if t is None else t.to(device))
    q = new._quantizer
    if isinstance(q, Float8Quantizer):
        new._quantizer = Float8Quantizer(
            q.scale.to(device), q.amax.to(device), q.dtype, update_margin=q.update_margin
        )
    out = torch.nn.Parameter(new, requires_grad=param.requires_grad)
    for k, v in param.__dict__.items():
        if k not in new._inner_names() and k != "_quantizer":
            setattr(out, k, v)
    return out


def materialize_params(module: torch.nn.Module) -> None:
    """TE's deferred initialization: each of the module's own parameters on the "meta" device is
    replaced by an uninitialized one of the same shape and dtype on the default device ("cuda"
    when a GPU is present, else the CPU), keeping its attributes (sequence_parallel, TP tags);
    the caller initializes it. Parameters elsewhere are left as they are."""
    from .base import default_device

    for name, p in list(module._parameters.items()):
        if p is None or p.device.type != "meta":
            continue
        new = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=default_device()),
                                 requires_grad=p.requires_grad)
        new.__dict__.update(p.__dict__)
        module._parameters[name] = new
