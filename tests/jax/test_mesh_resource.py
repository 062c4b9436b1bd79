"""MeshResource as TE-JAX has it: tp_resource and tpsp_resource may both be set (TE's own
test_fused_attn.py builds MeshResource("dp", "cp", "tp")), and a resource shards only where its
mesh axis spans more than one device (tpsp over tp, fsdp over dp). Checked on abstract meshes, so
no devices are needed."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import AbstractMesh

from transformer_engine_lite.jax import sharding as S


def _rules(shape, names, resource):
    with jax.sharding.use_abstract_mesh(AbstractMesh(shape, names)), \
            S.global_shard_guard(resource):
        return S.get_sharding_map_logic_axis_to_mesh_axis()


def test_positional_fields_in_te_order():
    r = S.MeshResource("dp", "cp", "tp")  # TE's test: tp_resource="cp", tpsp_resource="tp"
    assert (r.dp_resource, r.tp_resource, r.tpsp_resource) == ("dp", "cp", "tp")


@pytest.mark.parametrize("tpsp_size, head_axis", [(2, "tpsp"), (1, "tp")])
def test_tpsp_over_tp_only_where_it_shards(tpsp_size, head_axis):
    rules = _rules((2, 2, tpsp_size), ("dp", "tp", "tpsp"),
                   S.MeshResource(dp_resource="dp", tp_resource="tp", tpsp_resource="tpsp"))
    for axis in (S.HEAD_AXES, S.HIDDEN_TP_AXES, S.W_TP_AXES):
        assert rules[axis] == head_axis
    assert rules[S.SEQLEN_TP_AXES] == "tpsp"


@pytest.mark.parametrize("fsdp_size, batch_axis", [(2, "fsdp"), (1, "dp")])
def test_fsdp_over_dp_only_where_it_shards(fsdp_size, batch_axis):
    rules = _rules((2, fsdp_size), ("dp", "fsdp"),
                   S.MeshResource(dp_resource="dp", fsdp_resource="fsdp"))
    assert rules[S.BATCH_AXES] == batch_axis
    assert rules[S.W_FSDP_AXES] == "fsdp"


def test_resource_missing_from_mesh_falls_back():
    resource = S.MeshResource("dp", "tp", "tpsp")  # no "tpsp" axis in the mesh
    assert _rules((2, 4), ("dp", "tp"), resource)[S.HEAD_AXES] == "tp"
    with jax.sharding.use_abstract_mesh(AbstractMesh((2, 4), ("dp", "tp"))), \
            S.global_shard_guard(resource):
        spec = S.generate_pspec((S.BATCH_AXES, S.SEQLEN_TP_AXES, S.HEAD_AXES))
    assert tuple(spec) == ("dp", None, "tp")
