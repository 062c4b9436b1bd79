"""NVFP4 quantize of an N-D tensor under a mesh (TE-JAX's NVFP4 quantize with an AmaxScope).

TE-JAX takes NVFP4's per-tensor amax before the quantize (calculate_amax, and for the RHT copy
calculate_post_rht_amax), max-reduced over the AmaxScope's mesh axes, and each shard then
quantizes its own elements with it. Here:

- `scoped_nvfp4_amax(x, scope, tbs, flatten_axis, rht_sign_mask)`: the row-wise amax
  (quantization.calculate_amax) and the post-RHT one of the column-wise copy (the core's own
  transform, per shard, under the amax sharding rule: max over the scope's axes; `None` as scope:
  over every axis sharding x, the whole tensor's).
- `quantize_nvfp4_nd(x, flatten_axis, row_amax, col_amax, ...)`: the core's quantize with those
  amaxes, partitioned over x's shards (custom_partitioning): each device quantizes its own N-D
  block (reshaped to the core's 2-D view locally), so nothing is gathered. Results are TE-JAX's
  unpadded layout as uint8: row data [*shape[:-1], shape[-1] / 2] (two E2M1 per byte), row scales
  [*shape[:-1], shape[-1] / 16]; the column-wise copy of the transposed shape
  shape[fa:] + shape[:fa] the same way. A sharded dim keeps its sharding when every shard holds
  whole 16-element blocks (the last dim; dim flatten_axis - 1 too for a column-wise copy or 2D
  blocks); else it is gathered, which is allowed only where the amax is the same on the gathered
  devices (the scope spans that axis), since each device scales with its own amax.

Stochastic rounding draws from the state row of the device's shard index (TE-JAX's [num_devices,
4] state, one row per device), so replicas of a shard round alike and shards differently.

When the scope applies: the path is chosen at trace time from the mesh context (`with mesh:` or
`jax.set_mesh`). A jitted function first traced without one and called again inside one is
retraced (jax keys its trace cache on the mesh context), so it takes the scope (checked in
tests/jax/test_distributed_nvfp4_scope.py). A function traced with sharded inputs but no mesh
context quantizes with the whole tensor's amax (the inputs gathered), as our FP8 current scaling
does; TE-JAX decides in its partitioner from the inputs' shardings and would scope there too.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .nvfp4 import NVFP4_BLOCK, dequantize_nvfp4, nvfp4_scale_grid, quantize_nvfp4
from .partitioning import RowRule, lowering_mesh, mesh_axes_of, named_shapes, spec_of
from .quantization import AmaxPrimitive, _amax_axes, calculate_amax

__all__ = ["dequantize_nvfp4_nd", "quantize_nvfp4_nd", "scoped_nvfp4_amax"]

_U8 = jnp.uint8


def _split(shape, fa):
    return math.prod(shape[:fa]), math.prod(shape[fa:])


# ------------------------------------------------------------------------------ amaxes
class _PostRhtAmax:
    """The post-RHT amax of a (local) x: the core's column-wise quantize with the transform."""

    @staticmethod
    def ffi(x, *, flatten_axis, rht_sign_mask, **_):
        rows, cols = _split(x.shape, flatten_axis)
        if rows * cols == 0:
            return (jnp.zeros((1,), jnp.float32),)
        out = quantize_nvfp4(x.reshape(rows, cols), rowwise=False, columnwise=True, rht=True,
                             rht_sign_mask=rht_sign_mask)
        return (out[5],)


_POST_RHT_RULE = RowRule(("x",), ("amax",), trailing=0, amax_axes=_amax_axes)


def scoped_nvfp4_amax(x, amax_scope, transpose_batch_sequence, flatten_axis, rht_sign_mask=None):
    """(row amax, column-wise amax) float32 [1] each as TE-JAX takes them for NVFP4: the amax of x
    and, with the RHT (rht_sign_mask given), of its transformed column-wise copy (else the same
    amax), each max-reduced over the scope's mesh axes (None: the whole tensor)."""
    params = {"amax_scope": amax_scope, "transpose_batch_sequence": bool(transpose_batch_sequence)}
    row = calculate_amax(x, amax_scope, transpose_batch_sequence)
    if rht_sign_mask is None:
        return row, row
    p = dict(params, flatten_axis=flatten_axis, rht_sign_mask=int(rht_sign_mask))
    AmaxPrimitive.abstract(jax.ShapeDtypeStruct(x.shape, x.dtype), **params)
    return row, _POST_RHT_RULE.wrap(_PostRhtAmax, p, 1)(x)[0]


