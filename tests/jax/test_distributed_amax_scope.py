"""TE-JAX's AmaxScope at every entry point that takes it (issue #25), on 8 host devices.

Current scaling takes its amax per shard and reduces it only over the scope's mesh axes: LOCAL
none, TPSP the tpsp resource when x's sequence dim (1, or 0 with transpose_batch_sequence) is
sharded over it, FSDP the fsdp resource. Each shard then quantizes with the scale of that amax.

- Entry points (quantize, quantize_dbias, act_lu, quantize_dact_dbias, layernorm_fwd,
  rmsnorm_fwd) on x [b, s, ...] sharded P(fsdp, tpsp): every device's FP8 bytes and scale_inv equal
  a numpy oracle: the amax of the shards the scope spans (numpy max over those blocks of the
  high-precision values), scale = 448 / amax in float32, bytes = float8_e4m3fn(x * scale) by
  ml_dtypes. With TE's defaults (LOCAL; rmsnorm_fwd TPSP) when no scope is given.
- Layers (dense, layernorm_dense, layernorm_mlp, fwd + bwd) use TE-JAX's scopes: TPSP for the
  GEMM inputs and gradients, FSDP for the kernels. On x sharded over (dp, fsdp) on batch and tpsp
  on sequence, with the kernels sharded over fsdp, that is one scale per batch shard for x and one
  for each kernel: the result equals the single-device layer run on each batch shard alone
  (outputs and x gradients concatenated, weight gradients summed). The batch shards are scaled
  apart so that any other scope gives other bytes (checked: the whole-tensor result differs).
- A value that is not an AmaxScope is refused, naming the argument.

Run: XLA_FLAGS=--xla_force_host_platform_device_count=8 OMP_NUM_THREADS=1 \
         python -m pytest -q tests/jax/test_distributed_amax_scope.py
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
from transformer_engine_lite.jax.quantize import QuantizerFactory

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*context manager has been deprecated:DeprecationWarning")

S = tex.AmaxScope
F32 = jnp.float32
E4M3_MAX = np.float32(448.0)
EPS = 1e-6
# block (fsdp i, tpsp j) of an entry point's input is scaled by FACTOR[i][j]: every scope gives
# other amaxes
FACTOR = ((1.0, 3.0), (5.0, 11.0))


def _mesh():
    devs = np.asarray(jax.devices()[:8]).reshape(2, 2, 2)
    res = te.MeshResource(dp_resource="dp", fsdp_resource="fsdp", tpsp_resource="tpsp")
    return Mesh(devs, ("dp", "fsdp", "tpsp")), res


def _blocks(x, tbs=False):
    """x [b, s, ...] (or [s, b, ...]) with block (fsdp i, tpsp j) scaled by FACTOR[i][j]."""
    x = np.array(x, np.float32)
    b_dim, s_dim = (1, 0) if tbs else (0, 1)
    nb, ns = x.shape[b_dim] // 2, x.shape[s_dim] // 2
    for i in range(2):
        for j in range(2):
            idx = [slice(None)] * x.ndim
            idx[b_dim], idx[s_dim] = slice(i * nb, (i + 1) * nb), slice(j * ns, (j + 1) * ns)
            x[tuple(idx)] *= FACTOR[i][j]
    return jnp.asarray(x)


def _scope_amax(y, scope, i, j):
    """numpy: the amax device (fsdp i, tpsp j) takes for y [b, s, ...] sharded P(fsdp, tpsp)."""
    y = np.abs(np.asarray(y, np.float32))
    nb, ns = y.shape[0] // 2, y.shape[1] // 2
    rows = slice(None) if scope is S.FSDP else slice(i * nb, (i + 1) * nb)
    cols = slice(None) if scope is S.TPSP else slice(j * ns, (j + 1) * ns)
    return np.float32(y[rows, cols].max())


def _oracle_bytes(y_block, amax):
    scale = E4M3_MAX / amax  # float32 (TE's compute_scale_from_amax, margin 0)
    q = (np.asarray(y_block, np.float32) * scale).astype(ml_dtypes.float8_e4m3fn)
    return q.view(np.uint8), np.float32(1.0) / scale


def _check_per_device(data, scale_inv, y, scope, mesh):
    """Every device's FP8 block and scale_inv against the oracle for y (high precision)."""
    where = {mesh.devices[d, i, j].id: (i, j) for d in range(2) for i in range(2)
             for j in range(2)}
    sinv = {s.device.id: np.asarray(s.data) for s in scale_inv.addressable_shards}
    y = np.asarray(y, np.float32)
    for shard in data.addressable_shards:
        i, j = where[shard.device.id]
        want, want_si = _oracle_bytes(y[shard.index], _scope_amax(y, scope, i, j))
        got = np.asarray(shard.data).view(np.uint8)
        np.testing.assert_array_equal(got, want, err_msg=f"{scope} device ({i}, {j}) bytes")
        np.testing.assert_array_equal(sinv[shard.device.id], [want_si],
                                      err_msg=f"{scope} device ({i}, {j}) scale_inv")


