"""Sharding: MeshResource (which mesh axis plays which role), TE's logical axis names, and helpers.

A single device needs none of this: with no mesh active, every constraint is a no-op. On a mesh
(`with mesh:` or `jax.set_mesh`), `global_shard_guard(MeshResource(dp_resource="dp", ...))` (or
`autocast(..., mesh_resource=...)`) says which mesh axis is data-parallel, tensor-parallel, FSDP...;
modules then constrain activations by TE's logical axis names, and the primitives' partition rules
(cpp_extensions/partitioning.py) keep every op on its local shard.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import jax
from jax.sharding import NamedSharding, PartitionSpec

__all__ = [
    "BATCH_AXES",
    "HEAD_AXES",
    "HIDDEN_AXES",
    "HIDDEN_TP_AXES",
    "JOINED_AXES",
    "SEQLEN_AXES",
    "SEQLEN_CP_AXES",
    "SEQLEN_TP_AXES",
    "W_FSDP_AXES",
    "W_JOINED_AXES",
    "W_NO_SHARD_AXES",
    "W_TP_AXES",
    "MeshResource",
    "all_reduce_max_along_all_axes_except_PP",
    "all_reduce_sum_along_dp_fsdp",
    "generate_pspec",
    "get_all_mesh_axes",
    "get_mesh_axis_rank",
    "get_mesh_axis_size",
    "get_sharding_map_logic_axis_to_mesh_axis",
    "global_mesh_resource",
    "global_shard_guard",
    "num_of_devices",
    "with_sharding_constraint",
    "with_sharding_constraint_by_logical_axes",
]

BATCH_AXES = "nvte_batch"
SEQLEN_AXES = "nvte_seqlen"
SEQLEN_TP_AXES = "nvte_seqlen_tp"
SEQLEN_CP_AXES = "nvte_seqlen_cp"
HEAD_AXES = "nvte_head"
HIDDEN_AXES = "nvte_hidden"
HIDDEN_TP_AXES = "nvte_hidden_tp"
JOINED_AXES = "nvte_joined"
W_NO_SHARD_AXES = "nvte_w_no_shard"
W_FSDP_AXES = "nvte_w_fsdp"
W_TP_AXES = "nvte_w_tp"
W_JOINED_AXES = "nvte_w_joined"


@dataclass
class MeshResource:
    """Mesh axis names (or None) of each parallelism (TE-JAX's 7 fields). As in TE, tp_resource
    and tpsp_resource may both be set (TE's own tests build MeshResource("dp", "cp", "tp")): the
    sharding rules then use tpsp_resource where its axis has more than one device, else
    tp_resource (see get_sharding_map_logic_axis_to_mesh_axis)."""

    dp_resource: str | None = None
    tp_resource: str | None = None
    tpsp_resource: str | None = None
    fsdp_resource: str | None = None
    pp_resource: str | None = None
    cp_resource: str | None = None
    ep_resource: str | None = None


_GLOBAL_MESH_RESOURCE: list = [None]


@contextmanager
def global_shard_guard(resource: MeshResource | None):
    previous = _GLOBAL_MESH_RESOURCE[0]
    _GLOBAL_MESH_RESOURCE[0] = resource
    try:
        yield
    finally:
        _GLOBAL_MESH_RESOURCE[0] = previous


def global_mesh_resource() -> MeshResource:
    r = _GLOBAL_MESH_RESOURCE[0]
    assert r is not None, ("global_mesh_resource: no MeshResource is set; use "
                           "global_shard_guard(MeshResource(...)) or autocast(mesh_resource=...)")
    return r


def _active_mesh():
    """The concrete mesh of `with mesh:` or `jax.set_mesh(mesh)`, else the abstract mesh (inside
    `jax.sharding.use_abstract_mesh`), else None."""
    try:  # private API (jax.sharding.get_mesh refuses to answer inside jit)
        from jax._src import mesh as mesh_lib

        for mesh in (mesh_lib.thread_resources.env.physical_mesh,  # `with mesh:`
                     mesh_lib.get_concrete_mesh()):  # jax.set_mesh
            if mesh is not None and not mesh.empty:
                return mesh
    except (ImportError, AttributeError):
        pass
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh is None or mesh.empty else mesh


def get_all_mesh_axes() -> tuple[str, ...]:
    mesh = _active_mesh()
    return tuple(mesh.axis_names) if mesh is not None else ()


def get_mesh_axis_size(axis, mesh=None) -> int:
    mesh = mesh or _active_mesh()
    return 1 if mesh is None or axis is None else int(mesh.shape[axis])


def get_mesh_axis_rank(axis, mesh=None):
    if axis is None or get_mesh_axis_size(axis, mesh) == 1:
        return 0
    return jax.lax.axis_index(axis)


def num_of_devices() -> int:
    return len(jax.devices())


def get_sharding_map_logic_axis_to_mesh_axis() -> dict:
    """TE's logical axis names -> mesh axes; {} when no mesh is active or no resource is set."""
    r = _GLOBAL_MESH_RESOURCE[0]
    if r is None or _active_mesh() is None:
        return {}
    # A resource counts as enabled when its axis spans more than one device (TE's rule), so an
    # fsdp / tpsp axis of size 1 leaves batch / heads to dp / tp.
    def enabled(axis):
        return axis is not None and axis in get_all_mesh_axes() and get_mesh_axis_size(axis) > 1

    tp = r.tpsp_resource if enabled(r.tpsp_resource) else r.tp_resource
    return {
        BATCH_AXES: r.fsdp_resource if enabled(r.fsdp_resource) else r.dp_resource,
        SEQLEN_AXES: None,
        SEQLEN_TP_AXES: r.tpsp_resource,
        SEQLEN_CP_AXES: r.cp_resource,
        HEAD_AXES: tp,
        HIDDEN_AXES: None,
        HIDDEN_TP_AXES: tp,
        JOINED_AXES: None,
        W_NO_SHARD_AXES: None,
        W_FSDP_AXES: r.fsdp_resource,
        W_TP_AXES: tp,
        W_JOINED_AXES: None,
    }


def generate_pspec(logical_axis_names) -> PartitionSpec:
    rules = get_sharding_map_logic_axis_to_mesh_axis()
    mesh_axes = get_all_mesh_axes()
    out = []
    for name in logical_axis_names:
        axis = rules.get(name, name if name in mesh_axes else None)
        out.append(axis if axis in mesh_axes else None)
    return PartitionSpec(*out)


def with_sharding_constraint(x, pspec: PartitionSpec | None):
    """jax.lax.with_sharding_constraint on the active mesh; a no-op without one."""
    mesh = _active_mesh()
    if pspec is None or mesh is None or all(p is None for p in pspec):
        return x
    if isinstance(mesh, jax.sharding.Mesh):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, pspec))
    return jax.lax.with_sharding_constraint(x, pspec)


def with_sharding_constraint_by_logical_axes(x, logical_axis_names):
    if not logical_axis_names or _active_mesh() is None:
        return x
    if len(logical_axis_names) != x.ndim:
        raise ValueError(f"with_sharding_constraint_by_logical_axes: logical_axis_names: expected "
                         f"{x.ndim} names for shape {tuple(x.shape)}, got {logical_axis_names}")
    return with_sharding_constraint(x, generate_pspec(logical_axis_names))


def _axes(*names):
    present = get_all_mesh_axes()
    return tuple(a for a in names if a is not None and a in present)


def all_reduce_sum_along_dp_fsdp(x, mesh=None):
    del mesh
    r = _GLOBAL_MESH_RESOURCE[0] or MeshResource()
    axes = _axes(r.dp_resource, r.fsdp_resource)
    return jax.lax.psum(x, axes) if axes else x


def all_reduce_max_along_all_axes_except_PP(x, mesh=None):
    del mesh
    r = _GLOBAL_MESH_RESOURCE[0] or MeshResource()
    axes = tuple(a for a in get_all_mesh_axes() if a != r.pp_resource)
    return jax.lax.pmax(x, axes) if axes else x