# ------------------------------------------------------------------------------ quantize
def _local(x, rng, row_amax, col_amax, *, flatten_axis, rowwise, columnwise, two_d, rht,
           rht_sign_mask, stochastic_rounding):
    """The quantize of one (local) N-D block with given amaxes, in TE-JAX's unpadded layout."""
    shape = tuple(x.shape)
    fa = flatten_axis
    rows, cols = _split(shape, fa)
    tshape = shape[fa:] + shape[:fa]
    given = row_amax is not None
    r, rs, ra, c, cs, ca = quantize_nvfp4(
        x.reshape(rows, cols), rowwise, columnwise, two_d, rht, rht_sign_mask,
        stochastic_rounding, rng if stochastic_rounding else None,
        row_amax=row_amax if given and rowwise else None,
        col_amax=col_amax if given and columnwise else None)
    e = jnp.zeros((0,), _U8)
    n = NVFP4_BLOCK
    out_r = (r.reshape(*shape[:-1], shape[-1] // 2),
             rs[:rows, : cols // n].reshape(*shape[:-1], shape[-1] // n)) if rowwise else (e, e)
    out_c = (c.reshape(*tshape[:-1], tshape[-1] // 2),
             cs[:cols, : rows // n].reshape(*tshape[:-1], tshape[-1] // n)) if columnwise else (e, e)
    if not given:  # the core's own amaxes (unsharded)
        return (*out_r, *out_c, ra, ca)
    return (*out_r, *out_c)


def _groups(nd, fa, params):
    """(first dim, end dim, block) of x's row dims and column dims: a shard's contiguous run of
    the flattened dims must hold whole blocks (16 where blocks or the RHT run along them)."""
    rows_block = NVFP4_BLOCK if params["columnwise"] or params["two_d"] else 1
    cols_block = NVFP4_BLOCK if params["rowwise"] or params["two_d"] else 1
    return ((0, fa, rows_block), (fa, nd, cols_block))


def _x_spec(mesh, x_shape, params, resource):
    """x's spec with the dims that cannot stay sharded gathered (a shard's run of the flattened
    rows or columns not whole blocks: the last sharded dim of the group is gathered until it
    is); refuses a gather over an axis the amax differs on (each device scales with its own)."""
    shape = tuple(x_shape.shape)
    nd = len(shape)
    spec = spec_of(x_shape, nd)
    amax_axes = set(_amax_axes(params, resource, mesh, spec))
    for lo, hi, block in _groups(nd, params["flatten_axis"], params):
        for d in reversed(range(lo, hi)):
            axes = mesh_axes_of(spec[d:d + 1])
            if not axes:
                continue
            n = math.prod(mesh.shape[a] for a in axes)
            run = shape[d] // n * math.prod(shape[d + 1:hi])
            if shape[d] % n == 0 and run % block == 0:
                break  # this run holds whole blocks, and the dims before it split whole runs
            if not set(axes) <= amax_axes:
                raise NotImplementedError(
                    f"te_lite::quantize (NVFP4): x of shape {shape} is sharded over {axes} on "
                    f"dim {d} into runs of {shape[d] / n * math.prod(shape[d + 1:hi]):g} "
                    f"elements, not whole {block}-element blocks, and amax_scope="
                    f"{params['amax_scope']} gives those shards different amaxes: gathering "
                    "them would quantize with another shard's amax; shard x in whole blocks or "
                    f"use a scope spanning {axes}")
            spec[d] = None
    return spec


def _shardings(mesh, x_shape, arg_shapes, result_shapes, params, resource):
    nd = len(x_shape.shape)
    fa = params["flatten_axis"]
    spec = _x_spec(mesh, x_shape, params, resource)
    tspec = spec[fa:] + spec[:fa]

    def res(s, sp):
        return NamedSharding(mesh, P(*sp) if len(s.shape) == nd else P(*([None] * len(s.shape))))

    results = [res(result_shapes[0], spec), res(result_shapes[1], spec),
               res(result_shapes[2], tspec), res(result_shapes[3], tspec)]
    args = [NamedSharding(mesh, P(*spec))] + [
        NamedSharding(mesh, P(*([None] * len(a.shape)))) for a in arg_shapes[1:]]
    return args, results, mesh_axes_of(spec)


def _rule(shapes, fa, params, result_types):
    """Shardy: x's dims as factors, a blocked dim as (blocks, 16) so the packed data (blocks, 8)
    and the scales (blocks) follow it; other result dims of their own."""
    nd = len(shapes)
    sizes = {}
    x_f = []
    # (Shardy refuses a size-1 factor in a compound: a single block stays one factor of its own)
    blocked = {d for d in (nd - 1, fa - 1)
               if shapes[d] % NVFP4_BLOCK == 0 and shapes[d] > NVFP4_BLOCK}
    for d in range(nd):
        if d in blocked:
            sizes[f"u{d}"], sizes[f"h{d}"] = NVFP4_BLOCK, NVFP4_BLOCK // 2
            x_f.append(f"(d{d} u{d})")
        else:
            x_f.append(f"d{d}")
    # results: packed last dim; scales one per block of the last dim
    fresh = iter(f"z{i}" for i in range(4 * nd + 8))

    def last(d, packed):  # a result's last dim made from x's dim d (packed pairs or scales)
        if d not in blocked:
            return next(fresh)
        return f"(d{d} h{d})" if packed else f"d{d}"

    row_d = x_f[:-1] + [last(nd - 1, True)]
    row_s = x_f[:-1] + [last(nd - 1, False)]
    t_f = x_f[fa:] + x_f[:fa]
    col_d = t_f[:-1] + [last(fa - 1, True)]
    col_s = t_f[:-1] + [last(fa - 1, False)]

    def f(names, t):
        return " ".join(names) if len(t.shape) == nd else " ".join(next(fresh) for _ in t.shape)

    outs = [f(row_d, result_types[0]), f(row_s, result_types[1]), f(col_d, result_types[2]),
            f(col_s, result_types[3])]
    used = " ".join(outs) + " " + " ".join(x_f)
    sizes = {k: v for k, v in sizes.items() if k in used.replace("(", " ").replace(")", " ").split()}
    return f"{' '.join(x_f)}, r0 r1, a0, c0 -> {', '.join(outs)}", sizes


def quantize_nvfp4_nd(x, flatten_axis, row_amax, col_amax, rowwise=True, columnwise=True,
                      two_d=False, rht=False, rht_sign_mask=0, rng_state=None,
                      amax_scope=None, transpose_batch_sequence=False):
    """(row_data, row_scale, row_amax, col_data, col_scale, col_amax) of N-D x, data and scales
    uint8 in TE-JAX's unpadded layout (module docstring), each device quantizing its block with
    the given amaxes (float32 [1]; the scope that reduced them decides where x may be gathered).
    Without a mesh the amaxes may be None: the core takes x's own (every scope is the whole
    tensor there). rng_state: uint32 [n, 4] or None (no stochastic rounding)."""
    from ..sharding import _GLOBAL_MESH_RESOURCE

    nd = x.ndim
    fa = flatten_axis
    sr = rng_state is not None
    rng = (jnp.asarray(rng_state, jnp.uint32).reshape(-1, 4) if sr
           else jnp.zeros((1, 4), jnp.uint32))
    params = dict(flatten_axis=fa, rowwise=bool(rowwise), columnwise=bool(columnwise),
                  two_d=bool(two_d), rht=bool(rht), rht_sign_mask=int(rht_sign_mask),
                  stochastic_rounding=sr)
    context = lowering_mesh()
    if context is None:  # unsharded (and under vmap): one block, the device's first state row
        if row_amax is None:
            r, rs, c, cs, ra, ca = _local(x, rng[0], None, None, **params)
            return r, rs, ra, c, cs, ca
        row_amax, col_amax = (jnp.asarray(a, jnp.float32).reshape(1) for a in (row_amax, col_amax))
        r, rs, c, cs = _local(x, rng[0], row_amax, col_amax, **params)
        return r, rs, row_amax, c, cs, col_amax
    if row_amax is None:
        raise ValueError("te_lite::quantize_nvfp4_nd: arguments 'row_amax', 'col_amax': expected "
                         "float32 [1] amaxes under a mesh (scoped_nvfp4_amax), got None")
    ra = jnp.asarray(row_amax, jnp.float32).reshape(1)
    ca = jnp.asarray(col_amax, jnp.float32).reshape(1)
    scope = {"amax_scope": amax_scope, "transpose_batch_sequence": bool(transpose_batch_sequence)}
    resource = _GLOBAL_MESH_RESOURCE[0]

    def impl(x, rng, ra, ca):
        return _local(x, rng[0], ra, ca, **params)

    cp = custom_partitioning(impl)

    def infer(mesh, arg_shapes, result_shape):
        mesh, arg_shapes = named_shapes(mesh, arg_shapes, context)
        return tuple(_shardings(mesh, arg_shapes[0], arg_shapes, result_shape,
                                {**params, **scope}, resource)[1])

    def partition(mesh, arg_shapes, result_shape):
        mesh, arg_shapes = named_shapes(mesh, arg_shapes, context)
        args, results, axes = _shardings(mesh, arg_shapes[0], arg_shapes, result_shape,
                                         {**params, **scope}, resource)

        def lower(x, rng, ra, ca):
            row = 0
            for a in axes:  # the shard's index over the axes sharding x
                row = row * mesh.shape[a] + jax.lax.axis_index(a)
            state = jax.lax.dynamic_index_in_dim(rng, row % rng.shape[0], keepdims=False)
            return _local(x, state, ra, ca, **params)

        return mesh, lower, tuple(results), tuple(args)

    def rule(mesh, arg_types, result_types):
        from jax._src.custom_partitioning_sharding_rule import str_to_sdy_sharding_rule

        text, sizes = _rule(tuple(arg_types[0].shape), fa, params, result_types)
        return str_to_sdy_sharding_rule(text, **sizes)

    cp.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule)
    r, rs, c, cs = cp(x, rng, ra, ca)
    return r, rs, ra, c, cs, ca


# ------------------------------------------------------------------------------ dequantize
def _dq_local(data, scale_inv, amax, *, split, out_dtype):
    """One (local) stored copy: float4 data and E4M3 scales (TE-JAX's unpadded layout) -> its
    values through the core's dequantize."""
    shape = tuple(data.shape)
    rows, cols = _split(shape, split)
    packed = jax.lax.bitcast_convert_type(data.reshape(rows, cols // 2, 2), _U8)
    sc = jax.lax.bitcast_convert_type(scale_inv, _U8).reshape(rows, cols // NVFP4_BLOCK)
    gr, gc = nvfp4_scale_grid(rows, cols)
    sc = jnp.pad(sc, ((0, gr - rows), (0, gc - sc.shape[1])))
    return dequantize_nvfp4(packed, sc, amax, out_dtype).reshape(shape)


def dequantize_nvfp4_nd(data, scale_inv, amax, split, out_dtype):
    """The values of a stored NVFP4 copy (float4_e2m1fn data, its float8_e4m3fn scales of shape
    data.shape[:-1] + (last / 16,), fp32 amax [1]; blocks along the dims from `split` on), each
    device dequantizing its own block with its own amax: an AmaxScope's amax differs between
    shards, so a replicated dequantize (the data gathered, one device's amax) would be wrong."""
    params = dict(split=split, out_dtype=out_dtype)
    shape = tuple(data.shape)
    nd = len(shape)
    context = lowering_mesh()
    aligned = tuple(scale_inv.shape) == shape[:-1] + (shape[-1] // NVFP4_BLOCK,)
    if context is None or not aligned:
        return _dq_local(data, scale_inv, amax, **params)
    cp = custom_partitioning(lambda d, s, a: _dq_local(d, s, a, **params))
    blocks = {"flatten_axis": split, "rowwise": True, "columnwise": False, "two_d": False}

    def shardings(mesh, arg_shapes):
        mesh, arg_shapes = named_shapes(mesh, arg_shapes, context)
        spec = spec_of(arg_shapes[0], nd)
        for lo, hi, block in _groups(nd, split, blocks):  # gather what splits a block
            for d in reversed(range(lo, hi)):
                axes = mesh_axes_of(spec[d:d + 1])
                if not axes:
                    continue
                n = math.prod(mesh.shape[a] for a in axes)
                if shape[d] % n == 0 and shape[d] // n * math.prod(shape[d + 1:hi]) % block == 0:
                    break
                spec[d] = None
        ns = lambda sp: NamedSharding(mesh, P(*sp))
        return mesh, [ns(spec), ns(spec), ns([None])], ns(spec)

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[2]

    def partition(mesh, arg_shapes, result_shape):
        mesh, args, out = shardings(mesh, arg_shapes)
        return mesh, lambda d, s, a: _dq_local(d, s, a, **params), out, tuple(args)

    def rule(mesh, arg_types, result_types):
        from jax._src.custom_partitioning_sharding_rule import str_to_sdy_sharding_rule

        lead = [f"d{i}" for i in range(nd - 1)]
        if shape[-1] % NVFP4_BLOCK == 0 and shape[-1] > NVFP4_BLOCK:
            last, s_last, sizes = "(l u)", "l", {"u": NVFP4_BLOCK}
        else:
            last, s_last, sizes = "l", "z", {}
        x = " ".join(lead + [last])
        return str_to_sdy_sharding_rule(f"{x}, {' '.join(lead + [s_last])}, a -> {x}", **sizes)

    cp.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule)
    return cp(data, scale_inv, amax.reshape(1).astype(jnp.float32))
