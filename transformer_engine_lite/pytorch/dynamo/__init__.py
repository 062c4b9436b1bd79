"""torch.compile support (TE's `transformer_engine.pytorch.dynamo`): value-opaque quantizers, which
custom ops can take and compiled graphs bake in as constants, and TensorSpec, a data-free
description of a (quantized) tensor."""

from .quantizer_opaque import is_value_opaque_quantizer, register_value_opaque_quantizer
from .tensor_spec import TensorSpec, to_tensor_spec

__all__ = [
    "TensorSpec",
    "is_value_opaque_quantizer",
    "register_value_opaque_quantizer",
    "to_tensor_spec",
]
