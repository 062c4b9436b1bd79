"""Fused attention primitives: the core's flash backend (te_lite_fused_attn_{fwd,bwd}_ffi) in
TE-JAX's layouts, plus its Philox dropout keep mask.

Layouts (TE-JAX's QKVLayout names; all batch-first, every tensor [b, s, ...]):
  bs3hd / t3hd:           qkv [b, s, 3, h, d]
  bshd_bs2hd / thd_t2hd:  q [b, s_q, h, d], kv [b, s_kv, 2, h_kv, d]
  bshd_bshd_bshd / thd_thd_thd: q [b, s_q, h, d], k [b, s_kv, h_kv, d], v [b, s_kv, h_kv, d_v]
The primitives take (q, k, v) with the packed ones empty ([0]), as the FFI handlers do.

Sequences:
- bshd with a padding mask: q_seqlens / kv_seqlens int32 [b] (each row holds one sequence from
  position 0); the core gets cu_seqlens = [0, cumsum(seqlens)].
- thd (TE-JAX's THD is [b, s, h, d] with up to m = max_segments_per_seq sequences per row):
  seqlens int32 [b, m] and offsets int32 [b, m] or [b, m + 1] (start of each segment in its row).
  The tokens of the b * m segments are gathered to the front of a [b * s, h, d] buffer (the core's
  thd, cu_seqlens = [0, cumsum(seqlens)]), attended, and scattered back; tokens in no segment get
  output 0 and gradient 0. Segments must not overlap (TE's contract as well). A bias is indexed
  by row positions (as in TE); the core gets each segment's slice (attention_thd_bias.py).
Results: out [b, s_q, h, d_v] (q's dtype) and the fp32 softmax LSE, [b, h, s_q] (bshd) or
[b, m, h, s_q] (thd); the backward returns dq, dk, dv in the shapes of q, k, v (packed ones
packed) and dbias in bias's shape (post_scale_bias, else [0]).

Sharding (`_AttnRule`): the batch dim and the heads dim of q / k / v / out / LSE keep their
sharding (heads only when h and h_kv divide by it), sequences and head_dim are gathered, bias
follows where its dims are full size; dbias of a broadcast bias is summed over the axes it was
broadcast along. Dropout: each shard folds its index into the Philox offset, so shards draw
different (independent) masks; a sharded dropout run therefore differs from an unsharded one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .attention_masks import (  # noqa: F401  (re-exported: cpp_extensions, the reference)
    DropoutMaskPrimitive, _err, dropout_keep_mask, keep_mask)
from . import attention_thd_bias as thd_bias
from .base import FFIOp
from .misc import HIGH_PRECISION, check_dtype
from .partitioning import lowering_mesh, named_shapes, spec_of


class AttnSoftmaxType(Enum):
    VANILLA_SOFTMAX = "vanilla"
    OFF_BY_ONE_SOFTMAX = "off_by_one"
    LEARNABLE_SOFTMAX = "learnable"

    @classmethod
    def from_str(cls, softmax_type: str) -> AttnSoftmaxType:
        for member in cls:
            if member.value == softmax_type:
                return member
        raise ValueError(f"softmax_type: expected one of {[m.value for m in cls]}, got "
                         f"{softmax_type!r}")


__all__ = [
    "AttnSoftmaxType",
    "LAYOUTS",
    "check_side",
    "core_mask",
    "dropout_keep_mask",
    "fused_attn_bwd",
    "fused_attn_fwd",
    "keep_mask",
    "layout_dims",
]

_I32 = jnp.int32
_F32 = jnp.float32
# TE-JAX layout name -> (format, packing)
LAYOUTS = {
    "bs3hd": ("bshd", "qkv"),
    "bshd_bs2hd": ("bshd", "kv"),
    "bshd_bshd_bshd": ("bshd", "sep"),
    "t3hd": ("thd", "qkv"),
    "thd_t2hd": ("thd", "kv"),
    "thd_thd_thd": ("thd", "sep"),
}
MASKS = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
         "padding_causal_bottom_right")
BIASES = ("no_bias", "pre_scale_bias", "post_scale_bias")


def _empty(dtype=_I32):
    return jnp.zeros((0,), dtype)


# ------------------------------------------------------------------------------------ shapes
@dataclass(frozen=True)
class Dims:
    b: int
    s_q: int
    s_kv: int
    h: int
    h_kv: int
    d_qk: int
    d_v: int


def layout_dims(op: str, layout: str, q, k, v) -> Dims:
    """The problem sizes of (q, k, v) in `layout`, checking ranks, dtypes and agreement."""
    if layout not in LAYOUTS:
        raise _err(op, "qkv_layout", f"one of {sorted(LAYOUTS)}", repr(layout))
    _, pack = LAYOUTS[layout]
    for arg, x in (("q", q), ("k", k), ("v", v)):
        if x.size or arg == "q":
            check_dtype(op, arg, x.dtype, HIGH_PRECISION)

    def want(x, arg, nd, what):
        if len(x.shape) != nd:
            raise _err(op, arg, f"a {nd}-D array {what} for layout {layout}", f"shape {tuple(x.shape)}")

    def packed_away(x, arg, into):
        if x.size:
            raise _err(op, arg, f"an empty array (layout {layout} packs it into '{into}')",
                       f"shape {tuple(x.shape)}")

    if pack == "qkv":
        want(q, "q", 5, "[b, s, 3, h, d]")
        if q.shape[2] != 3:
            raise _err(op, "q", "[b, s, 3, h, d] (3 = q, k, v)", f"shape {tuple(q.shape)}")
        packed_away(k, "k", "q")
        packed_away(v, "v", "q")
        b, s, _, h, d = q.shape
        return Dims(b, s, s, h, h, d, d)
    want(q, "q", 4, "[b, s_q, h, d]")
    b, s_q, h, d = q.shape
    if pack == "kv":
        want(k, "k", 5, "[b, s_kv, 2, h_kv, d] (the packed kv)")
        packed_away(v, "v", "k")
        kb, s_kv, two, h_kv, kd = k.shape
        d_v = kd
        if two != 2:
            raise _err(op, "k", "[b, s_kv, 2, h_kv, d] (2 = k, v)", f"shape {tuple(k.shape)}")
    else:
        want(k, "k", 4, "[b, s_kv, h_kv, d]")
        want(v, "v", 4, "[b, s_kv, h_kv, d_v]")
        kb, s_kv, h_kv, kd = k.shape
        if v.shape[:3] != k.shape[:3]:
            raise _err(op, "v", f"[b, s_kv, h_kv] = {tuple(k.shape[:3])} as k's",
                       f"shape {tuple(v.shape)}")
        d_v = v.shape[3]
    if kb != b or kd != d:
        raise _err(op, "k", f"batch {b} and head_dim {d} as q's", f"shape {tuple(k.shape)}")
    if k.dtype != q.dtype or (v.size and v.dtype != q.dtype):
        raise TypeError(f"te_lite::{op}: arguments 'k', 'v': expected q's dtype {q.dtype}, got "
                        f"{k.dtype}, {v.dtype}")
    if h_kv == 0 or h % h_kv:
        raise _err(op, "k", f"a number of heads dividing q's {h} (GQA / MQA)", h_kv)
    return Dims(b, s_q, s_kv, h, h_kv, d, d_v)


def check_side(op, layout, dims: Dims, bias, q_seqlens, kv_seqlens, q_offsets, kv_offsets,
                seed, bias_type, mask_type):
    fmt = LAYOUTS[layout][0]
    if bias_type not in BIASES:
        raise _err(op, "attn_bias_type", f"one of {BIASES}", repr(bias_type))
    if mask_type not in MASKS:
        raise _err(op, "attn_mask_type", f"one of {MASKS}", repr(mask_type))
    if bias_type == "no_bias":
        if bias.size:
            raise _err(op, "bias", "no bias with attn_bias_type no_bias", f"shape {bias.shape}")
    else:
        ok = (len(bias.shape) == 4 and bias.shape[0] in (1, dims.b) and bias.shape[1] in (1, dims.h)
              and tuple(bias.shape[2:]) == (dims.s_q, dims.s_kv))
        if not ok:
            raise _err(op, "bias", f"[1 or {dims.b}, 1 or {dims.h}, {dims.s_q}, {dims.s_kv}]",
                       f"shape {tuple(bias.shape)}")
    padded = fmt == "thd" or "padding" in mask_type
    for arg, x, s in (("q_seqlens", q_seqlens, dims.s_q), ("kv_seqlens", kv_seqlens, dims.s_kv)):
        if not padded:
            if x.size:
                raise _err(op, arg, f"none for layout {layout} with mask {mask_type}",
                           f"shape {x.shape}")
            continue
        check_dtype(op, arg, x.dtype, (_I32,))
        want = (dims.b,) if fmt == "bshd" else (dims.b, "m")
        if len(x.shape) != len(want) or x.shape[0] != dims.b:
            raise _err(op, arg, f"int32 {list(want)} (sequence lengths per row)",
                       f"shape {tuple(x.shape)}")
    if fmt == "thd":
        m = q_seqlens.shape[1]
        for arg, x, lens in (("q_offsets", q_offsets, q_seqlens), ("kv_offsets", kv_offsets,
                                                                   kv_seqlens)):
            check_dtype(op, arg, x.dtype, (_I32,))
            if len(x.shape) != 2 or x.shape[0] != dims.b or x.shape[1] < lens.shape[1]:
                raise _err(op, arg, f"int32 [{dims.b}, m] or [{dims.b}, m + 1] (segment starts)",
                           f"shape {tuple(x.shape)}")
        if kv_seqlens.shape[1] != m:
            raise _err(op, "kv_seqlens", f"[{dims.b}, {m}] as q_seqlens", kv_seqlens.shape)
    if seed.size and not (seed.shape == (4,) and seed.dtype in (jnp.int32, jnp.uint32)):
        raise _err(op, "seed", "int32 / uint32 [4] = {seed lo, hi, offset lo, hi}",
                   f"{seed.dtype} {tuple(seed.shape)}")


# ------------------------------------------------------------------------------------ thd
class _Segments:
    """Where the tokens of up to m segments per row go in the core's packed thd buffer."""

    def __init__(self, seqlens, offsets, s: int):
        b, m = seqlens.shape
        self.b, self.s = b, s
        lens = jnp.clip(seqlens, 0, s)
        starts = offsets[:, :m]
        self.cu = jnp.concatenate([jnp.zeros((1,), _I32), jnp.cumsum(lens.reshape(-1), dtype=_I32)])
        j = jnp.arange(s, dtype=_I32)[None, :, None]
        inside = (j >= starts[:, None, :]) & (j < (starts + lens)[:, None, :])  # [b, s, m]
        self.valid = inside.any(-1)
        seg = jnp.argmax(inside, axis=-1).astype(_I32)
        n = jnp.arange(b, dtype=_I32)[:, None] * m + seg
        pos = self.cu[n] + j[..., 0] - jnp.take_along_axis(starts, seg, axis=1)
        total = b * s
        self.pos = jnp.where(self.valid, pos, total).reshape(-1)  # packed index of each token
        # source token of each packed slot (slots past cu[-1] read token 0: no sequence has them)
        self.src = jnp.zeros((total,), _I32).at[self.pos].set(jnp.arange(total, dtype=_I32),
                                                               mode="drop")

    def pack(self, x):
        """[b, s, ...] -> [b * s, ...] in packed order."""
        return x.reshape(self.b * self.s, *x.shape[2:])[self.src]

    def unpack(self, y):
        """[b * s, ...] packed -> [b, s, ...], 0 outside every segment."""
        got = y[jnp.minimum(self.pos, self.b * self.s - 1)]
        keep = self.valid.reshape(-1, *([1] * (y.ndim - 1)))
        return jnp.where(keep, got, jnp.zeros((), y.dtype)).reshape(self.b, self.s, *y.shape[1:])


