"""Scaling modes and the enums TE-JAX names (values as TE's pybind JAXX_* enums)."""

from __future__ import annotations

from enum import Enum, IntEnum

__all__ = ["AmaxComputeAlgo", "QuantizeLayout", "ScalingMode", "TensorSource"]


class ScalingMode(IntEnum):
    NO_SCALING = 0
    DELAYED_TENSOR_SCALING = 1
    MXFP8_1D_SCALING = 2
    CURRENT_TENSOR_SCALING = 3
    NVFP4_1D_SCALING = 4
    NVFP4_2D_SCALING = 5

    @property
    def is_tensor_scaling(self) -> bool:
        return self in (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING)

    @property
    def is_1d_block_scaling(self) -> bool:
        return self is ScalingMode.MXFP8_1D_SCALING


class QuantizeLayout(IntEnum):
    ROWWISE = 0
    COLWISE = 1
    ROWWISE_COLWISE = 2

    @property
    def has_rowwise(self) -> bool:
        return self in (QuantizeLayout.ROWWISE, QuantizeLayout.ROWWISE_COLWISE)

    @property
    def has_colwise(self) -> bool:
        return self in (QuantizeLayout.COLWISE, QuantizeLayout.ROWWISE_COLWISE)


class TensorSource(Enum):
    X = 0
    KERNEL = 1
    DGRAD = 2


class AmaxComputeAlgo(Enum):
    MAX = "max"
    MOST_RECENT = "most_recent"
