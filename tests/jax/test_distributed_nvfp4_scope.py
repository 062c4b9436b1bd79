"""NVFP4 under TE-JAX's AmaxScope (issue #25), on 8 host devices.

TE-JAX takes NVFP4's per-tensor amax (and, with the random Hadamard transform, the column-wise
copy's post-RHT amax) before the quantize, max-reduced over the scope's mesh axes; each shard then
quantizes its own block with it (per-tensor scale S = 2688 / amax, E4M3 block scales, E2M1 codes).

- quantize on x [b, s, h] sharded P(fsdp, tpsp): every device's E2M1 codes, E4M3 block scales and
  amaxes (row-wise and column-wise copies; 1x16, 16x16 and 1x16 with the RHT) equal a NumPy /
  ml_dtypes oracle over that device's block with the amax of the blocks its scope spans (LOCAL:
  its own; TPSP: the tpsp row; FSDP: the fsdp column). The whole-tensor result differs (checked).
- Layers (dense, layernorm_dense, layernorm_mlp; fwd + bwd) under the NVFP4BlockScaling recipe,
  x's batch sharded over (dp, fsdp) and sequence over tpsp, kernels over fsdp, traced under the
  mesh: equal the single-device layer on each batch shard alone (TE-JAX's scopes: TPSP for x and
  the gradients, one amax per batch shard; FSDP for the kernels, the whole kernel's).
- A LOCAL scope on a shard that splits 16-element blocks is refused (gathering would scale
  elements with another shard's amax); a bad scope value stays a ValueError.

Run: XLA_FLAGS=--xla_force_host_platform_device_count=8 OMP_NUM_THREADS=1 \
         python -m pytest -q tests/jax/test_distributed_nvfp4_scope.py
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

jax = pytest.importorskip("jax")
from utils import require_host_devices  # noqa: E402

require_host_devices(8)

import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import transformer_engine_lite.jax as te
from scope_layers import KERNEL_SPECS, layer_grad, layer_params  # noqa: E402
from transformer_engine_lite.common import recipe as te_recipe
from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.quantize import QuantizerFactory, ScalingMode
from transformer_engine_lite.jax.quantize.hadamard import (get_sign_from_vector,
                                                           get_wgrad_sign_vector)

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*context manager has been deprecated:DeprecationWarning")

S = tex.AmaxScope
F32 = np.float32
FLT_MAX = np.finfo(np.float32).max
FACTOR = ((1.0, 3.0), (5.0, 11.0))  # block (fsdp i, tpsp j) scaled apart: every scope differs
SHAPE = (4, 32, 64)  # each device: [2, 16, 64], whole 16-blocks along s and h


def _mesh():
    devs = np.asarray(jax.devices()[:8]).reshape(2, 2, 2)
    res = te.MeshResource(dp_resource="dp", fsdp_resource="fsdp", tpsp_resource="tpsp")
    return Mesh(devs, ("dp", "fsdp", "tpsp")), res


def _x(key=1):
    x = np.array(jax.random.normal(jax.random.PRNGKey(key), SHAPE, jnp.float32))
    for i in range(2):
        for j in range(2):
            x[2 * i:2 * i + 2, 16 * j:16 * j + 16] *= FACTOR[i][j]
    return x.astype(ml_dtypes.bfloat16)


# --------------------------------------------------------------------------------- oracle
def _rht_np(t, mask, dtype):
    """t [C, R] (fp32) transformed along its rows in groups of 16: y_j = sum_i t_i / 4 * sign,
    sign = (-1) ** (bit i of mask + popcount(i & j)), fp32 summed in order, rounded to dtype."""
    i = np.arange(16)
    par = np.array([[bin(a & b).count("1") & 1 for b in i] for a in i])
    sign = np.where((((mask >> i) & 1)[:, None] ^ par) == 1, F32(-1), F32(1))
    g = t.reshape(t.shape[0], -1, 16).astype(F32) * F32(0.25)
    acc = np.zeros(g.shape, F32)
    for k in range(16):
        acc = acc + g[..., k:k + 1] * sign[k]
    return acc.reshape(t.shape).astype(dtype).astype(F32)


def _oracle(y, amax, two_d):
    """NVFP4 of y [R, C] (fp32 values) with per-tensor amax: (E2M1 codes, E4M3 scale bytes
    [R, C / 16]) by ml_dtypes' round-to-nearest-even casts."""
    with np.errstate(divide="ignore", over="ignore"):
        s = F32(2688.0) / F32(amax)
        s = FLT_MAX if not np.isfinite(s) else (F32(1.0) if s == 0 else s)
        dec = F32(1.0) / s
        mult = s * (F32(1.0) / F32(6.0))
        r, c = y.shape
        a = np.abs(y)
        if two_d:
            b = a.reshape(r // 16, 16, c // 16, 16).max(axis=(1, 3))
            b = np.repeat(b, 16, axis=0)
        else:
            b = a.reshape(r, c // 16, 16).max(axis=2)
        e4 = np.minimum(b * mult, F32(448.0)).astype(ml_dtypes.float8_e4m3fn)
        enc = F32(1.0) / (e4.astype(F32) * dec)
        enc = np.where(np.isfinite(enc), enc, FLT_MAX).astype(F32)
        v = np.clip(y * np.repeat(enc, 16, axis=1), F32(-6.0), F32(6.0))
    return v.astype(ml_dtypes.float4_e2m1fn).view(np.uint8), e4.view(np.uint8)


def _expected(x, scope, two_d, rht):
    """Per device block (i, j): the row-wise and column-wise oracle with the scope's amaxes, laid
    out as the global arrays (row [b, s, h], column-wise [h, b, s]); amaxes per (i, j)."""
    mask = get_sign_from_vector(get_wgrad_sign_vector())
    xs = np.asarray(x, F32)
    blk = {(i, j): xs[2 * i:2 * i + 2, 16 * j:16 * j + 16] for i in range(2) for j in range(2)}
    row_src = {k: v.reshape(32, 64) for k, v in blk.items()}
    col_src = {k: (_rht_np(v.T, mask, ml_dtypes.bfloat16) if rht else v.T)
               for k, v in row_src.items()}

    def amax(src, i, j):
        keys = [(a, b) for a in range(2) for b in range(2)
                if (scope is S.FSDP or a == i) and (scope is S.TPSP or b == j)]
        return F32(max(np.abs(src[k]).max() for k in keys))

    rc, rs = np.zeros(SHAPE, np.uint8), np.zeros((4, 32, 4), np.uint8)
    cc, cs = np.zeros((64, 4, 32), np.uint8), np.zeros((64, 4, 2), np.uint8)
    amaxes = {}
    for (i, j) in blk:
        ra, ca = amax(row_src, i, j), amax(col_src, i, j)
        amaxes[i, j] = (ra, ca)
        q, sc = _oracle(row_src[i, j], ra, two_d)
        bi, sj = slice(2 * i, 2 * i + 2), slice(16 * j, 16 * j + 16)
        rc[bi, sj], rs[bi, sj] = q.reshape(2, 16, 64), sc.reshape(2, 16, 4)
        q, sc = _oracle(col_src[i, j], ca, two_d)
        cc[:, bi, sj], cs[:, bi, j:j + 1] = q.reshape(64, 2, 16), sc.reshape(64, 2, 1)
    return (rc, rs, cc, cs), amaxes


MODES = {"1d": (ScalingMode.NVFP4_1D_SCALING, False), "2d": (ScalingMode.NVFP4_2D_SCALING, False),
         "1d_rht": (ScalingMode.NVFP4_1D_SCALING, True)}


def _quantize(x, mesh, res, mode, rht, **kw):
    q = QuantizerFactory.create(scaling_mode=mode, q_dtype=jnp.float4_e2m1fn, use_rht=rht)

    def f(x):
        t = tex.quantize(x, q, **kw)
        r, c = t.rowwise_tensor, t.colwise_tensor
        return r.data, r.scale_inv, r.amax, c.data, c.scale_inv, c.amax

    with mesh, te.autocast(enabled=False, mesh_resource=res):
        return jax.jit(f)(jax.device_put(jnp.asarray(x), NamedSharding(mesh, P("fsdp", "tpsp"))))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("scope", ["default", "LOCAL", "TPSP", "FSDP"])
def test_quantize_scope_per_device(scope, mode):
    mesh, res = _mesh()
    sm, rht = MODES[mode]
    x = _x()
    kw = {} if scope == "default" else {"amax_scope": S[scope]}
    want_scope = S.LOCAL if scope == "default" else S[scope]
    got = _quantize(x, mesh, res, sm, rht, **kw)
    want, amaxes = _expected(x, want_scope, sm == ScalingMode.NVFP4_2D_SCALING, rht)
    where = {mesh.devices[d, i, j].id: (i, j) for d in range(2) for i in range(2)
             for j in range(2)}
    names = ("row codes", "row scales", "col codes", "col scales")
    for arr, w, name in zip((got[0], got[1], got[3], got[4]), want, names):
        for shard in arr.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data).view(np.uint8), w[shard.index],
                                          err_msg=f"{scope} {mode} {name} device "
                                                  f"{where[shard.device.id]}")
    for arr, k, name in ((got[2], 0, "row amax"), (got[5], 1, "col amax")):
        for shard in arr.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data),
                                          [amaxes[where[shard.device.id]][k]],
                                          err_msg=f"{scope} {mode} {name}")
    # the whole tensor's amax (unsharded) gives other bytes: the scope mattered
    whole = jax.jit(lambda x: tex.quantize(x, QuantizerFactory.create(
        scaling_mode=sm, q_dtype=jnp.float4_e2m1fn, use_rht=rht)).rowwise_tensor.data)(x)
    assert (np.asarray(whole).view(np.uint8) != want[0]).any()


