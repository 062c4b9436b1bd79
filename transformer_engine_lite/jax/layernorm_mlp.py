"""`layernorm_mlp`: norm -> dense (kernel_1 [H, n_act, I]) -> activation -> dense (kernel_2 [I, H]),
one custom_vjp over the core kernels, FP8 under two QuantizerSets (one per GEMM: fp8_metas names
with postfix _0 / _1). Gated activations (("gelu", "linear"), ...) use n_act = 2."""

from __future__ import annotations

from functools import partial

import jax
from jax.ad_checkpoint import checkpoint_name

from . import _gemm_core as core
from . import cpp_extensions as tex
from .layernorm import canonicalize_norm_type, norm_bwd, norm_fwd
from .quantize.quantizer import QuantizerSet, noop_quantizer_set
from .sharding import with_sharding_constraint_by_logical_axes

__all__ = ["layernorm_mlp"]


def layernorm_mlp(x, gamma, beta, kernels, biases, norm_type="layernorm",
                  zero_centered_gamma=False, epsilon=1e-6, transpose_batch_sequence=False,
                  norm_input_axes=None, dot_1_input_axes=None, dot_2_input_axes=None,
                  kernel_1_axes=None, kernel_2_axes=None, ffn1_ckpt_name="ffn1",
                  ffn2_ckpt_name="ffn2", activation_type=("gelu",), activation_params=None,
                  collective_op_sets=None, quantizer_sets=(noop_quantizer_set, noop_quantizer_set)):
    """x [..., H] -> [..., H]; kernels = [k1 (H, n_act, I), k2 (I, H)], biases = [b1 (n_act, I) or
    None, b2 (H,) or None]. Current scaling takes its amaxes as TE-JAX's layernorm_mlp does: the
    norm output, the activation output and both gradients over AmaxScope.TPSP (the sequence dim: 0
    with transpose_batch_sequence, else 1), the kernels over AmaxScope.FSDP."""
    del collective_op_sets
    norm_type = canonicalize_norm_type(norm_type)
    act = tuple(activation_type)
    n_act = 2 if tex.is_gated(act) else 1
    k1, k2 = kernels
    b1, b2 = biases if biases is not None else (None, None)
    hidden = x.shape[-1]
    if k1.ndim != 3 or k1.shape[0] != hidden or k1.shape[1] != n_act:
        raise ValueError(f"layernorm_mlp: argument 'kernels[0]': expected shape ({hidden}, {n_act}"
                         f", intermediate) for activation {act}, got {tuple(k1.shape)}")
    if k2.ndim != 2 or k2.shape[0] != k1.shape[2]:
        raise ValueError(f"layernorm_mlp: argument 'kernels[1]': expected shape ({k1.shape[2]}, "
                         f"hidden), got {tuple(k2.shape)}")
    if norm_type == "rmsnorm":
        beta = None
    x = with_sharding_constraint_by_logical_axes(x, norm_input_axes)
    k1 = with_sharding_constraint_by_logical_axes(k1, kernel_1_axes)
    k2 = with_sharding_constraint_by_logical_axes(k2, kernel_2_axes)
    cfg = (norm_type, bool(zero_centered_gamma), float(epsilon), act, activation_params,
           dot_1_input_axes, dot_2_input_axes, ffn1_ckpt_name, ffn2_ckpt_name,
           bool(transpose_batch_sequence))
    return _ln_mlp(x, gamma, beta, k1, k2, b1, b2, tuple(quantizer_sets), cfg)


@partial(jax.custom_vjp, nondiff_argnums=(8,))
def _ln_mlp(x, gamma, beta, k1, k2, b1, b2, qsets, cfg):
    return _fwd(x, gamma, beta, k1, k2, b1, b2, qsets, cfg)[0]


def _fwd(x, gamma, beta, k1, k2, b1, b2, qsets, cfg):
    norm_type, zcg, eps, act, act_params, dot1_axes, dot2_axes, ck1, ck2, tbs = cfg
    tpsp, fsdp = tex.AmaxScope.TPSP, tex.AmaxScope.FSDP
    q1, q2 = qsets
    q1x, q1k = core.copy_quantizer(q1.x), core.copy_quantizer(q1.kernel)
    q2x, q2k = core.copy_quantizer(q2.x), core.copy_quantizer(q2.kernel)
    z, mu, rs = norm_fwd(x, gamma, beta, norm_type, zcg, eps, q1x, x.ndim - 1, tpsp, tbs)
    if q1x is None:
        z = with_sharding_constraint_by_logical_axes(z, dot1_axes)
    k1q = core.quantize(q1k, k1.astype(x.dtype) if q1k is None else k1, 1, fsdp, tbs)
    h1 = core.forward(z, k1q, x.ndim, 1, b1, x.dtype)  # [..., n_act, I]
    h1 = checkpoint_name(h1, ck1)
    a = tex.act_lu(h1 if h1.shape[-2] == 2 else h1[..., 0, :], act,
                   act_params=act_params)[0]  # [..., I]
    if q2x is None:
        a = with_sharding_constraint_by_logical_axes(a, dot2_axes)
    aq = core.quantize(q2x, a, a.ndim - 1, tpsp, tbs)
    k2q = core.quantize(q2k, k2.astype(x.dtype) if q2k is None else k2, 1, fsdp, tbs)
    out = core.forward(aq, k2q, a.ndim, 1, b2, x.dtype)
    out = checkpoint_name(out, ck2)
    static = core.Static(x.dtype, k1.dtype, k2.dtype, x.ndim,
                         None if b1 is None else b1.dtype, None if b2 is None else b2.dtype,
                         None if beta is None else beta.dtype)
    new_sets = (QuantizerSet(q1x, q1k, core.copy_quantizer(q1.dgrad)),
                QuantizerSet(q2x, q2k, core.copy_quantizer(q2.dgrad)))
    return out, (x, mu, rs, gamma, z, k1q, h1, aq, k2q, static, new_sets)


def _bwd(cfg, res, g):
    norm_type, zcg, _eps, act, act_params, *_, tbs = cfg
    x, mu, rs, gamma, z, k1q, h1, aq, k2q, static, (s1, s2) = res
    x_dtype, k1_dtype, k2_dtype, x_ndim, b1_dtype, b2_dtype, beta_dtype = static.values
    da, dk2, db2, qg2 = core.backward(g, aq, k2q, x_ndim, 2, 1, s2.dgrad, x_dtype, k2_dtype, tbs)
    if h1.shape[-2] == 2:
        dh1 = tex.dact_lu(da, h1, act, act_params)
    else:
        dh1 = tex.dact_lu(da, h1[..., 0, :], act, act_params)[..., None, :]
    dz, dk1, db1, qg1 = core.backward(dh1, z, k1q, x_ndim, 3, 1, s1.dgrad, x_dtype, k1_dtype,
                                      tbs)
    dx, dgamma, dbeta = norm_bwd(dz, x, mu, rs, gamma, beta_dtype, norm_type, zcg)
    db1 = None if b1_dtype is None else db1.astype(b1_dtype)
    db2 = None if b2_dtype is None else db2.astype(b2_dtype)
    sets = (QuantizerSet(s1.x, s1.kernel, qg1), QuantizerSet(s2.x, s2.kernel, qg2))
    return dx, dgamma, dbeta, dk1.astype(k1_dtype), dk2.astype(k2_dtype), db1, db2, sets


_ln_mlp.defvjp(_fwd, _bwd)
