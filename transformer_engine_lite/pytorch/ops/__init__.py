"""TE's fusible-operations API (transformer_engine.pytorch.ops, TE 2.8 level).

Build a network from basic ops in a `Sequential`; consecutive ops run through an
`OperationFuser`, which substitutes fused ops where one of our kernels covers several ops (see
fuser.py for the list). Every op computes with the same kernels as the modules (BasicLinear is
te.Linear's FP8-aware GEMM), with autograd for the backward.
"""

from .basic import *  # noqa: F403
from .basic import __all__ as _basic_all
from .fuser import OperationFuser
from .linear import Linear
from .op import BasicOperation, FusedOperation, FusibleOperation, OperationContext
from .sequential import Sequential

__all__ = [
    *_basic_all,
    "BasicOperation",
    "FusedOperation",
    "FusibleOperation",
    "Linear",
    "OperationContext",
    "OperationFuser",
    "Sequential",
]