def test_local_scope_refuses_split_blocks():
    """x's hidden dim split into 8-element shards under LOCAL: no gather with mixed amaxes."""
    mesh, res = _mesh()
    q = QuantizerFactory.create(scaling_mode=ScalingMode.NVFP4_1D_SCALING,
                                q_dtype=jnp.float4_e2m1fn)
    x = jnp.ones((4, 32, 16), jnp.bfloat16)
    with mesh, te.autocast(enabled=False, mesh_resource=res):
        xs = jax.device_put(x, NamedSharding(mesh, P(None, None, "tpsp")))
        # raised in the partitioner (XLA wraps it in a JaxRuntimeError), naming the problem
        with pytest.raises((NotImplementedError, jax.errors.JaxRuntimeError),
                           match="NotImplementedError.*not whole 16-element blocks.*LOCAL"):
            jax.jit(lambda x: tex.quantize(x, q, amax_scope=S.LOCAL).rowwise_tensor.data)(xs)
        # the whole tensor's amax (scope None, a layer's own use) may gather: same everywhere
        got = jax.jit(lambda x: tex.quantize(x, q, amax_scope=None).rowwise_tensor.data)(xs)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8),
                                  np.asarray(tex.quantize(x, q).rowwise_tensor.data).view(np.uint8))


