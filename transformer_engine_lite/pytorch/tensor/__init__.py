"""TE's quantized tensors and quantizers (transformer_engine.pytorch.tensor)."""

import torch as _torch

from .float8_tensor import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor
from .float8_tensor import rebuild_float8_tensor as _rebuild_f8
from .nvfp4_tensor import NVFP4Quantizer, NVFP4Tensor, NVFP4TensorStorage
from .nvfp4_tensor import rebuild_nvfp4_tensor as _rebuild_nv
from .float8_blockwise_tensor import (
    Float8BlockQuantizer,
    Float8BlockwiseQTensor,
    Float8BlockwiseQTensorStorage,
)
from .float8_blockwise_tensor import rebuild_float8_blockwise_tensor as _rebuild_fb
from .mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor, MXFP8TensorStorage
from .mxfp8_tensor import rebuild_mxfp8_tensor as _rebuild_mx
from .quantized_tensor import QuantizedTensor, QuantizedTensorStorage, Quantizer
from .hybrid_tensor import HybridQuantizedTensor, HybridQuantizer
from .hybrid_tensor import _rebuild_hybrid
from .identity_tensor import IdentityQuantizer
from .storage.hybrid_tensor_storage import HybridQuantizedTensorStorage
from .storage.grouped_tensor_storage import GroupedTensorStorage
from .grouped_tensor import GroupedTensor

# torch.load(weights_only=True) of a state_dict holding FP8 parameters (fp8_model_init): the two
# rebuild functions take plain tensors and values only.
_torch.serialization.add_safe_globals([_rebuild_f8, _rebuild_mx, _rebuild_fb, _rebuild_nv])
# (a HybridQuantizedTensor pickles its quantizer objects: torch.load needs weights_only=False)

__all__ = [
    "Float8BlockQuantizer",
    "Float8BlockwiseQTensor",
    "Float8BlockwiseQTensorStorage",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "GroupedTensor",
    "GroupedTensorStorage",
    "HybridQuantizedTensor",
    "HybridQuantizedTensorStorage",
    "HybridQuantizer",
    "IdentityQuantizer",
    "MXFP8Quantizer",
    "MXFP8Tensor",
    "MXFP8TensorStorage",
    "NVFP4Quantizer",
    "NVFP4Tensor",
    "NVFP4TensorStorage",
    "QuantizedTensor",
    "QuantizedTensorStorage",
    "Quantizer",
]
