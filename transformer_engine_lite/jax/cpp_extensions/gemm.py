"""GEMM primitive with TE's nvte_cublas_gemm semantics, and `gemm` with jax-style contracting dims.

In the core's (column-major) terms D = op(B) @ op(A) in row-major terms, op(A) = A^T if transa
([k, m]), op(B) = B^T if transb ([n, k]); D is [*B.shape[:-1], m] (not transb) or [n, m]. FP8
operands come with their scale_inv (float32 [1]); bias [m] and the GELU epilogue (D = gelu(Y),
pre_gelu_out = Y) are fused; accumulation is float32 (ARCHITECTURE §6).

`gemm(lhs, rhs, contracting_dims)` maps jax's dot_general view onto it: lhs = B, rhs = A.

Sharding (`GemmRule`): M dims follow lhs, N follows rhs, a contracting dim sharded the same way on
both operands stays sharded and the float32 partial products are summed over it (row-parallel TP,
and the DP reduction of weight gradients), with bias and GELU applied after the sum.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .base import FFIOp
from .misc import FP8_DTYPES, HIGH_PRECISION, as_scalar, check_dtype, check_scalar_f32, is_fp8
from .partitioning import lowering_mesh, mesh_axes_of, named_shapes, spec_of

__all__ = ["GemmPrimitive", "gemm", "gemm_core"]

_F32 = jnp.float32


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def _rows(shape):
    return math.prod(shape[:-1])


def _dims(a_shape, transa, b_shape, transb):
    a_rows, a_cols = _rows(a_shape), a_shape[-1]
    b_rows, b_cols = _rows(b_shape), b_shape[-1]
    m, k = (a_rows, a_cols) if transa else (a_cols, a_rows)
    n, kb = (b_cols, b_rows) if transb else (b_rows, b_cols)
    return m, n, k, kb


def _gemm_abstract(A, A_si, B, B_si, bias, gelu_input, out_scale, *, transa, transb, gelu, grad,
                   out_dtype):
    op = "gemm"
    for name, t, si in (("A", A, A_si), ("B", B, B_si)):
        check_dtype(op, name, t.dtype, (*HIGH_PRECISION, *FP8_DTYPES))
        if is_fp8(t.dtype):
            check_scalar_f32(op, f"{name}_scale_inv", si)
        elif tuple(si.shape) != (0,):
            raise ValueError(f"te_lite::{op}: argument '{name}_scale_inv': expected none for a "
                             f"{np.dtype(t.dtype).name} operand, got shape {tuple(si.shape)}")
        if len(t.shape) < 2 and not (name == "B" and len(t.shape) >= 1):
            raise ValueError(f"te_lite::{op}: argument '{name}': expected a 2-D array, got shape "
                             f"{tuple(t.shape)}")
    if (transb and len(B.shape) != 2) or len(A.shape) != 2:
        raise ValueError(f"te_lite::{op}: arguments 'A', 'B': expected 2-D A (and 2-D B when "
                         f"transb), got A {tuple(A.shape)}, B {tuple(B.shape)}")
    m, n, k, kb = _dims(A.shape, transa, B.shape, transb)
    if k != kb:
        raise ValueError(f"te_lite::{op}: argument 'B': expected inner dim {k} (that of op(A), A "
                         f"{tuple(A.shape)}, transa={transa}), got {kb} (B {tuple(B.shape)}, "
                         f"transb={transb})")
    d_shape = (n, m) if transb else (*B.shape[:-1], m)
    fp8_out = is_fp8(out_dtype)
    check_dtype(op, "out_dtype", out_dtype, (*HIGH_PRECISION, *FP8_DTYPES))
    has_bias = int(np.prod(bias.shape)) > 0
    if has_bias and not grad and tuple(bias.shape) != (m,):
        raise ValueError(f"te_lite::{op}: argument 'bias': expected shape ({m},), got "
                         f"{tuple(bias.shape)}")
    if fp8_out:
        check_scalar_f32(op, "out_scale", out_scale)
    if has_bias:
        pre_dtype = bias.dtype
    elif not fp8_out:
        pre_dtype = out_dtype
    else:
        pre_dtype = A.dtype if not is_fp8(A.dtype) else jnp.bfloat16
    pre = _sds(d_shape, pre_dtype) if gelu and not grad else _sds((0,), _F32)
    bias_grad = _sds(bias.shape, bias.dtype) if grad and has_bias else _sds((0,), _F32)
    n_side = 1 if fp8_out else 0
    return (_sds(d_shape, out_dtype), pre, bias_grad, _sds((n_side,), _F32),
            _sds((n_side,), _F32))


def _gelu(y):
    return 0.5 * y * (1.0 + jnp.tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)))


def _jax_gemm(A, A_si, B, B_si, bias, gelu_input, out_scale, transa, transb, gelu, grad,
              out_dtype):
    """Reference (forward mode, no FP8 output): float32 accumulation of the dequantized operands."""
    if grad or is_fp8(out_dtype):
        raise NotImplementedError("the pure-JAX gemm reference covers forward, non-FP8 outputs")
    a = A.astype(_F32) * (A_si[0] if is_fp8(A.dtype) else 1.0)
    b = B.astype(_F32) * (B_si[0] if is_fp8(B.dtype) else 1.0)
    opa = a.T if transa else a
    opb = b.T if transb else b.reshape(-1, b.shape[-1])
    y = jnp.matmul(opb, opa, precision=jax.lax.Precision.HIGHEST)
    if transb:
        shape = y.shape
    else:
        shape = (*B.shape[:-1], y.shape[-1])
    y = y.reshape(shape)
    shapes = _gemm_abstract(A, A_si, B, B_si, bias, gelu_input, out_scale, transa=transa,
                            transb=transb, gelu=gelu, grad=grad, out_dtype=out_dtype)
    if bias.size:
        y = y + bias.astype(_F32)
    z = jnp.zeros((0,), _F32)
    pre = z
    if gelu:
        pre = y.astype(shapes[1].dtype)
        y = _gelu(y)
    return y.astype(out_dtype), pre, z, z, z


class GemmRule:
    """Sharding of GemmPrimitive in forward mode (see the module docstring)."""

    def _plan(self, mesh, arg_shapes, transa, transb):
        A, B = arg_shapes[0], arg_shapes[2]
        a_spec, b_spec = spec_of(A, 2), spec_of(B, len(B.shape))
        k_a = a_spec[1] if transa else a_spec[0]
        n_a = a_spec[0] if transa else a_spec[1]
        if transb:
            k_b, m_b = b_spec[0], [b_spec[1]]
        else:
            k_b, m_b = b_spec[-1], list(b_spec[:-1])
        k = k_a if k_a == k_b else None
        used = set(mesh_axes_of(m_b + [k]))
        if n_a is not None and set(mesh_axes_of([n_a])) & used:
            n_a = None
        a_new = [n_a, k] if transa else [k, n_a]
        b_new = [k, *m_b] if transb else [*m_b, k]
        d_spec = [*m_b, n_a]
        return P(*a_new), P(*b_new), P(*d_spec), k

    def wrap(self, op, params: dict, nargs: int):
        transa, transb = params["transa"], params["transb"]
        cp = custom_partitioning(lambda *args: op.ffi(*args, **params))
        context = lowering_mesh()

        def shardings(mesh, arg_shapes, result_shape):
            mesh, arg_shapes = named_shapes(mesh, arg_shapes, context)
            a_p, b_p, d_p, k = self._plan(mesh, arg_shapes, transa, transb)
            rep = lambda s: NamedSharding(mesh, P(*([None] * len(s.shape))))
            args = [rep(s) for s in arg_shapes]
            args[0], args[2] = NamedSharding(mesh, a_p), NamedSharding(mesh, b_p)
            if int(np.prod(arg_shapes[4].shape)) > 0:
                args[4] = NamedSharding(mesh, P(d_p[-1]))
            results = [rep(s) for s in result_shape]
            results[0] = NamedSharding(mesh, d_p)
            if len(result_shape[1].shape) == len(d_p):
                results[1] = NamedSharding(mesh, d_p)
            return mesh, args, results, k

        def infer(mesh, arg_shapes, result_shape):
            return tuple(shardings(mesh, arg_shapes, result_shape)[2])

        def partition(mesh, arg_shapes, result_shape):
            mesh, args, results, k = shardings(mesh, arg_shapes, result_shape)
            out_dtype = params["out_dtype"]
            if k is None:
                return mesh, lambda *local: op.ffi(*local, **params), tuple(results), tuple(args)
            k_axes = mesh_axes_of([k])
            pre_dtype = result_shape[1].dtype

            def lower(A, A_si, B, B_si, bias, gelu_input, out_scale):
                part = dict(params, gelu=False, out_dtype=np.dtype(_F32))
                y = op.ffi(A, A_si, B, B_si, jnp.zeros((0,), _F32), gelu_input, out_scale,
                           **part)[0]
                y = jax.lax.psum(y, k_axes)
                if bias.size:
                    y = y + bias.astype(_F32)
                z = jnp.zeros((0,), _F32)
                pre = z
                if params["gelu"]:
                    pre = y.astype(pre_dtype)
                    y = _gelu(y)
                return y.astype(out_dtype), pre, z, z, z

            return mesh, lower, tuple(results), tuple(args)

        def rule(mesh, arg_types, result_types):
            B = arg_types[2].shape
            names = iter(f"g{i}" for i in range(1000))
            ms = [next(names) for _ in range(1 if transb else len(B) - 1)]
            k, n = next(names), next(names)
            fresh = lambda s: " ".join(next(names) for _ in s)
            a = f"{n} {k}" if transa else f"{k} {n}"
            b = f"{k} {ms[0]}" if transb else " ".join([*ms, k])
            bias = n if len(arg_types[4].shape) == 1 and arg_types[4].shape[0] > 0 else fresh(
                arg_types[4].shape)
            ins = [a, fresh(arg_types[1].shape), b, fresh(arg_types[3].shape), bias,
                   fresh(arg_types[5].shape), fresh(arg_types[6].shape)]
            d = " ".join([*ms, n])
            pre = d if len(result_types[1].shape) == len(ms) + 1 else fresh(result_types[1].shape)
            outs = [d, pre] + [fresh(r.shape) for r in result_types[2:]]
            return f"{', '.join(ins)} -> {', '.join(outs)}"

        cp.def_partition(partition=partition, infer_sharding_from_operands=infer,
                         sharding_rule=rule)
        return cp


def _gemm_attrs(p):
    return {k: v for k, v in p.items() if k != "out_dtype"}


GemmPrimitive = FFIOp("GemmPrimitive", "te_lite_gemm_ffi", _gemm_abstract, _jax_gemm,
                      attrs=_gemm_attrs, partition=GemmRule())


def gemm_core(A, B, *, transa=False, transb=False, A_scale_inv=None, B_scale_inv=None, bias=None,
              gelu=False, out_dtype=None):
    """TE's nvte_cublas_gemm in forward mode: (D, pre_gelu_out) = op(B) @ op(A) (+ bias)(GELU)."""
    z = jnp.zeros((0,), _F32)
    if out_dtype is None:
        hp = [t.dtype for t in (A, B) if not is_fp8(t.dtype)]
        out_dtype = hp[0] if hp else jnp.bfloat16
    out = GemmPrimitive(
        A, z if A_scale_inv is None else as_scalar(A_scale_inv),
        B, z if B_scale_inv is None else as_scalar(B_scale_inv),
        z if bias is None else bias, z, z,
        transa=bool(transa), transb=bool(transb), gelu=bool(gelu), grad=False,
        out_dtype=np.dtype(out_dtype))
    return out[0], (out[1] if gelu else None)


