"""Grouped (MoE) NVFP4 (TE-JAX's NVFP4_1D_SCALING / NVFP4_2D_SCALING under grouped_quantize,
grouped_gemm and grouped_dense), over the core's NVFP4 quantize and block GEMM handlers.

Quantize: each group is quantized as a tensor of its own, with its own global amax (NVFP4's
per-tensor scale): the core quantizes the whole tensor once per group with the other groups' rows
zeroed (zeros do not move an amax), and each group keeps its rows' bytes. Row-wise 1x16 blocks lie
inside a row, so those bytes are exactly the group's own; 16x16 blocks (NVFP4_2D_SCALING) and the
column-wise copy's blocks (16 rows) lie inside one group when the group sizes are multiples of 16,
which these need (TE's grouped NVFP4 GEMMs take 16-row-aligned groups too): checked when the sizes
are concrete; traced sizes cannot be read at trace time, so that rule is the caller's there. The
same stochastic-rounding state serves every group: the core draws per element position, so each
element gets the draw a single quantize would give it.

Layout (GroupedScaledTensor1x, NVFP4): float4_e2m1fn data and unpadded float8_e4m3fn scales of
the whole tensor as one ScaledTensor1x holds them (the column-wise copy transposed, "T"), `amax`
one float32 per group.

GEMMs: group g's product is the FP4 tensor core's order GEMM (gemm_nvfp4.py) of the copies with
blocks along K and group g's amax; forward / dgrad keep group g's rows (each output row depends
only on its own lhs row); wgrad contracts the tokens with the other groups' blocks emptied (zero
codes and scales: their terms are +0, which leaves the K-ordered sum unchanged).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .gemm_nvfp4 import nvfp4_gemm, nvfp4_k_dims
from .nvfp4 import NVFP4_BLOCK, quantize_nvfp4

__all__ = ["grouped_quantize_nvfp4", "group_copy", "nvfp4_masked_group_gemm",
           "nvfp4_masked_group_wgrad"]


def _check_aligned(group_sizes, what):
    if group_sizes is None or isinstance(group_sizes, jax.core.Tracer):
        return
    sizes = np.asarray(group_sizes)
    if np.any(sizes % NVFP4_BLOCK):
        raise ValueError(f"te_lite::grouped_quantize: argument 'group_sizes': {what} needs group "
                         f"sizes that are multiples of {NVFP4_BLOCK} (its blocks span 16 rows), "
                         f"got {sizes.tolist()}")


def grouped_quantize_nvfp4(x, quantizer, group_sizes, gid, fa, row, col, dq, make):
    """(row-wise copy or None, column-wise copy or None) as GroupedScaledTensor1x (via `make`)."""
    from ..quantize.scaling_modes import ScalingMode
    from ..quantize.hadamard import get_sign_from_vector, get_wgrad_sign_vector

    q = quantizer.quantizers[0]
    mode = ScalingMode(quantizer.scaling_mode)
    two_d = mode == ScalingMode.NVFP4_2D_SCALING
    if two_d or col:
        _check_aligned(group_sizes, "NVFP4 with 16x16 blocks" if two_d else
                       "the NVFP4 column-wise copy")
    n = quantizer.n_groups
    shape = tuple(x.shape)
    rows, cols = int(np.prod(shape[:fa])), int(np.prod(shape[fa:]))
    tshape = shape[fa:] + shape[:fa]
    for name, d in (("rows", rows), ("cols", cols)):
        if d % NVFP4_BLOCK and (name == "cols" or col or two_d):
            raise ValueError(f"te_lite::grouped_quantize: NVFP4 needs the 2-D view's {name} to "
                             f"be a multiple of {NVFP4_BLOCK}, got {rows} x {cols}")
    if group_sizes is None and (col or two_d) and (rows // n) % NVFP4_BLOCK:
        # axis 0 is the group axis (kernels [G, ...]): each group's rows of the 2-D view
        raise ValueError(f"te_lite::grouped_quantize: NVFP4 column-wise copies and 16x16 blocks "
                         f"need each group's {rows // n} rows of the 2-D view to be a multiple "
                         f"of {NVFP4_BLOCK}")
    use_rht = bool(q.use_rht and col and mode == ScalingMode.NVFP4_1D_SCALING)
    mask = get_sign_from_vector(get_wgrad_sign_vector()) if use_rht else 0
    state = q.stochastic_rounding_rng_state
    x2 = x.reshape(rows, cols)
    gid_rows = gid if gid.shape[0] == rows else jnp.repeat(gid, rows // gid.shape[0])
    nbr, nbc = cols // NVFP4_BLOCK, rows // NVFP4_BLOCK
    r_data = r_s = c_data = c_s = None
    r_amax, c_amax = [], []
    for g in range(n):
        sel = gid_rows == g
        xg = jnp.where(sel[:, None], x2, jnp.zeros((), x2.dtype))
        r, rs, ra, c, cs, ca = quantize_nvfp4(xg, row, col, two_d=two_d, rht=use_rht,
                                              rht_sign_mask=mask,
                                              stochastic_rounding=state is not None,
                                              rng_state=state)
        if row:
            rs = rs[:rows, :nbr]
            r_data = r if r_data is None else jnp.where(sel[:, None], r, r_data)
            r_s = rs if r_s is None else jnp.where(sel[:, None], rs, r_s)
            r_amax.append(ra.reshape(1))
        if col:  # byte j of a column covers rows 2j, 2j+1; scale b rows 16b..16b+15
            cs = cs[:cols, :nbc]
            c_data = c if c_data is None else jnp.where(sel[0::2][None, :], c, c_data)
            c_s = cs if c_s is None else jnp.where(sel[0::NVFP4_BLOCK][None, :], cs, c_s)
            c_amax.append(ca.reshape(1))

    def fp4(packed, shp):
        return jax.lax.bitcast_convert_type(packed, jnp.float4_e2m1fn).reshape(shp)

    def e4m3(s):
        return jax.lax.bitcast_convert_type(s, jnp.float8_e4m3fn)

    out_r = out_c = None
    if row:
        out_r = make(fp4(r_data, shape), e4m3(r_s), jnp.concatenate(r_amax), False, fa)
    if col:
        out_c = make(fp4(c_data, tshape), e4m3(c_s), jnp.concatenate(c_amax), True,
                     len(shape) - fa, use_rht)
    return out_r, out_c


def group_copy(t, g, slab=None):
    """Group g's ScaledTensor1x view of a grouped NVFP4 copy t: its amax; with `slab` (a [G, ...]
    kernel quantized whole), the group's [rows, K] slab of the 2-D view instead of all rows."""
    from ..quantize.tensor import ScaledTensor1x

    data, si = t.data, t.scale_inv
    fa = t.flatten_axis
    if slab is not None:
        shape = tuple(data.shape)
        if not t.is_colwise:  # [G, a, b] split at fa: rows of group g are the slab's
            data = data[g]
            si = si.reshape(shape[0], -1, si.shape[-1])[g]
            fa = fa - 1
        else:  # "T" copy [b..., G, a]: the group's columns of the 2-D view
            data = jnp.take(data, g, axis=fa)
            k = int(np.prod(data.shape[fa:]))
            si = si[:, g * (k // NVFP4_BLOCK):(g + 1) * (k // NVFP4_BLOCK)]
    return ScaledTensor1x(data, si, t.scaling_mode, t.dq_dtype, t.is_colwise,
                          t.amax[g:g + 1], None, fa, getattr(t, "has_rht_applied", False))


def _pick(t, k_dims_of_view, g, slab):
    """The copy of t (a grouped copy or a ScaledTensor2x of two) whose group-g view has its blocks
    along `k_dims_of_view`, or None."""
    for c in (getattr(t, "rowwise_tensor", None), getattr(t, "colwise_tensor", None), t):
        if c is None or not hasattr(c, "n_groups"):
            continue
        v = group_copy(c, g, slab)
        if nvfp4_k_dims(v) == k_dims_of_view:
            return v
    return None


def nvfp4_masked_group_gemm(a, b, gid, n_groups, rc, out_dtype):
    """Rows of group g = a's group-g rows @ b[g] (b [G, K, N] for rc 1, [G, N, K] for rc 2) in the
    block order; None when a copy with blocks along K is missing (the caller dequantizes)."""
    out = None
    for g in range(n_groups):
        av = _pick(a, (1,), g, None)
        bv = _pick(b, (0,) if rc == 1 else (1,), g, True)
        if av is None or bv is None:
            return None
        y = nvfp4_gemm(av, bv, None, out_dtype)  # [M, N] whichever side b's K is on
        out = y if out is None else jnp.where((gid == g)[:, None], y, out)
    return out


def _emptied(v, keep_rows):
    """v (a column-wise view, blocks along the tokens) with the blocks of other groups' tokens
    zeroed: codes and scales 0, so their terms are +0."""
    packed = jax.lax.bitcast_convert_type(v.data.reshape(v.data.shape[0], -1, 2), jnp.uint8)
    packed = jnp.where(keep_rows[0::2][None, :], packed, jnp.zeros((), jnp.uint8))
    s = jax.lax.bitcast_convert_type(v.scale_inv, jnp.uint8)
    s = jnp.where(keep_rows[0::NVFP4_BLOCK][None, :], s, jnp.zeros((), jnp.uint8))
    return v.__class__(jax.lax.bitcast_convert_type(packed, jnp.float4_e2m1fn).reshape(
        v.data.shape), jax.lax.bitcast_convert_type(s, jnp.float8_e4m3fn), v.scaling_mode,
        v.dq_dtype, v.is_colwise, v.amax, None, v.flatten_axis, v.has_rht_applied)


def nvfp4_masked_group_wgrad(a, g_, gid, n_groups, out_dtype):
    """[G, K, N]: group g's a tokens^T @ its g_ tokens, both column-wise (blocks along the
    tokens); None when a column-wise copy is missing."""
    parts = []
    for g in range(n_groups):
        av, gv = _pick(a, (0,), g, None), _pick(g_, (0,), g, None)
        if av is None or gv is None:
            return None
        keep = gid == g
        parts.append(nvfp4_gemm(_emptied(av, keep), _emptied(gv, keep), None, out_dtype))
    return jnp.stack(parts)
