"""Grouped (MoE) quantize and GEMM, TE-JAX's `grouped_quantize`, `grouped_gemm`,
`grouped_gemm_copy_group_sizes`, over the core's quantize and GEMM handlers.

Groups are runs of rows along axis 0 with sizes on device (traced: jit-compatible, nothing is read
back to the host). The core has no grouped GEMM kernel, so group g's product is the core GEMM of
the whole lhs with rhs[g], and its rows are selected by a row mask: every row of the result is
exactly the row a per-group GEMM gives (each output row depends only on its own lhs row), at G times
the FLOPs of a ragged kernel — the price of static shapes with ragged, device-resident sizes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .gemm import gemm
from .quantization import _quantize_scaled, compute_scale_from_amax, quantize_mxfp8

__all__ = [
    "GroupedQuantizePrimitive",
    "group_ids",
    "grouped_gemm",
    "grouped_gemm_copy_group_sizes",
    "grouped_quantize",
]

_F32 = jnp.float32


class GroupedQuantizePrimitive:
    """TE's grouped-quantize primitive class is only reached by TE's tests through
    `_use_v2_kernel` (does TE's 128-row-aligned MXFP8 "V2" kernel apply). We have no V2 kernel and
    no alignment rule beyond MXFP8's 32-row blocks, so: never."""

    @staticmethod
    def _use_v2_kernel(scaling_mode, input_shape, flatten_axis) -> bool:
        del scaling_mode, input_shape, flatten_axis
        return False


def group_ids(group_sizes, n_rows: int, n_groups: int):
    """Group index of each row along axis 0 (int32 [n_rows])."""
    if group_sizes is None:
        if n_rows != n_groups:
            raise ValueError(f"grouped: without group_sizes axis 0 is the group axis: expected "
                             f"{n_groups} rows (n_groups), got {n_rows}")
        return jnp.arange(n_rows, dtype=jnp.int32)
    return jnp.repeat(jnp.arange(n_groups, dtype=jnp.int32), group_sizes,
                      total_repeat_length=n_rows)


def _check_sizes(group_sizes, n_groups, op):
    if group_sizes is None:
        return
    if group_sizes.ndim != 1 or group_sizes.shape[0] != n_groups:
        raise ValueError(f"te_lite::{op}: argument 'group_sizes': expected shape ({n_groups},) "
                         f"(one size per group), got {tuple(group_sizes.shape)}")
    if not jnp.issubdtype(group_sizes.dtype, jnp.integer):
        raise TypeError(f"te_lite::{op}: argument 'group_sizes': expected an integer dtype, got "
                        f"{group_sizes.dtype}")


def _group_amax(x, gid, n_groups):
    rows = jnp.max(jnp.abs(x.astype(_F32)).reshape(x.shape[0], -1), axis=1)
    return jax.ops.segment_max(rows, gid, num_segments=n_groups).clip(0.0)  # empty group -> 0


def grouped_quantize(x, quantizer, group_sizes=None, flatten_axis=-1, is_rowwise=None,
                     is_colwise=None, dq_dtype=None):
    """GroupedScaledTensor1x (or ScaledTensor2x of two) / GroupedNoScaleTensor for None."""
    from ..quantize.grouped import GroupedNoScaleTensor, GroupedQuantizer, GroupedScaledTensor1x
    from ..quantize.scaling_modes import ScalingMode
    from ..quantize.tensor import ScaledTensor2x

    if quantizer is None:
        return GroupedNoScaleTensor(x, None, group_sizes, None, tuple(x.shape))
    if not isinstance(quantizer, GroupedQuantizer):
        raise TypeError(f"te_lite::grouped_quantize: argument 'quantizer': expected a "
                        f"GroupedQuantizer (QuantizerFactory.create(n_groups=...)), got "
                        f"{type(quantizer).__name__}")
    n = quantizer.n_groups
    _check_sizes(group_sizes, n, "grouped_quantize")
    fa = flatten_axis + x.ndim if flatten_axis < 0 else flatten_axis
    if not 0 < fa < x.ndim:
        raise ValueError(f"te_lite::grouped_quantize: argument 'flatten_axis': expected in "
                         f"[-{x.ndim}, {x.ndim}) and not 0, got {flatten_axis}")
    row = quantizer.q_layout.has_rowwise if is_rowwise is None else is_rowwise
    col = quantizer.q_layout.has_colwise if is_colwise is None else is_colwise
    dq = dq_dtype or x.dtype
    gid = group_ids(group_sizes, x.shape[0], n)
    mode = quantizer.scaling_mode

    def make(data, si, amax, colwise):
        return GroupedScaledTensor1x(data, si, amax, group_sizes, None, tuple(x.shape), mode, dq,
                                     colwise, fa, n)

    if mode == ScalingMode.MXFP8_1D_SCALING:
        x2 = x.reshape(int(np.prod(x.shape[:fa])), int(np.prod(x.shape[fa:])))
        rq, rs, cq, cs = quantize_mxfp8(x2, quantizer.q_dtype, row, col)
        out_r = make(rq.reshape(x.shape), rs, None, False) if row else None
        out_c = make(cq.reshape(x.shape), cs, None, True) if col else None
    elif mode.is_tensor_scaling():
        amax = _group_amax(x, gid, n)
        scales = []
        for g, q in enumerate(quantizer.quantizers):
            if mode == ScalingMode.DELAYED_TENSOR_SCALING:
                scales.append(q.scale.reshape(1))
                q.update(amax[g:g + 1])
            else:
                s, _ = compute_scale_from_amax(amax[g:g + 1], q.q_dtype, q.amax_epsilon,
                                               q.power_2_scale)
                scales.append(s.reshape(1))
        scale = jnp.concatenate(scales)
        # encode(x * s_g): the float32 product per row, then the quantize handler with scale 1
        # (exact), i.e. the bytes of the handler run on each group with its own scale.
        prod = x.astype(_F32) * scale[gid].reshape((-1,) + (1,) * (x.ndim - 1))
        data, _, _ = _quantize_scaled(prod, jnp.ones((1,), _F32), quantizer.q_dtype)
        si = (1.0 / scale).astype(_F32)
        out_r = make(data, si, amax, False) if row else None
        out_c = make(data, si, amax, True) if col else None
    elif mode.is_nvfp4_scaling:
        from .grouped_nvfp4 import grouped_quantize_nvfp4

        def make_nv(data, si, amax, colwise, own_fa, rht=False):
            return GroupedScaledTensor1x(data, si, amax, group_sizes, None, tuple(x.shape), mode,
                                         dq, colwise, own_fa, n, rht)

        out_r, out_c = grouped_quantize_nvfp4(x, quantizer, group_sizes, gid, fa, row, col, dq,
                                              make_nv)
    else:
        raise NotImplementedError(f"te_lite::grouped_quantize: scaling_mode {mode.name} is not "
                                  "implemented by transformer_engine_lite")
    if row and col:
        return ScaledTensor2x(out_r, out_c)
    return out_r if row else out_c


def grouped_gemm_copy_group_sizes(group_sizes, num_gemms: int):
    """TE copies the group sizes to the host ahead of its grouped GEMM. Ours reads them on device,
    so there is nothing to copy: the sizes are checked and returned."""
    _check_sizes(group_sizes, int(num_gemms), "grouped_gemm_copy_group_sizes")
    return group_sizes


def grouped_operand(t, quantizer, group_sizes, n_groups, hp_dtype):
    """(array, per-group scale_inv [G] or None): high precision, per-tensor FP8 (per-group scales),
    or MXFP8 dequantized exactly to the compute dtype (as _gemm_core does)."""
    from ..quantize.grouped import GroupedNoScaleTensor, GroupedScaledTensor1x
    from ..quantize.scaling_modes import ScalingMode
    from ..quantize.tensor import ScaledTensor2x

    if isinstance(t, GroupedNoScaleTensor):
        t = t.data
    nvfp4 = quantizer is not None and ScalingMode(quantizer.scaling_mode).is_nvfp4_scaling
    if quantizer is not None:
        # NVFP4: both copies (the GEMMs need the one with blocks along their K: grouped_nvfp4.py)
        t = grouped_quantize(t, quantizer, group_sizes, -1, True, nvfp4, hp_dtype)
    if _is_nvfp4(t):
        return t, None
    if isinstance(t, ScaledTensor2x):
        t = t.rowwise_tensor
    if isinstance(t, GroupedScaledTensor1x):
        if t.scaling_mode == ScalingMode.MXFP8_1D_SCALING:
            return t.dequantize_full(hp_dtype), None
        return t.data, t.scale_inv
    return t, None


def _is_nvfp4(t) -> bool:
    from ..quantize.scaling_modes import ScalingMode

    t = getattr(t, "rowwise_tensor", None) or getattr(t, "colwise_tensor", None) or t
    return (hasattr(t, "n_groups") and hasattr(t, "scaling_mode")
            and ScalingMode(t.scaling_mode).is_nvfp4_scaling)


def _nvfp4_dense(t, dtype):
    """A grouped NVFP4 operand dequantized (row-wise copy preferred), for a GEMM pairing it with
    a non-NVFP4 operand."""
    t = getattr(t, "rowwise_tensor", None) or getattr(t, "colwise_tensor", None) or t
    return t.dequantize_full(dtype)


def masked_group_gemm(a, a_si, b, b_si, gid, n_groups, rc, out_dtype):
    """Rows of group g = a[rows] @ b[g] (b [G, K, N] for rc 1, [G, N, K] for rc 2), per-group
    scale_inv of FP8 operands; see the module docstring for the row mask. Two grouped NVFP4
    operands multiply in the FP4 tensor core's order (grouped_nvfp4.py)."""
    if _is_nvfp4(a) and _is_nvfp4(b):
        from .grouped_nvfp4 import nvfp4_masked_group_gemm

        out = nvfp4_masked_group_gemm(a, b, gid, n_groups, rc, out_dtype)
        if out is not None:
            return out
    a = _nvfp4_dense(a, out_dtype) if _is_nvfp4(a) else a
    b = _nvfp4_dense(b, out_dtype) if _is_nvfp4(b) else b
    out = None
    for g in range(n_groups):
        y = gemm(a, b[g], ((1,), (0,) if rc == 1 else (1,)),
                 None if a_si is None else a_si[g:g + 1], None if b_si is None else b_si[g:g + 1],
                 out_dtype=out_dtype)
        out = y if out is None else jnp.where((gid == g)[:, None], y, out)
    return out


def masked_group_wgrad(a, a_si, g_, g_si, gid, n_groups, out_dtype):
    """[G, K, N]: group g's a rows^T @ its g_ rows (other rows zeroed: their products vanish)."""
    if _is_nvfp4(a) and _is_nvfp4(g_):
        from .grouped_nvfp4 import nvfp4_masked_group_wgrad

        out = nvfp4_masked_group_wgrad(a, g_, gid, n_groups, out_dtype)
        if out is not None:
            return out
    a = _nvfp4_dense(a, out_dtype) if _is_nvfp4(a) else a
    g_ = _nvfp4_dense(g_, out_dtype) if _is_nvfp4(g_) else g_
    zero_a = jnp.zeros((), a.dtype)
    parts = []
    for g in range(n_groups):
        ag = jnp.where((gid == g)[:, None], a, zero_a)
        parts.append(gemm(ag, g_, ((0,), (0,)), None if a_si is None else a_si[g:g + 1],
                          None if g_si is None else g_si[g:g + 1], out_dtype=out_dtype))
    return jnp.stack(parts)


def grouped_gemm(lhs, rhs, contracting_dims=((1,), (2,)), bias=None, precision=None,
                 preferred_element_type=None, group_offset=None, quantizer_set=None,
                 use_async_d2h_group_sizes=False):
    """out [M, N]: rows of group g = lhs rows of g @ rhs[g] (+ bias[g]).

    lhs [M, K] (or [K, M] with contracting_dims[0] == (0,)) carries the group sizes
    (GroupedNoScaleTensor.first_dims / GroupedScaledTensor1x.first_dims); rhs [G, K, N] (contracting
    (1,)) or [G, N, K] (contracting (2,)). `quantizer_set.x` / `.kernel` (GroupedQuantizers)
    quantize high-precision operands. `precision` / `use_async_d2h_group_sizes` select nothing here
    (the core GEMM accumulates in float32; no host copy is made)."""
    del precision, use_async_d2h_group_sizes
    from ..quantize.grouped import GroupedNoScaleTensor, GroupedScaledTensor1x

    if group_offset is not None:
        raise NotImplementedError("grouped_gemm: group_offset is not implemented (nor by TE)")
    lt = getattr(lhs, "rowwise_tensor", lhs)
    rt = getattr(rhs, "rowwise_tensor", rhs)
    for name, v in (("lhs", lt), ("rhs", rt)):
        if not isinstance(v, (GroupedNoScaleTensor, GroupedScaledTensor1x)):
            raise TypeError(f"grouped_gemm: argument '{name}': expected a GroupedNoScaleTensor or "
                            f"GroupedScaledTensor1x, got {type(v).__name__}")
    group_sizes = lt.first_dims
    if group_sizes is None:
        raise ValueError("grouped_gemm: argument 'lhs': expected first_dims (the group sizes)")
    n = rt.data.shape[0]
    _check_sizes(group_sizes, n, "grouped_gemm")
    (lc,), (rc,) = contracting_dims
    if lt.data.ndim != 2 or rt.data.ndim != 3 or lc not in (0, 1) or rc not in (1, 2):
        raise ValueError(f"grouped_gemm: expected lhs [M, K] / [K, M] and rhs [G, K, N] / "
                         f"[G, N, K] with contracting_dims ((1|0,), (1|2,)), got lhs "
                         f"{tuple(lt.data.shape)}, rhs {tuple(rt.data.shape)}, {contracting_dims}")
    hp = preferred_element_type or (lt.dq_dtype if isinstance(lt, GroupedScaledTensor1x)
                                    else lt.data.dtype)
    qs = quantizer_set
    qx = None if qs is None else qs.x
    qk = None if qs is None else qs.kernel
    if lc == 0:  # [K, M] -> [M, K]: the groups run along M
        lhs = jnp.swapaxes(lt.data, 0, 1) if isinstance(lt, GroupedNoScaleTensor) else None
        if lhs is None:
            raise NotImplementedError("grouped_gemm: a quantized lhs with contracting_dims (0,) "
                                      "is not implemented by transformer_engine_lite")
    a, a_si = grouped_operand(lhs, qx, group_sizes, n, hp)
    b, b_si = grouped_operand(rhs, qk, None, n, hp)
    gid = group_ids(group_sizes, lt.data.shape[0] if lc == 1 else lt.data.shape[1], n)
    out = masked_group_gemm(a, a_si, b, b_si, gid, n, rc, hp)
    if bias is not None:
        if tuple(bias.shape) != (n, out.shape[1]):
            raise ValueError(f"grouped_gemm: argument 'bias': expected shape {(n, out.shape[1])}, "
                             f"got {tuple(bias.shape)}")
        out = (out.astype(_F32) + bias.astype(_F32)[gid]).astype(hp)
    return out