def _cu(lens):
    return jnp.concatenate([jnp.zeros((1,), _I32), jnp.cumsum(lens, dtype=_I32)])


def _core_args(layout, dims, q, k, v, q_seqlens, kv_seqlens, q_offsets, kv_offsets, mask_type):
    """(q, k, v, cu_q, cu_kv, seg_q, seg_kv) as the handler takes them (seg_* for thd only)."""
    fmt = LAYOUTS[layout][0]
    if fmt == "bshd":
        if "padding" not in mask_type:
            return q, k, v, _empty(), _empty(), None, None
        return q, k, v, _cu(q_seqlens), _cu(kv_seqlens), None, None
    sq = _Segments(q_seqlens, q_offsets, dims.s_q)
    skv = _Segments(kv_seqlens, kv_offsets, dims.s_kv)
    pack = LAYOUTS[layout][1]
    qc = sq.pack(q)
    kc = skv.pack(k) if pack != "qkv" else k
    vc = skv.pack(v) if pack == "sep" else v
    return qc, kc, vc, sq.cu, skv.cu, sq, skv


def core_mask(layout: str, mask_type: str) -> str:
    """The mask name the core gets: thd is padded by construction, so its padding form."""
    if LAYOUTS[layout][0] == "bshd" or "padding" in mask_type:
        return mask_type
    return "padding" if mask_type == "no_mask" else "padding_" + mask_type


