"""Single-tensor operations the op fuser runs (TE's transformer_engine.pytorch.ops.basic)."""

from .activation import GEGLU, GELU, QGEGLU, QGELU, ReGLU, ReLU, SiLU, SReGLU, SReLU, SwiGLU
from .add_extra_input import AddExtraInput
from .all_gather import AllGather
from .all_reduce import AllReduce
from .basic_linear import BasicLinear
from .bias import Bias
from .constant_scale import ConstantScale
from .dropout import Dropout
from .identity import Identity
from .l2normalization import L2Normalization
from .layer_norm import LayerNorm
from .make_extra_output import MakeExtraOutput
from .quantize import Quantize
from .reduce_scatter import ReduceScatter
from .reshape import Reshape
from .rmsnorm import RMSNorm

__all__ = [
    "AddExtraInput", "AllGather", "AllReduce", "BasicLinear", "Bias", "ConstantScale", "Dropout",
    "GEGLU", "GELU", "Identity", "L2Normalization", "LayerNorm", "MakeExtraOutput", "QGEGLU",
    "QGELU", "Quantize", "RMSNorm", "ReGLU", "ReLU", "ReduceScatter", "Reshape", "SReGLU", "SReLU",
    "SiLU", "SwiGLU",
]
