"""Mixed-format quantizer factories (TE's quantizer_factory_zoo), for CustomRecipe.

Each factory keeps TE's per-role dispatch: linear / grouped_linear inputs and weights become
HybridQuantizers (one format for the forward GEMM's rowwise operands, another for the backward
GEMMs' columnwise ones), gradients a plain quantizer of the backward format, every other role the
fallback format. The three GEMMs then pair one format each (fprop: weight.row x input.row; dgrad:
weight.col x grad_output.row; wgrad: input.col x grad_output.col). Illustrative recipes, as TE
says of its own: not tuned or validated defaults.

A weight's backward copy is quantized from its dequantized forward copy where TE's does so
(columnwise_source="rowwise_dequantized"), so forward and backward see the same numbers.
"""

from __future__ import annotations

from typing import Any

from ..quantization import QuantizerRole
from ..tensor.hybrid_tensor import HybridQuantizer
from ..tensor.identity_tensor import IdentityQuantizer
from ..tex import DType
from .quantizer_factories import _check_role, mxfp8_factory, nvfp4_factory

__all__ = [
    "high_precision_fwd_mxfp8_bwd_factory",
    "mxfp8_fwd_high_precision_bwd_factory",
    "mxfp8_fwd_nvfp4_bwd_factory",
    "nvfp4_1d_weight_factory",
    "nvfp4_row_scaled_fwd_high_precision_bwd_factory",
    "nvfp4_row_scaled_fwd_mxfp8_bwd_factory",
]

_LINEAR = ("linear", "grouped_linear")


def _tensor_type(factory: str, role: QuantizerRole | None, modules: tuple[str, ...] = _LINEAR
                 ) -> str | None:
    """The role's tensor_type when it belongs to one of `modules`, else None."""
    _check_role(factory, role)
    return role.tensor_type if role is not None and role.module_type in modules else None


def _plain_nvfp4(*, row_scaled_nvfp4: bool = False) -> Any:
    """NVFP4 1x16 without RHT, stochastic rounding or 2D blocks (row-scaled NVFP4 is fprop-only
    and takes none of them)."""
    from ..tensor import NVFP4Quantizer

    return NVFP4Quantizer(fp4_dtype=DType.kFloat4E2M1, with_rht=False, with_post_rht_amax=False,
                          with_2d_quantization=False, stochastic_rounding=False,
                          row_scaled_nvfp4=row_scaled_nvfp4)


def high_precision_fwd_mxfp8_bwd_factory(role: QuantizerRole | None) -> Any:
    """High-precision forward, MXFP8 backward: linear gradients MXFP8, every other role
    Hybrid(rowwise=IdentityQuantizer, columnwise=MXFP8)."""
    if _tensor_type("high_precision_fwd_mxfp8_bwd_factory", role) == "grad_output":
        return mxfp8_factory(role)
    return HybridQuantizer(rowwise_quantizer=IdentityQuantizer(),
                           columnwise_quantizer=mxfp8_factory(role))


def mxfp8_fwd_nvfp4_bwd_factory(role: QuantizerRole | None) -> Any:
    """MXFP8 forward, NVFP4 (1D) backward: linear inputs Hybrid(MXFP8, NVFP4 of the input role,
    from the input), weights Hybrid(MXFP8, plain NVFP4, from the dequantized MXFP8 weight),
    gradients NVFP4 of the gradient role, everything else MXFP8."""
    kind = _tensor_type("mxfp8_fwd_nvfp4_bwd_factory", role)
    if kind == "input":
        return HybridQuantizer(rowwise_quantizer=mxfp8_factory(role),
                               columnwise_quantizer=nvfp4_factory(role),
                               columnwise_source="original")
    if kind == "weight":
        return HybridQuantizer(rowwise_quantizer=mxfp8_factory(role),
                               columnwise_quantizer=_plain_nvfp4(),
                               columnwise_source="rowwise_dequantized")
    if kind == "grad_output":
        return nvfp4_factory(role)
    return mxfp8_factory(role)


def nvfp4_1d_weight_factory(role: QuantizerRole | None) -> Any:
    """NVFP4 with a plain 1D weight in both directions (its backward copy from the dequantized
    forward one); every other role nvfp4_factory's."""
    if _tensor_type("nvfp4_1d_weight_factory", role) == "weight":
        return HybridQuantizer(rowwise_quantizer=_plain_nvfp4(),
                               columnwise_quantizer=_plain_nvfp4(),
                               columnwise_source="rowwise_dequantized")
    return nvfp4_factory(role)


def mxfp8_fwd_high_precision_bwd_factory(role: QuantizerRole | None) -> Any:
    """MXFP8 forward, high-precision backward (backward_override="dequantized" per direction):
    linear inputs / weights Hybrid(MXFP8, Identity from the dequantized MXFP8), gradients
    IdentityQuantizer, everything else MXFP8."""
    kind = _tensor_type("mxfp8_fwd_high_precision_bwd_factory", role)
    if kind in ("input", "weight"):
        return HybridQuantizer(rowwise_quantizer=mxfp8_factory(role),
                               columnwise_quantizer=IdentityQuantizer(),
                               columnwise_source="rowwise_dequantized")
    if kind == "grad_output":
        return IdentityQuantizer()
    return mxfp8_factory(role)


def nvfp4_row_scaled_fwd_mxfp8_bwd_factory(role: QuantizerRole | None) -> Any:
    """Row-scaled NVFP4 forward, MXFP8 backward for grouped_linear (TE's Composer-2-style MoE
    recipe): inputs Hybrid(row-scaled NVFP4, MXFP8), weights Hybrid(plain NVFP4, MXFP8), both
    backward copies from the dequantized forward ones; everything else MXFP8."""
    kind = _tensor_type("nvfp4_row_scaled_fwd_mxfp8_bwd_factory", role, ("grouped_linear",))
    if kind == "input":
        return HybridQuantizer(rowwise_quantizer=_plain_nvfp4(row_scaled_nvfp4=True),
                               columnwise_quantizer=mxfp8_factory(role),
                               columnwise_source="rowwise_dequantized")
    if kind == "weight":
        return HybridQuantizer(rowwise_quantizer=_plain_nvfp4(),
                               columnwise_quantizer=mxfp8_factory(role),
                               columnwise_source="rowwise_dequantized")
    return mxfp8_factory(role)


def nvfp4_row_scaled_fwd_high_precision_bwd_factory(role: QuantizerRole | None) -> Any:
    """Row-scaled NVFP4 forward, high-precision backward: linear inputs Hybrid(row-scaled NVFP4,
    Identity), weights Hybrid(plain NVFP4, Identity), both from the dequantized forward copies;
    gradients IdentityQuantizer; everything else plain NVFP4."""
    kind = _tensor_type("nvfp4_row_scaled_fwd_high_precision_bwd_factory", role)
    if kind == "input":
        return HybridQuantizer(rowwise_quantizer=_plain_nvfp4(row_scaled_nvfp4=True),
                               columnwise_quantizer=IdentityQuantizer(),
                               columnwise_source="rowwise_dequantized")
    if kind == "weight":
        return HybridQuantizer(rowwise_quantizer=_plain_nvfp4(),
                               columnwise_quantizer=IdentityQuantizer(),
                               columnwise_source="rowwise_dequantized")
    if kind == "grad_output":
        return IdentityQuantizer()
    return _plain_nvfp4()