def _attrs(layout, dims, scaling_factor, dropout_probability, bias_type, mask_type, window):
    return {
        "qkv_layout": layout,
        "max_seqlen_q": dims.s_q,
        "max_seqlen_kv": dims.s_kv,
        "attn_scale": float(scaling_factor),
        "dropout": float(dropout_probability),
        "bias_type": bias_type,
        "mask_type": core_mask(layout, mask_type),
        "window_left": int(window[0]),
        "window_right": int(window[1]),
    }


def _out_shapes(layout, dims, q_dtype, is_training, m):
    lead = (dims.b * dims.s_q,) if LAYOUTS[layout][0] == "thd" else (dims.b, dims.s_q)
    out = jax.ShapeDtypeStruct((*lead, dims.h, dims.d_v), q_dtype)
    n = dims.b * m if LAYOUTS[layout][0] == "thd" else dims.b
    lse = jax.ShapeDtypeStruct((n, dims.h, dims.s_q) if is_training else (0,), _F32)
    return out, lse


def _segments_of(layout, q_seqlens):
    return q_seqlens.shape[1] if LAYOUTS[layout][0] == "thd" else 1


# ------------------------------------------------------------------------------------ forward
def _fwd_abstract(q, k, v, bias, q_seqlens, kv_seqlens, q_offsets, kv_offsets, seed, *, qkv_layout,
                  attn_bias_type, attn_mask_type, scaling_factor, dropout_probability, is_training,
                  window):
    op = "fused_attn_fwd"
    dims = layout_dims(op, qkv_layout, q, k, v)
    check_side(op, qkv_layout, dims, bias, q_seqlens, kv_seqlens, q_offsets, kv_offsets, seed,
                attn_bias_type, attn_mask_type)
    if dropout_probability > 0 and not seed.size:
        raise _err(op, "seed", "a seed (dropout_probability > 0)", "none")
    m = _segments_of(qkv_layout, q_seqlens)
    out = jax.ShapeDtypeStruct((dims.b, dims.s_q, dims.h, dims.d_v), q.dtype)
    lse_shape = (dims.b, m, dims.h, dims.s_q) if LAYOUTS[qkv_layout][0] == "thd" else (
        dims.b, dims.h, dims.s_q)
    return out, jax.ShapeDtypeStruct(lse_shape if is_training else (0,), _F32)


