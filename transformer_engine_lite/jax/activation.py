"""`activation(x, activation_type, quantizer=None, act_params=None)`: TE-JAX's differentiable
activation over the core kernels (gated ones take [..., 2, H])."""

from __future__ import annotations

from functools import partial

import jax

from . import cpp_extensions as tex

__all__ = ["activation"]


def activation(x, activation_type, quantizer=None, act_params=None):
    """act(x) in x's dtype. With a quantizer, the forward output is quantized by it and dequantized
    again (TE-JAX's semantics); the backward is the unquantized activation's."""
    tex.activation_name(activation_type)  # validates the name
    return _activation(x, tuple(activation_type), quantizer, act_params)


@partial(jax.custom_vjp, nondiff_argnums=(1, 3))
def _activation(x, activation_type, quantizer, act_params):
    return _fwd(x, activation_type, quantizer, act_params)[0]


def _act(x, activation_type, act_params):
    return tex.act_lu(x, activation_type, act_params=act_params)[0]


def _fwd(x, activation_type, quantizer, act_params):
    y = _act(x, activation_type, act_params)
    if quantizer is not None:
        y = quantizer.quantize(y, dq_dtype=x.dtype).dequantize(x.dtype)
    return y, (x, quantizer)


def _bwd(activation_type, act_params, res, g):
    x, quantizer = res
    return tex.dact_lu(g.astype(x.dtype), x, activation_type, act_params), quantizer


_activation.defvjp(_fwd, _bwd)