def _row(t):
    return getattr(t, "rowwise_tensor", t)  # ScaledTensor2x: its row-wise copy


# entry point -> (input shape, fn(x, quantizer, **scope kwargs) -> ScaledTensor, oracle input
# fn(x) -> the high-precision values it quantizes, through the unsharded call without quantizer)
def _ln(x, q, **kw):
    g, b = jnp.full(x.shape[-1:], 1.5, F32), jnp.full(x.shape[-1:], 0.25, F32)
    return tex.layernorm_fwd(x, g, b, False, EPS, quantizer=q, **kw)[0]


def _rms(x, q, **kw):
    return tex.rmsnorm_fwd(x, jnp.full(x.shape[-1:], 1.5, F32), False, EPS, quantizer=q, **kw)[0]


def _dz(x):
    return jnp.cos(x[..., 0, :])


ENTRIES = {
    "quantize": ((4, 8, 32), lambda x, q, **kw: tex.quantize(x, q, **kw), lambda x: x),
    "quantize_dbias": ((4, 8, 32), lambda x, q, **kw: tex.quantize_dbias(x, q, **kw)[0],
                       lambda x: x),
    "act_lu": ((4, 8, 1, 32), lambda x, q, **kw: tex.act_lu(x, ("gelu",), q, **kw),
               lambda x: tex.act_lu(x, ("gelu",), None).data),
    "quantize_dact_dbias": (
        (4, 8, 1, 32),
        lambda x, q, **kw: tex.quantize_dact_dbias(_dz(x), x, ("gelu",), True, q, **kw)[0],
        lambda x: tex.quantize_dact_dbias(_dz(x), x, ("gelu",), True, None)[0].data),
    "layernorm_fwd": ((4, 8, 32), _ln, lambda x: _ln(x, None).data),
    "rmsnorm_fwd": ((4, 8, 32), _rms, lambda x: _rms(x, None).data),
}
DEFAULT = {"rmsnorm_fwd": S.TPSP}  # TE's defaults: LOCAL everywhere but rmsnorm_fwd


@pytest.mark.parametrize("scope", ["default", "LOCAL", "TPSP", "FSDP"])
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_entry_point_scope(entry, scope):
    mesh, res = _mesh()
    shape, fn, hp = ENTRIES[entry]
    x = _blocks(jax.random.normal(jax.random.PRNGKey(1), shape, F32))
    kw = {} if scope == "default" else {"amax_scope": S[scope]}
    want_scope = DEFAULT.get(entry, S.LOCAL) if scope == "default" else S[scope]
    with mesh, te.autocast(enabled=True, recipe=te_recipe.Float8CurrentScaling(),
                           mesh_resource=res):
        q = QuantizerFactory.create_set().x
        y = jax.jit(hp)(x)  # unsharded: the values the entry point quantizes
        f = jax.jit(lambda x: (lambda t: (t.data, t.scale_inv))(_row(fn(x, q, **kw))))
        spec = P("fsdp", "tpsp", *([None] * (len(shape) - 2)))
        data, scale_inv = f(jax.device_put(x, NamedSharding(mesh, spec)))
    if entry == "quantize_dact_dbias":
        y = y.reshape(data.shape)
    _check_per_device(data, scale_inv, y, want_scope, mesh)


def test_act_lu_output_amax_follows_scope():
    """act_lu without a quantizer, output_amax_when_no_scaling=True: the returned amax is reduced
    over the scope's axes (TE-JAX's updated_amax)."""
    mesh, res = _mesh()
    x = _blocks(jax.random.normal(jax.random.PRNGKey(2), (4, 8, 1, 32), F32))
    y = np.asarray(tex.act_lu(x, ("gelu",), None).data)
    where = {mesh.devices[d, i, j].id: (i, j) for d in range(2) for i in range(2)
             for j in range(2)}
    for scope in S:
        f = jax.jit(lambda x: tex.act_lu(x, ("gelu",), None, amax_scope=scope,
                                         output_amax_when_no_scaling=True).amax)
        with mesh, te.autocast(enabled=False, mesh_resource=res):
            amax = f(jax.device_put(x, NamedSharding(mesh, P("fsdp", "tpsp", None, None))))
        got = {s.device.id: float(np.asarray(s.data)[0]) for s in amax.addressable_shards}
        assert got == {d: float(_scope_amax(y, scope, *where[d])) for d in got}, scope


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_bad_scope_is_refused(entry):
    shape, fn, _ = ENTRIES[entry]
    x = jnp.ones(shape, F32)
    with te.autocast(enabled=True, recipe=te_recipe.Float8CurrentScaling()):
        q = QuantizerFactory.create_set().x
        with pytest.raises(ValueError, match=f"{entry}: argument 'amax_scope': expected an "
                                             "AmaxScope.*got 'TPSP'"):
            fn(x, q, amax_scope="TPSP")