def _fwd_local(q, k, v, bias, q_seqlens, kv_seqlens, q_offsets, kv_offsets, seed, *, qkv_layout,
               attn_bias_type, attn_mask_type, scaling_factor, dropout_probability, is_training,
               window):
    dims = layout_dims("fused_attn_fwd", qkv_layout, q, k, v)
    qc, kc, vc, cu_q, cu_kv, sq, _ = _core_args(qkv_layout, dims, q, k, v, q_seqlens, kv_seqlens,
                                                 q_offsets, kv_offsets, attn_mask_type)
    m = _segments_of(qkv_layout, q_seqlens)
    if sq is not None and bias.size:  # thd: the core indexes its bias per sequence
        bias = thd_bias.gather(bias, q_seqlens, q_offsets, kv_offsets)
    call = jax.ffi.ffi_call("te_lite_fused_attn_fwd_ffi",
                            _out_shapes(qkv_layout, dims, q.dtype, is_training, m))
    out, lse = call(qc, kc, vc, bias, cu_q, cu_kv, seed, is_training=bool(is_training),
                    **_attrs(qkv_layout, dims, scaling_factor, dropout_probability,
                             attn_bias_type, attn_mask_type, window))
    if sq is None:
        return out, lse
    lse = lse.reshape(dims.b, m, dims.h, dims.s_q) if is_training else lse
    return sq.unpack(out), lse


