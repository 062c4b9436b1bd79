"""TE's block-scaled quantizers and tensors (NVFP4, Float8 block scaling): named, not implemented.

The recipes behind them are not implemented in transformer_engine_lite (is_nvfp4_available() and
is_fp8_block_scaling_available() report False with the reason). The classes exist so that TE code
can name them (isinstance checks, imports); making one raises NotImplementedError naming it.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ..dynamo.quantizer_opaque import register_value_opaque_quantizer
from .quantized_tensor import QuantizedTensor, Quantizer

__all__ = ["Float8BlockQuantizer", "Float8BlockwiseQTensor", "NVFP4Quantizer", "NVFP4Tensor"]


def _refuse(name: str, recipe: str) -> NoReturn:
    raise NotImplementedError(
        f"{name}: {recipe} is not implemented in transformer_engine_lite (no {name} can be made)"
    )


class NVFP4Quantizer(Quantizer):
    """TE's NVFP4 quantizer (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse("NVFP4Quantizer", "NVFP4BlockScaling")


class Float8BlockQuantizer(Quantizer):
    """TE's Float8 block-scaling quantizer (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse("Float8BlockQuantizer", "Float8BlockScaling")


class NVFP4Tensor(QuantizedTensor):
    """TE's NVFP4 tensor (see the module docstring)."""

    @staticmethod
    def __new__(cls, *args: Any, **kwargs: Any) -> NVFP4Tensor:
        _refuse("NVFP4Tensor", "NVFP4BlockScaling")


class Float8BlockwiseQTensor(QuantizedTensor):
    """TE's Float8 block-scaled tensor (see the module docstring)."""

    @staticmethod
    def __new__(cls, *args: Any, **kwargs: Any) -> Float8BlockwiseQTensor:
        _refuse("Float8BlockwiseQTensor", "Float8BlockScaling")


# Registered as torch.compile value types like the implemented quantizers, so that TE code naming
# them in a custom op's schema (get_opaque_type_name) still defines its ops; making one still raises.
register_value_opaque_quantizer(NVFP4Quantizer)
register_value_opaque_quantizer(Float8BlockQuantizer)
