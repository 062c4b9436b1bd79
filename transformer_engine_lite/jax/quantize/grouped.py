"""Grouped (MoE) quantization: TE-JAX's GroupedQuantizer (one quantizer per group), and the grouped
tensors grouped_quantize / grouped_gemm pass around.

A group is a run of rows along axis 0: ragged (`first_dims` = group sizes, on device, summing to the
rows) or one leading index per group (`first_dims` None, x [G, ...]). Per-tensor recipes give each
group its own scale (its own quantizer's: delayed state, or the group's current amax); MXFP8 blocks
are those of the whole 2-D view, which equal per-group blocks when every group size is a multiple
of 32 (TE's grouped MXFP8 kernels require multiples of 128). Data keep the source shape ("N").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.tree_util import register_pytree_node_class

from .. import cpp_extensions as tex
from .quantizer import Quantizer, _pytree
from .scaling_modes import ScalingMode

__all__ = ["GroupedNoScaleTensor", "GroupedQuantizer", "GroupedScaledTensor1x"]


@_pytree
class GroupedQuantizer(Quantizer):
    """`n_groups` quantizers of one recipe (QuantizerFactory.create(n_groups=...))."""

    n_groups: int = 1
    quantizers: tuple = ()
    _array_fields = ("quantizers",)

    def quantize(self, x, is_rowwise=None, is_colwise=None, dq_dtype=None, flatten_axis=-1,
                 group_sizes=None):
        from ..cpp_extensions.grouped import grouped_quantize

        return grouped_quantize(x, self, group_sizes, flatten_axis, is_rowwise, is_colwise,
                                dq_dtype)


def _split_sizes(first_dims, n_rows, n_groups):
    if first_dims is None:
        return [1] * n_groups if n_rows == n_groups else None
    return [int(v) for v in np.asarray(first_dims)]


@register_pytree_node_class
@dataclass
class GroupedNoScaleTensor:
    data: Any
    amax: Any = None
    first_dims: Any = None
    last_dims: Any = None
    original_shape: tuple = ()

    def tree_flatten(self):
        children = (self.data, self.amax, self.first_dims, self.last_dims)
        return children, (tuple(self.original_shape),)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, aux[0])

    @property
    def ndim(self):
        return self.data.ndim

    def dequantize(self):
        return self.data


@register_pytree_node_class
@dataclass
class GroupedScaledTensor1x:
    """data (source shape), scale_inv: [G] float32 per-group for per-tensor recipes, the 2-D view's
    uint8 E8M0 blocks for MXFP8. dequantize() (eager: the group sizes are read) -> one array per
    group."""

    data: Any
    scale_inv: Any
    amax: Any = None
    first_dims: Any = None
    last_dims: Any = None
    original_shape: tuple = ()
    scaling_mode: ScalingMode = ScalingMode.DELAYED_TENSOR_SCALING
    dq_dtype: Any = jnp.bfloat16
    is_colwise: bool = False
    flatten_axis: int = 1
    n_groups: int = 1
    has_rht_applied: bool = False  # NVFP4 column-wise copies (cpp_extensions/grouped_nvfp4.py)

    def tree_flatten(self):
        return ((self.data, self.scale_inv, self.amax, self.first_dims, self.last_dims),
                (tuple(self.original_shape), self.scaling_mode, self.dq_dtype, self.is_colwise,
                 self.flatten_axis, self.n_groups, self.has_rht_applied))

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, *aux)

    @property
    def data_layout(self) -> str:
        nvfp4 = ScalingMode(self.scaling_mode).is_nvfp4_scaling
        return "T" if nvfp4 and self.is_colwise else "N"

    @property
    def ndim(self):
        return self.data.ndim

    def dequantize_full(self, dtype=None):
        """The whole tensor dequantized (traceable)."""
        dtype = dtype or self.dq_dtype
        if self.scaling_mode == ScalingMode.MXFP8_1D_SCALING:
            fa = self.flatten_axis
            shape = self.data.shape
            x2 = self.data.reshape(int(np.prod(shape[:fa])), int(np.prod(shape[fa:])))
            return tex.dequantize_mxfp8(x2, self.scale_inv, self.is_colwise, dtype).reshape(shape)
        from ..cpp_extensions.grouped import group_ids

        if ScalingMode(self.scaling_mode).is_nvfp4_scaling:
            return self._nvfp4_full(dtype)
        gid = group_ids(self.first_dims, self.data.shape[0], self.n_groups)
        si = self.scale_inv[gid].reshape((-1,) + (1,) * (self.data.ndim - 1))
        return (self.data.astype(jnp.float32) * si).astype(dtype)

    def dequantize(self, dtype=None):
        full = self.dequantize_full(dtype)
        sizes = _split_sizes(self.first_dims, full.shape[0], self.n_groups)
        return jnp.split(full, np.cumsum(sizes)[:-1].tolist(), axis=0)

    def _nvfp4_full(self, dtype):
        """Each group's rows dequantized with its own amax, in the source layout (a "T" copy is
        transposed back, its Hadamard transform undone)."""
        from ..cpp_extensions.grouped import group_ids
        from ..cpp_extensions.grouped_nvfp4 import group_copy

        shape = tuple(self.original_shape) or tuple(self.data.shape)
        gid = group_ids(self.first_dims, shape[0], self.n_groups)
        out = None
        for g in range(self.n_groups):
            v = group_copy(self, g).dequantize(jnp.float32)
            if self.is_colwise:  # "T": dims from flatten_axis on are the source's leading ones
                k = self.flatten_axis
                v = jnp.transpose(v, (*range(k, v.ndim), *range(k)))
            sel = (gid == g).reshape((-1,) + (1,) * (v.ndim - 1))
            out = v if out is None else jnp.where(sel, v, out)
        return out.astype(dtype)
