"""TE's NVFP4 quantizer and tensor: named, not implemented.

NVFP4BlockScaling is not implemented in transformer_engine_lite (is_nvfp4_available() reports
False with the reason). The classes exist so that TE code can name them (isinstance checks,
imports); making one raises NotImplementedError naming it. Float8BlockScaling's classes live in
float8_blockwise_tensor.py (implemented).
"""

from __future__ import annotations

from typing import Any, NoReturn

from ..dynamo.quantizer_opaque import register_value_opaque_quantizer
from .quantized_tensor import QuantizedTensor, Quantizer

__all__ = ["NVFP4Quantizer", "NVFP4Tensor"]


def _refuse(name: str, recipe: str) -> NoReturn:
    raise NotImplementedError(
        f"{name}: {recipe} is not implemented in transformer_engine_lite (no {name} can be made)"
    )


class NVFP4Quantizer(Quantizer):
    """TE's NVFP4 quantizer (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse("NVFP4Quantizer", "NVFP4BlockScaling")


class NVFP4Tensor(QuantizedTensor):
    """TE's NVFP4 tensor (see the module docstring)."""

    @staticmethod
    def __new__(cls, *args: Any, **kwargs: Any) -> NVFP4Tensor:
        _refuse("NVFP4Tensor", "NVFP4BlockScaling")


# Registered as torch.compile value types like the implemented quantizers, so that TE code naming
# them in a custom op's schema (get_opaque_type_name) still defines its ops; making one still raises.
register_value_opaque_quantizer(NVFP4Quantizer)
