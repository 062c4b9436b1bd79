"""MXFP8 quantize / dequantize on a mesh: the rows stay sharded (no all-gather of the tensor), the
bytes equal the unsharded call's. TE's test_distributed_layernorm.py counts the collectives of a
layernorm + MXFP8 quantizer step: before this rule the quantize gathered x (16 KiB on a [64, 64]
fp32 input); now only the loss and dgamma / dbeta are all-reduced, as TE's count says.

Run: XLA_FLAGS=--xla_force_host_platform_device_count=8 OMP_NUM_THREADS=1 \
         python -m pytest -q tests/jax/test_distributed_mxfp8.py
"""

from __future__ import annotations

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
from utils import require_host_devices  # noqa: E402

require_host_devices(8)

import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import transformer_engine_lite.jax as te
from transformer_engine_lite.common import recipe as te_recipe
from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.layernorm import layernorm
from transformer_engine_lite.jax.quantize import QuantizerFactory


def _mesh(n, name="dp"):
    return jax.make_mesh((n,), (name,), axis_types=(AxisType.Auto,), devices=jax.devices()[:n])


def _x(shape, dtype=jnp.float32):
    return (3.0 * jax.random.normal(jax.random.PRNGKey(7), shape, jnp.float32)).astype(dtype)


def _collectives(f, args):
    """{kind: [result shapes]} of the all-reduces / all-gathers in f's compiled HLO."""
    hlo = f.lower(*args).compile().as_text()
    return {k: re.findall(rf"= (\S+|\([^)]*\)) {k}(?:-start)?\(", hlo)
            for k in ("all-gather", "all-reduce")}


def _bytes_equal(out, ref):
    for i, (o, r) in enumerate(zip(jax.tree.leaves(out), jax.tree.leaves(ref))):
        o, r = np.asarray(o), np.asarray(r)
        assert o.shape == r.shape and o.dtype == r.dtype, (i, o.shape, r.shape)
        np.testing.assert_array_equal(o.view(np.uint8), r.view(np.uint8), err_msg=f"leaf {i}")


@pytest.mark.parametrize("shape,n", [((64, 64), 2), ((256, 96), 8), ((4, 32, 64), 4)],
                         ids=["64x64-dp2", "256x96-dp8", "4x32x64-dp4"])
def test_quantize_keeps_rows_sharded(shape, n):
    """32 rows or more per shard: bytes as unsharded; only the uint8 column-wise scales (a 32nd of
    the rows) are gathered, never x."""
    f = jax.jit(lambda x: tex.quantize_mxfp8(x))
    x = _x(shape)
    ref = f(x)
    xs = jax.device_put(x, NamedSharding(_mesh(n), P("dp")))
    _bytes_equal(f(xs), ref)
    gathers = _collectives(f, (xs,))["all-gather"]
    assert all(g.startswith("u8[") for g in gathers), gathers


def test_quantize_short_shards_gather_the_rows():
    """16 rows per shard: a 32-row column-wise block would straddle two shards, so x is gathered
    (bytes still those of the unsharded call)."""
    f = jax.jit(lambda x: tex.quantize_mxfp8(x))
    x = _x((32, 64))
    xs = jax.device_put(x, NamedSharding(_mesh(2), P("dp")))
    _bytes_equal(f(xs), f(x))
    assert any(g.startswith("f32[32,64]") for g in _collectives(f, (xs,))["all-gather"])


@pytest.mark.parametrize("rowwise", [True, False], ids=["rowwise", "columnwise"])
def test_quantize_one_copy(rowwise):
    """Only one copy requested: the empty placeholder of the other is not sharded."""
    f = jax.jit(lambda x: tex.quantize_mxfp8(x, rowwise=rowwise, columnwise=not rowwise))
    x = _x((128, 64), jnp.bfloat16)
    xs = jax.device_put(x, NamedSharding(_mesh(2), P("dp")))
    _bytes_equal(f(xs), f(x))


def test_dequantize_rowwise_stays_sharded():
    q = jax.jit(lambda x: tex.quantize_mxfp8(x))
    x = _x((128, 64))
    rd, rs, cd, cs = q(x)
    f = jax.jit(lambda d, s: tex.dequantize_mxfp8(d, s))
    mesh = _mesh(4)
    args = (jax.device_put(rd, NamedSharding(mesh, P("dp"))),
            jax.device_put(rs, NamedSharding(mesh, P("dp"))))
    np.testing.assert_array_equal(np.asarray(f(*args)), np.asarray(f(rd, rs)))
    assert _collectives(f, args)["all-gather"] == []
    # the column-wise copy's scales index blocks of rows: gathered, still exact
    g = jax.jit(lambda d, s: tex.dequantize_mxfp8(d, s, columnwise=True))
    np.testing.assert_array_equal(
        np.asarray(g(jax.device_put(cd, NamedSharding(mesh, P("dp"))), cs)), np.asarray(g(cd, cs)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
def test_layernorm_mxfp8_step_collectives(dtype):
    """TE's test_distributed_layernorm step (mean of layernorm with an MXFP8 quantizer, fwd + bwd,
    x sharded on dp): no all-gather; the all-reduces carry the loss and dgamma / dbeta only."""
    mesh = _mesh(2)
    x, g = _x((64, 64), dtype), jnp.ones((64,), dtype)

    def loss(x, g, b):
        q = QuantizerFactory.create_set().x
        return jnp.mean(layernorm(x, g, b, "layernorm", False, 1e-6, quantizer=q))

    with jax.set_mesh(mesh), te.autocast(enabled=True, recipe=te_recipe.MXFP8BlockScaling(),
                                         mesh_resource=te.MeshResource(dp_resource="dp")):
        f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
        xs = jax.device_put(x, NamedSharding(mesh, P("dp", None)))
        gs = jax.device_put(g, NamedSharding(mesh, P(None)))
        got = _collectives(f, (xs, gs, gs))
        ref = f(x, g, g)
        out = f(xs, gs, gs)
    assert got["all-gather"] == []
    # dgamma / dbeta are all-reduced in the parameter dtype (TE's rule, partitioning.RowRule
    # te_sum); XLA:CPU widens a bf16 all-reduce to f32, so both dtypes show f32[64] here
    shapes = " ".join(got["all-reduce"])
    assert "f32[64]" in shapes and "f32[]" in shapes and "[64,64]" not in shapes, shapes
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        np.testing.assert_allclose(np.asarray(o, np.float64), np.asarray(r, np.float64),
                                   rtol=1e-2, atol=1e-2)