def test_bad_scope_is_refused():
    q = QuantizerFactory.create(scaling_mode=ScalingMode.NVFP4_1D_SCALING,
                                q_dtype=jnp.float4_e2m1fn)
    with pytest.raises(ValueError, match="quantize: argument 'amax_scope': expected an AmaxScope"):
        tex.quantize(jnp.ones((32, 32)), q, amax_scope="TPSP")


# ------------------------------------------------------------------------------------ layers
@pytest.mark.parametrize("name", ["dense", "layernorm_dense", "layernorm_mlp"])
def test_layer_scopes_nvfp4(name):
    """x [8, 32, 64]: batch over (dp, fsdp) (4 shards of 2), sequence over tpsp (16 each): the
    layer under NVFP4BlockScaling equals the single-device layer on each batch shard alone."""
    mesh, res = _mesh()
    shape = (8, 32, 64)
    x = jax.random.normal(jax.random.PRNGKey(3), shape, jnp.float32)
    x = x * jnp.repeat(2.0 ** jnp.arange(4, dtype=jnp.float32), 2).reshape(8, 1, 1)
    cot = jax.random.normal(jax.random.PRNGKey(4), shape, jnp.float32)
    p = layer_params(name, 64, 64)
    ref = layer_grad(name)
    with te.autocast(enabled=True, recipe=te_recipe.NVFP4BlockScaling(), mesh_resource=res):
        parts = [ref(p, x[2 * k:2 * k + 2], cot[2 * k:2 * k + 2]) for k in range(4)]
        whole = ref(p, x, cot)
        with mesh:
            ps = {k: jax.device_put(v, NamedSharding(mesh, KERNEL_SPECS.get(k, P())))
                  for k, v in p.items()}
            got = layer_grad(name)(ps, jax.device_put(
                x, NamedSharding(mesh, P(("dp", "fsdp"), "tpsp", None))), cot)
    (loss, out), (dp_, dx) = got
    want_out = jnp.concatenate([o[0][1] for o in parts], axis=0)
    want_dx = jnp.concatenate([o[1][1] for o in parts], axis=0)
    tol = dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), **tol, err_msg="output")
    np.testing.assert_allclose(np.asarray(dx), np.asarray(want_dx), **tol, err_msg="dx")
    np.testing.assert_allclose(float(loss), sum(float(o[0][0]) for o in parts), rtol=2e-5)
    for k in p:
        want = sum(np.asarray(o[1][0][k], np.float64) for o in parts)
        np.testing.assert_allclose(np.asarray(dp_[k]), want, rtol=1e-4,
                                   atol=1e-5 * np.abs(want).max(), err_msg=f"d{k}")
    assert np.abs(np.asarray(whole[0][1]) - np.asarray(want_out)).max() > 1e-3


