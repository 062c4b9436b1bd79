"""Casts and scales: per-tensor quantize / dequantize, amax, current-scaling scale, the delayed-scaling
update, MXFP8 (1x32 blocks, E8M0 scales as uint8), transpose and cast_transpose.

Each function checks its arguments at trace time and calls its primitive (FFIOp) — or, when
NVTE_JAX_CUSTOM_CALLS disables it, the pure-JAX reference `_jax_*` beside it. The references follow
ARCHITECTURE.md §5 and are what tests compare the handlers against.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .base import FFIOp, custom_calls_enabled
from .misc import (
    FP8_DTYPES,
    HIGH_PRECISION,
    as_scalar,
    check_dtype,
    check_min_ndim,
    check_scalar_f32,
    dtype_name,
    fp8_dtype_of,
    fp8_max,
)
from .amax import AmaxScope, check_amax_scope
from .partitioning import RowRule, mesh_axes_of

__all__ = [
    "MX_BLOCK",
    "calculate_amax",
    "cast_transpose",
    "compute_scale_from_amax",
    "delayed_scaling_update",
    "dequantize",
    "dequantize_mxfp8",
    "quantize",
    "quantize_mxfp8",
    "transpose",
]

MX_BLOCK = 32
_F32 = jnp.float32


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def _no_dtypes(params: dict) -> dict:
    return {k: v for k, v in params.items() if k not in ("q_dtype", "out_dtype")}


# ------------------------------------------------------------------------------ pure-JAX refs
def _jax_encode(x32, q_dtype):
    """encode(x): nearest even, satfinite (NaN stays NaN, +-Inf and overflow -> +-max). NaN is
    the core's (and cuda_fp8.h's) canonical byte: 0x7F for OCP formats, 0x80 for FNUZ.

    Caveat of this reference (not of the handlers): XLA's CPU convert of a 16-bit input can round
    twice (through float16) near E5M2's subnormal range, so it may differ from the core by one
    step there; tests use ml_dtypes as the oracle for those bytes."""
    m = fp8_max(q_dtype)
    q = jnp.clip(x32, -m, m).astype(q_dtype)
    nan = 0x80 if "fnuz" in np.dtype(q_dtype).name else 0x7F
    bits = jnp.where(jnp.isnan(x32), jnp.uint8(nan), jax.lax.bitcast_convert_type(q, jnp.uint8))
    return jax.lax.bitcast_convert_type(bits, q_dtype)


def _jax_quantize_scaled(x, scale, q_dtype):
    """Pure-JAX per-tensor quantize with a given scale: (data, amax, scale_inv)."""
    x32 = x.astype(_F32)
    amax = jnp.max(jnp.abs(x32)).reshape(1) if x.size else jnp.zeros((1,), _F32)
    return _jax_encode(x32 * scale[0], q_dtype), amax, (1.0 / scale).astype(_F32).reshape(1)


def _jax_scale_from_amax(amax, fp8_dtype, epsilon, force_pow_2_scales):
    a = jnp.maximum(amax.astype(_F32), jnp.float32(epsilon))
    scale = jnp.float32(fp8_max(fp8_dtype)) / a
    bad = (a == 0) | ~jnp.isfinite(a)
    scale = jnp.where(bad, jnp.float32(1.0), scale)
    scale = jnp.where(jnp.isinf(scale), jnp.float32(np.finfo(np.float32).max), scale)
    if force_pow_2_scales:
        bits = jax.lax.bitcast_convert_type(scale, jnp.uint32) & jnp.uint32(0xFF800000)
        scale = jax.lax.bitcast_convert_type(bits, _F32)
    return scale, (1.0 / scale).astype(_F32)


def _jax_delayed_update(history, scale, amax_compute_algo, fp8_dtype, margin):
    if amax_compute_algo == "max":
        amax = jnp.max(jnp.where(jnp.isnan(history), 0.0, history), axis=0, initial=0.0)
    else:
        amax = history[0]
    new = (jnp.float32(fp8_max(fp8_dtype)) / amax) / jnp.float32(2.0 ** margin)
    new = jnp.where(jnp.isfinite(amax) & (amax > 0), new, scale)
    new = jnp.where(jnp.isinf(new), jnp.float32(np.finfo(np.float32).max), new)
    rolled = jnp.roll(history, -1, axis=0).at[0].set(0.0)
    return rolled, new.astype(_F32)


def _e8m0_exponent(block_amax, q_dtype):
    """E8M0 byte of 2^ceil(log2(amax / fp8_max)) (TE's round-up rule), computed on fp32 bits."""
    ratio = block_amax / jnp.float32(fp8_max(q_dtype))
    bits = jax.lax.bitcast_convert_type(ratio, jnp.uint32)
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    e = jnp.where((mant != 0) & (exp < 254), exp + 1, exp)
    e = jnp.where(block_amax == 0, jnp.uint32(127), e)
    e = jnp.where(jnp.isnan(block_amax), jnp.uint32(255), e)
    return e.astype(jnp.uint8)


def _jax_mx_1d(x2, q_dtype):
    """Row-wise MXFP8 of a 2-D array: (data, scales [rows, ceil(cols/32)])."""
    rows, cols = x2.shape
    nb = -(-cols // MX_BLOCK)
    pad = nb * MX_BLOCK - cols
    xp = jnp.pad(x2.astype(_F32), ((0, 0), (0, pad))).reshape(rows, nb, MX_BLOCK)
    amax = jnp.max(jnp.abs(xp), axis=-1)
    e = _e8m0_exponent(amax, q_dtype)
    inv_scale = jnp.exp2(127.0 - e.astype(_F32))  # 1 / 2^(e - 127)
    q = _jax_encode(xp * inv_scale[..., None], q_dtype).reshape(rows, nb * MX_BLOCK)[:, :cols]
    return q, e


# ------------------------------------------------------------------------------ primitives
def _quantize_abstract(x, scale, *, q_dtype):
    check_dtype("quantize", "x", x.dtype, HIGH_PRECISION)
    check_scalar_f32("quantize", "scale", scale)
    return (_sds(x.shape, q_dtype), _sds((1,), _F32), _sds((1,), _F32))


QuantizePrimitive = FFIOp(
    "QuantizePrimitive", "te_lite_quantize_ffi", _quantize_abstract,
    lambda x, scale, q_dtype: _jax_quantize_scaled(x, as_scalar(scale), q_dtype),
    attrs=_no_dtypes, row_args=(0,), reducing_results=(1,),
    partition=RowRule(("x", "rep"), ("x", "amax", "rep"), trailing=0),
)


def quantize(x, quantizer, flatten_axis=-1, amax_scope=AmaxScope.LOCAL,
             transpose_batch_sequence=False):
    """Two forms.

    TE-JAX's: `quantize(x, quantizer, flatten_axis=-1, amax_scope=AmaxScope.LOCAL,
    transpose_batch_sequence=False)` with a Quantizer (or None) -> ScaledTensor (NoScaleTensor for
    None), through the handlers (fused where the recipe allows); see te_api.quantize_te.
    The primitive form: `quantize(x, scale, q_dtype)` with a float32 scale [1] ->
    (data, amax, scale_inv): data = encode(x * scale); amax = max|x| before scaling. It takes its
    scale as given, so no other scope than the (local) default."""
    from . import te_api

    if quantizer is None or te_api.is_quantizer(quantizer):
        return te_api.quantize_te(x, quantizer, flatten_axis, amax_scope, transpose_batch_sequence)
    if amax_scope is not AmaxScope.LOCAL or transpose_batch_sequence:
        raise ValueError("te_lite::quantize: arguments 'amax_scope', 'transpose_batch_sequence': "
                         "only taken with a Quantizer (TE-JAX's form), got "
                         f"{amax_scope!r}, {transpose_batch_sequence!r} with a scale")
    return _quantize_scaled(x, quantizer, flatten_axis)


def _quantize_scaled(x, scale, q_dtype):
    q_dtype = fp8_dtype_of("quantize", "q_dtype", q_dtype)
    return QuantizePrimitive(x, as_scalar(scale), q_dtype=q_dtype)


def _dequantize_abstract(data, scale_inv, *, out_dtype):
    check_dtype("dequantize", "data", data.dtype, FP8_DTYPES)
    check_scalar_f32("dequantize", "scale_inv", scale_inv)
    check_dtype("dequantize", "out_dtype", out_dtype, HIGH_PRECISION)
    return (_sds(data.shape, out_dtype),)


DequantizePrimitive = FFIOp(
    "DequantizePrimitive", "te_lite_dequantize_ffi", _dequantize_abstract,
    lambda d, si, out_dtype: ((d.astype(_F32) * si[0]).astype(out_dtype),),
    attrs=_no_dtypes, row_args=(0,),
    partition=RowRule(("x", "rep"), ("x",), trailing=0),
)


def dequantize(data, scale_inv, out_dtype=jnp.float32):
    (out,) = DequantizePrimitive(data, as_scalar(scale_inv), out_dtype=np.dtype(out_dtype))
    return out


def _amax_abstract(x, *, amax_scope=None, transpose_batch_sequence=False):
    del transpose_batch_sequence
    check_dtype("compute_amax", "x", x.dtype, HIGH_PRECISION)
    check_amax_scope("calculate_amax", amax_scope)
    return (_sds((1,), _F32),)


def _amax_axes(params, resource, mesh, x_spec):
    """No scope: the max over the whole tensor (the axes sharding x); else the scope's axes."""
    scope = params.get("amax_scope")
    if scope is None:
        return mesh_axes_of(x_spec)
    axes = scope.axes(resource, x_spec, params.get("transpose_batch_sequence", False))
    return tuple(a for a in axes if a in mesh.axis_names)


AmaxPrimitive = FFIOp(
    "AmaxCalculationPrimitive", "te_lite_compute_amax_ffi", _amax_abstract,
    lambda x, **_: (jnp.max(jnp.abs(x.astype(_F32))).reshape(1) if x.size
                    else jnp.zeros((1,), _F32),),
    attrs=lambda params: {}, reducing_results=(0,),
    partition=RowRule(("x",), ("amax",), trailing=0, amax_axes=_amax_axes),
)


class _AmaxReference:
    """The amax reference as an op for the amax sharding rule (see calculate_amax)."""

    @staticmethod
    def ffi(x, **params):
        return AmaxPrimitive.reference(x, **params)


def calculate_amax(x, amax_scope=None, transpose_batch_sequence=False):
    """max|x| as float32 [1] (NaN propagates). Under sharding: with amax_scope None, the max over
    the whole tensor; with an AmaxScope, TE-JAX's: per shard (LOCAL), or max-reduced over the
    tpsp (TPSP, when x's sequence dim is sharded over it) or fsdp (FSDP) resource only."""
    params = {"amax_scope": amax_scope, "transpose_batch_sequence": bool(transpose_batch_sequence)}
    if amax_scope is not None and not custom_calls_enabled(AmaxPrimitive.name):
        # The pure-JAX reference under the primitive's sharding rule, so that a scoped amax is
        # per shard there too (plain jnp.max would be the whole tensor's under jit).
        AmaxPrimitive.abstract(jax.ShapeDtypeStruct(x.shape, x.dtype), **params)
        return AmaxPrimitive.partition.wrap(_AmaxReference, params, 1)(x)[0]
    return AmaxPrimitive(x, **params)[0]


def _scale_abstract(amax, *, fp8_dtype, epsilon, force_pow_2_scales):
    check_scalar_f32("compute_scale_from_amax", "amax", amax)
    return (_sds((1,), _F32), _sds((1,), _F32))


ScalePrimitive = FFIOp(
    "ComputeScalePrimitive", "te_lite_compute_scale_from_amax_ffi", _scale_abstract,
    lambda a, fp8_dtype, epsilon, force_pow_2_scales: _jax_scale_from_amax(
        a, fp8_dtype_of("compute_scale_from_amax", "fp8_dtype", fp8_dtype), epsilon,
        force_pow_2_scales),
)


def compute_scale_from_amax(amax, fp8_dtype, epsilon: float = 0.0, force_pow_2_scales=False):
    """Current scaling (ARCHITECTURE §5): (scale, scale_inv) from amax, float32 [1] each."""
    name = dtype_name(fp8_dtype_of("compute_scale_from_amax", "fp8_dtype", fp8_dtype))
    return ScalePrimitive(as_scalar(amax), fp8_dtype=name, epsilon=float(epsilon),
                          force_pow_2_scales=bool(force_pow_2_scales))


def _delayed_abstract(history, scale, *, amax_compute_algo, fp8_dtype, margin):
    op = "delayed_scaling_update"
    check_dtype(op, "amax_history", history.dtype, (_F32,))
    check_dtype(op, "scale", scale.dtype, (_F32,))
    if len(history.shape) != 2 or tuple(scale.shape) != (history.shape[1],):
        raise ValueError(
            f"te_lite::{op}: argument 'scale': expected shape ({history.shape[-1]},) for "
            f"amax_history [history_length, num_scales], got amax_history {tuple(history.shape)} "
            f"and scale {tuple(scale.shape)}"
        )
    if amax_compute_algo not in ("max", "most_recent"):
        raise ValueError(
            f"te_lite::{op}: argument 'amax_compute_algo': expected 'max' or 'most_recent', got "
            f"{amax_compute_algo!r}"
        )
    return (_sds(history.shape, _F32), _sds(scale.shape, _F32))


DelayedScalingPrimitive = FFIOp(
    "DelayedScalingUpdatePrimitive", "te_lite_delayed_scaling_update_ffi", _delayed_abstract,
    lambda h, s, amax_compute_algo, fp8_dtype, margin: _jax_delayed_update(
        h, s, amax_compute_algo, fp8_dtype_of("delayed_scaling_update", "fp8_dtype", fp8_dtype),
        margin),
)


def delayed_scaling_update(amax_history, scale, amax_compute_algo: str, fp8_dtype, margin: float):
    """TE's delayed-scaling update of `num_scales` tensors: amax_history [L, n] and scale [n] ->
    (rolled history with row 0 zeroed, new scale), exactly the C core's rule (ARCHITECTURE §5)."""
    name = dtype_name(fp8_dtype_of("delayed_scaling_update", "fp8_dtype", fp8_dtype))
    return DelayedScalingPrimitive(amax_history, scale, amax_compute_algo=amax_compute_algo,
                                   fp8_dtype=name, margin=float(margin))


def _mx_abstract(x, *, q_dtype, rowwise, columnwise):
    op = "quantize_mxfp8"
    check_dtype(op, "x", x.dtype, HIGH_PRECISION)
    check_min_ndim(op, "x", x.shape, 1)
    if not (rowwise or columnwise):
        raise ValueError(f"te_lite::{op}: arguments 'rowwise', 'columnwise': expected at least "
                         "one True, got both False")
    rows, cols = math.prod(x.shape[:-1]), x.shape[-1]
    e = (0,)
    return (
        _sds(x.shape if rowwise else e, q_dtype if rowwise else _F32),
        _sds((rows, -(-cols // MX_BLOCK)) if rowwise else e, jnp.uint8 if rowwise else _F32),
        _sds(x.shape if columnwise else e, q_dtype if columnwise else _F32),
        _sds((-(-rows // MX_BLOCK), cols) if columnwise else e, jnp.uint8 if columnwise else _F32),
    )


def _jax_mx(x, q_dtype, rowwise, columnwise):
    x2 = x.reshape(-1, x.shape[-1])
    z = jnp.zeros((0,), _F32)
    out = [z, z, z, z]
    if rowwise:
        q, s = _jax_mx_1d(x2, q_dtype)
        out[0], out[1] = q.reshape(x.shape), s
    if columnwise:
        q, s = _jax_mx_1d(x2.T, q_dtype)
        out[2], out[3] = q.T.reshape(x.shape), s.T
    return tuple(out)


QuantizeMXFP8Primitive = FFIOp(
    "QuantizeMXFP8Primitive", "te_lite_quantize_mxfp8_ffi", _mx_abstract, _jax_mx,
    attrs=_no_dtypes,
    # on 2-D x (quantize_mxfp8 flattens): rows stay sharded, 32 per shard at least; the small
    # column-wise scales are gathered instead of x (TE gathers nothing: its scales stay sharded)
    partition=RowRule(("x",), ("x", "x", "x", "gather0"), row_block=MX_BLOCK),
)


def quantize_mxfp8(x, q_dtype=jnp.float8_e4m3fn, rowwise=True, columnwise=True):
    """MXFP8 (1x32 blocks; ARCHITECTURE §5): (row_data, row_scale_inv [rows, ceil(cols/32)],
    col_data, col_scale_inv [ceil(rows/32), cols]); E8M0 scales as uint8; copies not requested are
    float32 [0]."""
    q_dtype = fp8_dtype_of("quantize_mxfp8", "q_dtype", q_dtype)
    if q_dtype not in (jnp.float8_e4m3fn, jnp.float8_e5m2):
        raise TypeError("te_lite::quantize_mxfp8: argument 'q_dtype': expected float8_e4m3fn or "
                        f"float8_e5m2 (OCP formats), got {dtype_name(q_dtype)}")
    # 2-D for the sharding rule: the scales are [rows, .] / [rows / 32, .] over the flattened rows
    rd, rs, cd, cs = QuantizeMXFP8Primitive(x.reshape(-1, x.shape[-1]) if x.ndim > 2 else x,
                                            q_dtype=q_dtype, rowwise=bool(rowwise),
                                            columnwise=bool(columnwise))
    return (rd.reshape(x.shape) if rd.size else rd, rs,
            cd.reshape(x.shape) if cd.size else cd, cs)


def _mx_deq_abstract(data, scale_inv, *, columnwise, out_dtype):
    check_dtype("dequantize_mxfp8", "data", data.dtype, (jnp.float8_e4m3fn, jnp.float8_e5m2))
    check_dtype("dequantize_mxfp8", "scale_inv", scale_inv.dtype, (jnp.uint8,))
    return (_sds(data.shape, out_dtype),)


def _jax_mx_deq(data, scale_inv, columnwise, out_dtype):
    d2 = data.reshape(-1, data.shape[-1]).astype(_F32)
    if columnwise:
        d2, s = d2.T, scale_inv.T
    else:
        s = scale_inv
    f = jnp.repeat(jnp.exp2(s.astype(_F32) - 127.0), MX_BLOCK, axis=-1)[:, : d2.shape[1]]
    out = d2 * f
    if columnwise:
        out = out.T
    return (out.reshape(data.shape).astype(out_dtype),)


DequantizeMXFP8Primitive = FFIOp(
    "DequantizeMXFP8Primitive", "te_lite_dequantize_mxfp8_ffi", _mx_deq_abstract, _jax_mx_deq,
    attrs=_no_dtypes,
    # row-wise copies on 2-D data: the rows and their scales [rows, cols / 32] stay sharded
    partition=RowRule(("x", "x"), ("x",)),
)
# column-wise copies: their scales [rows / 32, cols] index blocks of rows; gathered (no rule)
DequantizeMXFP8ColPrimitive = FFIOp(
    "DequantizeMXFP8Primitive", "te_lite_dequantize_mxfp8_ffi", _mx_deq_abstract, _jax_mx_deq,
    attrs=_no_dtypes,
)


def dequantize_mxfp8(data, scale_inv, columnwise=False, out_dtype=jnp.float32):
    prim = DequantizeMXFP8ColPrimitive if columnwise else DequantizeMXFP8Primitive
    (out,) = prim(data.reshape(-1, data.shape[-1]) if data.ndim > 2 else data, scale_inv,
                  columnwise=bool(columnwise), out_dtype=np.dtype(out_dtype))
    return out.reshape(data.shape)


def _transpose_abstract(x):
    if len(x.shape) != 2:
        raise ValueError(f"te_lite::transpose: argument 'x': expected a 2-D array, got shape "
                         f"{tuple(x.shape)}")
    return (_sds(x.shape[::-1], x.dtype),)


TransposePrimitive = FFIOp("TransposePrimitive", "te_lite_transpose_ffi", _transpose_abstract,
                           lambda x: (x.T,))


def transpose(x):
    return TransposePrimitive(x)[0]


def _ct_abstract(x, scale, *, q_dtype):
    op = "cast_transpose"
    check_dtype(op, "x", x.dtype, HIGH_PRECISION)
    if len(x.shape) != 2:
        raise ValueError(f"te_lite::{op}: argument 'x': expected a 2-D array, got shape "
                         f"{tuple(x.shape)}")
    check_scalar_f32(op, "scale", scale)
    return (_sds(x.shape, q_dtype), _sds(x.shape[::-1], q_dtype), _sds((1,), _F32),
            _sds((1,), _F32))


def _jax_ct(x, scale, q_dtype):
    q, amax, si = _jax_quantize_scaled(x, scale, q_dtype)
    return q, q.T, amax, si


CastTransposePrimitive = FFIOp("CastTransposePrimitive", "te_lite_cast_transpose_ffi",
                               _ct_abstract, _jax_ct, attrs=_no_dtypes)


def cast_transpose(x, scale, q_dtype):
    """(data, data_t, amax, scale_inv) of a 2-D x: both copies of encode(x * scale)."""
    q_dtype = fp8_dtype_of("cast_transpose", "q_dtype", q_dtype)
    return CastTransposePrimitive(x, as_scalar(scale), q_dtype=q_dtype)


# TE-JAX's quantizer-taking forms and references, importable from this module as in TE.
from .te_api import _jax_quantize, _jax_quantize_dbias, quantize_dbias  # noqa: E402,F401
from .grouped import GroupedQuantizePrimitive, grouped_quantize  # noqa: E402,F401
