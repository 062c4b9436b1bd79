"""Scaling modes and the enums TE-JAX names (values as TE's pybind JAXX_* enums)."""

from __future__ import annotations

import math
from enum import Enum, IntEnum

import jax.numpy as jnp

__all__ = ["AmaxComputeAlgo", "QuantizeLayout", "ScalingMode", "TensorSource"]


class ScalingMode(IntEnum):
    NO_SCALING = 0
    DELAYED_TENSOR_SCALING = 1
    MXFP8_1D_SCALING = 2
    CURRENT_TENSOR_SCALING = 3
    NVFP4_1D_SCALING = 4
    NVFP4_2D_SCALING = 5

    # TE-JAX: is_tensor_scaling() and is_1d_block_scaling() are methods, the other is_* properties.
    def is_tensor_scaling(self) -> bool:
        return self in (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING)

    def is_1d_block_scaling(self) -> bool:
        return self in (ScalingMode.MXFP8_1D_SCALING, ScalingMode.NVFP4_1D_SCALING)

    @property
    def is_block_scaling(self) -> bool:
        return self.is_1d_block_scaling() or self is ScalingMode.NVFP4_2D_SCALING

    @property
    def is_mxfp8_scaling(self) -> bool:
        return self is ScalingMode.MXFP8_1D_SCALING

    @property
    def is_nvfp4_scaling(self) -> bool:
        return self in (ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING)

    def _check_implemented(self, what: str) -> None:
        if self.is_nvfp4_scaling:
            raise NotImplementedError(f"ScalingMode.{what}: {self.name} is not implemented by "
                                      "transformer_engine_lite (NVFP4)")

    def get_compatible_q_dtypes(self) -> set:
        """The dtypes a quantizer of this mode may produce (TE's sets)."""
        if self.is_nvfp4_scaling:
            return {jnp.float4_e2m1fn}
        if self is ScalingMode.NO_SCALING:
            return {jnp.float16, jnp.bfloat16, jnp.float32}
        return {jnp.float8_e5m2, jnp.float8_e4m3fn}

    def get_scale_dtype(self):
        """float32 for per-tensor modes (and no scaling), E8M0 for MXFP8's block scales."""
        self._check_implemented("get_scale_dtype")
        return jnp.float8_e8m0fnu if self.is_mxfp8_scaling else jnp.float32

    def get_data_layout(self) -> str:
        """Row-wise / column-wise data layouts: "N" each here. The lite keeps column-wise data in
        the source layout for every mode (TE transposes it for the per-tensor modes, "NT")."""
        self._check_implemented("get_data_layout")
        return "NN"

    def get_scale_shape(self, data_shape, data_layout="N", is_colwise=False, is_padded=True,
                        flatten_axis=-1, broadcast_2d_scale_shape_to_1d=False) -> tuple:
        """The scale_inv shape TE allocates for `data_shape`: (1,) per tensor ((0,) for an empty
        tensor or no scaling); MXFP8: one E8M0 per 32 elements along the last dim (row-wise) or the
        flattened first dims (column-wise) of the 2-D view split at `flatten_axis`, the block
        counts padded to 128 x 4 (row-wise) / 4 x 128 (column-wise) when `is_padded`."""
        del broadcast_2d_scale_shape_to_1d
        self._check_implemented("get_scale_shape")
        if data_layout != "N":
            raise ValueError(f"ScalingMode.get_scale_shape: data_layout: expected 'N' (the lite's "
                             f"only layout), got {data_layout!r}")
        shape = tuple(int(d) for d in data_shape)
        if self is ScalingMode.NO_SCALING:
            return (0,)
        if self.is_tensor_scaling():
            return (0,) if math.prod(shape) == 0 else (1,)
        nd = len(shape)
        if nd < 2 or not -nd < flatten_axis < nd or flatten_axis % nd == 0:
            raise ValueError(f"ScalingMode.get_scale_shape: flatten_axis: expected an axis splitting "
                             f"{shape} into two non-empty parts, got {flatten_axis}")
        fa = flatten_axis % nd
        first, last = math.prod(shape[:fa]), math.prod(shape[fa:])
        # (block rows, block cols) and padding of the scale grid, per direction.
        (bx, by), (ax, ay) = ((32, 1), (4, 128)) if is_colwise else ((1, 32), (128, 4))
        if first % bx or last % by or shape[fa - 1] % bx or shape[-1] % by:
            raise ValueError(f"ScalingMode.get_scale_shape: data_shape: expected the 2-D view of "
                             f"{shape} (split at axis {fa}) divisible by blocks of {bx}x{by}")
        nx, ny = first // bx, last // by
        if is_padded:
            nx, ny = -(-nx // ax) * ax, -(-ny // ay) * ay
        return (*_spread(shape[:fa], nx, bx), *_spread(shape[fa:], ny, by))

    def get_scale_shape_2x(self, data_shape, is_padded=True, flatten_axis=-1,
                           broadcast_2d_scale_shape_to_1d=False) -> tuple:
        """(row-wise scale shape, column-wise scale shape)."""
        return tuple(self.get_scale_shape(data_shape, "N", colwise, is_padded, flatten_axis,
                                          broadcast_2d_scale_shape_to_1d)
                     for colwise in (False, True))


def _spread(dims, n_blocks, block) -> tuple:
    """Writes a (padded) block count over the dims it came from: the last dim gets its own block
    count, the middle dims stay, the first takes what is left (TE's scale-shape convention)."""
    if len(dims) == 1:
        return (n_blocks,)
    out = [dims[-1] // block]
    n_blocks //= out[0]
    for d in reversed(dims[1:-1]):
        out.insert(0, d)
        n_blocks //= d
    return (n_blocks, *out)


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
