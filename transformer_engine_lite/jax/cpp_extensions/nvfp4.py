"""NVFP4 primitives (TE-JAX's NVFP4_1D_SCALING / NVFP4_2D_SCALING): quantize a 2-D [rows, cols]
array into the core's NVFP4 buffers and dequantize one stored copy, through the handlers of
jax/csrc/nvfp4.cpp (the core calls of torch.ops.te_lite.quantize_nvfp4, so both front ends write the
same bytes), with pure-JAX references beside them.

Buffers as the core holds them (common/cast/nvfp4_quantize.cpp): data uint8, two E2M1 codes per
byte (element 2j in the low nibble); the column-wise copy transposed ([cols, rows/2]); one E4M3
scale byte per 1x16 block (16x16 in 2D mode, repeated over its 16 rows) in a grid padded to
[roundup(rows, 128), roundup(cols/16, 4)] with zeros; an fp32 amax per copy, the column-wise one
taken after the random Hadamard transform (RHT) when it is applied.

The reference follows nvfp4_math.h operation for operation (fp32, the same order), so it gives the
core's bytes, except for stochastic rounding: the core draws from its Philox stream keyed by
(seed, offset) = the state's first 16 bytes; the reference draws with jax.random from a key built
from the same four uint32 (TE-JAX's pure-JAX rule), so it is a statistically equivalent rounding,
not the same bytes.

Given amaxes (row_amax / col_amax, TE-JAX's amax computed before the quantize and reduced over an
AmaxScope's mesh axes): the second-level scales come from them instead of from x
(kNVTEQuantizationConfigNVFP4AmaxGiven), and they are returned as given.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .base import FFIOp
from .misc import HIGH_PRECISION, check_dtype, dtype_name
from .quantization import _jax_encode

__all__ = ["NVFP4_BLOCK", "dequantize_nvfp4", "nvfp4_scale_grid", "quantize_nvfp4"]

NVFP4_BLOCK = 16
_F32 = jnp.float32
_FLT_MAX = np.float32(np.finfo(np.float32).max)
_E2M1_MAG = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def _round_up(a: int, m: int) -> int:
    return -(-a // m) * m


def nvfp4_scale_grid(rows: int, cols: int) -> tuple[int, int]:
    """The core's padded E4M3 scale grid of a [rows, cols] copy."""
    return (_round_up(rows, 128), _round_up(-(-cols // NVFP4_BLOCK), 4))


# ------------------------------------------------------------------------------ quantize
def _q_abstract(x, rng_state, row_amax, col_amax, *, rowwise, columnwise, two_d, rht,
                rht_sign_mask, stochastic_rounding):
    op = "quantize_nvfp4"
    check_dtype(op, "x", x.dtype, HIGH_PRECISION)
    given = int(np.prod(row_amax.shape)) != 0 or int(np.prod(col_amax.shape)) != 0
    if given:
        for name, a, want in (("row_amax", row_amax, rowwise), ("col_amax", col_amax, columnwise)):
            if int(np.prod(a.shape)) != int(want) or (want and np.dtype(a.dtype) != np.float32):
                raise ValueError(
                    f"te_lite::{op}: argument '{name}': expected float32 [1] for each requested "
                    f"copy (rowwise={rowwise}, columnwise={columnwise}) or None for both, got "
                    f"{dtype_name(a.dtype)} of shape {tuple(a.shape)}")
    if len(x.shape) != 2:
        raise ValueError(f"te_lite::{op}: argument 'x': expected a 2-D array, got shape "
                         f"{tuple(x.shape)}")
    if not (rowwise or columnwise):
        raise ValueError(f"te_lite::{op}: arguments 'rowwise', 'columnwise': expected at least "
                         "one True, got both False")
    rows, cols = x.shape
    if rowwise and cols % 2:
        raise ValueError(f"te_lite::{op}: argument 'x': expected an even number of columns (two "
                         f"E2M1 per byte), got shape {tuple(x.shape)}")
    if columnwise and rows % 2:
        raise ValueError(f"te_lite::{op}: argument 'x': expected an even number of rows for the "
                         f"column-wise (transposed) copy, got shape {tuple(x.shape)}")
    if rht and columnwise and rows % NVFP4_BLOCK:
        raise ValueError(f"te_lite::{op}: argument 'x': the random Hadamard transform runs over "
                         f"16 rows at a time; expected rows divisible by 16, got {rows}")
    if not 0 <= int(rht_sign_mask) <= 0xFFFF:
        raise ValueError(f"te_lite::{op}: argument 'rht_sign_mask': expected a 16-bit mask, got "
                         f"{rht_sign_mask}")
    if stochastic_rounding and (np.dtype(rng_state.dtype) != np.uint32
                                or int(np.prod(rng_state.shape)) < 4):
        raise ValueError(f"te_lite::{op}: argument 'rng_state': expected uint32 with at least 4 "
                         f"elements for stochastic rounding, got {dtype_name(rng_state.dtype)} of "
                         f"shape {tuple(rng_state.shape)}")
    e = _sds((0,), _F32)
    u8, f32 = jnp.uint8, _F32
    a = e if given else _sds((1,), f32)  # a given amax is the caller's already
    row = ((_sds((rows, cols // 2), u8), _sds(nvfp4_scale_grid(rows, cols), u8), a)
           if rowwise else (e, e, e))
    col = ((_sds((cols, rows // 2), u8), _sds(nvfp4_scale_grid(cols, rows), u8), a)
           if columnwise else (e, e, e))
    return (*row, *col)


def _amax(x32):
    """NaN-propagating max|x| (the core's nvfp4_amax_acc; 0 for an empty array)."""
    a = jnp.abs(x32)
    m = jnp.max(a, initial=0.0)
    return jnp.where(jnp.any(jnp.isnan(a)), jnp.float32(jnp.nan), m)


def _global(amax):
    """(S_enc, S_dec, S_enc * (1/6)) of nvfp4_global, fp32 in its order."""
    s = jnp.float32(6.0 * 448.0) / amax
    s = jnp.where(s > _FLT_MAX, _FLT_MAX, s)
    s = jnp.where(s == 0.0, jnp.float32(1.0), s)
    return s, jnp.float32(1.0) / s, s * (np.float32(1.0) / np.float32(6.0))


def _e2m1_rne(v):
    """e2m1_rne: v in [-6, 6] (or NaN) -> 4-bit code; -0.0 and NaN give 0, tiny negatives 8."""
    m = jnp.abs(v)
    c = sum(((m > 0.25), (m >= 0.75), (m > 1.25), (m >= 1.75), (m > 2.5), (m >= 3.5),
             (m > 5.0)), jnp.zeros(v.shape, jnp.uint8))
    return jnp.where(v < 0, c | 8, c).astype(jnp.uint8)


def _e2m1_stochastic(v, key):
    """Stochastic E2M1 rounding of v in [-6, 6] with jax.random uniforms (reference only)."""
    m = jnp.abs(v)
    grid = jnp.asarray(_E2M1_MAG)
    k = jnp.sum(m[..., None] >= grid[1:], axis=-1).astype(jnp.int32)  # lo = grid[k]
    lo = grid[k]
    hi = grid[jnp.minimum(k + 1, 7)]
    p = jnp.where(k < 7, (m - lo) / jnp.where(k < 7, hi - lo, 1.0), 0.0)
    up = jax.random.uniform(key, v.shape, _F32) < p
    c = jnp.where(up, k + 1, k).astype(jnp.uint8)
    c = jnp.where(m > 0, c, 0).astype(jnp.uint8)
    return jnp.where(v < 0, c | 8, c).astype(jnp.uint8)


def _blocks(x32, two_d):
    """[R, C] (multiples of 16) -> per-element block amax, NaN-propagating."""
    r, c = x32.shape
    n = NVFP4_BLOCK
    if two_d:
        b = x32.reshape(r // n, n, c // n, n)
        am = _amax_axes(b, (1, 3))
        return jnp.broadcast_to(am[:, None, :, None], b.shape).reshape(r, c)
    b = x32.reshape(r, c // n, n)
    return jnp.broadcast_to(_amax_axes(b, (2,))[..., None], b.shape).reshape(r, c)


def _amax_axes(b, axes):
    a = jnp.abs(b)
    return jnp.where(jnp.any(jnp.isnan(a), axis=axes), jnp.float32(jnp.nan), jnp.max(a, axis=axes))


def _quantize_copy(x32, two_d, sr_key, amax=None):
    """One copy [R, C] fp32 -> (packed data, padded scale grid, amax) as the core writes it;
    `amax` (float32 [1]) given replaces x32's own."""
    rows, cols = x32.shape
    n = NVFP4_BLOCK
    pr, pc = _round_up(rows, n), _round_up(cols, n)  # short blocks: zero padding (amax-neutral)
    xp = jnp.pad(x32, ((0, pr - rows), (0, pc - cols)))
    amax = _amax(x32) if amax is None else amax.reshape(()).astype(_F32)
    enc, dec, mult = _global(amax)
    d = _blocks(xp, two_d) * mult
    d = jnp.where(d > _FLT_MAX, _FLT_MAX, d)
    d = jnp.where(d > 448.0, jnp.float32(448.0), d)
    e4m3 = _jax_encode(d, jnp.float8_e4m3fn)
    benc = jnp.float32(1.0) / (e4m3.astype(_F32) * dec)
    benc = jnp.where(benc > _FLT_MAX, _FLT_MAX, benc)
    v = xp * benc
    v = jnp.where(v > 6.0, jnp.float32(6.0), v)
    v = jnp.where(v < -6.0, jnp.float32(-6.0), v)
    codes = _e2m1_rne(v) if sr_key is None else _e2m1_stochastic(v, sr_key)
    codes = codes[:rows, :cols]
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    sc = jax.lax.bitcast_convert_type(e4m3, jnp.uint8)[:rows, 0::n][:, : -(-cols // n)]
    gr, gc = nvfp4_scale_grid(rows, cols)
    sc = jnp.pad(sc, ((0, gr - sc.shape[0]), (0, gc - sc.shape[1])))
    return packed.astype(jnp.uint8), sc, amax.reshape(1)


def rht_signs(sign_mask: int) -> np.ndarray:
    """The RHT's 16x16 fp32 matrix S*H/4 (S = diag(signs), sign i negative where bit i of
    sign_mask is set, H Sylvester's Hadamard): y = x @ M transforms a group of 16."""
    i = np.arange(16)
    parity = np.array([[bin(a & b).count("1") & 1 for b in i] for a in i])
    neg = ((sign_mask >> i) & 1)[:, None] ^ parity
    return np.where(neg == 1, -0.25, 0.25).astype(np.float32)


def _rht(t32, sign_mask, dtype):
    """nvfp4_rht16 over groups of 16 along the last dim: y_j = sum_i (+-x_i / 4), summed in fp32
    for i = 0..15 in order, then rounded to the input dtype (TE's RHT works in it)."""
    m = rht_signs(sign_mask)
    g = t32.reshape(*t32.shape[:-1], -1, 16) * jnp.float32(0.25)
    acc = jnp.zeros(g.shape, _F32)
    for i in range(16):  # sequential sum, the core's order (no tree reduction); +-1 is exact
        acc = acc + g[..., i:i + 1] * jnp.asarray(np.sign(m[i]))
    y = acc.reshape(t32.shape)
    if np.dtype(dtype) == np.dtype(jnp.bfloat16):
        return jax.lax.reduce_precision(y, exponent_bits=8, mantissa_bits=7)
    return y.astype(dtype).astype(_F32)


def _sr_key(rng_state, copy: int):
    """TE-JAX's pure-JAX key: the first two uint32 as key data, the other two folded in; the
    column-wise copy folds in its index too so the two copies draw differently."""
    s = rng_state.reshape(-1)
    key = jax.random.wrap_key_data(s[:2].astype(jnp.uint32))
    key = jax.random.fold_in(jax.random.fold_in(key, s[2]), s[3])
    return jax.random.fold_in(key, copy) if copy else key


def _jax_nvfp4(x, rng_state, row_amax, col_amax, rowwise, columnwise, two_d, rht, rht_sign_mask,
               stochastic_rounding):
    x32 = x.astype(_F32)
    e = jnp.zeros((0,), _F32)
    given = row_amax.size != 0 or col_amax.size != 0
    out = [e] * 6
    if rowwise:
        key = _sr_key(rng_state, 0) if stochastic_rounding else None
        out[0:3] = _quantize_copy(x32, two_d, key, row_amax if given else None)
    if columnwise:
        t = x32.T
        if rht:
            t = _rht(t, int(rht_sign_mask), x.dtype)
        key = _sr_key(rng_state, 1) if stochastic_rounding else None
        out[3:6] = _quantize_copy(t, two_d, key, col_amax if given else None)
    if given:  # the results the handler leaves out
        out[2] = out[5] = e
    return tuple(out)


QuantizeNVFP4Primitive = FFIOp(
    "QuantizeNVFP4Primitive", "te_lite_quantize_nvfp4_ffi", _q_abstract, _jax_nvfp4,
    attrs=lambda p: {**p, "rht_sign_mask": np.int64(p["rht_sign_mask"])},
)


def quantize_nvfp4(x, rowwise=True, columnwise=True, two_d=False, rht=False, rht_sign_mask=0,
                   stochastic_rounding=False, rng_state=None, row_amax=None, col_amax=None):
    """NVFP4 of a 2-D x: (row_data, row_scale_inv, row_amax, col_data, col_scale_inv, col_amax),
    uint8 packed data and padded E4M3 scale grids (module docstring); copies not requested are
    float32 [0]. rng_state: uint32 with at least 4 elements when stochastic_rounding (TE-JAX's
    state: its first 16 bytes are the core's int64 (seed, offset)). row_amax / col_amax: float32
    [1] each for the requested copies (col_amax after the RHT when it is applied), or None: the
    per-tensor scales from these amaxes (a reduced amax), which come back as the amax results."""
    if rng_state is None:
        if stochastic_rounding:
            raise ValueError("te_lite::quantize_nvfp4: argument 'rng_state': expected a uint32 "
                             "state for stochastic rounding, got None")
        rng_state = jnp.zeros((0,), jnp.uint32)
    empty = jnp.zeros((0,), _F32)
    given = row_amax is not None or col_amax is not None
    ra = empty if row_amax is None else jnp.asarray(row_amax).reshape(-1)
    ca = empty if col_amax is None else jnp.asarray(col_amax).reshape(-1)
    out = QuantizeNVFP4Primitive(
        x, rng_state.reshape(-1), ra, ca, rowwise=bool(rowwise), columnwise=bool(columnwise),
        two_d=bool(two_d), rht=bool(rht), rht_sign_mask=int(rht_sign_mask),
        stochastic_rounding=bool(stochastic_rounding))
    if not given:
        return out
    r, rs, _, c, cs, _ = out
    return (r, rs, ra if rowwise else empty, c, cs, ca if columnwise else empty)


# ------------------------------------------------------------------------------ dequantize
def _dq_abstract(data, scale_inv, amax, *, out_dtype):
    op = "dequantize_nvfp4"
    check_dtype(op, "data", data.dtype, (jnp.uint8,))
    check_dtype(op, "scale_inv", scale_inv.dtype, (jnp.uint8,))
    check_dtype(op, "amax", amax.dtype, (_F32,))
    check_dtype(op, "out_dtype", out_dtype, HIGH_PRECISION)
    if len(data.shape) != 2:
        raise ValueError(f"te_lite::{op}: argument 'data': expected a 2-D packed copy, got shape "
                         f"{tuple(data.shape)}")
    rows, cols = data.shape[0], 2 * data.shape[1]
    if tuple(scale_inv.shape) != nvfp4_scale_grid(rows, cols):
        raise ValueError(f"te_lite::{op}: argument 'scale_inv': expected shape "
                         f"{nvfp4_scale_grid(rows, cols)} (the padded grid of [{rows}, {cols}]), "
                         f"got {tuple(scale_inv.shape)}")
    if int(np.prod(amax.shape)) != 1:
        raise ValueError(f"te_lite::{op}: argument 'amax': expected one float32, got shape "
                         f"{tuple(amax.shape)}")
    return (_sds((rows, cols), out_dtype),)


def _jax_dq(data, scale_inv, amax, out_dtype):
    """nvfp4_dequant_factor: e4m3 * amax * (1 / 2688), times the E2M1 value, in fp32."""
    rows, cols = data.shape[0], 2 * data.shape[1]
    codes = jnp.stack([data & 0xF, data >> 4], axis=-1).reshape(rows, cols)
    mag = jnp.asarray(_E2M1_MAG)[(codes & 7).astype(jnp.int32)]
    val = jnp.where((codes & 8) != 0, -mag, mag)
    s = jax.lax.bitcast_convert_type(scale_inv, jnp.float8_e4m3fn).astype(_F32)
    s = s[:rows, : -(-cols // NVFP4_BLOCK)]
    f = (s * amax.reshape(())) * (np.float32(1.0) / np.float32(6.0 * 448.0))
    f = jnp.repeat(f, NVFP4_BLOCK, axis=1)[:, :cols]
    return ((val * f).astype(out_dtype),)


DequantizeNVFP4Primitive = FFIOp(
    "DequantizeNVFP4Primitive", "te_lite_dequantize_nvfp4_ffi", _dq_abstract, _jax_dq,
    attrs=lambda p: {},
)


def dequantize_nvfp4(data, scale_inv, amax, out_dtype=jnp.float32):
    """One stored copy (packed uint8 [rows, cols/2], its padded uint8 E4M3 grid, fp32 amax [1]) ->
    [rows, cols] in out_dtype, the core's dequantize."""
    (out,) = DequantizeNVFP4Primitive(data, scale_inv, amax.reshape(1).astype(_F32),
                                      out_dtype=np.dtype(out_dtype))
    return out