def test_primitive_quantize_refuses_a_scope():
    with pytest.raises(ValueError, match="amax_scope.*only taken with a Quantizer"):
        tex.quantize(jnp.ones((4, 4)), jnp.ones((1,), F32), jnp.float8_e4m3fn, S.TPSP)


# ------------------------------------------------------------------------------------ layers
@pytest.mark.parametrize("tbs", [False, True], ids=["bsh", "sbh"])
@pytest.mark.parametrize("name", ["dense", "layernorm_dense", "layernorm_mlp"])
def test_layer_scopes(name, tbs):
    """x's batch sharded over (dp, fsdp), its sequence over tpsp, kernels over fsdp: the layer
    equals the single-device layer on each of the 4 batch shards alone."""
    mesh, res = _mesh()
    b_dim = 1 if tbs else 0
    shape = (8, 8, 32)
    x = jax.random.normal(jax.random.PRNGKey(3), shape, F32)
    # batch shard k scaled by 2 ** k (exact): four different amaxes
    x = x * jnp.repeat(2.0 ** jnp.arange(4, dtype=F32), 2).reshape(
        (1, 8, 1) if tbs else (8, 1, 1))
    n_out = 32 if name == "layernorm_mlp" else 48
    cot = jax.random.normal(jax.random.PRNGKey(4), shape[:2] + (n_out,), F32)
    p = layer_params(name, 32, 48)
    ref = layer_grad(name, tbs)
    x_spec = P("tpsp", ("dp", "fsdp"), None) if tbs else P(("dp", "fsdp"), "tpsp", None)
    with te.autocast(enabled=True, recipe=te_recipe.Float8CurrentScaling(), mesh_resource=res):
        parts = [ref(p, jnp.take(x, jnp.arange(2 * k, 2 * k + 2), b_dim),
                     jnp.take(cot, jnp.arange(2 * k, 2 * k + 2), b_dim)) for k in range(4)]
        whole = ref(p, x, cot)
        with mesh:  # traced in the mesh context (TE's tests' idiom), a jit of its own
            ps = {k: jax.device_put(v, NamedSharding(mesh, KERNEL_SPECS.get(k, P())))
                  for k, v in p.items()}
            got = layer_grad(name, tbs)(ps, jax.device_put(x, NamedSharding(mesh, x_spec)), cot)
    (loss, out), (dp_, dx) = got
    want_out = jnp.concatenate([o[0][1] for o in parts], axis=b_dim)
    want_dx = jnp.concatenate([o[1][1] for o in parts], axis=b_dim)
    tol = dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), **tol, err_msg="output")
    np.testing.assert_allclose(np.asarray(dx), np.asarray(want_dx), **tol, err_msg="dx")
    np.testing.assert_allclose(float(loss), sum(float(o[0][0]) for o in parts), rtol=2e-5)
    for k in p:
        want = sum(np.asarray(o[1][0][k], np.float64) for o in parts)
        scale = np.abs(want).max()
        np.testing.assert_allclose(np.asarray(dp_[k]), want, rtol=1e-4, atol=1e-5 * scale,
                                   err_msg=f"d{k}")
    # the per-shard scales matter: one scale for the whole batch gives another output
    assert np.abs(np.asarray(whole[0][1]) - np.asarray(want_out)).max() > 1e-3


