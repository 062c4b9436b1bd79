"""TE's low-level PyTorch entry points (transformer_engine.pytorch.cpp_extensions) over
torch.ops.te_lite."""

from .gemm import general_gemm
from .grouped_gemm import general_grouped_gemm
from .grouped_tensor_gemm import general_grouped_gemm_for_grouped_tensor

__all__ = [
    "general_gemm",
    "general_grouped_gemm",
    "general_grouped_gemm_for_grouped_tensor",
]
