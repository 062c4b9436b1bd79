"""Activation primitives: every activation of the core, forward (optionally FP8 output) and backward,
named as TE-JAX names them — tuples such as ("gelu",), ("gelu", "linear") (GEGLU) or
("clamped_silu", "clamped_linear") (GPT-OSS clamped SwiGLU).

Gated activations take x [..., 2, H] (TE-JAX's layout: index 0 is the activated half, index 1 the
linear one) and give [..., H]; the core's gated kernels take [..., 2H] = [a | b], the same memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .base import FFIOp
from .misc import HIGH_PRECISION, as_scalar, check_dtype, check_scalar_f32, is_fp8
from .partitioning import RowRule
from .quantization import _jax_quantize_scaled

__all__ = [
    "ActivationEnum",
    "ActivationParams",
    "ClampedSwigluParams",
    "_jax_act_lu_f32",
    "act_lu",
    "activation_name",
    "dact_lu",
    "is_gated",
]

_F32 = jnp.float32

# TE-JAX activation tuples -> the core's names (pytorch/te_lite_ops.py ACTIVATIONS + clamped_swiglu).
ActivationEnum = {
    ("linear",): "identity",
    ("gelu",): "gelu",
    ("gelu", "linear"): "geglu",
    ("sigmoid", "linear"): "glu",
    ("silu",): "silu",
    ("silu", "linear"): "swiglu",
    ("relu",): "relu",
    ("relu", "linear"): "reglu",
    ("quick_gelu",): "qgelu",
    ("quick_gelu", "linear"): "qgeglu",
    ("squared_relu",): "srelu",
    ("squared_relu", "linear"): "sreglu",
    ("clamped_silu", "clamped_linear"): "clamped_swiglu",
}
_GATED = {"geglu", "glu", "swiglu", "reglu", "qgeglu", "sreglu", "clamped_swiglu"}


@dataclass(frozen=True)
class ClampedSwigluParams:
    """GPT-OSS clamped SwiGLU: out = min(a, limit) * sigmoid(alpha * min(a, limit)) *
    (clip(b, -limit, limit) + glu_linear_offset) (the core's nvte_clamped_swiglu_v2)."""

    limit: float = 7.0
    alpha: float = 1.702
    glu_linear_offset: float = 1.0


@dataclass(frozen=True)
class ActivationParams:
    """Extra parameters of an activation (TE's ActivationParams): only clamped SwiGLU has some."""

    clamped_swiglu: ClampedSwigluParams = ClampedSwigluParams()

    @staticmethod
    def create(activation_type, **kwargs) -> ActivationParams:
        if activation_name(activation_type) == "clamped_swiglu":
            return ActivationParams(ClampedSwigluParams(**kwargs))
        return ActivationParams()


def activation_name(activation_type: Sequence[str] | str) -> str:
    key = (activation_type,) if isinstance(activation_type, str) else tuple(activation_type)
    if key not in ActivationEnum:
        names = ", ".join(str(k) for k in ActivationEnum)
        raise ValueError(f"activation_type: expected one of {names}, got {key}")
    return ActivationEnum[key]


def is_gated(activation_type) -> bool:
    return activation_name(activation_type) in _GATED


# ------------------------------------------------------------------------------ references
def _gelu(x):
    return 0.5 * x * (1.0 + jnp.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


_ELEMENTWISE = {
    "gelu": _gelu,
    "qgelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "relu": lambda x: jnp.maximum(x, 0.0),
    "srelu": lambda x: jnp.square(jnp.maximum(x, 0.0)),
    "silu": lambda x: x * jax.nn.sigmoid(x),
}
_GATE_OF = {"geglu": "gelu", "qgeglu": "qgelu", "reglu": "relu", "sreglu": "srelu",
            "swiglu": "silu", "glu": None}


def _jax_act_fwd32(x32, name, limit, alpha, offset=1.0):
    """float32 activation of the core layout ([..., 2H] for gated ones)."""
    if name in _ELEMENTWISE:
        return _ELEMENTWISE[name](x32)
    h = x32.shape[-1] // 2
    a, b = x32[..., :h], x32[..., h:]
    if name == "clamped_swiglu":
        ac = jnp.minimum(a, limit)
        return ac * jax.nn.sigmoid(alpha * ac) * (jnp.clip(b, -limit, limit) + offset)
    gate = jax.nn.sigmoid(a) if name == "glu" else _ELEMENTWISE[_GATE_OF[name]](a)
    return gate * b


def _jax_act_fwd(x, scale, activation, limit, alpha, out_dtype, offset=1.0):
    x = _core_layout(x, activation)
    y = _jax_act_fwd32(x.astype(_F32), activation, limit, alpha, offset)
    if is_fp8(out_dtype):
        return _jax_quantize_scaled(y, scale, out_dtype)
    z = jnp.zeros((0,), _F32)
    return y.astype(out_dtype), z, z


def _jax_act_bwd(grad, x, activation, limit, alpha, offset=1.0):
    xc = _core_layout(x, activation)
    _, vjp = jax.vjp(lambda v: _jax_act_fwd32(v, activation, limit, alpha, offset),
                     xc.astype(_F32))
    return (vjp(grad.astype(_F32))[0].reshape(x.shape).astype(x.dtype),)


# ------------------------------------------------------------------------------ primitives
def _fwd_abstract(x, scale, *, activation, limit, alpha, out_dtype, offset=1.0):
    op = "activation_fwd"
    check_dtype(op, "x", x.dtype, HIGH_PRECISION)
    shape = list(x.shape)
    if activation in _GATED:
        if len(shape) < 2 or shape[-2] != 2:
            raise ValueError(f"te_lite::{op}: argument 'x': expected shape [..., 2, H] for gated "
                             f"activation '{activation}', got {tuple(x.shape)}")
        del shape[-2]
    n = 1 if is_fp8(out_dtype) else 0
    if n:
        check_scalar_f32(op, "scale", scale)
    return (jax.ShapeDtypeStruct(tuple(shape), out_dtype), jax.ShapeDtypeStruct((n,), _F32),
            jax.ShapeDtypeStruct((n,), _F32))


def _fwd_attrs(p):
    if p["activation"] == "clamped_swiglu":
        return {"limit": p["limit"], "alpha": p["alpha"],
                "glu_linear_offset": p.get("offset", 1.0)}
    return {"activation": p["activation"]}


def _bwd_abstract(grad, x, *, activation, limit, alpha, offset=1.0):
    out = _fwd_abstract(x, jax.ShapeDtypeStruct((0,), _F32), activation=activation, limit=limit,
                        alpha=alpha, out_dtype=x.dtype)[0]
    if tuple(grad.shape) != tuple(out.shape):
        raise ValueError(f"te_lite::activation_bwd: argument 'grad': expected shape "
                         f"{tuple(out.shape)} (the activation's output), got {tuple(grad.shape)}")
    check_dtype("activation_bwd", "grad", grad.dtype, HIGH_PRECISION)
    return (jax.ShapeDtypeStruct(x.shape, x.dtype),)


class _ActOp(FFIOp):
    """Gated activations keep TE-JAX's [..., 2, H] layout in the graph (so H can stay sharded, the
    pair dim gathered) and hand the handler the same memory as [..., 2H]."""

    def __init__(self, *args, x_arg: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.x_arg = x_arg

    def ffi(self, *args, **params) -> tuple:
        if params["activation"] not in _GATED:
            return super().ffi(*args, **params)
        outs = list(self.abstract(*[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args],
                                  **params))
        x = args[self.x_arg]
        core = list(args)
        core[self.x_arg] = x.reshape(*x.shape[:-2], 2 * x.shape[-1])
        bwd = self.x_arg == 1
        if bwd:  # dx comes back in the core's layout
            outs[0] = jax.ShapeDtypeStruct(core[1].shape, outs[0].dtype)
        res = list(jax.ffi.ffi_call(self.ffi_name, tuple(outs))(*core, **self._attrs(params)))
        if bwd:
            res[0] = res[0].reshape(x.shape)
        return tuple(res)


def _make(name, ffi_fwd, ffi_bwd, gated):
    gather = (-2,) if gated else ()
    fwd = _ActOp(name[0], ffi_fwd, _fwd_abstract, _jax_act_fwd, attrs=_fwd_attrs, row_args=(0,),
                 reducing_results=(1,), x_arg=0,
                 partition=RowRule(("x", "rep"), ("x", "amax", "rep"), trailing=0, gather=gather))
    bwd = _ActOp(name[1], ffi_bwd, _bwd_abstract, _jax_act_bwd, attrs=_fwd_attrs,
                 row_args=(0, 1), x_arg=1,
                 partition=RowRule(("x", "x"), ("x",), trailing=0, gather=gather))
    return fwd, bwd


# Element-wise and gated activations are separate primitives (their sharding rules differ) under
# TE's names, so NVTE_JAX_CUSTOM_CALLS=ActLuPrimitive=false switches both.
ActLuPrimitive, DActLuPrimitive = _make(("ActLuPrimitive", "DActLuPrimitive"),
                                        "te_lite_activation_fwd_ffi", "te_lite_activation_bwd_ffi",
                                        gated=False)
GatedActLuPrimitive, GatedDActLuPrimitive = _make(
    ("ActLuPrimitive", "DActLuPrimitive"), "te_lite_activation_fwd_ffi",
    "te_lite_activation_bwd_ffi", gated=True)
ClampedActLuPrimitive, ClampedDActLuPrimitive = _make(
    ("ClampedSwigluPrimitive", "ClampedDSwigluPrimitive"),
    "te_lite_clamped_swiglu_fwd_ffi", "te_lite_clamped_swiglu_bwd_ffi", gated=True)


def _params(activation_type, act_params):
    name = activation_name(activation_type)
    p = (act_params or ActivationParams()).clamped_swiglu
    return name, float(p.limit), float(p.alpha), float(p.glu_linear_offset)


def _core_layout(x, name):
    """[..., 2, H] (TE-JAX) -> [..., 2H] for gated activations."""
    if name in _GATED:
        if x.ndim < 2 or x.shape[-2] != 2:
            raise ValueError(f"act_lu: argument 'x': expected shape [..., 2, H] for gated "
                             f"activation '{name}', got {tuple(x.shape)}")
        return x.reshape(*x.shape[:-2], 2 * x.shape[-1])
    return x


def act_lu(x, activation_type, *args, **kwargs):
    """TE-JAX's form `act_lu(x, activation_type, quantizer=None, act_params=None)` with x
    [..., len(activation_type), H] -> ScaledTensor / NoScaleTensor [..., H] (te_api.act_lu_te); or
    the primitive form `act_lu(x, activation_type, out_dtype, scale, act_params)` -> (y, amax,
    scale_inv). The TE form is the one taken when the third argument is a Quantizer or None, the
    fourth an ActivationParams, or a `quantizer` keyword is given."""
    from . import te_api

    if ("quantizer" in kwargs or (args and (args[0] is None or te_api.is_quantizer(args[0])))
            or (len(args) > 1 and isinstance(args[1], ActivationParams))):
        return te_api.act_lu_te(x, activation_type, *args, **kwargs)
    return _act_lu(x, activation_type, *args, **kwargs)


def _act_lu(x, activation_type, out_dtype=None, scale=None, act_params=None):
    """(y, amax, scale_inv): y = act(x) in out_dtype (default x's; FP8 needs `scale`)."""
    name, limit, alpha, offset = _params(activation_type, act_params)
    out_dtype = np.dtype(out_dtype if out_dtype is not None else x.dtype)
    if name == "identity":
        if is_fp8(out_dtype):
            from .quantization import _quantize_scaled
            return _quantize_scaled(x, scale, out_dtype)
        z = jnp.zeros((0,), _F32)
        return x.astype(out_dtype), z, z
    _core_layout(x, name)  # checks the [..., 2, H] layout of gated activations
    prim = (ClampedActLuPrimitive if name == "clamped_swiglu"
            else GatedActLuPrimitive if name in _GATED else ActLuPrimitive)
    scale = as_scalar(scale) if scale is not None else jnp.zeros((0,), _F32)
    extra = {"offset": offset} if name == "clamped_swiglu" else {}
    return prim(x, scale, activation=name, limit=limit, alpha=alpha, out_dtype=out_dtype, **extra)


def dact_lu(grad, x, activation_type, act_params=None):
    """d act(x) / dx applied to grad; x as given to act_lu ([..., 2, H] when gated)."""
    name, limit, alpha, offset = _params(activation_type, act_params)
    if name == "identity":
        return grad.astype(x.dtype)
    _core_layout(x, name)
    prim = (ClampedDActLuPrimitive if name == "clamped_swiglu"
            else GatedDActLuPrimitive if name in _GATED else DActLuPrimitive)
    extra = {"offset": offset} if name == "clamped_swiglu" else {}
    (dx,) = prim(grad, x, activation=name, limit=limit, alpha=alpha, **extra)
    return dx


def _jax_act_lu_f32(x, activation_type, act_params=None):
    """Pure-JAX float32 reference of act_lu (TE-JAX's name), in x's dtype."""
    name, limit, alpha, offset = _params(activation_type, act_params)
    if name == "identity":
        return x
    x32 = _core_layout(x, name).astype(_F32)
    return _jax_act_fwd32(x32, name, limit, alpha, offset).astype(x.dtype)


# TE-JAX's quantizer-taking forms and references, importable from this module as in TE.
from .te_api import _jax_act_lu, _jax_quantize_dact_dbias, quantize_dact_dbias  # noqa: E402,F401
