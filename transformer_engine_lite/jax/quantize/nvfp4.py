"""NVFP4 in the JAX front end (TE-JAX's NVFP4Quantizer): quantize through the core
(cpp_extensions.nvfp4, the bytes of the PyTorch front end) into TE-JAX's ScaledTensor1x layout, and
dequantize it back.

Layout (TE-JAX's): float4_e2m1fn data of the logical shape, the column-wise copy transposed ("T":
dims from flatten_axis on, then the rest); unpadded float8_e4m3fn scales shaped by
ScalingMode.get_scale_shape (2D blocks repeated over their 16 rows, TE's broadcast to 1D); the
copy's fp32 global amax [1]. The core's buffers are the same values packed (two E2M1 per byte; a
bitcast, element 2j in the low nibble) with the scale grid padded: conversion is a bitcast and a
slice each way.

Random Hadamard transform (use_rht): applied by the core to the column-wise copy of
NVFP4_1D_SCALING only (TE-JAX's rule), with TE's fixed sign vector; its amax is the transformed
tensor's. Both operands of the wgrad GEMM carry it, so it cancels there; dequantize() of such a copy
alone applies the inverse.

Stochastic rounding: when `stochastic_rounding_rng_state` is set (TE-JAX: uint32 [num_devices, 4],
for the gradient quantizer), the core rounds stochastically with (seed, offset) = the state's first
16 bytes read as two little-endian int64 (state[0] | state[1] << 32, state[2] | state[3] << 32), as
TE-JAX's handler reads them; the same state gives the same bytes, a new state new draws. Flax
modules draw the state from the "sr_rng" stream (helper.QuantizeConfig.get_quantize_flax_meta).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from .. import cpp_extensions as tex
from ..cpp_extensions.nvfp4 import nvfp4_scale_grid
from ..cpp_extensions.nvfp4_sharded import (dequantize_nvfp4_nd, quantize_nvfp4_nd,
                                            scoped_nvfp4_amax)
from ..cpp_extensions.partitioning import lowering_mesh
from .hadamard import apply_rht, get_sign_from_vector, get_wgrad_sign_vector
from .quantizer import Quantizer, _pytree
from .scaling_modes import ScalingMode
from .tensor import NoScaleTensor, ScaledTensor1x, ScaledTensor2x

__all__ = ["NVFP4Quantizer"]


def _unpack(packed, shape):
    """uint8 [r, c/2] -> float4_e2m1fn of `shape` (a bitcast: low nibble first)."""
    return jax.lax.bitcast_convert_type(packed, jnp.float4_e2m1fn).reshape(shape)


def _pack(data, rows, cols):
    """float4_e2m1fn -> uint8 [rows, cols/2], the inverse of _unpack."""
    return jax.lax.bitcast_convert_type(data.reshape(rows, cols // 2, 2), jnp.uint8)


def _copy_split(t: ScaledTensor1x) -> int:
    """Where the stored copy's 2-D view splits its dims: flatten_axis, which TE-JAX gives a "T"
    copy in its own (transposed) layout."""
    return t.flatten_axis


@_pytree
class NVFP4Quantizer(Quantizer):
    """TE-JAX's NVFP4Quantizer: NVFP4_1D_SCALING (1x16 blocks) or NVFP4_2D_SCALING (16x16, the
    weights'), float4_e2m1fn data, use_rht and stochastic_rounding_rng_state as described in the
    module docstring."""

    q_dtype: Any = jnp.float4_e2m1fn
    scaling_mode: ScalingMode = ScalingMode.NVFP4_1D_SCALING
    data_layout: str = "NT"
    use_rht: bool = False
    stochastic_rounding_rng_state: Any = None
    _array_fields = ("stochastic_rounding_rng_state",)

    def __post_init__(self):
        if np.dtype(self.q_dtype) != np.dtype(jnp.float4_e2m1fn):
            raise ValueError(f"NVFP4Quantizer: q_dtype: expected float4_e2m1fn, got "
                             f"{np.dtype(self.q_dtype).name}")
        if not ScalingMode(self.scaling_mode).is_nvfp4_scaling:
            raise ValueError(f"NVFP4Quantizer: scaling_mode: expected NVFP4_1D_SCALING or "
                             f"NVFP4_2D_SCALING, got {ScalingMode(self.scaling_mode).name}")
        if self.data_layout != "NT":
            raise ValueError(f"NVFP4Quantizer: data_layout: expected 'NT' (row-wise as is, "
                             f"column-wise transposed), got {self.data_layout!r}")
        s = self.stochastic_rounding_rng_state
        if s is not None and (np.dtype(s.dtype) != np.uint32 or s.ndim != 2 or s.shape[1] != 4):
            raise ValueError("NVFP4Quantizer: stochastic_rounding_rng_state: expected uint32 "
                             f"[num_devices, 4], got {np.dtype(s.dtype).name} {tuple(s.shape)}")

    def get_data_layout(self) -> str:
        return self.data_layout

    def get_scale_dtype(self):
        return jnp.float8_e4m3fn

    def quantize(self, x, is_rowwise=None, is_colwise=None, dq_dtype=None, flatten_axis=-1,
                 amax_scope=None, transpose_batch_sequence=False):
        """amax_scope (an AmaxScope): the per-tensor amaxes (x's, and the post-RHT one of the
        column-wise copy) max-reduced over the scope's mesh axes before the quantize, as TE-JAX's
        NVFP4 path; None: the whole tensor's. Each shard then quantizes its own block with them
        (cpp_extensions.nvfp4_sharded)."""
        if isinstance(x, NoScaleTensor):  # its precomputed amax is not needed: the core takes it
            x = x.data
        row = self.q_layout.has_rowwise if is_rowwise is None else is_rowwise
        col = self.q_layout.has_colwise if is_colwise is None else is_colwise
        nd = x.ndim
        fa = flatten_axis + nd if flatten_axis < 0 else flatten_axis
        if not 0 < fa < nd:
            raise ValueError(f"NVFP4Quantizer.quantize: flatten_axis: expected an axis splitting "
                             f"{tuple(x.shape)} into two non-empty parts, got {flatten_axis}")
        mode = ScalingMode(self.scaling_mode)
        shape = tuple(x.shape)
        tshape = shape[fa:] + shape[:fa]
        rows, cols = math.prod(shape[:fa]), math.prod(shape[fa:])
        # TE-JAX's shape rules (blocks must tile the copies): get_scale_shape names the problem.
        if row:
            mode.get_scale_shape(shape, "N", False, False, fa)
        if col:
            mode.get_scale_shape(tshape, "T", True, False, fa)
        use_rht = bool(self.use_rht and col and mode == ScalingMode.NVFP4_1D_SCALING)
        mask = get_sign_from_vector(get_wgrad_sign_vector()) if use_rht else 0
        state = self.stochastic_rounding_rng_state
        # TE-JAX: the amaxes first (reduced over the scope), then a quantize with them per shard.
        ra = ca = None  # without a mesh every scope is the whole tensor: the core takes it
        if lowering_mesh() is not None:
            ra, ca = scoped_nvfp4_amax(x, amax_scope, transpose_batch_sequence, fa,
                                       mask if use_rht else None)
        r, rs, ra, c, cs, ca = quantize_nvfp4_nd(
            x, fa, ra, ca, row, col, two_d=mode == ScalingMode.NVFP4_2D_SCALING, rht=use_rht,
            rht_sign_mask=mask, rng_state=state, amax_scope=amax_scope,
            transpose_batch_sequence=transpose_batch_sequence)
        del rows, cols
        dq = dq_dtype or x.dtype
        out_r = out_c = None
        if row:
            s_shape = mode.get_scale_shape(shape, "N", False, False, fa, True)
            si = jax.lax.bitcast_convert_type(rs, jnp.float8_e4m3fn)
            out_r = ScaledTensor1x(_unpack(r, shape), si.reshape(s_shape), mode, dq, False, ra,
                                   None, fa, False)
        if col:
            s_shape = mode.get_scale_shape(tshape, "T", True, False, fa, True)
            si = jax.lax.bitcast_convert_type(cs, jnp.float8_e4m3fn)
            # flatten_axis of a "T" copy: in its own layout (TE-JAX's create_1x rule).
            out_c = ScaledTensor1x(_unpack(c, tshape), si.reshape(s_shape), mode, dq, True, ca,
                                   None, nd - fa, use_rht)
        if self.checkpoint_name is not None:  # as in Quantizer._wrap
            out_r, out_c = jax.tree_util.tree_map(
                lambda a: checkpoint_name(a, self.checkpoint_name), (out_r, out_c))
        if row and col:
            return ScaledTensor2x(out_r, out_c)
        return out_r if row else out_c


def _stored_values(t: ScaledTensor1x, dtype):
    """The stored copy's values (its own layout, transform kept) through the core's dequantize."""
    shape = tuple(t.data.shape)
    split = _copy_split(t)
    rows, cols = math.prod(shape[:split]), math.prod(shape[split:])
    si = t.scale_inv.reshape(*shape[:-1], shape[-1] // 16) if shape[-1] % 16 == 0 else None
    if si is not None and si.size == rows * cols // 16:  # per shard under a mesh (own amax)
        return dequantize_nvfp4_nd(t.data, si, t.amax, split, dtype)
    sc = jax.lax.bitcast_convert_type(t.scale_inv, jnp.uint8).reshape(rows, cols // 16)
    gr, gc = nvfp4_scale_grid(rows, cols)
    sc = jnp.pad(sc, ((0, gr - rows), (0, gc - sc.shape[1])))
    out = tex.dequantize_nvfp4(_pack(t.data, rows, cols), sc, t.amax, dtype)
    return out.reshape(shape)


def dequantize_nvfp4_tensor(t: ScaledTensor1x, dtype):
    """ScaledTensor1x.dequantize for NVFP4: values in the data's layout (TE-JAX's), a
    Hadamard-transformed copy transformed back (in float32)."""
    if not t.has_rht_applied:
        return _stored_values(t, dtype)
    return apply_rht(_stored_values(t, jnp.float32), inverse=True).astype(dtype)


def nvfp4_gemm_operand(t: ScaledTensor1x):
    """A GEMM operand in the source layout, float32 (exact: E2M1 x E4M3 x the fp32 global
    factor, the core's dequantize), the Hadamard transform kept: it cancels between the two
    transformed operands of the wgrad GEMM (H orthogonal)."""
    v = _stored_values(t, jnp.float32)
    if t.is_colwise:
        k = t.flatten_axis  # the stored copy's: dims k.. are the source's leading ones
        v = jnp.transpose(v, (*range(k, v.ndim), *range(k)))
    return v


def check_rht_pair(a, b) -> None:
    """TE-JAX's rule: RHT cancels in a GEMM only when both operands carry it."""
    ra = isinstance(a, ScaledTensor1x) and a.has_rht_applied
    rb = isinstance(b, ScaledTensor1x) and b.has_rht_applied
    if ra != rb:
        raise ValueError("With NVFP4_1D_SCALING, if one operand is quantized with RHT, the other "
                         "must be quantized with RHT as well (the transforms cancel in the GEMM "
                         "only in pairs)")

