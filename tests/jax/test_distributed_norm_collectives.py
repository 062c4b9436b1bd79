"""TE-JAX's collective pattern for the sharded LayerNorm / RMSNorm (issue #25, TE's
test_distributed_layernorm.py), on TE's four meshes over 8 host devices.

- Backward: dgamma / dbeta are all-reduced once, in the parameter dtype, over the mesh's dp, fsdp
  and tpsp resources (TE: all_reduce_sum_along_dp_fsdp_tpsp), also where x is replicated over one
  of them; the loss adds its 4-byte all-reduce when dp is set. Nothing else is communicated (TE's
  generate_collectives_count_ref), whatever the recipe.
- Forward: current scaling takes each shard's own amax (TE's AmaxScope.LOCAL default, no
  collective), so a shard's FP8 bytes are those of the unsharded call on its rows.
- Numerics: the gradients against a float64 reference. A bf16 dgamma is no longer bit-exact
  against the unsharded call: each shard's float32 partial sum is rounded to bf16 before the
  all-reduce (TE's communication volume), one more rounding per shard than the unsharded kernel.

XLA:CPU widens every bf16 all-reduce to f32 in its own pipeline (its AllReducePromotion pass, which
`--xla_disable_hlo_passes` does not turn off): the bf16 partial sums travel as f32 there, so the
compiled HLO counts 4 bytes per bf16 element. `_expected_bytes` applies that widening to TE's
formula; on GPUs the all-reduce stays bf16.

Run: XLA_FLAGS=--xla_force_host_platform_device_count=8 OMP_NUM_THREADS=1 \
         python -m pytest -q tests/jax/test_distributed_norm_collectives.py
"""

from __future__ import annotations

import contextlib
import re
from functools import reduce

import numpy as np
import pytest

jax = pytest.importorskip("jax")
from utils import require_host_devices  # noqa: E402

require_host_devices(8)

import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import transformer_engine_lite.jax as te
from transformer_engine_lite.common import recipe as te_recipe
from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.cpp_extensions.base import reference_mode
from transformer_engine_lite.jax.layernorm import layernorm
from transformer_engine_lite.jax.quantize import QuantizerFactory

from utils import assert_bytes_equal, tols

# TE's tests enter the mesh with `with mesh:` (deprecated by jax, still TE users' idiom)
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*context manager has been deprecated:DeprecationWarning")

# TE's distributed_test_base.generate_configs
MESHES = {
    "n8_dp2_fsdp2_tp2": ((2, 2, 2), ("dp", "fsdp", "tpsp"),
                         dict(dp_resource="dp", fsdp_resource="fsdp", tpsp_resource="tpsp")),
    "n4_dp2_tp2": ((2, 2), ("dp", "tpsp"), dict(dp_resource="dp", tpsp_resource="tpsp")),
    "n2_dp2_tp1": ((2,), ("dp",), dict(dp_resource="dp")),
    "n2_dp1_tp2": ((2,), ("tpsp",), dict(tpsp_resource="tpsp")),
}
RECIPES = {"none": None, "delayed": te_recipe.DelayedScaling,
           "current": te_recipe.Float8CurrentScaling, "mxfp8": te_recipe.MXFP8BlockScaling}
EPS = 1e-6


def _mesh(name):
    shape, axes, res = MESHES[name]
    n = int(np.prod(shape))
    return Mesh(np.asarray(jax.devices()[:n]).reshape(shape), axes), te.MeshResource(**res)


def _allreduce_bytes(f, args) -> tuple[int, list]:
    """(bytes, all-gathers) of the compiled HLO, counted as TE's assert_equal_collectives does."""
    hlo = f.lower(*args).compile().as_text()
    total = 0
    for shapes in re.findall(r"= (\S+|\([^)]*\)) all-reduce(?:-start)?\(", hlo):
        for dt, dims in re.findall(r"[a-z]+?(\d+)\[([0-9,]*)\]", shapes):
            n = reduce(lambda a, b: a * b, map(int, dims.split(",")), 1) if dims else 1
            total += int(dt) // 8 * n
    return total, re.findall(r"= (\S+) all-gather(?:-start)?\(", hlo)


def _expected_bytes(res, norm, h, dtype) -> int:
    """TE's generate_collectives_count_ref, with XLA:CPU's bf16 -> f32 all-reduce widening."""
    dp, tpsp = res.dp_resource is not None, res.tpsp_resource is not None
    itemsize = np.dtype(dtype).itemsize
    if np.dtype(dtype) == np.dtype(jnp.bfloat16) and jax.default_backend() == "cpu":
        itemsize = 4
    weights = (2 if norm == "layernorm" else 1) * h * itemsize
    return (4 if dp else 0) + weights if (dp or tpsp) else 0