# ------------------------------------------------------------------------------------ backward
def _bwd_abstract(q, k, v, bias, lse, out, d_out, q_seqlens, kv_seqlens, q_offsets, kv_offsets,
                  seed, *, qkv_layout, attn_bias_type, attn_mask_type, scaling_factor,
                  dropout_probability, window, deterministic):
    op = "fused_attn_bwd"
    dims = layout_dims(op, qkv_layout, q, k, v)
    check_side(op, qkv_layout, dims, bias, q_seqlens, kv_seqlens, q_offsets, kv_offsets, seed,
                attn_bias_type, attn_mask_type)
    want = (dims.b, dims.s_q, dims.h, dims.d_v)
    for arg, x in (("out", out), ("d_out", d_out)):
        if tuple(x.shape) != want or x.dtype != q.dtype:
            raise _err(op, arg, f"{q.dtype} {want}", f"{x.dtype} {tuple(x.shape)}")
    dbias = bias if attn_bias_type == "post_scale_bias" else jax.ShapeDtypeStruct((0,), q.dtype)
    return (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
            jax.ShapeDtypeStruct(v.shape, v.dtype),
            jax.ShapeDtypeStruct(dbias.shape, dbias.dtype))


def _bwd_local(q, k, v, bias, lse, out, d_out, q_seqlens, kv_seqlens, q_offsets, kv_offsets, seed,
               *, qkv_layout, attn_bias_type, attn_mask_type, scaling_factor, dropout_probability,
               window, deterministic):
    dims = layout_dims("fused_attn_bwd", qkv_layout, q, k, v)
    fmt, pack = LAYOUTS[qkv_layout]
    qc, kc, vc, cu_q, cu_kv, sq, skv = _core_args(qkv_layout, dims, q, k, v, q_seqlens,
                                                  kv_seqlens, q_offsets, kv_offsets,
                                                  attn_mask_type)
    row_bias = bias
    if sq is not None:
        out, d_out = sq.pack(out), sq.pack(d_out)
        lse = lse.reshape(-1, dims.h, dims.s_q)
        if bias.size:  # thd: the core indexes its bias (and dbias) per sequence
            bias = thd_bias.gather(bias, q_seqlens, q_offsets, kv_offsets)
    # The handler returns dq, dk, dv in the views' shapes: one slice of a packed buffer each.
    view_q = qc.shape if pack != "qkv" else (*qc.shape[:-3], dims.h, dims.d_qk)
    view_k = (*kc.shape[:-3], dims.h_kv, dims.d_qk) if pack != "sep" else kc.shape
    if pack == "qkv":
        view_k = view_q
    view_v = view_k if pack != "sep" else vc.shape
    has_dbias = attn_bias_type == "post_scale_bias" and bias.size > 0
    shapes = (jax.ShapeDtypeStruct(view_q, q.dtype), jax.ShapeDtypeStruct(view_k, q.dtype),
              jax.ShapeDtypeStruct(view_v, q.dtype),
              jax.ShapeDtypeStruct(bias.shape if has_dbias else (0,), bias.dtype if has_dbias
                                   else q.dtype))
    call = jax.ffi.ffi_call("te_lite_fused_attn_bwd_ffi", shapes)
    dq, dk, dv, dbias = call(qc, kc, vc, out, d_out, lse, bias, cu_q, cu_kv, seed,
                             deterministic=bool(deterministic),
                             **_attrs(qkv_layout, dims, scaling_factor, dropout_probability,
                                      attn_bias_type, attn_mask_type, window))
    if fmt == "thd":
        if has_dbias:
            dbias = thd_bias.scatter(dbias, row_bias.shape, row_bias.dtype, q_seqlens, kv_seqlens,
                                     q_offsets, kv_offsets)
        dq = sq.unpack(dq)
        dk, dv = (sq.unpack(dk), sq.unpack(dv)) if pack == "qkv" else (skv.unpack(dk),
                                                                        skv.unpack(dv))
    if pack == "qkv":
        return jnp.stack([dq, dk, dv], axis=2), _empty(k.dtype), _empty(v.dtype), dbias
    if pack == "kv":
        return dq, jnp.stack([dk, dv], axis=2), _empty(v.dtype), dbias
    return dq, dk, dv, dbias


