"""`dense`: y = x @ kernel (+ bias) with TE-JAX's signature, differentiable (jax.custom_vjp), FP8 under
a QuantizerSet. The backward returns the updated QuantizerSet as the cotangent of `quantizer_set`
(TE's idiom: a train step takes the gradient w.r.t. all variables, pops "params" and keeps the rest
as the new fp8_metas state)."""

from __future__ import annotations

from functools import partial

import jax

from . import _gemm_core as core
from .quantize.quantizer import QuantizerSet, noop_quantizer_set
from .sharding import with_sharding_constraint_by_logical_axes

__all__ = ["dense"]


def _check(x, kernel, contracting_dims):
    xc, kc = contracting_dims
    nx, nk = x.ndim, kernel.ndim
    xc = tuple(sorted(d % nx for d in xc))
    kc = tuple(sorted(d % nk for d in kc))
    if xc != tuple(range(nx - len(xc), nx)) or kc != tuple(range(len(kc))) or len(xc) != len(kc):
        raise ValueError(
            "dense: argument 'contracting_dims': expected x's trailing dims and kernel's leading "
            f"dims (e.g. (({nx - 1},), (0,))), got {contracting_dims} for x {tuple(x.shape)}, "
            f"kernel {tuple(kernel.shape)}")
    if [x.shape[d] for d in xc] != [kernel.shape[d] for d in kc]:
        raise ValueError(f"dense: argument 'kernel': expected leading dims "
                         f"{[x.shape[d] for d in xc]} (x's contracting dims), got shape "
                         f"{tuple(kernel.shape)}")
    return len(xc)


def dense(x, kernel, bias=None, contracting_dims=((1,), (0,)), transpose_batch_sequence=False,
          input_axes=None, kernel_axes=None, output_axes=None, collective_op_set=None,
          quantizer_set: QuantizerSet = noop_quantizer_set):
    """x [batch..., K...] . kernel [K..., N...] (+ bias [N...]) -> [batch..., N...] in x's dtype."""
    del transpose_batch_sequence, collective_op_set
    if contracting_dims == ((1,), (0,)) and x.ndim != 2:
        contracting_dims = ((x.ndim - 1,), (0,))
    nc = _check(x, kernel, contracting_dims)
    x = with_sharding_constraint_by_logical_axes(x, input_axes)
    kernel = with_sharding_constraint_by_logical_axes(kernel, kernel_axes)
    out = _dense(x, kernel, bias, quantizer_set, nc)
    return with_sharding_constraint_by_logical_axes(out, output_axes)


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _dense(x, kernel, bias, quantizer_set, nc):
    return _dense_fwd(x, kernel, bias, quantizer_set, nc)[0]


def _dense_fwd(x, kernel, bias, quantizer_set, nc):
    qx = core.copy_quantizer(quantizer_set.x)
    qk = core.copy_quantizer(quantizer_set.kernel)
    xq = core.quantize(qx, x, x.ndim - nc)
    kq = core.quantize(qk, kernel.astype(x.dtype) if qk is None else kernel, nc)
    out = core.forward(xq, kq, x.ndim, nc, bias, x.dtype)
    static = core.Static(x.dtype, kernel.dtype, x.ndim, kernel.ndim,
                         None if bias is None else bias.dtype)
    res = (xq, kq, static, QuantizerSet(qx, qk, core.copy_quantizer(quantizer_set.dgrad)))
    return out, res


def _dense_bwd(nc, res, g):
    xq, kq, static, qset = res
    x_dtype, k_dtype, x_ndim, k_ndim, bias_dtype = static.values
    dx, dk, dbias, qg = core.backward(g, xq, kq, x_ndim, k_ndim, nc, qset.dgrad, x_dtype, k_dtype)
    dbias = None if bias_dtype is None else dbias.astype(bias_dtype)
    return dx, dk.astype(k_dtype), dbias, QuantizerSet(qset.x, qset.kernel, qg)


_dense.defvjp(_dense_fwd, _dense_bwd)