def _ref_grads(x, gamma, w, norm, zero_centered):
    """float64 (dx, dgamma, dbeta) of sum(norm(x) * w)."""
    x, g, w = (np.asarray(a, np.float64) for a in (x, gamma, w))
    g = g + 1.0 if zero_centered else g
    n = x.shape[-1]
    if norm == "layernorm":
        xc = x - x.mean(-1, keepdims=True)
        rs = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + EPS)
    else:
        xc = x
        rs = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
    xhat = xc * rs
    dy = w * g
    proj = (dy * xhat).sum(-1, keepdims=True) / n
    dx = rs * (dy - xhat * proj - (dy.mean(-1, keepdims=True) if norm == "layernorm" else 0.0))
    return dx, (w * xhat).sum(0), w.sum(0)


def _step(norm, zero_centered, w):
    def loss(x, g, b):
        q = QuantizerFactory.create_set().x
        y = layernorm(x, g, b if norm == "layernorm" else None, norm, zero_centered, EPS,
                      quantizer=q)
        return jnp.sum(y.astype(jnp.float32) * w)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_norm_step_collectives_and_grads(mesh_name, norm, dtype, recipe):
    mesh, res = _mesh(mesh_name)
    h = 64
    x = (2.0 * jax.random.normal(jax.random.PRNGKey(1), (64, h), jnp.float32)).astype(dtype)
    gamma = (1.0 + 0.3 * jax.random.normal(jax.random.PRNGKey(2), (h,))).astype(dtype)
    beta = (0.1 * jax.random.normal(jax.random.PRNGKey(3), (h,))).astype(dtype)
    # weights making dgamma O(1), so the dtype's relative tolerance means something
    w = jax.random.normal(jax.random.PRNGKey(4), (64, h), jnp.float32)
    zero_centered = norm == "layernorm" and recipe == "current"
    rec = RECIPES[recipe]
    with mesh, te.autocast(enabled=rec is not None, recipe=rec() if rec else None,
                           mesh_resource=res):
        f = _step(norm, zero_centered, w)
        xs = jax.device_put(x, NamedSharding(mesh, P(res.dp_resource, None)))
        gs = jax.device_put(gamma, NamedSharding(mesh, P(None)))
        bs = jax.device_put(beta, NamedSharding(mesh, P(None)))
        got, gathers = _allreduce_bytes(f, (xs, gs, bs))
        _, (dx, dg, db) = f(xs, gs, bs)
    assert gathers == [], gathers
    assert got == _expected_bytes(res, norm, h, dtype), (got, mesh_name)
    # the backward takes dz (= w) in x's dtype, as TE's does: the reference starts from that dz
    rdx, rdg, rdb = _ref_grads(x, gamma, w.astype(dtype), norm, zero_centered)
    np.testing.assert_allclose(np.asarray(dx, np.float64), rdx, **tols(dtype))
    np.testing.assert_allclose(np.asarray(dg, np.float64), rdg, **tols(dtype))
    if norm == "layernorm":
        np.testing.assert_allclose(np.asarray(db, np.float64), rdb, **tols(dtype))


@pytest.mark.parametrize("mesh_name", ["n2_dp2_tp1", "n8_dp2_fsdp2_tp2"])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_current_scaling_amax_is_per_shard(mesh_name, norm):
    """AmaxScope.LOCAL: each dp shard quantizes with its own amax, so its FP8 bytes are those of
    the unsharded call on its rows alone (the rows of shard 1 are scaled 8x: different scales)."""
    mesh, res = _mesh(mesh_name)
    x = jax.random.normal(jax.random.PRNGKey(5), (64, 64), jnp.float32)
    x = x.at[32:].mul(8.0).at[40, 3].set(100.0)
    g, b = jnp.full((64,), 1.5), jnp.full((64,), 0.25)
    rec = te_recipe.Float8CurrentScaling()

    def fwd(x):
        q = QuantizerFactory.create_set().x
        out, _, _ = tex.layernorm_fwd(x, g, b, False, EPS, quantizer=q) if norm == "layernorm" \
            else (*tex.rmsnorm_fwd(x, g, False, EPS, quantizer=q), None)
        return getattr(out, "rowwise_tensor", out).data  # ScaledTensor2x: its row-wise copy

    with mesh, te.autocast(enabled=True, recipe=rec, mesh_resource=res):
        f = jax.jit(fwd)
        xs = jax.device_put(x, NamedSharding(mesh, P("dp", None)))
        got = f(xs)
        hlo = f.lower(xs).compile().as_text()
        halves = [f(x[:32]), f(x[32:])]
    assert "all-reduce" not in hlo
    assert_bytes_equal(got, jnp.concatenate(halves))