def test_jit_traced_unsharded_then_reused_under_the_mesh():
    """A jit first traced without a mesh (the whole tensor's amax) and called again inside one is
    retraced there: the scope applies (per-device LOCAL amaxes)."""
    mesh, res = _mesh()
    x = _x()
    q = QuantizerFactory.create(scaling_mode=ScalingMode.NVFP4_1D_SCALING,
                                q_dtype=jnp.float4_e2m1fn)
    f = jax.jit(lambda x: tex.quantize(x, q, amax_scope=S.LOCAL).rowwise_tensor.amax)
    np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), [np.abs(np.asarray(x, F32)).max()])
    with mesh, te.autocast(enabled=False, mesh_resource=res):
        a = f(jax.device_put(jnp.asarray(x), NamedSharding(mesh, P("fsdp", "tpsp"))))
    _, amaxes = _expected(x, S.LOCAL, False, False)
    want = sorted({float(v[0]) for v in amaxes.values()})
    assert sorted({float(np.asarray(s.data)[0]) for s in a.addressable_shards}) == want


@pytest.mark.parametrize("custom_calls", [True, False], ids=["handler", "reference"])
def test_quantize_nvfp4_given_amax(custom_calls, monkeypatch):
    """The 2-D primitive with given amaxes (the handler's row_amax_in / col_amax_in, and the
    pure-JAX reference): scales from them, returned as given; a partial pair is refused."""
    if not custom_calls:
        monkeypatch.setenv("NVTE_JAX_CUSTOM_CALLS", "false")
    y = np.asarray(_x(), F32)[:2, :16].reshape(32, 64)
    yb = jnp.asarray(y.astype(ml_dtypes.bfloat16))
    ra, ca = np.float32(7 * np.abs(y).max()), np.float32(0.5 * np.abs(y).max())
    r, rs, a_r, c, cs, a_c = tex.quantize_nvfp4(yb, row_amax=jnp.asarray([ra]),
                                                col_amax=jnp.asarray([ca]))
    for packed, sc, amax, src, name in ((r, rs, a_r, y, "row"), (c, cs, a_c, y.T, "col")):
        q, s = _oracle(src, amax[0], False)
        codes = np.stack([np.asarray(packed) & 15, np.asarray(packed) >> 4], -1)
        np.testing.assert_array_equal(codes.reshape(q.shape), q, err_msg=name)
        np.testing.assert_array_equal(np.asarray(sc)[:s.shape[0], :s.shape[1]], s, err_msg=name)
    assert float(a_r[0]) == ra and float(a_c[0]) == ca
    with pytest.raises(ValueError, match="argument 'col_amax': expected float32 \\[1\\]"):
        tex.quantize_nvfp4(yb, row_amax=jnp.asarray([ra]))


@pytest.mark.parametrize("module", ["DenseGeneral", "LayerNormMLP"])
def test_flax_module_nvfp4_scopes(module):
    """A Flax module under NVFP4BlockScaling with transpose_batch_sequence ([s, b, h], batch over
    (dp, fsdp), sequence over tpsp; 16 rows a batch shard so the column-wise blocks stay whole):
    equals the single-device module run on each batch shard alone."""
    import transformer_engine_lite.jax.flax as te_flax

    mesh, res = _mesh()
    kw = {"DenseGeneral": dict(features=64),
          "LayerNormMLP": dict(intermediate_dim=64, activations=("gelu", "linear"))}[module]
    layer = getattr(te_flax, module)(transpose_batch_sequence=True, dtype=jnp.float32, **kw)
    x = jax.random.normal(jax.random.PRNGKey(9), (32, 64, 64), jnp.float32)
    x = x * jnp.repeat(2.0 ** jnp.arange(4, dtype=jnp.float32), 16).reshape(1, 64, 1)

    def fwd(v, x):  # the "sr_rng" stream feeds the gradients' stochastic rounding only
        out = layer.apply(v, x, rngs={"sr_rng": jax.random.PRNGKey(1)})
        return out[0] if isinstance(out, tuple) else out

    with te.autocast(enabled=True, recipe=te_recipe.NVFP4BlockScaling(), mesh_resource=res):
        v = layer.init({"params": jax.random.PRNGKey(0), "sr_rng": jax.random.PRNGKey(1)}, x)
        want = jnp.concatenate([jax.jit(fwd)(v, x[:, 16 * k:16 * k + 16]) for k in range(4)],
                               axis=1)
        with mesh:
            got = jax.jit(fwd)(v, jax.device_put(
                x, NamedSharding(mesh, P("tpsp", ("dp", "fsdp"), None))))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)
