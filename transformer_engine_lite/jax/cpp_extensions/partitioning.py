"""Sharding rules of the primitives (`custom_partitioning`): each op runs on its local shards.

Two rule families cover every handler:
- `RowRule` for ops over rows of a token tensor (quantize, norms, activations, softmax, RoPE): the
  leading dims of the token arguments keep their sharding, the trailing `trailing` dims (the hidden
  / feature dims the kernel reduces or mixes over) are gathered, weights and scalars are replicated.
  Results that reduce over rows are combined across the mesh axes that shard the rows: `amax` with a
  max (or over the axes an op names: TE's all_reduce_max_along_all_axes_except_PP, AmaxScope),
  `sum` (dgamma, dbeta) with a sum (the norms: TE's all_reduce_sum_along_dp_fsdp_tpsp, `te_sum`).
- `GemmRule` for D = op(lhs) @ op(rhs): M dims follow lhs, N dims follow rhs, a sharded contracting
  dim is kept sharded on both sides and the partial products are summed (row-parallel TP; TE psums
  the GEMM output over the TP axis), with bias and GELU applied after the sum.

Both give Shardy a rule string built from the shapes, and GSPMD an `infer_sharding_from_operands`.
Both see the operands' shardings as NamedShardings of a named mesh (`named_shapes`), also when the
jit only knows its mesh from `jax.set_mesh`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.sharding_impls import parse_flatten_op_sharding
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["RowRule", "lowering_mesh", "mesh_axes_of", "named_shapes", "spec_of"]


def lowering_mesh():
    """The mesh active while an op is lowered (`with mesh:` or `jax.set_mesh`), or None."""
    from ..sharding import _active_mesh

    return _active_mesh()


def named_shapes(mesh, shapes, context=None):
    """(mesh, shapes) with every sharding a NamedSharding of a mesh with axis names.

    Under `jax.set_mesh` with sharding constraints on uncommitted inputs, jax gives the
    custom_partitioning rules an empty Mesh and GSPMDShardings (its lowering finds no abstract mesh
    in the context), and reading no spec from them would replicate every operand. The axis names
    then come from `context` (the mesh active when the op was lowered) and the devices from the
    shardings, as jax builds the mesh itself when it has one.
    """
    if context is None or not getattr(mesh, "empty", True):
        return mesh, shapes
    found = [getattr(s, "sharding", None) for s in shapes]
    found = [sh for sh in found if sh is not None and not isinstance(sh, NamedSharding)]
    if not found:
        return mesh, shapes
    devices = list(found[0]._device_assignment)
    sizes = tuple(context.axis_sizes)
    if len(devices) != math.prod(sizes):
        return mesh, shapes
    named = jax.sharding.Mesh(np.array(devices, dtype=object).reshape(sizes),
                              tuple(context.axis_names))
    out = []
    for s in shapes:
        sh = getattr(s, "sharding", None)
        if sh is not None and not isinstance(sh, NamedSharding):
            spec = parse_flatten_op_sharding(sh._to_xla_hlo_sharding(len(s.shape)), named)[0]
            sh = NamedSharding(named, P(*spec))
        out.append(jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh))
    return named, type(shapes)(out) if isinstance(shapes, (list, tuple)) else out


def spec_of(shape_with_sharding, ndim: int) -> list:
    """The PartitionSpec entries of an argument (padded to `ndim`), None where unknown."""
    sharding = getattr(shape_with_sharding, "sharding", None)
    spec = list(getattr(sharding, "spec", ()) or ())
    return (spec + [None] * ndim)[:ndim]


def mesh_axes_of(entries: Sequence[Any]) -> tuple[str, ...]:
    axes: list[str] = []
    for e in entries:
        if e is None:
            continue
        for a in (e if isinstance(e, tuple) else (e,)):
            if a not in axes:
                axes.append(a)
    return tuple(axes)


class _Names:
    def __init__(self) -> None:
        self.n = 0

    def fresh(self, k: int) -> list[str]:
        out = [f"f{self.n + i}" for i in range(k)]
        self.n += k
        return out


class RowRule:
    """Sharding of an op over rows (see the module docstring).

    arg_roles: per argument "x" (token tensor: leading dims = those of argument 0, trailing dims
        gathered), "row" (the leading dims only: mu, rsigma), "lead0" (dim 0 follows argument 0's
        dim 0 when the sizes agree: a softmax mask [b or 1, 1, sq, sk]) or "rep" (replicated).
    result_roles: per result "x", "row", "rep", "amax" (max over the row axes), "sum" or "gather0"
        (computed per shard, then all-gathered along dim 0 over the row axes: MXFP8's column-wise
        scales [rows / 32, cols], a 32nd of the rows in uint8, rather than gathering the rows).
    row_block: the rows (dim 0 of a 2-D argument 0) stay sharded only when every shard holds a
        multiple of it (MXFP8's 32-row column-wise blocks must not straddle shards).
    trailing: how many trailing dims of argument 0 are gathered.
    gather: with trailing=0 (element-wise ops), dims of argument 0 (negative) gathered anyway; an
        "x" tensor one dim shorter or longer than argument 0 lacks / has an extra dim -2 (gated
        activations: [..., 2, I] in, [..., I] out, the pair dim gathered, I kept sharded).
    f32_args: arguments cast to float32 on a sharded run (the weight whose dtype the "sum" results
        take: gamma of a norm backward), so that each shard's partial sum is float32 and is
        rounded once, to the result's dtype, before the all-reduce.
    te_sum: the "sum" results are all-reduced as TE-JAX's norm backward does
        (all_reduce_sum_along_dp_fsdp_tpsp): in the result's (parameter) dtype, over the mesh's
        dp, fsdp and tpsp resources as well as the axes sharding the rows, so a TE user sees TE's
        collective (one all-reduce of [H] in the parameter dtype) also where x is replicated
        over such an axis. There only the copy at index 0 of the axis contributes (the others add
        zeros): summing the replicas as TE does would count the gradient once per replica.
    amax_axes: `(params, resource, mesh, x_spec) -> axes` for the "amax" results, in place of the
        row axes (TE's per-recipe amax reductions: all axes but pp for delayed scaling, the
        AmaxScope of current scaling); resource is the MeshResource active at lowering or None.
    """

    def __init__(self, arg_roles: Sequence[str], result_roles: Sequence[str], trailing: int = 1,
                 f32_args: Sequence[int] = (), gather: Sequence[int] = (), row_block: int = 1,
                 te_sum: bool = False, amax_axes=None):
        self.te_sum = te_sum
        self.amax_axes = amax_axes
        self.gather = tuple(gather)
        self.row_block = row_block
        self.arg_roles = tuple(arg_roles)
        self.result_roles = tuple(result_roles)
        self.trailing = trailing
        self.f32_args = tuple(f32_args)

    # -- the shardings
    def _lead(self, x_shape) -> list:
        nd = len(x_shape.shape)
        spec = spec_of(x_shape, nd)
        for d in self.gather:
            spec[d] = None
        return spec[: max(nd - self.trailing, 0)]

    @staticmethod
    def _adjust(entries: list, nd: int, fill):
        """Entries of argument 0's full spec / factors for an element-wise tensor of rank nd."""
        if nd == len(entries) - 1 and len(entries) >= 2:
            return entries[:-2] + entries[-1:]
        if nd == len(entries) + 1 and entries:
            return entries[:-1] + [fill()] + entries[-1:]
        return None

    def _spec_for(self, role: str, shape, lead: list, lead0_size: int | None) -> P:
        nd = len(shape)
        if 0 in shape:  # an empty placeholder (a copy not requested): nothing to shard
            role = "rep"
        if role == "x" and self.trailing == 0 and nd != len(lead):
            adj = self._adjust(list(lead), nd, lambda: None)
            if adj is not None:
                return P(*adj)
        if role in ("x", "row"):
            return P(*(lead + [None] * (nd - len(lead)))[:nd])
        if role == "lead0" and nd and lead and shape[0] == lead0_size and shape[0] != 1:
            return P(lead[0], *([None] * (nd - 1)))
        return P(*([None] * nd))

    def shardings(self, mesh, arg_shapes, result_shapes):
        lead = self._lead(arg_shapes[0])
        if self.row_block > 1 and lead:
            n = math.prod(mesh.shape[a] for a in mesh_axes_of(lead[:1]))
            if arg_shapes[0].shape[0] % (n * self.row_block):
                lead = [None] + lead[1:]
        size0 = arg_shapes[0].shape[0] if arg_shapes[0].shape else None
        args = [
            NamedSharding(mesh, self._spec_for(r, a.shape, lead, size0))
            for r, a in zip(self.arg_roles, arg_shapes)
        ]
        results = [
            NamedSharding(mesh, self._spec_for(r, s.shape, lead, size0))
            for r, s in zip(self.result_roles, result_shapes)
        ]
        return args, results, mesh_axes_of(lead)

    def rule(self, arg_types, result_types) -> str:
        """Shardy rule string: shared factors for the leading dims, fresh ones elsewhere."""
        names = _Names()
        x_nd = len(arg_types[0].shape)
        n_lead = max(x_nd - self.trailing, 0)
        lead = names.fresh(n_lead)
        size0 = arg_types[0].shape[0] if x_nd else None

        def factors(role: str, shape) -> str:
            nd = len(shape)
            adj = None
            if 0 in shape:  # empty placeholder: its own factors (replicated), as in _spec_for
                role = "rep"
            if role == "x" and self.trailing == 0 and nd != n_lead:
                adj = self._adjust(list(lead), nd, lambda: names.fresh(1)[0])
            if adj is not None:
                f = adj
            elif role in ("x", "row") and nd >= n_lead:
                f = lead + names.fresh(nd - n_lead)
            elif role == "lead0" and nd and n_lead and shape[0] == size0 and shape[0] != 1:
                f = lead[:1] + names.fresh(nd - 1)
            else:
                f = names.fresh(nd)
            return " ".join(f) if f else ""

        lhs = ", ".join(factors(r, a.shape) for r, a in zip(self.arg_roles, arg_types))
        rhs = ", ".join(factors(r, s.shape) for r, s in zip(self.result_roles, result_types))
        return f"{lhs} -> {rhs}"

    # -- custom_partitioning
    def _sum_axes(self, resource, mesh, axes) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(axes the "sum" results are all-reduced over, those of them replicating x)."""
        if not self.te_sum or resource is None:
            return axes, ()
        te = [getattr(resource, f) for f in ("tpsp_resource", "dp_resource", "fsdp_resource")]
        extra = tuple(a for a in te if a is not None and a in mesh.axis_names and a not in axes)
        return tuple(axes) + extra, extra

    def wrap(self, op, params: dict, nargs: int):
        from ..sharding import _GLOBAL_MESH_RESOURCE

        def impl(*args):
            return op.ffi(*args, **params)

        cp = custom_partitioning(impl)
        context = lowering_mesh()
        # The MeshResource of the lowering's context: partition() may run after it is left.
        resource = _GLOBAL_MESH_RESOURCE[0]

        def infer(mesh, arg_shapes, result_shape):
            mesh, arg_shapes = named_shapes(mesh, arg_shapes, context)
            return tuple(self.shardings(mesh, arg_shapes, result_shape)[1])

        def partition(mesh, arg_shapes, result_shape):
            mesh, arg_shapes = named_shapes(mesh, arg_shapes, context)
            args, results, axes = self.shardings(mesh, arg_shapes, result_shape)
            sum_axes, replicated = self._sum_axes(resource, mesh, axes)
            amax_axes = axes
            if self.amax_axes is not None:
                amax_axes = tuple(self.amax_axes(params, resource, mesh,
                                                 spec_of(arg_shapes[0], len(arg_shapes[0].shape))))

            def lower(*local):
                if sum_axes and "sum" in self.result_roles:
                    local = [a.astype(jnp.float32) if i in self.f32_args else a
                             for i, a in enumerate(local)]
                outs = list(op.ffi(*local, **params))
                for i, role in enumerate(self.result_roles):
                    if amax_axes and role == "amax" and outs[i].size:
                        outs[i] = jax.lax.pmax(outs[i], amax_axes)
                    elif sum_axes and role == "sum":
                        # Rounded to the result's dtype before the all-reduce (TE's volume).
                        part = outs[i].astype(result_shape[i].dtype)
                        if replicated:
                            first = jnp.logical_and.reduce(jnp.stack(
                                [jax.lax.axis_index(a) == 0 for a in replicated]))
                            part = jnp.where(first, part, jnp.zeros_like(part))
                        outs[i] = jax.lax.psum(part, sum_axes)
                    elif axes and role == "gather0" and outs[i].size:
                        outs[i] = jax.lax.all_gather(outs[i], axes, axis=0, tiled=True)
                    outs[i] = outs[i].astype(result_shape[i].dtype)
                return tuple(outs)

            return mesh, lower, tuple(results), tuple(args)

        def rule(mesh, arg_types, result_types):
            return self.rule(arg_types, result_types)

        cp.def_partition(
            partition=partition, infer_sharding_from_operands=infer, sharding_rule=rule
        )
        return cp
