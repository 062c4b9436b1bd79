"""Quantizer factories mirroring the built-in recipes, for common.recipe.CustomRecipe.

A factory is called as qfactory(role) with a quantization.QuantizerRole (None for slots whose
consumer is unknown) and returns the quantizer of that slot. A CustomRecipe built from one of
these runs the same numerics as the recipe it mirrors (at that recipe's defaults), so it is the
starting point for overriding single roles or modules:

    def factory(role):
        if role is not None and role.name == "proj":
            return high_precision_factory(role)
        return current_scaling_factory(role)

    with autocast(recipe=CustomRecipe(qfactory=factory)):
        ...
"""

from __future__ import annotations

from typing import Any

from ..quantization import DelayedScalingRequest, QuantizerRole
from ..tensor.float8_tensor import Float8CurrentScalingQuantizer
from ..tensor.identity_tensor import IdentityQuantizer
from ..tensor.mxfp8_tensor import MXFP8Quantizer
from ..tex import DType

__all__ = [
    "current_scaling_factory",
    "delayed_scaling_factory",
    "float8_block_scaling_factory",
    "high_precision_factory",
    "mxfp8_factory",
    "nvfp4_factory",
]


def _check_role(factory: str, role: Any) -> None:
    if role is not None and not isinstance(role, QuantizerRole):
        raise TypeError(f"{factory}: role: expected a QuantizerRole or None, got "
                        f"{type(role).__name__}")


def _is_grad(role: QuantizerRole | None) -> bool:
    return role is not None and role.tensor_type == "grad_output"


def high_precision_factory(role: QuantizerRole | None) -> IdentityQuantizer:
    """No quantization for any role: the GEMMs run in the activation dtype, as outside autocast."""
    _check_role("high_precision_factory", role)
    return IdentityQuantizer()


def delayed_scaling_factory(role: QuantizerRole | None) -> DelayedScalingRequest:
    """DelayedScaling's defaults (HYBRID, history 1024, "max") as a request for module-managed
    scale / amax-history state. Modules of transformer_engine_lite do not serve such requests
    under a CustomRecipe (NotImplementedError there); use recipe.DelayedScaling."""
    _check_role("delayed_scaling_factory", role)
    from ...common.recipe import Format

    return DelayedScalingRequest(fp8_format=Format.HYBRID)


def current_scaling_factory(role: QuantizerRole | None) -> Float8CurrentScalingQuantizer:
    """Float8CurrentScaling's defaults: E5M2 for gradients (role tensor_type "grad_output"), E4M3
    for every other role; no power-of-two scales, amax epsilon 0."""
    _check_role("current_scaling_factory", role)
    dtype = DType.kFloat8E5M2 if _is_grad(role) else DType.kFloat8E4M3
    return Float8CurrentScalingQuantizer(dtype, force_pow_2_scales=False, amax_epsilon=0.0)


def mxfp8_factory(role: QuantizerRole | None) -> MXFP8Quantizer:
    """MXFP8BlockScaling's defaults: E4M3 for every role (TE's MXFP8 recipe default format),
    1x32 blocks with E8M0 scales."""
    _check_role("mxfp8_factory", role)
    return MXFP8Quantizer(DType.kFloat8E4M3)


def float8_block_scaling_factory(role: QuantizerRole | None) -> Any:
    """Float8BlockScaling's defaults: E4M3 for every role, power-of-two scales, amax epsilon 0;
    128x128 blocks for the weights of linear / grouped_linear modules, 1x128 tiles otherwise."""
    _check_role("float8_block_scaling_factory", role)
    from ..tensor import Float8BlockQuantizer

    is_weight = (role is not None and role.module_type in ("linear", "grouped_linear")
                 and role.tensor_type == "weight")
    return Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True,
                                amax_epsilon=0.0, force_pow_2_scales=True,
                                block_scaling_dim=2 if is_weight else 1)


def nvfp4_factory(role: QuantizerRole | None) -> Any:
    """NVFP4BlockScaling's defaults (TE's): linear weights 16x16 blocks; linear gradients the
    random Hadamard transform and stochastic rounding; every other role 1x16 with the RHT."""
    _check_role("nvfp4_factory", role)
    from ..tensor.nvfp4_tensor import NVFP4Quantizer

    linear = role is not None and role.module_type in ("linear", "grouped_linear")
    if linear and role.tensor_type == "weight":
        return NVFP4Quantizer(with_2d_quantization=True)
    grad = linear and role.tensor_type == "grad_output"
    return NVFP4Quantizer(with_rht=True, with_post_rht_amax=True, stochastic_rounding=grad)