# ------------------------------------------------------------------------------------ sharding
class _AttnRule:
    """Batch (dim 0) and heads (dim -2) of q / k / v / out / LSE keep their sharding, the rest is
    gathered (see the module docstring). roles per argument / result: "tok", "bias", "row",
    "rep"; "dbias" (a result: bias's sharding, summed over the axes bias is broadcast along)."""

    def __init__(self, arg_roles, result_roles, seed_arg: int):
        self.arg_roles = tuple(arg_roles)
        self.result_roles = tuple(result_roles)
        self.seed_arg = seed_arg

    @staticmethod
    def _axis_size(mesh, entry) -> int:
        size = 1
        for a in (entry if isinstance(entry, tuple) else (entry,)) if entry else ():
            size *= mesh.shape[a]
        return size

    def _axes(self, mesh, arg_shapes):
        q = arg_shapes[0]
        spec = spec_of(q, len(q.shape))
        b_ax, h_ax = spec[0], spec[-2]
        h_kv = [a.shape[-2] for a, r in zip(arg_shapes, self.arg_roles)
                if r == "tok" and len(a.shape) >= 3]
        if h_ax is not None and any(n % self._axis_size(mesh, h_ax) for n in h_kv):
            h_ax = None
        if b_ax is not None and q.shape[0] % self._axis_size(mesh, b_ax):
            b_ax = None
        return b_ax, h_ax, q.shape[0], q.shape[-2]

    @staticmethod
    def _spec(role, shape, b_ax, h_ax, b, h):
        nd = len(shape)
        if role == "tok" and nd >= 3:
            return P(b_ax, *([None] * (nd - 3)), h_ax, None)
        if role == "row" and nd >= 1 and shape[0] == b:
            return P(b_ax, *([None] * (nd - 1)))
        if role in ("bias", "dbias") and nd == 4:
            return P(b_ax if shape[0] == b and b != 1 else None,
                     h_ax if shape[1] == h and h != 1 else None, None, None)
        return P(*([None] * nd))

    def shardings(self, mesh, arg_shapes, result_shapes):
        b_ax, h_ax, b, h = self._axes(mesh, arg_shapes)
        args = [NamedSharding(mesh, self._spec(r, a.shape, b_ax, h_ax, b, h))
                for r, a in zip(self.arg_roles, arg_shapes)]
        results = [NamedSharding(mesh, self._spec(r, s.shape, b_ax, h_ax, b, h))
                   for r, s in zip(self.result_roles, result_shapes)]
        return args, results, (b_ax, h_ax, b, h)

    def rule(self, arg_types, result_types) -> str:
        n = [0]
        h = arg_types[0].shape[-2] if len(arg_types[0].shape) >= 3 else None
        b = arg_types[0].shape[0] if arg_types[0].shape else None

        def fresh():
            n[0] += 1
            return f"f{n[0]}"

        def factors(role, shape):
            nd = len(shape)
            if role == "tok" and nd >= 3:
                heads = "h" if shape[-2] == h else "hk"
                f = ["b"] + [fresh() for _ in range(nd - 3)] + [heads, fresh()]
            elif role == "row" and nd >= 1 and shape[0] == b:
                f = ["b"] + [fresh() for _ in range(nd - 1)]
            elif role in ("bias", "dbias") and nd == 4:
                f = ["b" if shape[0] == b and b != 1 else fresh(),
                     "h" if shape[1] == h and h != 1 else fresh(), fresh(), fresh()]
            else:
                f = [fresh() for _ in range(nd)]
            return " ".join(f)

        lhs = ", ".join(factors(r, a.shape) for r, a in zip(self.arg_roles, arg_types))
        rhs = ", ".join(factors(r, s.shape) for r, s in zip(self.result_roles, result_types))
        return f"{lhs} -> {rhs}"

    def wrap(self, op, params: dict, nargs: int):
        cp = custom_partitioning(lambda *args: op.ffi(*args, **params))
        context = lowering_mesh()

        def infer(mesh, arg_shapes, result_shape):
            mesh, arg_shapes = named_shapes(mesh, arg_shapes, context)
            return tuple(self.shardings(mesh, arg_shapes, result_shape)[1])

        def partition(mesh, arg_shapes, result_shape):
            mesh, arg_shapes = named_shapes(mesh, arg_shapes, context)
            args, results, (b_ax, h_ax, b, h) = self.shardings(mesh, arg_shapes, result_shape)
            axes = [a for e in (b_ax, h_ax) if e for a in (e if isinstance(e, tuple) else (e,))]

            def lower(*local):
                local = list(local)
                seed = local[self.seed_arg]
                if axes and seed.size:  # a different Philox stream per shard
                    index = jnp.zeros((), jnp.uint32)
                    for a in axes:
                        index = index * mesh.shape[a] + jax.lax.axis_index(a).astype(jnp.uint32)
                    local[self.seed_arg] = seed.at[2].add(index.astype(seed.dtype))
                outs = list(op.ffi(*local, **params))
                for i, role in enumerate(self.result_roles):
                    if role != "dbias" or not outs[i].size:
                        continue
                    shape = result_shape[i].shape
                    summed = [a for e, full, n in ((b_ax, shape[0], b), (h_ax, shape[1], h))
                              if e and (full != n or n == 1)
                              for a in (e if isinstance(e, tuple) else (e,))]
                    if summed:
                        outs[i] = jax.lax.psum(outs[i].astype(_F32), summed).astype(
                            result_shape[i].dtype)
                return tuple(outs)

            return mesh, lower, tuple(results), tuple(args)

        cp.def_partition(partition=partition, infer_sharding_from_operands=infer,
                         sharding_rule=lambda mesh, a, r: self.rule(a, r))
        return cp


