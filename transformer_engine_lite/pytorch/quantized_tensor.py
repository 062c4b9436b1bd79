"""TE's `transformer_engine.pytorch.quantized_tensor` (where TE >= 2.9 keeps these names); the
classes live in tensor/quantized_tensor.py."""

from .tensor.quantized_tensor import QuantizedTensor, Quantizer

__all__ = ["QuantizedTensor", "Quantizer"]