def _scoped(x_spec, scope, mesh, res, x, reference=False):
    f = jax.jit(lambda x: tex.calculate_amax(x, amax_scope=scope))
    mode = reference_mode() if reference else contextlib.nullcontext()
    with mode, mesh, te.autocast(enabled=False, mesh_resource=res):
        xs = jax.device_put(x, NamedSharding(mesh, P(*x_spec)))
        out = f(xs)
        n_ar = len(re.findall(r"all-reduce(?:-start)?\(", f.lower(xs).compile().as_text()))
    # a per-shard amax is declared replicated (TE's sharding): each device holds its own value
    per_device = {s.device.id: float(np.asarray(s.data)[0]) for s in out.addressable_shards}
    return per_device, n_ar


@pytest.mark.parametrize("reference", [False, True], ids=["handler", "reference"])
def test_amax_scopes(reference):
    """TE's AmaxScope rule on x [b, s, h] sharded P(fsdp, tpsp): LOCAL none, TPSP the max over
    tpsp (x's sequence dim is on it), FSDP over fsdp; None keeps the max over the whole tensor.
    The pure-JAX reference (NVTE_JAX_CUSTOM_CALLS off) follows the same rule."""
    mesh, res = _mesh("n8_dp2_fsdp2_tp2")
    x = jax.random.uniform(jax.random.PRNGKey(6), (4, 8, 16), minval=-1.0, maxval=1.0)
    # block (fsdp i, tpsp j) holds max 10 * (1 + 2 i + j)
    for i in range(2):
        for j in range(2):
            x = x.at[2 * i, 4 * j, 0].set(10.0 * (1 + 2 * i + j))
    devs = np.asarray(jax.devices()[:8]).reshape(2, 2, 2)
    where = {devs[d, i, j].id: (i, j) for d in range(2) for i in range(2) for j in range(2)}
    spec = ("fsdp", "tpsp", None)
    want = {
        tex.AmaxScope.LOCAL: lambda i, j: 10.0 * (1 + 2 * i + j),
        tex.AmaxScope.TPSP: lambda i, j: 10.0 * (2 + 2 * i),
        tex.AmaxScope.FSDP: lambda i, j: 10.0 * (3 + j),
        None: lambda i, j: 40.0,
    }
    for scope, fn in want.items():
        per_device, n_ar = _scoped(spec, scope, mesh, res, x, reference)
        assert per_device == {d: fn(*where[d]) for d in per_device}, scope
        if scope is not None or not reference:  # unscoped reference: XLA's own jnp.max
            assert n_ar == (0 if scope is tex.AmaxScope.LOCAL else 1), (scope, n_ar)
    # TPSP reduces only when the sequence dim (dim 1) is sharded over tpsp
    per_device, n_ar = _scoped(("fsdp", None, None), tex.AmaxScope.TPSP, mesh, res, x, reference)
    assert n_ar == 0 and sorted(set(per_device.values())) == [20.0, 40.0]
    # transpose_batch_sequence: the sequence dim is dim 0
    f = jax.jit(lambda x: tex.calculate_amax(x, tex.AmaxScope.TPSP, True))
    with mesh, te.autocast(enabled=False, mesh_resource=res):
        xs = jax.device_put(x, NamedSharding(mesh, P("tpsp", None, None)))
        hlo = f.lower(xs).compile().as_text()
    assert len(re.findall(r"all-reduce(?:-start)?\(", hlo)) == 1


def test_amax_scope_bad_value():
    with pytest.raises(ValueError, match="amax_scope.*AmaxScope"):
        tex.calculate_amax(jnp.ones((4, 4)), amax_scope="local")


def test_delayed_scaling_amax_over_all_axes():
    """A fused-FP8 (delayed scaling) norm's amax: the max over every mesh axis (TE's
    all_reduce_max_along_all_axes_except_PP), here the global max though x is sharded on dp only."""
    mesh, res = _mesh("n8_dp2_fsdp2_tp2")
    x = jax.random.normal(jax.random.PRNGKey(7), (64, 64), jnp.float32).at[50, 1].set(40.0)
    g, b = jnp.ones((64,)), jnp.zeros((64,))
    f = jax.jit(lambda x: tex.layernorm_fwd(x, g, b, EPS, False, jnp.float8_e4m3fn,
                                            jnp.ones((1,), jnp.float32))[3])
    with mesh, te.autocast(enabled=False, mesh_resource=res):
        xs = jax.device_put(x, NamedSharding(mesh, P("dp", None)))
        out = f(xs)
        hlo = f.lower(xs).compile().as_text()
    ref = f(x)
    assert {float(np.asarray(s.data)[0]) for s in out.addressable_shards} == {float(ref[0])}
    groups = re.findall(r"all-reduce(?:-start)?\(.*?replica_groups=\{\{([0-9,]+)\}\}", hlo)
    assert len(groups) == 1 and sorted(map(int, groups[0].split(","))) == list(range(8)), groups