def _normalize(dims, ndim):
    return tuple(sorted(d % ndim for d in dims))


def _te_operand(x, quantizer, contracting, dtype):
    """(array, scale_inv or None, the ScaledTensor1x used or None) from TE-JAX's operand forms: an
    array quantized by `quantizer` (its copy with blocks along the contracted dims), or a
    ScaledTensor."""
    from ..quantize.scaling_modes import ScalingMode
    from ..quantize.tensor import NoScaleTensor, ScaledTensor1x, ScaledTensor2x

    if isinstance(x, NoScaleTensor):
        x = x.data
    trailing = contracting == tuple(range(x.ndim - len(contracting), x.ndim))
    if quantizer is not None:
        if isinstance(x, (ScaledTensor1x, ScaledTensor2x)):
            raise ValueError("gemm: an operand that is already a ScaledTensor takes no quantizer")
        x = quantizer.quantize(x, is_rowwise=trailing, is_colwise=not trailing, dq_dtype=x.dtype)
    if isinstance(x, ScaledTensor2x):
        x = x.get_tensor(not trailing)
    if isinstance(x, ScaledTensor1x):
        if x.scaling_mode == ScalingMode.MXFP8_1D_SCALING:
            # MXFP8 operands: dequantized exactly (E4M3/E5M2 times a power of two) and multiplied in
            # high precision, as dense() does (see _gemm_core).
            return x.dequantize(dtype), None, x
        if ScalingMode(x.scaling_mode).is_nvfp4_scaling:
            # NVFP4: the copy itself; gemm() runs the tensor-core-order GEMM on two such copies
            # (gemm_nvfp4.py), else dequantizes it exactly to float32 in the source layout, any
            # Hadamard transform kept (it cancels against the other operand's).
            return None, None, x
        return x.data, x.scale_inv, x
    return x, None, None


