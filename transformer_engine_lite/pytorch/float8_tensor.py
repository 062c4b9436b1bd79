"""TE's old import path of Float8Tensor (`transformer_engine.pytorch.float8_tensor`), kept by TE 2.x
for clients such as Megatron-Core; the class lives in tensor/float8_tensor.py."""

from .tensor.float8_tensor import Float8Tensor

__all__ = ["Float8Tensor"]
