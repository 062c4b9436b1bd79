"""TE-JAX's quantizer-taking forms of the primitive functions, and the `_jax_*` references they are
tested against (TE-JAX's names and signatures):

- `quantize(x, quantizer, flatten_axis)`, `quantize_dbias(dz, quantizer, is_dbias, flatten_axis)`,
  `act_lu(x, activation_type, quantizer, act_params)`, `quantize_dact_dbias(dz, x, activation_type,
  is_dbias, quantizer, act_params)`, `layernorm_fwd(x, gamma, beta, zero_centered_gamma, epsilon,
  quantizer)`, `rmsnorm_fwd(x, gamma, zero_centered_gamma, epsilon, quantizer)`: ScaledTensor /
  NoScaleTensor results, through the handlers (the FP8 output fused into the norm / activation
  kernel under delayed scaling, as TE fuses it).
- `_jax_quantize`, `_jax_quantize_dbias`, `_jax_act_lu`, `_jax_quantize_dact_dbias`,
  `_jax_layernorm`, `_jax_rmsnorm`: the same quantizers run in `reference_mode`, so every primitive
  they reach traces its pure-JAX reference (ARCHITECTURE §5) instead of its handler: an
  independent implementation to compare bytes with.

The primitive forms stay (the functions in quantization / activation / normalization dispatch on
their arguments); the Quantizer classes live in ..quantize, which imports this package, hence the
imports inside functions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .amax import AmaxScope, check_amax_scope
from .base import reference_mode

_F32 = jnp.float32


def is_quantizer(q) -> bool:
    from ..quantize.quantizer import Quantizer

    return isinstance(q, Quantizer)


def _check_quantizer(op, quantizer):
    if quantizer is not None and not is_quantizer(quantizer):
        raise TypeError(f"te_lite::{op}: argument 'quantizer': expected a Quantizer or None, got "
                        f"{type(quantizer).__name__}")


def _unwrap(x):
    from ..quantize.tensor import NoScaleTensor

    return x.data if isinstance(x, NoScaleTensor) else x


def _no_scale(x):
    from ..quantize.tensor import NoScaleTensor

    return NoScaleTensor(data=x, amax=None)


def _axis(flatten_axis, ndim, op):
    fa = flatten_axis + ndim if flatten_axis < 0 else flatten_axis
    if not 0 < fa < ndim:
        raise ValueError(f"te_lite::{op}: argument 'flatten_axis': expected in [-{ndim}, {ndim}) "
                         f"and not 0, got {flatten_axis} for a tensor of rank {ndim}")
    return fa


def _dbias(x, dtype, flatten_axis, op):
    """Sum over the leading (flattened-row) dims in float32, in `dtype` (TE's _jax_dbias)."""
    fa = _axis(flatten_axis, x.ndim, op)
    return jnp.sum(x.astype(_F32), axis=tuple(range(fa))).astype(dtype or x.dtype)


# -------------------------------------------------------------------------------------- quantize
def _scoped_quantize(quantizer, x, amax_scope, transpose_batch_sequence, **kwargs):
    """quantizer.quantize(x, **kwargs), a current-scaling or NVFP4 amax taken as `amax_scope`
    says (TE-JAX: the scope steers current scaling and NVFP4's per-tensor scale; delayed scaling's
    amax is reduced over the whole mesh and MXFP8 / FP8 block scalings have no tensor amax)."""
    from ..quantize.scaling_modes import ScalingMode

    mode = quantizer.scaling_mode
    if mode == ScalingMode.CURRENT_TENSOR_SCALING or ScalingMode(mode).is_nvfp4_scaling:
        kwargs = dict(kwargs, amax_scope=amax_scope,
                      transpose_batch_sequence=bool(transpose_batch_sequence))
    return quantizer.quantize(x, **kwargs)


def quantize_te(x, quantizer, flatten_axis=-1, amax_scope=AmaxScope.LOCAL,
                transpose_batch_sequence=False):
    """x (array or NoScaleTensor) quantized by `quantizer` (NoScaleTensor for None).

    amax_scope / transpose_batch_sequence steer a sharded current-scaling amax as in TE (an
    AmaxScope, TE's default LOCAL: each shard quantizes with its own amax; see calculate_amax).
    None (our extension) takes the whole tensor's amax (one scale, as unsharded)."""
    _check_quantizer("quantize", quantizer)
    check_amax_scope("quantize", amax_scope)
    x = _unwrap(x)
    if quantizer is None:
        return _no_scale(x)
    return _scoped_quantize(quantizer, x, amax_scope, transpose_batch_sequence,
                            flatten_axis=flatten_axis)


def _jax_quantize(x, quantizer=None, dq_dtype=None, flatten_axis=-1):
    """TE-JAX's pure-JAX quantize: the quantizer's own arithmetic with the references."""
    _check_quantizer("_jax_quantize", quantizer)
    x = _unwrap(x)
    if quantizer is None:
        return _no_scale(x)
    with reference_mode():
        return quantizer.quantize(x, dq_dtype=dq_dtype, flatten_axis=flatten_axis)


def quantize_dbias(dz, quantizer, is_dbias=True, flatten_axis=-1, amax_scope=AmaxScope.LOCAL,
                   transpose_batch_sequence=False):
    """(quantized dz, dbias or None): dbias = sum of dz over the dims before flatten_axis,
    float32 accumulation, in dz's dtype. The core has no fused cast+dbias kernel, so this is the
    quantize handler plus a float32 sum — the same values the fused kernel would produce.
    amax_scope: as in quantize (TE's default LOCAL)."""
    check_amax_scope("quantize_dbias", amax_scope)
    dz = _unwrap(dz)
    out = quantize_te(dz, quantizer, flatten_axis, amax_scope, transpose_batch_sequence)
    return out, (_dbias(dz, dz.dtype, flatten_axis, "quantize_dbias") if is_dbias else None)


def _jax_quantize_dbias(x, quantizer=None, dq_dtype=None, flatten_axis=-1):
    x = _unwrap(x)
    if quantizer is None:
        return _no_scale(x), None
    return (_jax_quantize(x, quantizer, dq_dtype, flatten_axis),
            _dbias(x, dq_dtype, flatten_axis, "_jax_quantize_dbias"))


# ------------------------------------------------------------------------------------ activation
def _act_split(x, activation_type, op):
    """TE-JAX's activation layout: x [..., len(activation_type), H]."""
    from .activation import activation_name, is_gated

    activation_name(activation_type)  # validates the names
    n = len(tuple(activation_type))
    if x.ndim < 2 or x.shape[-2] != n:
        raise ValueError(f"te_lite::{op}: argument 'x': expected shape [..., {n}, H] for "
                         f"activation {tuple(activation_type)}, got {tuple(x.shape)}")
    return x if is_gated(activation_type) else x[..., 0, :]


def act_lu_te(x, activation_type, quantizer=None, act_params=None, amax_scope=AmaxScope.LOCAL,
              transpose_batch_sequence=False, output_amax_when_no_scaling=False):
    """act(x) [..., H], quantized by `quantizer` (delayed scaling: fused into the kernel).
    amax_scope (TE's default LOCAL): where the output's amax is reduced under sharding, for a
    current-scaling quantizer and for the amax returned with output_amax_when_no_scaling (TE-JAX
    reduces both over the scope's axes)."""
    from ..quantize.scaling_modes import ScalingMode
    from ..quantize.tensor import NoScaleTensor, ScaledTensor1x
    from .activation import _act_lu
    from .quantization import calculate_amax

    _check_quantizer("act_lu", quantizer)
    check_amax_scope("act_lu", amax_scope)
    xs = _act_split(x, activation_type, "act_lu")
    if quantizer is not None and quantizer.scaling_mode == ScalingMode.DELAYED_TENSOR_SCALING:
        q, amax, si = _act_lu(xs, activation_type, quantizer.q_dtype, quantizer.scale, act_params)
        quantizer.update(amax)
        t = ScaledTensor1x(q, si, quantizer.scaling_mode, x.dtype, False, amax)
        return quantizer._wrap(t, None, None)
    y, _, _ = _act_lu(xs, activation_type, None, None, act_params)
    if quantizer is None:
        amax = (calculate_amax(y, amax_scope, transpose_batch_sequence)
                if output_amax_when_no_scaling else None)
        return NoScaleTensor(y, amax)
    return _scoped_quantize(quantizer, y, amax_scope, transpose_batch_sequence, dq_dtype=x.dtype,
                            flatten_axis=-1)


def _jax_act_lu(inputs, activation_type, quantizer=None, act_params=None):
    """TE-JAX's pure-JAX activation: act in float32, cast to the input's dtype, then quantized
    (if a quantizer is given) with the references."""
    from .activation import _jax_act_lu_f32

    _check_quantizer("_jax_act_lu", quantizer)
    y = _jax_act_lu_f32(_act_split(inputs, activation_type, "_jax_act_lu"), activation_type,
                        act_params)
    return _jax_quantize(y, quantizer, None, -1)


def _dact32(dz, x, activation_type, act_params):
    from .activation import _jax_act_lu_f32

    _, vjp = jax.vjp(lambda v: _jax_act_lu_f32(_act_split(v, activation_type, "dact"),
                                               activation_type, act_params), x.astype(_F32))
    return vjp(dz.astype(_F32))[0]


def quantize_dact_dbias(dz, x, activation_type=("gelu",), is_dbias=True, quantizer=None,
                        act_params=None, amax_scope=AmaxScope.LOCAL,
                        transpose_batch_sequence=False):
    """(quantized d act(x)/dx * dz [..., n, H], dbias [n, H] or None) through the dact handler,
    dbias summed in float32 over the leading dims, dx quantized with flatten_axis=-2 (TE's).
    The core has no fused dact+dbias+cast kernel, so the handler runs in float32 and that float32
    dx is what is summed and quantized — the bytes a fused kernel gives. amax_scope: as in
    quantize (TE's default LOCAL)."""
    from .activation import dact_lu

    _check_quantizer("quantize_dact_dbias", quantizer)
    check_amax_scope("quantize_dact_dbias", amax_scope)
    dz = _unwrap(dz)
    xs = _act_split(x, activation_type, "quantize_dact_dbias")
    if dz.shape != x.shape[:-2] + x.shape[-1:]:
        raise ValueError(f"te_lite::quantize_dact_dbias: argument 'dz': expected shape "
                         f"{x.shape[:-2] + x.shape[-1:]} (x's without its activation axis), got "
                         f"{tuple(dz.shape)}")
    # The handler in float32: the values a fused dact+dbias+cast kernel would sum and quantize.
    dx = dact_lu(dz.astype(_F32), xs.astype(_F32), activation_type, act_params).reshape(x.shape)
    dbias = _dbias(dx, x.dtype, -2, "quantize_dact_dbias") if is_dbias else None
    if quantizer is None:
        return _no_scale(dx.astype(x.dtype)), dbias
    return _scoped_quantize(quantizer, dx, amax_scope, transpose_batch_sequence,
                            dq_dtype=x.dtype, flatten_axis=-2), dbias


def _jax_quantize_dact_dbias(dz, x, activation_type, is_dbias=True, quantizer=None,
                             act_params=None):
    """TE-JAX's pure-JAX reference: float32 VJP of the activation, dbias of the float32 dx, the
    float32 dx quantized (or cast to x's dtype)."""
    dx = _dact32(_unwrap(dz), x, activation_type, act_params)
    dbias = _dbias(dx, x.dtype, -2, "_jax_quantize_dact_dbias") if is_dbias else None
    if quantizer is None:
        return _no_scale(dx.astype(x.dtype)), dbias
    with reference_mode():
        return quantizer.quantize(dx, dq_dtype=x.dtype, flatten_axis=-2), dbias


# ---------------------------------------------------------------------------------- normalization
def is_norm_zero_centered_gamma_in_weight_dtype(scaling_mode) -> bool:
    """TE: whether cuDNN's norm adds zero-centered gamma's 1 in the weight dtype. Our norm kernels
    always add it in float32 compute, so: False for every scaling mode."""
    del scaling_mode
    return False


def _norm_te(kind, x, gamma, beta, zero_centered_gamma, epsilon, quantizer, amax_scope=None,
             transpose_batch_sequence=False):
    """(output, mu or None, rsigma) through the handlers."""
    from ..quantize.scaling_modes import ScalingMode
    from ..quantize.tensor import ScaledTensor1x
    from .normalization import _layernorm_fwd, _rmsnorm_fwd

    _check_quantizer(f"{kind}_fwd", quantizer)
    check_amax_scope(f"{kind}_fwd", amax_scope)

    def run(out_dtype=None, scale=None):
        if kind == "layernorm":
            return _layernorm_fwd(x, gamma, beta, epsilon, zero_centered_gamma, out_dtype, scale)
        z, rs, amax, si = _rmsnorm_fwd(x, gamma, epsilon, zero_centered_gamma, out_dtype, scale)
        return z, None, rs, amax, si

    if quantizer is not None and quantizer.scaling_mode == ScalingMode.DELAYED_TENSOR_SCALING:
        z, mu, rs, amax, si = run(quantizer.q_dtype, quantizer.scale)
        quantizer.update(amax)
        t = ScaledTensor1x(z, si, quantizer.scaling_mode, x.dtype, False, amax)
        return quantizer._wrap(t, None, None), mu, rs
    if quantizer is None:
        z, mu, rs, _, _ = run()
        return _no_scale(z), mu, rs
    # Other recipes: the float32 norm output is quantized (no rounding to x's dtype between);
    # TE-JAX takes a current-scaling amax of a norm output as its AmaxScope says.
    z, mu, rs, _, _ = run(np.dtype(np.float32))
    return _scoped_quantize(quantizer, z, amax_scope, transpose_batch_sequence, dq_dtype=x.dtype,
                            flatten_axis=-1), mu, rs


def layernorm_fwd_te(x, gamma, beta, zero_centered_gamma, epsilon, quantizer=None,
                     amax_scope=AmaxScope.LOCAL, transpose_batch_sequence=False,
                     output_amax_when_no_scaling=False):
    """amax_scope / transpose_batch_sequence: where a current-scaling amax is reduced (TE's
    defaults: LOCAL here, TPSP for rmsnorm_fwd)."""
    if output_amax_when_no_scaling:
        raise NotImplementedError("layernorm_fwd: output_amax_when_no_scaling=True is not "
                                  "implemented by transformer_engine_lite")
    if beta is None:
        beta = jnp.zeros_like(gamma)
    return _norm_te("layernorm", x, gamma, beta, bool(zero_centered_gamma), float(epsilon),
                    quantizer, amax_scope, bool(transpose_batch_sequence))


def rmsnorm_fwd_te(x, gamma, zero_centered_gamma, epsilon, quantizer=None,
                   amax_scope=AmaxScope.TPSP, transpose_batch_sequence=False,
                   output_amax_when_no_scaling=False):
    if output_amax_when_no_scaling:
        raise NotImplementedError("rmsnorm_fwd: output_amax_when_no_scaling=True is not "
                                  "implemented by transformer_engine_lite")
    out, _, rs = _norm_te("rmsnorm", x, gamma, None, bool(zero_centered_gamma), float(epsilon),
                          quantizer, amax_scope, bool(transpose_batch_sequence))
    return out, rs


def _norm_ref_out(y32, x, quantizer):
    """TE's reference: current scaling quantizes the output rounded to x's dtype (TE's unfused
    path), the other recipes the float32 output; no quantizer: x's dtype."""
    from ..quantize.scaling_modes import ScalingMode

    if quantizer is None:
        return _no_scale(y32.astype(x.dtype))
    if quantizer.scaling_mode == ScalingMode.CURRENT_TENSOR_SCALING:
        y32 = y32.astype(x.dtype)
    return _jax_quantize(y32, quantizer, x.dtype, -1)


def _jax_layernorm(x, gamma, beta, zero_centered_gamma, epsilon, quantizer=None):
    """TE-JAX's pure-JAX LayerNorm: (output, mu, rsigma), float32 statistics."""
    from .normalization import _jax_layernorm_f32

    _check_quantizer("_jax_layernorm", quantizer)
    beta = jnp.zeros_like(gamma) if beta is None else beta
    y, mu, rs = _jax_layernorm_f32(x, gamma, beta, epsilon, zero_centered_gamma)
    return _norm_ref_out(y, x, quantizer), mu, rs


def _jax_rmsnorm(x, gamma, zero_centered_gamma, epsilon, quantizer=None):
    """TE-JAX's pure-JAX RMSNorm: (output, rsigma)."""
    from .normalization import _jax_rmsnorm_f32

    _check_quantizer("_jax_rmsnorm", quantizer)
    y, rs = _jax_rmsnorm_f32(x, gamma, epsilon, zero_centered_gamma)
    return _norm_ref_out(y, x, quantizer), rs
