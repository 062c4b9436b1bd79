"""TE's quantized-tensor storages (transformer_engine.pytorch.tensor.storage): the buffers of a
quantized tensor without the torch.Tensor wrapper."""

from ..quantized_tensor import QuantizedTensorStorage
from .float8_blockwise_tensor_storage import Float8BlockwiseQTensorStorage
from .grouped_tensor_storage import GroupedTensorStorage
from .mxfp8_tensor_storage import MXFP8TensorStorage
from .nvfp4_tensor_storage import NVFP4TensorStorage

__all__ = [
    "Float8BlockwiseQTensorStorage",
    "GroupedTensorStorage",
    "MXFP8TensorStorage",
    "NVFP4TensorStorage",
    "QuantizedTensorStorage",
]
