"""`activation(x, activation_type, quantizer=None, act_params=None)`: TE-JAX's differentiable
activation over the core kernels (gated ones take [..., 2, H])."""

from __future__ import annotations

from functools import partial

import jax

from . import cpp_extensions as tex

__all__ = ["activation"]


def activation(x, activation_type, quantizer=None, act_params=None):
    """act(x) in x's dtype; with a quantizer, the result is quantized by it (a ScaledTensor)."""
    tex.activation_name(activation_type)  # validates the name
    y = _activation(x, tuple(activation_type), act_params)
    if quantizer is not None:
        return quantizer.quantize(y, dq_dtype=x.dtype)
    return y


@partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _activation(x, activation_type, act_params):
    return tex.act_lu(x, activation_type, act_params=act_params)[0]


def _fwd(x, activation_type, act_params):
    return _activation(x, activation_type, act_params), (x,)


def _bwd(activation_type, act_params, res, g):
    (x,) = res
    return (tex.dact_lu(g.astype(x.dtype), x, activation_type, act_params),)


_activation.defvjp(_fwd, _bwd)
