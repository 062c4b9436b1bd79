"""`layernorm(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer)`: TE-JAX's
differentiable LayerNorm / RMSNorm over the last dim, and the norm step shared with layernorm_dense
and layernorm_mlp (with the FP8 output fused into the norm under delayed scaling)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from . import _gemm_core as core
from . import cpp_extensions as tex
from .quantize.scaling_modes import ScalingMode
from .quantize.tensor import ScaledTensor1x

__all__ = ["canonicalize_norm_type", "layernorm"]


def canonicalize_norm_type(norm_type: str) -> str:
    n = str(norm_type).lower().replace("_", "")
    if n not in ("layernorm", "rmsnorm"):
        raise ValueError(f"norm_type: expected 'layernorm' or 'rmsnorm', got {norm_type!r}")
    return n


def norm_fwd(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer, flatten_axis=-1,
             amax_scope=None, transpose_batch_sequence=False):
    """(z, mu, rsigma): z high precision, or quantized by `quantizer` (delayed scaling: fused into
    the norm kernel, amax fed to the quantizer's update; other recipes: quantized after).
    amax_scope: where current scaling takes its amax under sharding (tex.AmaxScope, TE-JAX's
    rule, with transpose_batch_sequence naming the sequence dim for TPSP; None: over the whole
    tensor)."""
    if norm_type == "layernorm" and beta is None:
        beta = jnp.zeros_like(gamma)
    g = gamma.astype(x.dtype) if gamma.dtype != x.dtype else gamma
    b = None if beta is None else beta.astype(x.dtype)
    if quantizer is not None and quantizer.scaling_mode == ScalingMode.DELAYED_TENSOR_SCALING:
        z, mu, rs, amax, si = tex.normalization_fwd(x, g, b, norm_type, epsilon,
                                                    zero_centered_gamma, quantizer.q_dtype,
                                                    quantizer.scale)
        quantizer.update(amax)
        t = ScaledTensor1x(z, si, quantizer.scaling_mode, x.dtype, False, amax)
        return quantizer._wrap(t, None, None), mu, rs
    z, mu, rs, _, _ = tex.normalization_fwd(x, g, b, norm_type, epsilon, zero_centered_gamma)
    if quantizer is not None:
        # (z is in x's dtype: core.quantize's dq_dtype is x's)
        z = core.quantize(quantizer, z, flatten_axis, amax_scope, transpose_batch_sequence)
    return z, mu, rs


def norm_bwd(dz, x, mu, rsigma, gamma, beta_dtype, norm_type, zero_centered_gamma):
    """(dx, dgamma, dbeta) in the dtypes of x, gamma, beta."""
    g = gamma.astype(x.dtype)
    dx, dgamma, dbeta = tex.normalization_bwd(dz.astype(x.dtype), x, mu, rsigma, g, norm_type,
                                              zero_centered_gamma)
    dgamma = dgamma.astype(gamma.dtype)
    dbeta = None if dbeta is None or beta_dtype is None else dbeta.astype(beta_dtype)
    return dx, dgamma, dbeta


def layernorm(x, gamma, beta, norm_type="layernorm", zero_centered_gamma=False, epsilon=1e-6,
              quantizer=None):
    """Normalized x (x's dtype). With a quantizer, the forward output is quantized by it and
    dequantized again (TE-JAX's semantics: the result is what an FP8 consumer would see), and the
    backward is the unquantized norm's."""
    norm_type = canonicalize_norm_type(norm_type)
    if norm_type == "rmsnorm":
        beta = None
    return _layernorm(x, gamma, beta, norm_type, bool(zero_centered_gamma), float(epsilon),
                      quantizer)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _layernorm(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer):
    return _fwd(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer)[0]


def _fwd(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer):
    # TE-JAX's layernorm takes a current-scaling amax per shard (normalization_fwd's default
    # AmaxScope.LOCAL): no collective, each shard quantizes with its own scale.
    z, mu, rs = norm_fwd(x, gamma, beta, norm_type, zero_centered_gamma, epsilon, quantizer,
                         amax_scope=tex.AmaxScope.LOCAL)
    if quantizer is not None:
        z = z.dequantize(x.dtype)
    return z, (x, mu, rs, gamma, beta, quantizer)


def _bwd(norm_type, zero_centered_gamma, epsilon, res, dz):
    x, mu, rs, gamma, beta, quantizer = res
    dx, dgamma, dbeta = norm_bwd(dz, x, mu, rs, gamma, None if beta is None else beta.dtype,
                                 norm_type, zero_centered_gamma)
    # The quantizer's "gradient" is the quantizer as updated by the forward (TE-JAX's idiom).
    return dx, dgamma, dbeta, quantizer


_layernorm.defvjp(_fwd, _bwd)
