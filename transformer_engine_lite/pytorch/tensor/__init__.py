"""TE's quantized tensors and quantizers (transformer_engine.pytorch.tensor)."""

from .float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor
from .mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor
from .quantized_tensor import QuantizedTensor, Quantizer

__all__ = [
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "MXFP8Quantizer",
    "MXFP8Tensor",
    "QuantizedTensor",
    "Quantizer",
]
