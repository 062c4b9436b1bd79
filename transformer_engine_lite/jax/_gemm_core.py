"""The GEMM steps shared by dense, layernorm_dense and layernorm_mlp: quantize the operands, the
forward GEMM, and the two backward GEMMs (dgrad, wgrad) on the quantized residuals saved by the
forward (TE's rule: FP8 operands are reused in the backward, never recomputed).

Layout: x [batch..., K...] contracts its trailing `nc` dims with the leading `nc` dims of kernel
[K..., N...]. Which copy each GEMM reads (MXFP8 blocks must run along the contracted dim):
  forward  y  = x @ k        x row-wise, k column-wise
  dgrad    dx = g @ k^T      g row-wise, k row-wise
  wgrad    dk = x^T @ g      x column-wise, g column-wise
Per-tensor FP8 has one copy (the GEMM transposes); MXFP8 copies are dequantized to the compute
dtype (exact: E4M3/E5M2 values times a power of two fit bf16) and multiplied in high precision.
NVFP4 copies go to tex.gemm as they are, which multiplies two of them in the FP4 tensor core's
order through the core's block GEMM (the PyTorch front end's function and bits); the paired GEMMs
below dequantize them to float32 instead (exact) with float32 accumulation; the column-wise
copies of x and the gradient carry the Hadamard transform along the batch dim, which cancels in
the wgrad GEMM (TE-JAX's rule: both operands or neither).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import cpp_extensions as tex
from .quantize.nvfp4 import check_rht_pair, nvfp4_gemm_operand
from .quantize.scaling_modes import ScalingMode
from .quantize.tensor import ScaledTensor1x, ScaledTensor2x


def copy_quantizer(q):
    """A fresh quantizer object (quantize() mutates; the caller's must stay as given)."""
    return None if q is None else jax.tree_util.tree_map(lambda a: a, q)


def _scoped(quantizer) -> bool:
    """Whether the quantizer's per-tensor amax follows an AmaxScope (TE-JAX: current scaling
    and NVFP4's second-level scale)."""
    mode = quantizer.scaling_mode
    return mode == ScalingMode.CURRENT_TENSOR_SCALING or ScalingMode(mode).is_nvfp4_scaling


def quantize(quantizer, x, flatten_axis: int, amax_scope=None, transpose_batch_sequence=False):
    """x quantized by `quantizer` (None: x as is). amax_scope: where a current-scaling (or
    NVFP4 per-tensor) amax is
    reduced under sharding (TE-JAX's layers: TPSP for activations and gradients, FSDP for
    kernels); None: over the whole tensor."""
    if quantizer is None:
        return x
    if amax_scope is None or not _scoped(quantizer):
        return quantizer.quantize(x, flatten_axis=flatten_axis, dq_dtype=x.dtype)
    return quantizer.quantize(x, flatten_axis=flatten_axis, dq_dtype=x.dtype,
                              amax_scope=amax_scope,
                              transpose_batch_sequence=bool(transpose_batch_sequence))


def _copy(t, colwise: bool):
    return t.get_tensor(colwise) if isinstance(t, ScaledTensor2x) else t


def _pair(a, a_col: bool, b, b_col: bool) -> None:
    check_rht_pair(_copy(a, a_col), _copy(b, b_col))


def operand(t, colwise: bool, dtype, nvfp4_copy: bool = True):
    """(array, scale_inv or None) for tex.gemm from a high-precision array or a ScaledTensor. An
    NVFP4 copy is passed as the ScaledTensor1x itself (tex.gemm multiplies two of them in the FP4
    tensor core's order, the PyTorch front end's bits), or dequantized when nvfp4_copy is False
    (the paired GEMMs slice their operands)."""
    t = _copy(t, colwise)
    if isinstance(t, ScaledTensor1x):
        if ScalingMode(t.scaling_mode).is_nvfp4_scaling:
            return (t, None) if nvfp4_copy else (nvfp4_gemm_operand(t), None)
        if t.scaling_mode == ScalingMode.MXFP8_1D_SCALING:
            return t.dequantize(dtype), None
        return t.data, t.scale_inv
    return t.astype(dtype), None


def _ndim(t) -> int:
    """Rank of an array or of a (ScaledTensor2x's row-wise) ScaledTensor's data."""
    t = getattr(t, "rowwise_tensor", t)
    return t.data.ndim if isinstance(t, ScaledTensor1x) else t.ndim


def _paired(k_ndim: int, nc: int) -> bool:
    """A kernel [K, n_act, I] (LayerNormMLP's first GEMM): one GEMM per n_act slice, so that a
    tensor-parallel I stays sharded (flattening (n_act, I) into one dim would gather it)."""
    return nc == 1 and k_ndim == 3


def forward(xq, kq, x_ndim: int, nc: int, bias, out_dtype):
    _pair(xq, False, kq, True)
    paired = _paired(_ndim(kq), nc)
    lhs, lsi = operand(xq, False, out_dtype, not paired)
    rhs, rsi = operand(kq, True, out_dtype, not paired)
    dims = (tuple(range(x_ndim - nc, x_ndim)), tuple(range(nc)))
    b = None if bias is None else bias.astype(out_dtype)
    if paired:
        return jnp.stack([
            tex.gemm(lhs, rhs[:, j, :], dims, lsi, rsi, bias=None if b is None else b[j],
                     out_dtype=out_dtype) for j in range(rhs.shape[1])], axis=-2)
    return tex.gemm(lhs, rhs, dims, lsi, rsi, bias=b, out_dtype=out_dtype)


def backward(g, xq, kq, x_ndim: int, k_ndim: int, nc: int, dgrad_quantizer, x_dtype, k_dtype,
             transpose_batch_sequence=False):
    """(dx, dk, dbias, dgrad_quantizer after use). The gradient's current-scaling amax is taken
    over TE-JAX's AmaxScope.TPSP (as its layers' quantize_dbias / quantize_dact_dbias)."""
    n_free = k_ndim - nc
    n_batch = x_ndim - nc
    gq = quantize(dgrad_quantizer, g, g.ndim - n_free, tex.AmaxScope.TPSP,
                  transpose_batch_sequence)
    _pair(gq, False, kq, False)
    _pair(xq, True, gq, True)
    paired = _paired(k_ndim, nc)
    g_row, g_row_si = operand(gq, False, x_dtype, not paired)
    k_row, k_row_si = operand(kq, False, x_dtype, not paired)
    x_col, x_col_si = operand(xq, True, x_dtype, not paired)
    g_col, g_col_si = operand(gq, True, x_dtype, not paired)
    batch = tuple(range(n_batch))
    if transpose_batch_sequence and n_batch >= 2 and not any(
            isinstance(t, ScaledTensor1x) for t in (x_col, g_col)):
        # wgrad contracts (seq, batch) flattened into one dim. Under current scaling the batch
        # shards carry their own scales (TPSP is reduced over tpsp only), so the flattened dim
        # must keep the batch sharding and may gather only along seq, within one scale: with the
        # seq dim leading, XLA would keep the seq sharding and gather across batch shards instead,
        # mixing bytes of different scales. Contracting (batch, seq) is the same sum.
        x_col, g_col = jnp.swapaxes(x_col, 0, 1), jnp.swapaxes(g_col, 0, 1)
    if paired:
        n_act = k_row.shape[1]
        parts = [tex.gemm(g_row[..., j, :], k_row[:, j, :], ((n_batch,), (1,)), g_row_si,
                          k_row_si, out_dtype=jnp.float32) for j in range(n_act)]
        dx = sum(parts[1:], parts[0]).astype(x_dtype)
        dk = jnp.stack([tex.gemm(x_col, g_col[..., j, :], (batch, batch), x_col_si, g_col_si,
                                 out_dtype=k_dtype) for j in range(n_act)], axis=1)
    else:
        dx = tex.gemm(g_row, k_row, (tuple(range(n_batch, g.ndim)), tuple(range(nc, k_ndim))),
                      g_row_si, k_row_si, out_dtype=x_dtype)
        dk = tex.gemm(x_col, g_col, (batch, batch), x_col_si, g_col_si, out_dtype=k_dtype)
    dbias = jnp.sum(g.astype(jnp.float32), axis=tuple(range(n_batch)))
    return dx, dk, dbias, dgrad_quantizer


class Static:
    """Static (hashable) values carried in custom_vjp residuals as pytree aux data."""

    def __init__(self, *values) -> None:
        self.values = values


jax.tree_util.register_pytree_node(Static, lambda s: ((), s.values), lambda aux, _: Static(*aux))
