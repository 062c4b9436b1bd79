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
        # TE-JAX counts NVFP4_2D here too: its 16x16 scales are repeated to 1x16 for the GEMM.
        return self is ScalingMode.MXFP8_1D_SCALING or self.is_nvfp4_scaling

    @property
    def is_block_scaling(self) -> bool:
        return self.is_1d_block_scaling() or self is ScalingMode.NVFP4_2D_SCALING

    @property
    def is_mxfp8_scaling(self) -> bool:
        return self is ScalingMode.MXFP8_1D_SCALING

    @property
    def is_nvfp4_scaling(self) -> bool:
        return self in (ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING)

    @property
    def is_colwise_transposed(self) -> bool:
        """Whether the column-wise copy is stored transposed ("T"): NVFP4's is (the core writes
        it so); the lite keeps the per-tensor modes' column-wise copy in the source order."""
        return self.is_nvfp4_scaling

    def get_compatible_q_dtypes(self) -> set:
        """The dtypes a quantizer of this mode may produce (TE's sets)."""
        if self.is_nvfp4_scaling:
            return {jnp.float4_e2m1fn}
        if self is ScalingMode.NO_SCALING:
            return {jnp.float16, jnp.bfloat16, jnp.float32}
        return {jnp.float8_e5m2, jnp.float8_e4m3fn}

    def get_scale_dtype(self):
        """float32 for per-tensor modes (and no scaling), E8M0 for MXFP8's block scales, E4M3 for
        NVFP4's."""
        if self.is_nvfp4_scaling:
            return jnp.float8_e4m3fn
        return jnp.float8_e8m0fnu if self.is_mxfp8_scaling else jnp.float32

    def get_data_layout(self) -> str:
        """Row-wise / column-wise data layouts: "NT" for NVFP4 (its column-wise copy is the
        transpose, as TE's), "NN" otherwise (the lite keeps the per-tensor modes' column-wise
        copy in the source layout, where TE transposes it)."""
        return "NT" if self.is_nvfp4_scaling else "NN"

    def get_scale_shape(self, data_shape, data_layout="N", is_colwise=False, is_padded=True,
                        flatten_axis=-1, broadcast_2d_scale_shape_to_1d=False) -> tuple:
        """The scale_inv shape TE allocates for `data_shape`: (1,) per tensor ((0,) for an empty
        tensor or no scaling); block modes: one scale per block of the 2-D view split at
        `flatten_axis` (MXFP8 1x32, NVFP4 1x16, NVFP4_2D 16x16, which
        `broadcast_2d_scale_shape_to_1d` repeats over the block's rows), the block counts padded
        to 128 x 4 (row-wise; 4 x 128 column-wise in the "N" layout) when `is_padded`. A
        column-wise "T" copy (NVFP4) is `data_shape` as stored, `flatten_axis` given for the
        source ("N") layout: its scales are the row-wise ones of the stored array."""
        shape = tuple(int(d) for d in data_shape)
        layout = self.get_data_layout()[1 if is_colwise else 0]
        if data_layout != layout:
            raise ValueError(f"ScalingMode.get_scale_shape: data_layout: expected {layout!r} for "
                             f"{'column' if is_colwise else 'row'}-wise {self.name}, got "
                             f"{data_layout!r}")
        if self is ScalingMode.NO_SCALING:
            return (0,)
        if self.is_tensor_scaling():
            return (0,) if math.prod(shape) == 0 else (1,)
        nd = len(shape)
        if nd < 2 or not -nd < flatten_axis < nd or flatten_axis % nd == 0:
            raise ValueError(f"ScalingMode.get_scale_shape: flatten_axis: expected an axis splitting "
                             f"{shape} into two non-empty parts, got {flatten_axis}")
        fa = flatten_axis % nd
        if is_colwise and layout == "T":  # the stored transpose: its own row-wise scales
            is_colwise, fa = False, nd - fa
        block = {ScalingMode.MXFP8_1D_SCALING: (1, 32), ScalingMode.NVFP4_1D_SCALING: (1, 16),
                 ScalingMode.NVFP4_2D_SCALING: (16, 16)}[self]
        if broadcast_2d_scale_shape_to_1d and block[0] > 1:
            block = (1, block[1])
        first, last = math.prod(shape[:fa]), math.prod(shape[fa:])
        # (block rows, block cols) and padding of the scale grid, per direction.
        (bx, by), (ax, ay) = (block[::-1], (4, 128)) if is_colwise else (block, (128, 4))
        if first % bx or last % by or shape[fa - 1] % bx or shape[-1] % by:
            raise ValueError(f"ScalingMode.get_scale_shape: data_shape: expected the 2-D view of "
                             f"{shape} (split at axis {fa}) divisible by blocks of {bx}x{by}")
        nx, ny = first // bx, last // by
        if is_padded:
            nx, ny = -(-nx // ax) * ax, -(-ny // ay) * ay
        return (*_spread(shape[:fa], nx, bx), *_spread(shape[fa:], ny, by))

    def get_scale_shape_2x(self, data_shape, is_padded=True, flatten_axis=-1,
                           broadcast_2d_scale_shape_to_1d=False) -> tuple:
        """(row-wise scale shape, column-wise scale shape); a "T" column-wise copy's shape is
        that of the transposed data (TE's rule)."""
        shape = tuple(int(d) for d in data_shape)
        rl, cl = self.get_data_layout()
        row = self.get_scale_shape(shape, rl, False, is_padded, flatten_axis,
                                   broadcast_2d_scale_shape_to_1d)
        col_shape = shape
        if cl == "T":
            fa = flatten_axis % len(shape)
            col_shape = shape[fa:] + shape[:fa]
        col = self.get_scale_shape(col_shape, cl, True, is_padded, flatten_axis,
                                   broadcast_2d_scale_shape_to_1d)
        return row, col


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
