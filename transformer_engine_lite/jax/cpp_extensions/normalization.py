"""LayerNorm and RMSNorm primitives over the last dim, forward (optionally with the FP8 output fused:
z = encode(norm(x) * scale), amax of norm(x)) and backward. Statistics (mu, rsigma) are float32 over
the leading dims; compute is float32 (ARCHITECTURE §5).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .base import FFIOp
from .misc import (
    HIGH_PRECISION,
    as_scalar,
    check_dtype,
    check_min_ndim,
    check_scalar_f32,
    check_shape,
    is_fp8,
)
from .partitioning import RowRule
from .quantization import _jax_quantize_scaled

__all__ = [
    "_jax_layernorm_f32",
    "_jax_rmsnorm_f32",
    "layernorm_bwd",
    "layernorm_fwd",
    "normalization_bwd",
    "normalization_fwd",
    "rmsnorm_bwd",
    "rmsnorm_fwd",
]

_F32 = jnp.float32


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def _check_fwd(op, x, gamma, beta, scale, out_dtype):
    check_dtype(op, "x", x.dtype, HIGH_PRECISION)
    check_min_ndim(op, "x", x.shape, 1)
    check_dtype(op, "gamma", gamma.dtype, HIGH_PRECISION)
    check_shape(op, "gamma", gamma.shape, x.shape[-1:], " (x's last dim)")
    if beta is not None:
        check_dtype(op, "beta", beta.dtype, HIGH_PRECISION)
        check_shape(op, "beta", beta.shape, x.shape[-1:], " (x's last dim)")
    if is_fp8(out_dtype):
        check_scalar_f32(op, "scale", scale)
    elif tuple(scale.shape) != (0,):
        raise ValueError(f"te_lite::{op}: argument 'scale': expected none (a scale is only used "
                         f"for FP8 outputs) for out_dtype {np.dtype(out_dtype).name}, got shape "
                         f"{tuple(scale.shape)}")
    else:
        check_dtype(op, "out_dtype", out_dtype, HIGH_PRECISION)


def _fp8_side(out_dtype):
    n = 1 if is_fp8(out_dtype) else 0
    return _sds((n,), _F32), _sds((n,), _F32)


def _stats(x32):
    return x32.shape[:-1]


def _jax_layernorm_f32(x, gamma, beta, eps, zero_centered_gamma):
    """(y float32, mu, rsigma): the float32 reference."""
    x32 = x.astype(_F32)
    mu = jnp.mean(x32, axis=-1)
    var = jnp.mean(jnp.square(x32 - mu[..., None]), axis=-1)
    rsigma = jax.lax.rsqrt(var + jnp.float32(eps))
    g = gamma.astype(_F32) + (1.0 if zero_centered_gamma else 0.0)
    y = (x32 - mu[..., None]) * rsigma[..., None] * g + beta.astype(_F32)
    return y, mu, rsigma


def _jax_rmsnorm_f32(x, gamma, eps, zero_centered_gamma):
    x32 = x.astype(_F32)
    rsigma = jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1) + jnp.float32(eps))
    g = gamma.astype(_F32) + (1.0 if zero_centered_gamma else 0.0)
    return x32 * rsigma[..., None] * g, rsigma


def _finish(y, scale, out_dtype):
    if is_fp8(out_dtype):
        q, amax, si = _jax_quantize_scaled(y, scale, out_dtype)
        return q, amax, si
    z = jnp.zeros((0,), _F32)
    return y.astype(out_dtype), z, z


# -- LayerNorm
def _ln_fwd_abstract(x, gamma, beta, scale, *, eps, zero_centered_gamma, out_dtype):
    _check_fwd("layernorm_fwd", x, gamma, beta, scale, out_dtype)
    st = _sds(x.shape[:-1], _F32)
    return (_sds(x.shape, out_dtype), st, st, *_fp8_side(out_dtype))


def _ln_fwd_ref(x, gamma, beta, scale, eps, zero_centered_gamma, out_dtype):
    y, mu, rs = _jax_layernorm_f32(x, gamma, beta, eps, zero_centered_gamma)
    z, amax, si = _finish(y, scale, out_dtype)
    return z, mu, rs, amax, si


def _attrs(params):
    return {k: v for k, v in params.items() if k != "out_dtype"}


def _fwd_amax_axes(params, resource, mesh, x_spec):
    """TE-JAX's fused-FP8 (delayed scaling) norm: the amax max-reduced over every mesh axis but
    the pipeline one (all_reduce_max_along_all_axes_except_PP)."""
    del params, x_spec
    pp = getattr(resource, "pp_resource", None)
    return tuple(a for a in mesh.axis_names if a != pp)


LayerNormFwdPrimitive = FFIOp(
    "NormFwdPrimitive", "te_lite_layernorm_fwd_ffi", _ln_fwd_abstract, _ln_fwd_ref,
    attrs=_attrs, row_args=(0,), reducing_results=(3,),
    partition=RowRule(("x", "rep", "rep", "rep"), ("x", "row", "row", "amax", "rep"),
                      amax_axes=_fwd_amax_axes),
)


def _te_form(args, kwargs) -> bool:
    """TE-JAX's norm forms put zero_centered_gamma (a bool) where the primitive forms put eps, and
    take `quantizer` / `epsilon` keywords the primitive forms do not have."""
    return ("quantizer" in kwargs or "epsilon" in kwargs
            or (len(args) > 0 and isinstance(args[0], (bool, np.bool_))))


def layernorm_fwd(x, gamma, beta, *args, **kwargs):
    """TE-JAX's form `layernorm_fwd(x, gamma, beta, zero_centered_gamma, epsilon, quantizer=None)`
    -> (output ScaledTensor / NoScaleTensor, mu, rsigma) (see te_api.layernorm_fwd_te), or the
    primitive form `layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma, out_dtype, scale)`."""
    if _te_form(args, kwargs):
        from .te_api import layernorm_fwd_te
        return layernorm_fwd_te(x, gamma, beta, *args, **kwargs)
    return _layernorm_fwd(x, gamma, beta, *args, **kwargs)


def _layernorm_fwd(x, gamma, beta, eps=1e-6, zero_centered_gamma=False, out_dtype=None, scale=None):
    """(z, mu, rsigma, amax, scale_inv); z in out_dtype (default x's). An FP8 out_dtype needs
    `scale` (float32 [1]) and gives amax / scale_inv float32 [1]; otherwise they are float32 [0]."""
    out_dtype = np.dtype(out_dtype if out_dtype is not None else x.dtype)
    scale = as_scalar(scale) if scale is not None else jnp.zeros((0,), _F32)
    return LayerNormFwdPrimitive(x, gamma, beta, scale, eps=float(eps),
                                 zero_centered_gamma=bool(zero_centered_gamma),
                                 out_dtype=out_dtype)


def _ln_bwd_abstract(dz, x, mu, rsigma, gamma, *, zero_centered_gamma):
    op = "layernorm_bwd"
    check_dtype(op, "dz", dz.dtype, HIGH_PRECISION)
    check_shape(op, "dz", dz.shape, x.shape, " (x's)")
    check_shape(op, "mu", mu.shape, x.shape[:-1], " (x's leading dims)")
    check_shape(op, "rsigma", rsigma.shape, x.shape[:-1], " (x's leading dims)")
    check_shape(op, "gamma", gamma.shape, x.shape[-1:], " (x's last dim)")
    return (_sds(x.shape, x.dtype), _sds(gamma.shape, gamma.dtype), _sds(gamma.shape, gamma.dtype))


def _jax_ln_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma):
    x32, dz32 = x.astype(_F32), dz.astype(_F32)
    xhat = (x32 - mu[..., None]) * rsigma[..., None]
    g = gamma.astype(_F32) + (1.0 if zero_centered_gamma else 0.0)
    dy = dz32 * g
    n = x.shape[-1]
    dx = rsigma[..., None] * (dy - jnp.mean(dy, -1, keepdims=True)
                              - xhat * jnp.mean(dy * xhat, -1, keepdims=True))
    lead = tuple(range(x.ndim - 1))
    del n
    return (dx.astype(x.dtype), jnp.sum(dz32 * xhat, axis=lead).astype(gamma.dtype),
            jnp.sum(dz32, axis=lead).astype(gamma.dtype))


LayerNormBwdPrimitive = FFIOp(
    "NormBwdPrimitive", "te_lite_layernorm_bwd_ffi", _ln_bwd_abstract, _jax_ln_bwd,
    row_args=(0, 1, 2, 3), reducing_results=(1, 2),
    # dgamma / dbeta: TE-JAX's all-reduce (partitioning.RowRule te_sum), float32 partial sums.
    partition=RowRule(("x", "x", "row", "row", "rep"), ("x", "sum", "sum"), f32_args=(4,),
                      te_sum=True),
)


def layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma=False):
    """(dx, dgamma, dbeta)."""
    return LayerNormBwdPrimitive(dz, x, mu, rsigma, gamma,
                                 zero_centered_gamma=bool(zero_centered_gamma))


# -- RMSNorm
def _rms_fwd_abstract(x, gamma, scale, *, eps, zero_centered_gamma, out_dtype):
    _check_fwd("rmsnorm_fwd", x, gamma, None, scale, out_dtype)
    return (_sds(x.shape, out_dtype), _sds(x.shape[:-1], _F32), *_fp8_side(out_dtype))


def _rms_fwd_ref(x, gamma, scale, eps, zero_centered_gamma, out_dtype):
    y, rs = _jax_rmsnorm_f32(x, gamma, eps, zero_centered_gamma)
    z, amax, si = _finish(y, scale, out_dtype)
    return z, rs, amax, si


RMSNormFwdPrimitive = FFIOp(
    "RMSNormFwdPrimitive", "te_lite_rmsnorm_fwd_ffi", _rms_fwd_abstract, _rms_fwd_ref,
    attrs=_attrs, row_args=(0,), reducing_results=(2,),
    partition=RowRule(("x", "rep", "rep"), ("x", "row", "amax", "rep"), amax_axes=_fwd_amax_axes),
)


def rmsnorm_fwd(x, gamma, *args, **kwargs):
    """TE-JAX's form `rmsnorm_fwd(x, gamma, zero_centered_gamma, epsilon, quantizer=None)` ->
    (output, rsigma), or the primitive form `rmsnorm_fwd(x, gamma, eps, zero_centered_gamma,
    out_dtype, scale)` -> (z, rsigma, amax, scale_inv)."""
    if _te_form(args, kwargs):
        from .te_api import rmsnorm_fwd_te
        return rmsnorm_fwd_te(x, gamma, *args, **kwargs)
    return _rmsnorm_fwd(x, gamma, *args, **kwargs)


def _rmsnorm_fwd(x, gamma, eps=1e-6, zero_centered_gamma=False, out_dtype=None, scale=None):
    """(z, rsigma, amax, scale_inv), as layernorm_fwd."""
    out_dtype = np.dtype(out_dtype if out_dtype is not None else x.dtype)
    scale = as_scalar(scale) if scale is not None else jnp.zeros((0,), _F32)
    return RMSNormFwdPrimitive(x, gamma, scale, eps=float(eps),
                               zero_centered_gamma=bool(zero_centered_gamma), out_dtype=out_dtype)


def _rms_bwd_abstract(dz, x, rsigma, gamma, *, zero_centered_gamma):
    op = "rmsnorm_bwd"
    check_dtype(op, "dz", dz.dtype, HIGH_PRECISION)
    check_shape(op, "dz", dz.shape, x.shape, " (x's)")
    check_shape(op, "rsigma", rsigma.shape, x.shape[:-1], " (x's leading dims)")
    check_shape(op, "gamma", gamma.shape, x.shape[-1:], " (x's last dim)")
    return (_sds(x.shape, x.dtype), _sds(gamma.shape, gamma.dtype))


def _jax_rms_bwd(dz, x, rsigma, gamma, zero_centered_gamma):
    x32, dz32 = x.astype(_F32), dz.astype(_F32)
    xhat = x32 * rsigma[..., None]
    g = gamma.astype(_F32) + (1.0 if zero_centered_gamma else 0.0)
    dy = dz32 * g
    dx = rsigma[..., None] * (dy - xhat * jnp.mean(dy * xhat, -1, keepdims=True))
    lead = tuple(range(x.ndim - 1))
    return dx.astype(x.dtype), jnp.sum(dz32 * xhat, axis=lead).astype(gamma.dtype)


RMSNormBwdPrimitive = FFIOp(
    "RMSNormBwdPrimitive", "te_lite_rmsnorm_bwd_ffi", _rms_bwd_abstract, _jax_rms_bwd,
    row_args=(0, 1, 2), reducing_results=(1,),
    partition=RowRule(("x", "x", "row", "rep"), ("x", "sum"), f32_args=(3,), te_sum=True),
)


def rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma=False):
    """(dx, dgamma)."""
    return RMSNormBwdPrimitive(dz, x, rsigma, gamma, zero_centered_gamma=bool(zero_centered_gamma))


def normalization_fwd(x, gamma, beta, norm_type, eps=1e-6, zero_centered_gamma=False,
                      out_dtype=None, scale=None):
    """(z, mu or None, rsigma, amax, scale_inv) for norm_type "layernorm" or "rmsnorm"."""
    if norm_type == "layernorm":
        return _layernorm_fwd(x, gamma, beta, eps, zero_centered_gamma, out_dtype, scale)
    z, rs, amax, si = _rmsnorm_fwd(x, gamma, eps, zero_centered_gamma, out_dtype, scale)
    return z, None, rs, amax, si


def normalization_bwd(dz, x, mu, rsigma, gamma, norm_type, zero_centered_gamma=False):
    """(dx, dgamma, dbeta or None)."""
    if norm_type == "layernorm":
        return layernorm_bwd(dz, x, mu, rsigma, gamma, zero_centered_gamma)
    dx, dg = rmsnorm_bwd(dz, x, rsigma, gamma, zero_centered_gamma)
    return dx, dg, None


# TE-JAX's quantizer-taking forms and references, importable from this module as in TE.
from .te_api import _jax_layernorm, _jax_rmsnorm, is_norm_zero_centered_gamma_in_weight_dtype  # noqa: E402,F401
