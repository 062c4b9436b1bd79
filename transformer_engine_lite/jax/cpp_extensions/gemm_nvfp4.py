"""The NVFP4 GEMM in the FP4 tensor core's summation order (TE-JAX's NVFP4_1D_SCALING /
NVFP4_2D_SCALING operands), through the core's nvte_nvfp4_block_gemm: the function the PyTorch
front end's NVFP4 GEMM calls (pytorch/cpp_extensions/nvfp4_gemm.py), so the same quantized bytes
give the same output bits in both front ends.

    y[m, n] = factor * sum over 16-element K blocks, in K order from 0, in fp32, of
              sB[m, b] * sA[n, b] * (sum over block b of e2m1_B * e2m1_A)
    factor  = (amax_B * amax_A) / (6 * 6 * 448 * 448)       (fp32, one division, as PyTorch's)
    D       = cast(y + bias)                                 (fp32, then one rounding)

Each block term is exact in fp32, so the only roundings are the block adds (in K order), the
factor, the bias add and the cast: TE's reference qgemm's order. The operands are the copies whose
blocks run along the contracted dims (row-wise when they are the trailing dims, column-wise when
the leading ones); their stored 2-D views [rows, K] go to the core packed (two E2M1 per byte) with
their E4M3 scale bytes. A Hadamard-transformed pair (the wgrad GEMM's) is multiplied as stored: the
transforms cancel (H orthogonal), as in PyTorch.

The pure-JAX reference (custom calls disabled) sums the same exact block terms in the same order
(a batched matmul over single blocks, then a sequential scan) and divides for the factor on the
host (XLA's CPU division is not correctly rounded), so it gives the same bits.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from .base import FFIOp, custom_calls_enabled, register_targets
from .misc import check_dtype
from .partitioning import lowering_mesh

__all__ = ["nvfp4_block_gemm", "nvfp4_gemm", "nvfp4_k_dims"]

_BLOCK = 16
_F32 = jnp.float32
# 6 * 6 * 448 * 448: the two per-tensor scales' denominators (exact in fp32).
_DENOM = np.float32(36.0 * 448.0 * 448.0)


def _abstract(b_data, b_scale, a_data, a_scale, amax_b, amax_a):
    op = "nvfp4_block_gemm"
    for name, t in (("b_data", b_data), ("b_scale", b_scale), ("a_data", a_data),
                    ("a_scale", a_scale)):
        check_dtype(op, name, t.dtype, (jnp.uint8,))
        if len(t.shape) != 2:
            raise ValueError(f"te_lite::{op}: argument '{name}': expected a 2-D array, got shape "
                             f"{tuple(t.shape)}")
    sizes = (math.prod(amax_b.shape), math.prod(amax_a.shape))
    if sizes not in ((0, 0), (1, 1)):
        raise ValueError(f"te_lite::{op}: arguments 'amax_b' and 'amax_a': expected both float32 "
                         f"[1] or neither ([0]), got shapes {tuple(amax_b.shape)} and "
                         f"{tuple(amax_a.shape)}")
    check_dtype(op, "amax_b", amax_b.dtype, (_F32,))
    check_dtype(op, "amax_a", amax_a.dtype, (_F32,))
    if b_data.shape[1] != a_data.shape[1]:
        raise ValueError(f"te_lite::{op}: arguments 'b_data' and 'a_data': expected the same K "
                         f"(2 x packed columns), got {2 * b_data.shape[1]} and "
                         f"{2 * a_data.shape[1]}")
    nb = -(-2 * b_data.shape[1] // _BLOCK)
    for name, d, s in (("b_scale", b_data, b_scale), ("a_scale", a_data, a_scale)):
        if s.shape[0] < d.shape[0] or s.shape[1] < nb:
            raise ValueError(f"te_lite::{op}: argument '{name}': expected an E4M3 grid of at "
                             f"least [{d.shape[0]}, {nb}], got {tuple(s.shape)}")
    return (jax.ShapeDtypeStruct((b_data.shape[0], a_data.shape[0]), _F32),)


def _values(data, scale, k):
    """[rows, KB, 16] exact fp32 block-scaled values (zeros past K)."""
    rows, nb = data.shape[0], -(-k // _BLOCK)
    codes = jnp.stack([data & 0xF, data >> 4], axis=-1).reshape(rows, k)
    mag = jnp.asarray(np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32))
    val = mag[(codes & 7).astype(jnp.int32)]
    val = jnp.where((codes & 8) != 0, -val, val)
    val = jnp.pad(val, ((0, 0), (0, nb * _BLOCK - k))).reshape(rows, nb, _BLOCK)
    s = jax.lax.bitcast_convert_type(scale[:rows, :nb], jnp.float8_e4m3fn).astype(_F32)
    return val * s[:, :, None]


def _exact_factor(part):
    """RN(part / 7225344) in float32. XLA's CPU backend divides through a reciprocal (off by an
    ulp for about one value in six), so the reference divides on the host (numpy: IEEE)."""
    return jax.pure_callback(lambda v: np.asarray(np.float32(v) / _DENOM, np.float32),
                             jax.ShapeDtypeStruct((), _F32), part)


def _reference(b_data, b_scale, a_data, a_scale, amax_b, amax_a):
    m, n, k = b_data.shape[0], a_data.shape[0], 2 * b_data.shape[1]
    if k == 0 or m == 0 or n == 0:
        return (jnp.zeros((m, n), _F32),)
    p, q = _values(b_data, b_scale, k), _values(a_data, a_scale, k)
    # one exact term per block ([KB, M, N]; any summation order inside a block is exact)
    terms = jnp.einsum("mbj,nbj->bmn", p, q, precision=jax.lax.Precision.HIGHEST)
    y, _ = jax.lax.scan(lambda acc, t: (acc + t, None), jnp.zeros((m, n), _F32), terms)
    if amax_b.size:
        y = _exact_factor(amax_b.reshape(()) * amax_a.reshape(())) * y
    return (y,)


NVFP4BlockGemmPrimitive = FFIOp(
    "NVFP4BlockGemmPrimitive", "te_lite_nvfp4_block_gemm_ffi", _abstract, _reference,
    attrs=lambda p: {},
)


def nvfp4_block_gemm(b_data, b_scale, a_data, a_scale, amax_b=None, amax_a=None):
    """fp32 [m, n]: the K-ordered sum of the exact 16-block terms of b . a^T (packed uint8
    [rows, K/2] codes and uint8 E4M3 scales, at least [rows, ceil(K/16)]); with the two copies'
    amaxes, times (amax_b * amax_a) / (6 * 6 * 448 * 448) (fp32, when K > 0)."""
    if (amax_b is None) != (amax_a is None):
        raise ValueError("nvfp4_block_gemm: arguments 'amax_b' and 'amax_a': expected both or "
                         "neither")
    none = jnp.zeros((0,), _F32)
    ab = none if amax_b is None else amax_b.reshape(1).astype(_F32)
    aa = none if amax_a is None else amax_a.reshape(1).astype(_F32)
    (y,) = NVFP4BlockGemmPrimitive(b_data, b_scale, a_data, a_scale, ab, aa)
    return y


def _block_gemm_local(b_data, b_scale, a_data, a_scale, amax_b, amax_a):
    """The block GEMM on one device's arrays inside a partitioned GEMM: the handler itself (or
    its reference), not the primitive (whose own sharding rule has nothing left to split)."""
    args = (b_data, b_scale, a_data, a_scale, amax_b.reshape(1), amax_a.reshape(1))
    if not custom_calls_enabled(NVFP4BlockGemmPrimitive.name):
        return _reference(*args)[0]
    register_targets()
    return NVFP4BlockGemmPrimitive.ffi(*args)[0]


def nvfp4_k_dims(t) -> tuple[int, ...]:
    """The source dims an NVFP4 ScaledTensor1x copy's blocks run along: the trailing ones
    (from flatten_axis) for a row-wise copy, the leading ones for a column-wise ("T") copy."""
    nd = t.data.ndim
    return tuple(range(nd - t.flatten_axis)) if t.is_colwise else tuple(range(t.flatten_axis, nd))


def _k_operand(t):
    """(packed uint8 [rows, K/2], uint8 scales [rows, K/16], stored free dims, K) of a copy."""
    shape = tuple(t.data.shape)
    rows, k = math.prod(shape[: t.flatten_axis]), math.prod(shape[t.flatten_axis:])
    packed = jax.lax.bitcast_convert_type(t.data.reshape(rows, k // 2, 2), jnp.uint8)
    scales = jax.lax.bitcast_convert_type(t.scale_inv, jnp.uint8).reshape(rows, -(-k // _BLOCK))
    return packed, scales, shape[: t.flatten_axis], k


def nvfp4_gemm(lhs, rhs, bias=None, out_dtype=jnp.float32):
    """D [lhs free dims..., rhs free dims...] of two NVFP4 copies (ScaledTensor1x) whose blocks
    run along the contracted dims (nvfp4_k_dims), in the tensor core's order (module docstring);
    bias (rhs free dims, any float dtype) added in fp32 before the one cast to out_dtype."""
    bd, bs, bfree, kb = _k_operand(lhs)
    ad, as_, afree, ka = _k_operand(rhs)
    if kb != ka:
        raise ValueError(f"nvfp4_gemm: expected operands contracting the same K, got {kb} and {ka}")
    if bias is not None and tuple(bias.shape) != tuple(afree):
        raise ValueError(f"gemm: argument 'bias': expected shape {tuple(afree)} (rhs's free "
                         f"dims), got {tuple(bias.shape)}")
    # the per-tensor factor is applied by the handler (an empty K leaves the zeros unscaled)
    if lowering_mesh() is not None:  # per device on the N-D copies (gemm_nvfp4_sharded)
        from .gemm_nvfp4_sharded import nvfp4_gemm_nd

        y = nvfp4_gemm_nd(lhs.data, lhs.scale_inv, lhs.flatten_axis, rhs.data, rhs.scale_inv,
                          rhs.flatten_axis, lhs.amax, rhs.amax, _block_gemm_local)
        y = y.reshape(math.prod(bfree), math.prod(afree))
    else:
        y = nvfp4_block_gemm(bd, bs, ad, as_, lhs.amax, rhs.amax)
    if bias is not None:
        y = y + bias.reshape(1, -1).astype(_F32)
    return y.astype(out_dtype).reshape(*bfree, *afree)
