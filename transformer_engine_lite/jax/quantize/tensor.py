"""Quantized tensors as pytrees: ScaledTensor1x (one FP8 copy + its scale_inv), ScaledTensor2x
(row-wise and column-wise copies), NoScaleTensor (high precision + optional amax)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
from jax.tree_util import register_pytree_node_class

from .. import cpp_extensions as tex
from .scaling_modes import ScalingMode

__all__ = [
    "NoScaleTensor",
    "ScaledTensor",
    "ScaledTensor1x",
    "ScaledTensor2x",
    "ScaledTensorFactory",
]


class ScaledTensor:
    """Base class of the quantized tensors."""


@register_pytree_node_class
@dataclass
class NoScaleTensor(ScaledTensor):
    data: Any
    amax: Any = None

    def tree_flatten(self):
        return (self.data, self.amax), ()

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    def dequantize(self):
        return self.data

    @property
    def ndim(self):
        return self.data.ndim


@register_pytree_node_class
@dataclass
class ScaledTensor1x(ScaledTensor):
    """data (FP8 / FP4), scale_inv (float32 [1] per tensor, uint8 E8M0 blocks for MXFP8,
    float8_e4m3fn blocks for NVFP4).

    Per-tensor data keeps the source shape; MXFP8 column-wise data too (blocks run along the first
    dim of the 2-D view), so `is_colwise` only says which scales these are. NVFP4 (TE-JAX's
    layout): float4_e2m1fn data, the column-wise copy transposed ("T": the dims from
    `flatten_axis` on, then those before), unpadded E4M3 scales shaped as TE's get_scale_shape
    (2D blocks repeated over their rows), `amax` the copy's global amax (after the Hadamard
    transform when `has_rht_applied`), `flatten_axis` positive and in the data's own layout (a "T"
    copy's is ndim minus the source's, TE-JAX's convention)."""

    data: Any
    scale_inv: Any
    scaling_mode: ScalingMode = ScalingMode.DELAYED_TENSOR_SCALING
    dq_dtype: Any = jnp.bfloat16
    is_colwise: bool = False
    amax: Any = None
    orig_shape: tuple | None = None  # MXFP8: data is the 2-D view, this the tensor's shape
    flatten_axis: int = -1
    has_rht_applied: bool = False

    def tree_flatten(self):
        return (self.data, self.scale_inv, self.amax), (
            self.scaling_mode, self.dq_dtype, self.is_colwise, self.orig_shape, self.flatten_axis,
            self.has_rht_applied)

    @classmethod
    def tree_unflatten(cls, aux, children):
        data, scale_inv, amax = children
        return cls(data, scale_inv, aux[0], aux[1], aux[2], amax, aux[3], aux[4], aux[5])

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def data_layout(self) -> str:
        """TE-JAX's "N" (data in the tensor's own dim order) or "T" (transposed): "T" for an NVFP4
        column-wise copy; the other modes' column-wise copies keep the source order."""
        return "T" if self.is_colwise and ScalingMode(self.scaling_mode).is_nvfp4_scaling else "N"

    def dequantize(self, dtype=None):
        """The values in `dtype` (dq_dtype by default), in the data's layout (an NVFP4
        column-wise copy comes out transposed, as TE-JAX's; a Hadamard-transformed one is
        transformed back)."""
        dtype = dtype or self.dq_dtype
        if ScalingMode(self.scaling_mode).is_nvfp4_scaling:
            from .nvfp4 import dequantize_nvfp4_tensor

            return dequantize_nvfp4_tensor(self, dtype)
        if self.scaling_mode == ScalingMode.MXFP8_1D_SCALING:
            out = tex.dequantize_mxfp8(self.data, self.scale_inv, self.is_colwise, dtype)
            return out.reshape(self.orig_shape) if self.orig_shape is not None else out
        return tex.dequantize(self.data, self.scale_inv, dtype)


@register_pytree_node_class
@dataclass
class ScaledTensor2x(ScaledTensor):
    rowwise_tensor: ScaledTensor1x
    colwise_tensor: ScaledTensor1x

    def tree_flatten(self):
        return (self.rowwise_tensor, self.colwise_tensor), ()

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    def get_tensor(self, colwise: bool) -> ScaledTensor1x:
        return self.colwise_tensor if colwise else self.rowwise_tensor

    def dequantize(self, dtype=None):
        return self.rowwise_tensor.dequantize(dtype)


class ScaledTensorFactory:
    @staticmethod
    def create_1x(data, scale_inv, scaling_mode=ScalingMode.DELAYED_TENSOR_SCALING,
                  dq_dtype=jnp.bfloat16, is_colwise=False, amax=None, data_layout="N",
                  flatten_axis=-1, has_rht_applied=False, **_):
        """TE-JAX's factory: flatten_axis is given for the source layout and stored in the data's
        ("T": ndim minus it). The grouped-tensor arguments are taken and not needed."""
        fa = flatten_axis % data.ndim if data.ndim else flatten_axis
        if data_layout == "T":
            fa = data.ndim - fa
        return ScaledTensor1x(data, scale_inv, scaling_mode, dq_dtype, is_colwise, amax, None, fa,
                              has_rht_applied)

    @staticmethod
    def create_2x(rowwise, colwise):
        return ScaledTensor2x(rowwise, colwise)
