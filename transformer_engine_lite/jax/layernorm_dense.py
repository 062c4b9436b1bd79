"""`layernorm_dense`: norm(x) @ kernel (+ bias), one custom_vjp; under FP8 the norm writes the FP8
GEMM input directly (delayed scaling) and the backward reuses the FP8 residuals."""

from __future__ import annotations

from functools import partial

import jax

from . import _gemm_core as core
from . import cpp_extensions as tex
from .layernorm import canonicalize_norm_type, norm_bwd, norm_fwd
from .quantize.quantizer import QuantizerSet, noop_quantizer_set
from .sharding import with_sharding_constraint_by_logical_axes

__all__ = ["layernorm_dense"]


def layernorm_dense(x, kernel, gamma, beta, bias=None, norm_type="layernorm",
                    zero_centered_gamma=False, epsilon=1e-6, transpose_batch_sequence=False,
                    layernorm_input_axes=None, dot_input_axes=None, kernel_axes=None,
                    quantizer_set: QuantizerSet = noop_quantizer_set):
    """x [..., H] -> norm -> @ kernel [H, N...] (+ bias) -> [..., N...] in x's dtype. Current
    scaling takes its amaxes as TE-JAX's layernorm_dense does: the norm output and the gradient
    over AmaxScope.TPSP (the sequence dim: 0 with transpose_batch_sequence, else 1), the kernel
    over AmaxScope.FSDP."""
    norm_type = canonicalize_norm_type(norm_type)
    if kernel.shape[0] != x.shape[-1]:
        raise ValueError(f"layernorm_dense: argument 'kernel': expected leading dim {x.shape[-1]} "
                         f"(x's last dim), got shape {tuple(kernel.shape)}")
    x = with_sharding_constraint_by_logical_axes(x, layernorm_input_axes)
    kernel = with_sharding_constraint_by_logical_axes(kernel, kernel_axes)
    if norm_type == "rmsnorm":
        beta = None
    return _ln_dense(x, kernel, gamma, beta, bias, quantizer_set, norm_type,
                     bool(zero_centered_gamma), float(epsilon), dot_input_axes,
                     bool(transpose_batch_sequence))


@partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def _ln_dense(x, kernel, gamma, beta, bias, qset, norm_type, zcg, eps, dot_input_axes, tbs):
    return _fwd(x, kernel, gamma, beta, bias, qset, norm_type, zcg, eps, dot_input_axes, tbs)[0]


def _fwd(x, kernel, gamma, beta, bias, qset, norm_type, zcg, eps, dot_input_axes, tbs):
    qx, qk = core.copy_quantizer(qset.x), core.copy_quantizer(qset.kernel)
    z, mu, rs = norm_fwd(x, gamma, beta, norm_type, zcg, eps, qx, x.ndim - 1, tex.AmaxScope.TPSP,
                         tbs)
    if qx is None:
        z = with_sharding_constraint_by_logical_axes(z, dot_input_axes)
    kq = core.quantize(qk, kernel.astype(x.dtype) if qk is None else kernel, 1,
                       tex.AmaxScope.FSDP, tbs)
    out = core.forward(z, kq, x.ndim, 1, bias, x.dtype)
    static = core.Static(x.dtype, kernel.dtype, x.ndim, kernel.ndim,
                         None if bias is None else bias.dtype, None if beta is None else beta.dtype)
    res = (x, mu, rs, gamma, z, kq, static, QuantizerSet(qx, qk, core.copy_quantizer(qset.dgrad)))
    return out, res


def _bwd(norm_type, zcg, eps, dot_input_axes, tbs, res, g):
    x, mu, rs, gamma, z, kq, static, qset = res
    x_dtype, k_dtype, x_ndim, k_ndim, bias_dtype, beta_dtype = static.values
    dz, dk, dbias, qg = core.backward(g, z, kq, x_ndim, k_ndim, 1, qset.dgrad, x_dtype, k_dtype,
                                      tbs)
    dx, dgamma, dbeta = norm_bwd(dz, x, mu, rs, gamma, beta_dtype, norm_type, zcg)
    dbias = None if bias_dtype is None else dbias.astype(bias_dtype)
    return dx, dk.astype(k_dtype), dgamma, dbeta, dbias, QuantizerSet(qset.x, qset.kernel, qg)


_ln_dense.defvjp(_fwd, _bwd)
