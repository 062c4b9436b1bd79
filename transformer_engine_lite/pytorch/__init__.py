"""transformer_engine_lite.pytorch: TransformerEngine's PyTorch API over the te_lite dispatcher ops.

Importing it loads the C++ extension and registers torch.ops.te_lite.* (see te_lite_ops.py), then
exposes TE's public API layered on those ops: the fusible-operations API (`ops`), the modules
(Linear, LayerNorm, RMSNorm, LayerNormLinear, LayerNormMLP), attention (DotProductAttention,
MultiheadAttention, TransformerLayer, the KV cache InferenceParams), rotary position embeddings (RotaryPositionEmbedding,
apply_rotary_pos_emb), fp8_autocast / autocast, quantized_model_init / fp8_model_init, the
recipes (`recipe`, shared with the JAX front end) and the availability checks.
"""

from ..common import recipe
from . import te_lite_ops  # registers torch.ops.te_lite: extension, fake kernels, autograd
from . import ops  # TE's fusible-operations API (transformer_engine.pytorch.ops)
from . import router  # TE's transformer_engine.pytorch.router (fused MoE routing)
from . import optimizers  # TE's FusedAdam, FusedSGD, multi_tensor_applier and multi-tensor ops
from .attention import DotProductAttention, InferenceParams, MultiheadAttention
from .attention.rope import RotaryPositionEmbedding, apply_rotary_pos_emb
from .checkpoint import checkpoint
from .cpu_offload import get_cpu_offload_context
from .cross_entropy import parallel_cross_entropy  # TE's pytorch.cross_entropy
from .permutation import (
    moe_permute,
    moe_permute_with_probs,
    moe_sort_chunks_by_index,
    moe_sort_chunks_by_index_with_probs,
    moe_unpermute,
)
from .distributed import CudaRNGStatesTracker, allreduce_sequence_parallel_grads
from .fp8 import (
    FP8GlobalStateManager,
    autocast,
    fp8_autocast,
    fp8_model_init,
    get_default_fp8_recipe,
    get_default_recipe,
    is_fp8_available,
    is_fp8_block_scaling_available,
    is_mxfp8_available,
    is_nvfp4_available,
    quantized_model_init,
)
from .module import (
    GroupedLinear,
    LayerNorm,
    LayerNormLinear,
    LayerNormMLP,
    Linear,
    RMSNorm,
    TransformerEngineBaseModule,
)
from .export import onnx_export
from .graph import make_graphed_callables
from .module.userbuffers import UserBufferQuantizationMode, destroy_ub, initialize_ub
from .module.fp8_padding import Fp8Padding, Fp8Unpadding
from .tensor import (
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    MXFP8Quantizer,
    MXFP8Tensor,
    QuantizedTensor,
    Quantizer,
)
from .tex import DType
from .transformer import TransformerLayer
from .utils import (
    get_cudnn_version,
    get_device_compute_capability,
    is_bf16_available,
    torch_version,
)

__all__ = [
    "UserBufferQuantizationMode",
    "destroy_ub",
    "initialize_ub",
    "onnx_export",
    "torch_version",
    "get_cpu_offload_context",
    "parallel_cross_entropy",
    "moe_permute",
    "moe_permute_with_probs",
    "moe_sort_chunks_by_index",
    "moe_sort_chunks_by_index_with_probs",
    "moe_unpermute",
    "CudaRNGStatesTracker",
    "DType",
    "Fp8Padding",
    "Fp8Unpadding",
    "get_default_recipe",
    "InferenceParams",
    "make_graphed_callables",
    "DotProductAttention",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "GroupedLinear",
    "MXFP8Quantizer",
    "MXFP8Tensor",
    "QuantizedTensor",
    "Quantizer",
    "checkpoint",
    "get_cudnn_version",
    "get_device_compute_capability",
    "is_bf16_available",
    "is_fp8_block_scaling_available",
    "is_nvfp4_available",
    "FP8GlobalStateManager",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "MultiheadAttention",
    "RMSNorm",
    "RotaryPositionEmbedding",
    "TransformerEngineBaseModule",
    "TransformerLayer",
    "allreduce_sequence_parallel_grads",
    "apply_rotary_pos_emb",
    "autocast",
    "fp8_autocast",
    "fp8_model_init",
    "get_default_fp8_recipe",
    "is_fp8_available",
    "is_mxfp8_available",
    "ops",
    "quantized_model_init",
    "recipe",
]

# Quantized-tensor storages and the block-scaled classes TE names.
from .tensor import (  # noqa: E402
    Float8BlockQuantizer,
    Float8BlockwiseQTensor,
    HybridQuantizedTensor,
    HybridQuantizedTensorStorage,
    HybridQuantizer,
    IdentityQuantizer,
    MXFP8TensorStorage,
    NVFP4Quantizer,
    NVFP4Tensor,
    NVFP4TensorStorage,
    QuantizedTensorStorage,
)

__all__ += [
    "Float8BlockQuantizer",
    "Float8BlockwiseQTensor",
    "HybridQuantizedTensor",
    "HybridQuantizedTensorStorage",
    "HybridQuantizer",
    "IdentityQuantizer",
    "MXFP8TensorStorage",
    "NVFP4Quantizer",
    "NVFP4Tensor",
    "NVFP4TensorStorage",
    "QuantizedTensorStorage",
]