class _AttnOp(FFIOp):
    """An FFIOp whose local computation is a composite around the handler (thd packing)."""

    def __init__(self, name, local, abstract, reference, rule):
        super().__init__(name, "", abstract, reference, partition=rule)
        self._local = local

    def ffi(self, *args, **params):
        return tuple(self._local(*args, **params))


def _reference_fwd(*args, **params):
    from .attention_reference import reference_fwd

    return reference_fwd(*args, **params)


def _reference_bwd(*args, **params):
    from .attention_reference import reference_bwd

    return reference_bwd(*args, **params)


FusedAttnFwdPrimitive = _AttnOp(
    "FusedAttnFwdPrimitive", _fwd_local, _fwd_abstract, _reference_fwd,
    _AttnRule(("tok", "tok", "tok", "bias", "row", "row", "row", "row", "rep"), ("tok", "tok"),
              seed_arg=8))
FusedAttnBwdPrimitive = _AttnOp(
    "FusedAttnBwdPrimitive", _bwd_local, _bwd_abstract, _reference_bwd,
    _AttnRule(("tok", "tok", "tok", "bias", "tok", "tok", "tok", "row", "row", "row", "row",
               "rep"), ("tok", "tok", "tok", "dbias"), seed_arg=11))


def _or_empty(x, dtype=_I32):
    return _empty(dtype) if x is None else x


def fused_attn_fwd(q, k, v, bias, q_seqlens, kv_seqlens, q_offsets, kv_offsets, seed, *,
                   qkv_layout, attn_bias_type, attn_mask_type, scaling_factor,
                   dropout_probability, is_training, window=(-1, -1)):
    """(out [b, s_q, h, d_v], softmax LSE) of the flash backend; None for absent arguments."""
    return FusedAttnFwdPrimitive(
        q, _or_empty(k, q.dtype), _or_empty(v, q.dtype), _or_empty(bias, q.dtype),
        _or_empty(q_seqlens), _or_empty(kv_seqlens), _or_empty(q_offsets), _or_empty(kv_offsets),
        _or_empty(seed, jnp.uint32), qkv_layout=qkv_layout, attn_bias_type=attn_bias_type,
        attn_mask_type=attn_mask_type, scaling_factor=float(scaling_factor),
        dropout_probability=float(dropout_probability), is_training=bool(is_training),
        window=tuple(int(w) for w in window))


def fused_attn_bwd(q, k, v, bias, lse, out, d_out, q_seqlens, kv_seqlens, q_offsets, kv_offsets,
                   seed, *, qkv_layout, attn_bias_type, attn_mask_type, scaling_factor,
                   dropout_probability, window=(-1, -1), deterministic=False):
    """(dq, dk, dv, dbias) in the shapes of q, k, v, bias (empty for absent / packed ones)."""
    return FusedAttnBwdPrimitive(
        q, _or_empty(k, q.dtype), _or_empty(v, q.dtype), _or_empty(bias, q.dtype), lse, out, d_out,
        _or_empty(q_seqlens), _or_empty(kv_seqlens), _or_empty(q_offsets), _or_empty(kv_offsets),
        _or_empty(seed, jnp.uint32), qkv_layout=qkv_layout, attn_bias_type=attn_bias_type,
        attn_mask_type=attn_mask_type, scaling_factor=float(scaling_factor),
        dropout_probability=float(dropout_probability), window=tuple(int(w) for w in window),
        deterministic=bool(deterministic))