def _nvfp4_pair(lq, rq, contracting_dims, lnd, rnd, bias, fuse_gelu, out_dtype):
    """D of two NVFP4 copies whose blocks run along the contracted dims, in the FP4 tensor core's
    order (gemm_nvfp4.py: the PyTorch front end's bits), or None when the pair is not one (one
    operand not NVFP4, blocks along other dims, or a fused GELU, which the block GEMM has no
    epilogue for: those multiply the exact float32 dequantized copies instead)."""
    from ..quantize.scaling_modes import ScalingMode
    from ..quantize.tensor import ScaledTensor1x
    from .gemm_nvfp4 import nvfp4_gemm, nvfp4_k_dims

    def nv(t):
        return isinstance(t, ScaledTensor1x) and ScalingMode(t.scaling_mode).is_nvfp4_scaling

    if fuse_gelu or not (nv(lq) and nv(rq)):
        return None
    if (nvfp4_k_dims(lq) != _normalize(contracting_dims[0], lnd)
            or nvfp4_k_dims(rq) != _normalize(contracting_dims[1], rnd)):
        return None
    return nvfp4_gemm(lq, rq, bias, out_dtype)


def gemm(lhs, rhs, contracting_dims=((-1,), (0,)), lhs_scale_inv=None, rhs_scale_inv=None,
         bias=None, fuse_gelu=False, out_dtype=None, *, lhs_quantizer=None, rhs_quantizer=None,
         transpose_batch_sequence=False, fuse_bias=None, quantizer_set=None):
    """dot_general(lhs, rhs, contracting_dims) (+ bias)(GELU) through the core GEMM.

    The contracting dims of each operand must be its leading or its trailing dims (other orders
    are transposed first). Output: lhs's free dims, then rhs's. FP8 operands need their scale_inv.
    Returns D, or (D, pre_gelu_out) with fuse_gelu.
    TE-JAX's forms: `lhs_quantizer` / `rhs_quantizer` quantize a high-precision operand first;
    an operand may be a ScaledTensor (then its scale_inv comes with it). The output dtype is then
    the operands' high-precision dtype (TE's).
    TE's keyword forms kept for callers of its earlier API: `quantizer_set` supplies the
    quantizers not given (its x for lhs, its kernel for rhs); `fuse_bias` True (or None) adds
    the bias inside the GEMM, False adds it after the GEMM, unfused."""
    del transpose_batch_sequence  # sharding hint of TE's; our GEMM's partitioning derives it
    if quantizer_set is not None:
        lhs_quantizer = quantizer_set.x if lhs_quantizer is None else lhs_quantizer
        rhs_quantizer = quantizer_set.kernel if rhs_quantizer is None else rhs_quantizer
    if fuse_bias is not None and not isinstance(fuse_bias, bool):
        raise TypeError(f"gemm: argument 'fuse_bias': expected a bool or None, got {fuse_bias!r}")
    if fuse_bias is False and bias is not None:
        if fuse_gelu:
            raise ValueError("gemm: arguments 'fuse_bias' and 'fuse_gelu': an unfused bias "
                             "cannot come before the fused GELU; pass fuse_bias=True")
        out = gemm(lhs, rhs, contracting_dims, lhs_scale_inv, rhs_scale_inv, None, False,
                   out_dtype, lhs_quantizer=lhs_quantizer, rhs_quantizer=rhs_quantizer)
        if tuple(bias.shape) != tuple(out.shape[out.ndim - bias.ndim:]):
            raise ValueError(f"gemm: argument 'bias': expected shape of the output's trailing "
                             f"(rhs free) dims {tuple(out.shape[out.ndim - bias.ndim:])}, got "
                             f"{tuple(bias.shape)}")
        return (out + bias).astype(out.dtype)
    from ..quantize.tensor import ScaledTensor

    if (lhs_quantizer is not None or rhs_quantizer is not None or isinstance(lhs, ScaledTensor)
            or isinstance(rhs, ScaledTensor)):
        def hp(t):
            t = getattr(t, "rowwise_tensor", t)
            return getattr(t, "dq_dtype", None) if isinstance(t, ScaledTensor) else t.dtype
        out_dtype = out_dtype or hp(lhs) or hp(rhs)
        lnd = getattr(getattr(lhs, "rowwise_tensor", lhs), "ndim")
        rnd = getattr(getattr(rhs, "rowwise_tensor", rhs), "ndim")
        from ..quantize.nvfp4 import check_rht_pair

        lhs, lhs_scale_inv, lq = _te_operand(lhs, lhs_quantizer,
                                             _normalize(contracting_dims[0], lnd), out_dtype)
        rhs, rhs_scale_inv, rq = _te_operand(rhs, rhs_quantizer,
                                             _normalize(contracting_dims[1], rnd), out_dtype)
        check_rht_pair(lq, rq)
        d = _nvfp4_pair(lq, rq, contracting_dims, lnd, rnd, bias, fuse_gelu, out_dtype)
        if d is not None:
            return d
        from ..quantize.nvfp4 import nvfp4_gemm_operand

        lhs = nvfp4_gemm_operand(lq) if lhs is None else lhs
        rhs = nvfp4_gemm_operand(rq) if rhs is None else rhs
    lc, rc = _normalize(contracting_dims[0], lhs.ndim), _normalize(contracting_dims[1], rhs.ndim)
    if len(lc) != len(rc) or [lhs.shape[i] for i in lc] != [rhs.shape[i] for i in rc]:
        raise ValueError(f"gemm: argument 'contracting_dims': expected dims of equal sizes, got "
                         f"lhs {tuple(lhs.shape)} dims {lc} and rhs {tuple(rhs.shape)} dims {rc}")
    nl, nr = lhs.ndim, rhs.ndim
    lhs_free = [lhs.shape[i] for i in range(nl) if i not in lc]
    rhs_free = [rhs.shape[i] for i in range(nr) if i not in rc]
    k = math.prod(lhs.shape[i] for i in lc)
    if lc == tuple(range(nl - len(lc), nl)):
        B, transb = lhs.reshape(*lhs_free, k) if lhs_free else lhs.reshape(1, k), False
    elif lc == tuple(range(len(lc))):
        B, transb = lhs.reshape(k, math.prod(lhs_free)), True
    else:
        perm = [i for i in range(nl) if i not in lc] + list(lc)
        B, transb = jnp.transpose(lhs, perm).reshape(*lhs_free, k), False
    if rc == tuple(range(len(rc))):
        A, transa = rhs.reshape(k, math.prod(rhs_free)), False
    elif rc == tuple(range(nr - len(rc), nr)):
        A, transa = rhs.reshape(math.prod(rhs_free), k), True
    else:
        perm = list(rc) + [i for i in range(nr) if i not in rc]
        A, transa = jnp.transpose(rhs, perm).reshape(k, math.prod(rhs_free)), False
    if B.ndim == 1:
        B = B.reshape(1, -1)
    if bias is not None:
        if tuple(bias.shape) != tuple(rhs_free):
            raise ValueError(f"gemm: argument 'bias': expected shape {tuple(rhs_free)} (rhs's free "
                             f"dims), got {tuple(bias.shape)}")
        bias = bias.reshape(-1)
    d, pre = gemm_core(A, B, transa=transa, transb=transb, A_scale_inv=rhs_scale_inv,
                       B_scale_inv=lhs_scale_inv, bias=bias, gelu=fuse_gelu, out_dtype=out_dtype)
    shape = (*lhs_free, *rhs_free)
    d = d.reshape(shape)
    return (d, pre.reshape(shape)) if fuse_gelu else d