@pytest.mark.parametrize("mesh_shape", [(8, 1), (1, 8), (2, 4)], ids=["dp", "tp", "dp_tp"])
def test_dense_tensor_parallel_scopes(mesh_shape):
    """Column-parallel dense (kernel N sharded over tp, no fsdp resource): TE-JAX's FSDP scope then
    reduces the kernel's amax over nothing, so each tp shard quantizes its kernel columns with its
    own scale, and x / the gradient take one scale per dp shard (TPSP: no tpsp resource). The
    result equals the single-device dense run on each (dp shard, tp shard) block alone."""
    n_dp, n_tp = mesh_shape
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(mesh_shape), ("dp", "tp"))
    res = te.MeshResource(dp_resource="dp", tp_resource="tp")
    x = jax.random.normal(jax.random.PRNGKey(5), (8, 4, 32), F32)
    x = x * jnp.repeat(2.0 ** jnp.arange(n_dp, dtype=F32), 8 // n_dp).reshape(8, 1, 1)
    k = 0.2 * jax.random.normal(jax.random.PRNGKey(6), (32, 64), F32)
    k = k * jnp.repeat(1.5 ** jnp.arange(n_tp, dtype=F32), 64 // n_tp)
    b = 0.1 * jax.random.normal(jax.random.PRNGKey(7), (64,), F32)
    cot = jax.random.normal(jax.random.PRNGKey(8), (8, 4, 64), F32)
    p = {"k": k, "b": b}
    ref = layer_grad("dense", False)
    rb, cb = 8 // n_dp, 64 // n_tp
    with te.autocast(enabled=True, recipe=te_recipe.Float8CurrentScaling(), mesh_resource=res):
        parts = [[ref({"k": k[:, j * cb:(j + 1) * cb], "b": b[j * cb:(j + 1) * cb]},
                      x[i * rb:(i + 1) * rb], cot[i * rb:(i + 1) * rb, :, j * cb:(j + 1) * cb])
                  for j in range(n_tp)] for i in range(n_dp)]
        with mesh:
            ps = {"k": jax.device_put(k, NamedSharding(mesh, P(None, "tp"))),
                  "b": jax.device_put(b, NamedSharding(mesh, P("tp")))}
            got = layer_grad("dense", False)(ps, jax.device_put(x, NamedSharding(mesh, P("dp"))),
                                         cot)
    (loss, out), (dp_, dx) = got
    want_out = jnp.concatenate([jnp.concatenate([pt[0][1] for pt in row], axis=-1)
                                for row in parts], axis=0)
    want_dx = jnp.concatenate([sum(np.asarray(pt[1][1], np.float64) for pt in row)
                               for row in parts], axis=0)
    tol = dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), **tol, err_msg="output")
    np.testing.assert_allclose(np.asarray(dx), np.asarray(want_dx), rtol=1e-4, atol=1e-4,
                               err_msg="dx")
    np.testing.assert_allclose(float(loss), sum(float(pt[0][0]) for row in parts for pt in row),
                               rtol=2e-5)
    for name in ("k", "b"):
        want = np.concatenate([sum(np.asarray(parts[i][j][1][0][name], np.float64)
                                   for i in range(n_dp)) for j in range(n_tp)], axis=-1)
        np.testing.assert_allclose(np.asarray(dp_[name]), want, rtol=1e-4,
                                   atol=1e-5 * np.abs(want).max(), err_msg=f"d{name}")


@pytest.mark.parametrize("module", ["DenseGeneral", "LayerNormDenseGeneral", "LayerNormMLP"])
def test_flax_modules_pass_transpose_batch_sequence(module):
    """The Flax modules hand their transpose_batch_sequence to the layers, so TPSP finds the
    sequence dim of an [s, b, h] input: sharded, the module equals the single-device module run on
    each batch shard alone (with the flag dropped, TPSP would read dim 1, the batch, and take each
    (seq, batch) block's own amax)."""
    import transformer_engine_lite.jax.flax as te_flax

    mesh, res = _mesh()
    kw = {"DenseGeneral": dict(features=48), "LayerNormDenseGeneral": dict(features=48),
          "LayerNormMLP": dict(intermediate_dim=64, activations=("gelu", "linear"))}[module]
    layer = getattr(te_flax, module)(transpose_batch_sequence=True, dtype=F32, **kw)
    x = jax.random.normal(jax.random.PRNGKey(9), (8, 8, 32), F32)
    x = x * jnp.repeat(2.0 ** jnp.arange(4, dtype=F32), 2).reshape(1, 8, 1)
    x = x * jnp.repeat(jnp.asarray([1.0, 5.0], F32), 4).reshape(8, 1, 1)  # seq halves apart

    def fwd(v, x):
        out = layer.apply(v, x)
        return out[0] if isinstance(out, tuple) else out  # (out, ln_out) of the LayerNorm* ones

    with te.autocast(enabled=True, recipe=te_recipe.Float8CurrentScaling(), mesh_resource=res):
        v = layer.init(jax.random.PRNGKey(0), x)
        ref = jax.jit(fwd)
        want = jnp.concatenate([ref(v, x[:, 2 * k:2 * k + 2]) for k in range(4)], axis=1)
        with mesh:
            got = jax.jit(fwd)(v, jax.device_put(
                x, NamedSharding(mesh, P("tpsp", ("dp", "fsdp"), None))))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)
