"""The NVFP4 GEMM under a mesh on the copies' N-D layouts (each device its own blocks).

An AmaxScope gives each shard of an NVFP4 copy its own per-tensor amax (TE-JAX's scoped amax): a
device may multiply only the blocks it quantized, with its own amax. Flattening a copy to the
block GEMM's 2-D [rows, K] view before partitioning lets XLA move rows between devices (a
sequence-major [s, b, h] with the batch sharded has no 2-D tiling), after which a device would
scale other shards' blocks with its amax. Here the GEMM is partitioned on the N-D copies
(`custom_partitioning`) and flattened per device: free dims keep their sharding (an axis on
both operands' free dims is dropped from the right one), the contracted dims stay sharded where
both operands shard them alike (each device its K slice with its own factor, the partial
products summed, as TE's GEMM over a sharded contracting dim), else they are gathered.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax._src.custom_partitioning_sharding_rule import str_to_sdy_sharding_rule
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .partitioning import lowering_mesh, mesh_axes_of, named_shapes, spec_of

__all__ = ["nvfp4_gemm_nd"]

_BLOCK = 16


def _flat(data, scale, split):
    """(packed uint8 [rows, K/2], uint8 scales [rows, K/16]) of a (local) copy whose blocks run
    along its dims from `split` on."""
    shape = tuple(data.shape)
    rows, k = math.prod(shape[:split]), math.prod(shape[split:])
    packed = jax.lax.bitcast_convert_type(data.reshape(rows, k // 2, 2), jnp.uint8)
    scales = jax.lax.bitcast_convert_type(scale, jnp.uint8).reshape(rows, -(-k // _BLOCK))
    return packed, scales


def nvfp4_gemm_nd(b_data, b_scale, b_split, a_data, a_scale, a_split, amax_b, amax_a, gemm):
    """fp32 [*b free dims, *a free dims] = gemm(flattened b, flattened a, amaxes) per device:
    b / a are stored copies (float4 data, float8 scales of shape data.shape[:-1] +
    (last / 16,)) whose blocks run along the dims from b_split / a_split on (the K dims, the same
    shape in both); `gemm` the 2-D block GEMM (packed, scales, packed, scales, amax, amax)."""
    bfree, afree = tuple(b_data.shape[:b_split]), tuple(a_data.shape[:a_split])
    kshape = tuple(b_data.shape[b_split:])

    def local(bd, bs, ad, as_, ab, aa):
        pb, sb = _flat(bd, bs, b_split)
        pa, sa = _flat(ad, as_, a_split)
        return gemm(pb, sb, pa, sa, ab, aa).reshape(*bd.shape[:b_split], *ad.shape[:a_split])

    context = lowering_mesh()
    aligned = (tuple(a_data.shape[a_split:]) == kshape
               and tuple(b_scale.shape) == tuple(b_data.shape[:-1]) + (b_data.shape[-1] // 16,)
               and tuple(a_scale.shape) == tuple(a_data.shape[:-1]) + (a_data.shape[-1] // 16,))
    if context is None or not aligned or b_data.shape[-1] % _BLOCK:
        return local(b_data, b_scale, a_data, a_scale, amax_b, amax_a)
    nb, na, nk = len(bfree), len(afree), len(kshape)

    def plan(mesh, shapes):
        bs_, as_ = spec_of(shapes[0], nb + nk), spec_of(shapes[2], na + nk)
        k = [x if x == y else None for x, y in zip(bs_[nb:], as_[na:])]
        for d in reversed(range(nk)):  # each device's run of the flattened K: whole blocks
            axes = mesh_axes_of(k[d:d + 1])
            if not axes:
                continue
            n = math.prod(mesh.shape[x] for x in axes)
            if kshape[d] % n == 0 and kshape[d] // n * math.prod(kshape[d + 1:]) % _BLOCK == 0:
                break
            k[d] = None
        used = set(mesh_axes_of(k))
        bf = [e if not set(mesh_axes_of([e])) & used else None for e in bs_[:nb]]
        used |= set(mesh_axes_of(bf))
        af = [e if not set(mesh_axes_of([e])) & used else None for e in as_[:na]]
        return bf, af, k

    def shardings(mesh, arg_shapes):
        mesh, arg_shapes = named_shapes(mesh, arg_shapes, context)
        bf, af, k = plan(mesh, arg_shapes)
        ns = lambda sp: NamedSharding(mesh, P(*sp))
        bsp, asp = bf + k, af + k
        args = [ns(bsp), ns(bsp), ns(asp), ns(asp), ns([None]), ns([None])]
        return mesh, args, ns(bf + af), mesh_axes_of(k)

    cp = custom_partitioning(local)

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[2]

    def partition(mesh, arg_shapes, result_shape):
        mesh, args, out, k_axes = shardings(mesh, arg_shapes)

        def lower(*xs):
            y = local(*xs)
            return jax.lax.psum(y, k_axes) if k_axes else y

        return mesh, lower, out, tuple(args)

    def rule(mesh, arg_types, result_types):
        fb = [f"b{i}" for i in range(nb)]
        fa = [f"a{i}" for i in range(na)]
        fk = [f"k{i}" for i in range(nk)]
        sizes = {}
        if kshape[-1] > _BLOCK:
            data_k = fk[:-1] + [f"(k{nk - 1} u)"]
            scale_k = fk
            sizes["u"] = _BLOCK
        else:
            data_k, scale_k = fk, fk[:-1] + ["z"]
        text = (f"{' '.join(fb + data_k)}, {' '.join(fb + scale_k)}, {' '.join(fa + data_k)}, "
                f"{' '.join(fa + scale_k)}, p, q -> {' '.join(fb + fa)}")
        return str_to_sdy_sharding_rule(text, **sizes)

    cp.def_partition(partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule)
    return cp(b_data, b_scale, a_data, a_scale, amax_b.reshape(1).astype(jnp.float32),
              amax_a.reshape(1).astype(jnp.float32))
