"""`dense`: y = x @ kernel (+ bias) with TE-JAX's signature, differentiable (jax.custom_vjp), FP8 under
a QuantizerSet. The backward returns the updated QuantizerSet as the cotangent of `quantizer_set`
(TE's idiom: a train step takes the gradient w.r.t. all variables, pops "params" and keeps the rest
as the new fp8_metas state)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from . import _gemm_core as core
from . import cpp_extensions as tex
from .quantize.quantizer import QuantizerSet, noop_quantizer_set
from .sharding import with_sharding_constraint_by_logical_axes

__all__ = ["dense", "grouped_dense"]


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
    """x [batch..., K...] . kernel [K..., N...] (+ bias [N...]) -> [batch..., N...] in x's dtype.
    Current scaling takes its amaxes as TE-JAX's dense does: x and the gradient over
    AmaxScope.TPSP (the sequence dim: 0 with transpose_batch_sequence, else 1), the kernel over
    AmaxScope.FSDP."""
    del collective_op_set
    if contracting_dims == ((1,), (0,)) and x.ndim != 2:
        contracting_dims = ((x.ndim - 1,), (0,))
    nc = _check(x, kernel, contracting_dims)
    x = with_sharding_constraint_by_logical_axes(x, input_axes)
    kernel = with_sharding_constraint_by_logical_axes(kernel, kernel_axes)
    out = _dense(x, kernel, bias, quantizer_set, nc, bool(transpose_batch_sequence))
    return with_sharding_constraint_by_logical_axes(out, output_axes)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _dense(x, kernel, bias, quantizer_set, nc, tbs):
    return _dense_fwd(x, kernel, bias, quantizer_set, nc, tbs)[0]


def _dense_fwd(x, kernel, bias, quantizer_set, nc, tbs):
    qx = core.copy_quantizer(quantizer_set.x)
    qk = core.copy_quantizer(quantizer_set.kernel)
    xq = core.quantize(qx, x, x.ndim - nc, tex.AmaxScope.TPSP, tbs)
    kq = core.quantize(qk, kernel.astype(x.dtype) if qk is None else kernel, nc,
                       tex.AmaxScope.FSDP, tbs)
    out = core.forward(xq, kq, x.ndim, nc, bias, x.dtype)
    static = core.Static(x.dtype, kernel.dtype, x.ndim, kernel.ndim,
                         None if bias is None else bias.dtype)
    res = (xq, kq, static, QuantizerSet(qx, qk, core.copy_quantizer(quantizer_set.dgrad)))
    return out, res


def _dense_bwd(nc, tbs, res, g):
    xq, kq, static, qset = res
    x_dtype, k_dtype, x_ndim, k_ndim, bias_dtype = static.values
    dx, dk, dbias, qg = core.backward(g, xq, kq, x_ndim, k_ndim, nc, qset.dgrad, x_dtype, k_dtype,
                                      tbs)
    dbias = None if bias_dtype is None else dbias.astype(bias_dtype)
    return dx, dk.astype(k_dtype), dbias, QuantizerSet(qset.x, qset.kernel, qg)


_dense.defvjp(_dense_fwd, _dense_bwd)


# ------------------------------------------------------------------------------- grouped (MoE)
def grouped_dense(x, kernel, group_sizes, contracting_dims=((1,), (1,)), bias=None, precision=None,
                  preferred_element_type=None, group_offset=None,
                  quantizer_set=noop_quantizer_set, kernel_fsdp_info=(None, -1)):
    """TE-JAX's grouped_dense: x [M, K] in groups of rows (group_sizes [G], on device), kernel
    [G, K, N] (contracting_dims ((1,), (1,))) or [G, N, K] (((1,), (2,))), bias [G, N]; rows of
    group g -> x_g @ kernel[g] + bias[g]. Differentiable; FP8 under a QuantizerSet of
    GroupedQuantizers (QuantizerFactory.create_set(n_groups=G)), the forward's quantized operands
    reused by the backward. Built on cpp_extensions.grouped's masked per-group core GEMMs."""
    del precision
    if group_offset is not None:
        raise NotImplementedError("grouped_dense: group_offset is not implemented (nor by TE)")
    if tuple(kernel_fsdp_info) != (None, -1):
        raise NotImplementedError("grouped_dense: kernel_fsdp_info (FSDP-sharded kernels) is not "
                                  "implemented by transformer_engine_lite")
    (lc,), (rc,) = contracting_dims
    if x.ndim != 2 or kernel.ndim != 3 or lc != 1 or rc not in (1, 2):
        raise ValueError(f"grouped_dense: expected x [M, K], kernel [G, K, N] / [G, N, K] and "
                         f"contracting_dims ((1,), (1|2,)), got x {tuple(x.shape)}, kernel "
                         f"{tuple(kernel.shape)}, {contracting_dims}")
    hp = preferred_element_type or x.dtype
    return _grouped_dense(x, kernel, group_sizes, bias, quantizer_set, core.Static(rc, hp))


@jax.custom_vjp
def _grouped_dense(x, kernel, group_sizes, bias, quantizer_set, st):
    return _gd_fwd(x, kernel, group_sizes, bias, quantizer_set, st)[0]


def _gd_fwd(x, kernel, group_sizes, bias, quantizer_set, st):
    from .cpp_extensions import grouped as gr

    rc, hp = st.values
    n = kernel.shape[0]
    qs = quantizer_set if quantizer_set is not None else noop_quantizer_set
    xq, x_si = gr.grouped_operand(x, core.copy_quantizer(qs.x), group_sizes, n, hp)
    kq, k_si = gr.grouped_operand(kernel, core.copy_quantizer(qs.kernel), None, n, hp)
    gid = gr.group_ids(group_sizes, x.shape[0], n)
    out = gr.masked_group_gemm(xq, x_si, kq, k_si, gid, n, rc, hp)
    if bias is not None:
        out = (out.astype(jnp.float32) + bias.astype(jnp.float32)[gid]).astype(hp)
    res = (xq, x_si, kq, k_si, gid, group_sizes, bias, quantizer_set,
           core.Static(rc, hp, x.dtype, kernel.dtype))
    return out, res


def _gd_bwd(res, g):
    from .cpp_extensions import grouped as gr

    xq, x_si, kq, k_si, gid, group_sizes, bias, quantizer_set, st = res
    rc, hp, x_dtype, k_dtype = st.values
    # (grouped NVFP4 operands are quantized tensors, not arrays: their group count)
    kt = getattr(kq, "rowwise_tensor", None) or kq
    n = kq.shape[0] if hasattr(kq, "shape") else kt.n_groups
    qs = quantizer_set if quantizer_set is not None else noop_quantizer_set
    gq, g_si = gr.grouped_operand(g, core.copy_quantizer(qs.dgrad), group_sizes, n, hp)
    # dgrad: rows of group j = g_j @ kernel[j]^T (contract g's N with the kernel's N)
    dx = gr.masked_group_gemm(gq, g_si, kq, k_si, gid, n, 2 if rc == 1 else 1, x_dtype)
    dk = gr.masked_group_wgrad(xq, x_si, gq, g_si, gid, n, k_dtype)  # [G, K, N]
    if rc == 2:
        dk = jnp.swapaxes(dk, 1, 2)
    dbias = None
    if bias is not None:
        dbias = jax.ops.segment_sum(g.astype(jnp.float32), gid, num_segments=n).astype(bias.dtype)
    return dx, dk, None, dbias, quantizer_set, None


_grouped_dense.defvjp(_gd_fwd, _gd_bwd)
