"""`AmaxScope`: over which mesh axes a current-scaling amax is taken (TE-JAX's enum and rule).

TE-JAX computes a current-scaling amax per shard and reduces it only as the scope says: LOCAL
keeps each shard's own amax (each shard then quantizes with its own scale), TPSP takes the max over
the tpsp resource when the sequence dim of the data is sharded over it, FSDP over the fsdp
resource. `axes` gives those mesh axes for the sharding rules (partitioning.RowRule.amax_axes).
"""

from __future__ import annotations

from enum import Enum

import jax

__all__ = ["AmaxScope", "check_amax_scope"]


class AmaxScope(Enum):
    LOCAL = 1
    TPSP = 2
    FSDP = 3

    def axes(self, resource, data_spec, transpose_batch_sequence=False) -> tuple[str, ...]:
        """The mesh axes the amax is max-reduced over for data sharded as `data_spec`."""
        if resource is None or self is AmaxScope.LOCAL:
            return ()
        if self is AmaxScope.TPSP:
            seq = 0 if transpose_batch_sequence else 1
            tpsp = resource.tpsp_resource
            on_seq = len(data_spec) > seq and data_spec[seq] == tpsp
            return (tpsp,) if tpsp is not None and on_seq else ()
        return (resource.fsdp_resource,) if resource.fsdp_resource is not None else ()

    def all_reduce_amax_along_TPSP_and_FSDP(self, amax, data_spec, transpose_batch_sequence, mesh):
        """TE-JAX's method: `amax` max-reduced over this scope's axes (inside a sharded body)."""
        from ..sharding import _GLOBAL_MESH_RESOURCE

        axes = tuple(a for a in self.axes(_GLOBAL_MESH_RESOURCE[0], data_spec,
                                           transpose_batch_sequence) if a in mesh.axis_names)
        return jax.lax.pmax(amax, axes) if axes else amax


def check_amax_scope(op: str, amax_scope, allow_none: bool = True):
    """`amax_scope` validated at trace time for entry point `op`: an AmaxScope (or None where our
    whole-tensor extension is taken). TE-JAX would fail only once sharded, deep in the partition
    rule (an AttributeError on the scope); we name the argument up front."""
    if isinstance(amax_scope, AmaxScope) or (allow_none and amax_scope is None):
        return amax_scope
    expected = "an AmaxScope (LOCAL, TPSP, FSDP)" + (" or None" if allow_none else "")
    raise ValueError(f"te_lite::{op}: argument 'amax_scope': expected {expected}, got "
                     f"{amax_scope!r}")
