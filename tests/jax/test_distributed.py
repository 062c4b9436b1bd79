"""Sharded == unsharded for the JAX front end: primitives (custom_partitioning rules), the functional
API with its gradients under the three FP8 recipes, and a Flax module, on 8 (host) devices.

Run: XLA_FLAGS=--xla_force_host_platform_device_count=8 OMP_NUM_THREADS=1 \
         python -m pytest -q tests/jax/test_distributed.py
Each case runs one jitted function on unsharded inputs (one device) and on inputs placed on a mesh
with jax.device_put; FP8 bytes must be bit-identical, float results agree within TOLS (partial sums
are added in another order). The HLO checks count all-gathers: none for the norms, the DP GEMM and
DP dense (fwd + bwd), nor for dense sharded through TE's logical axes under a mesh context.
The GEMM cases run one oneDNN matmul per device at once: they rely on the core creating its cached
primitives with a user scratchpad (common/gemm/gemm_onednn_cpu.cpp).
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
from transformer_engine_lite.jax import sharding as te_sh
from transformer_engine_lite.jax.quantize import QuantizerFactory

# (atol, rtol) of a sharded result against the unsharded one, by dtype. FP8 and integer results
# must be bit-identical.
TOLS = {"float32": (1e-5, 1e-5), "bfloat16": (1.6e-2, 1.6e-2), "float16": (2e-3, 2e-3)}
F32, BF16, E4M3 = jnp.float32, jnp.bfloat16, jnp.float8_e4m3fn
RECIPES = {"bf16": None, "delayed": te_recipe.DelayedScaling,
           "current": te_recipe.Float8CurrentScaling, "mxfp8": te_recipe.MXFP8BlockScaling}
MESHES = {"dp": ((8,), ("dp",)), "tp": ((8,), ("tp",)), "dp_tp": ((2, 4), ("dp", "tp"))}


def mesh_of(name):
    shape, axes = MESHES[name]
    return jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(axes))


def put(mesh, x, spec):
    """x placed on `mesh` with PartitionSpec `spec` (axes the mesh lacks are dropped)."""
    spec = tuple(s if s in mesh.axis_names else None for s in spec)
    return jax.device_put(x, NamedSharding(mesh, P(*spec)))


def rand(key, shape, dtype=F32, scale=1.0):
    return (scale * jax.random.normal(jax.random.PRNGKey(key), shape, F32)).astype(dtype)


def assert_same(out, ref, what="", summed=None, shards=1):
    """FP8 / integer leaves bit-identical, float leaves within TOLS.

    summed(path) marks the norm weight gradients (dgamma / dbeta) of a step whose rows are split
    over `shards` devices: each shard's float32 partial sum is rounded to the parameter dtype
    before the all-reduce (TE-JAX's rule and volume), so a bf16 / fp16 result carries up to one
    rounding per shard that the unsharded kernel does not (partials are of the order of the
    largest element, more under cancellation): atol widens by `shards` units in the last place of
    the largest reference element."""
    lo = jax.tree_util.tree_leaves_with_path(out)
    lr = jax.tree.leaves(ref)
    assert len(lo) == len(lr), f"{what}: {len(lo)} leaves, expected {len(lr)}"
    for i, ((path, o), r) in enumerate(zip(lo, lr)):
        o, r = np.asarray(o), np.asarray(r)
        name = f"{what}[{i}] {r.dtype} {r.shape}"
        assert o.shape == r.shape and o.dtype == r.dtype, f"{name}: got {o.dtype} {o.shape}"
        if r.dtype.name in TOLS:
            atol, rtol = TOLS[r.dtype.name]
            if summed is not None and summed(jax.tree_util.keystr(path)) and r.itemsize < 4:
                ulp = 2.0 ** -jnp.finfo(r.dtype).nmant * np.abs(r.astype(np.float64)).max()
                atol = max(atol, shards * ulp)
            np.testing.assert_allclose(o.astype(np.float64), r.astype(np.float64), atol=atol,
                                       rtol=rtol, err_msg=name)
        else:  # FP8, integer, bool: the bytes
            np.testing.assert_array_equal(o.view(np.uint8), r.view(np.uint8), err_msg=name)


def check(fn, args, specs, mesh, what="", summed=None, shards=1):
    """fn(*args) jitted on one device vs on the inputs placed by `specs` (None: left as is)."""
    f = jax.jit(fn)
    ref = f(*args)
    sharded = [a if s is None else put(mesh, a, s) for a, s in zip(args, specs)]
    out = f(*sharded)
    assert_same(out, ref, what, summed, shards)
    return f, sharded


def all_gathers(f, args):
    """The all-gather ops (result shapes) in the compiled HLO of f(*args)."""
    hlo = f.lower(*args).compile().as_text()
    return re.findall(r"= (\S+) all-gather(?:-start)?\(", hlo)


# ----------------------------------------------------------------------------- primitives
ROWS = [("dp", ("dp",)), ("dp_tp", ("dp", "tp"))]  # x [b, s, h] sharded on batch / batch x seq


@pytest.mark.parametrize("mesh_name,spec", ROWS)
def test_quantize_amax(mesh_name, spec):
    mesh = mesh_of(mesh_name)
    x = rand(0, (8, 16, 64), BF16).at[7, 13, 5].set(-50.0)  # the max sits in the last shard
    scale = jnp.full((1,), 2.0, F32)
    f, args = check(lambda x, s: (tex.quantize(x, s, E4M3), tex.calculate_amax(x)),
                    (x, scale), (spec, None), mesh, "quantize")
    (q, amax, _), amax2 = f(*args)
    assert float(amax[0]) == 50.0 and float(amax2[0]) == 50.0  # the global max
    assert q.sharding.spec == P(*spec)  # stays sharded


def _norm_case(norm, fp8):
    def fn(x, gamma, beta, dz):
        kw = {"out_dtype": E4M3, "scale": jnp.full((1,), 4.0, F32)} if fp8 else {}
        if norm == "layernorm":
            z, mu, rs, amax, si = tex.layernorm_fwd(x, gamma, beta, 1e-6, **kw)
            return (z, mu, rs, amax, si), tex.layernorm_bwd(dz, x, mu, rs, gamma)
        z, rs, amax, si = tex.rmsnorm_fwd(x, gamma, 1e-6, **kw)
        return (z, rs, amax, si), tex.rmsnorm_bwd(dz, x, rs, gamma)
    return fn


@pytest.mark.parametrize("mesh_name,spec", ROWS)
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_norm(mesh_name, spec, norm, fp8):
    mesh = mesh_of(mesh_name)
    x = rand(1, (8, 16, 64), BF16).at[0, 3].mul(30.0)
    gamma, beta = rand(2, (64,), BF16, 0.5) + 1, rand(3, (64,), BF16, 0.1)
    dz = rand(4, (8, 16, 64), BF16)
    # results: the forward's, then (dx, dgamma[, dbeta]): paths "[1][1]" and "[1][2]"
    shards = int(np.prod([mesh.shape[a] for a in spec]))
    f, args = check(_norm_case(norm, fp8), (x, gamma, beta, dz), (spec, None, None, spec), mesh,
                    norm, lambda path: path in ("[1][1]", "[1][2]"), shards)
    if mesh_name == "dp" and not fp8:
        gathers = all_gathers(f, args)
        assert not gathers, f"{norm} fwd+bwd on P('dp'): all-gathers {gathers}"


@pytest.mark.parametrize("act", [("gelu",), ("gelu", "linear"), ("silu", "linear")])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_activation(act, fp8):
    mesh = mesh_of("dp_tp")
    shape = (8, 16, 2, 64) if tex.is_gated(act) else (8, 16, 64)
    out_shape = shape[:-2] + shape[-1:] if tex.is_gated(act) else shape
    x, g = rand(5, shape, BF16, 2.0), rand(6, out_shape, BF16)

    def fn(x, g):
        kw = {"out_dtype": E4M3, "scale": jnp.full((1,), 8.0, F32)} if fp8 else {}
        return tex.act_lu(x, act, **kw), tex.dact_lu(g, x, act)

    check(fn, (x, g), (("dp", "tp"), ("dp", "tp")), mesh, str(act))


@pytest.mark.parametrize("masked", ["none", "mask_b", "mask_1"])
def test_softmax(masked):
    mesh = mesh_of("dp_tp")
    x, dy = rand(7, (4, 8, 16, 32), BF16, 3.0), rand(8, (4, 8, 16, 32), BF16)
    mb = 4 if masked == "mask_b" else 1
    mask = jax.random.bernoulli(jax.random.PRNGKey(9), 0.3, (mb, 1, 16, 32)).astype(jnp.uint8)

    def fn(x, mask, dy):
        y = (tex.scaled_softmax_fwd(x, 0.5) if masked == "none"
             else tex.scaled_masked_softmax_fwd(x, mask, 0.5))
        return y, tex.scaled_softmax_bwd(dy, y, x, 0.5)

    mspec = ("dp",) if masked == "mask_b" else None
    check(fn, (x, mask, dy), (("dp", "tp"), mspec, ("dp", "tp")), mesh, "softmax")


@pytest.mark.parametrize("kind", ["SCALED", "SCALED_MASKED", "SCALED_UPPER_TRIANG_MASKED"])
def test_softmax_head_sharded_no_gather(kind):
    """TE-JAX's softmax on [b, h, sq, sk] sharded over batch and heads: fwd + bwd equal the
    unsharded run bit for bit and run on local shards (no all-gather). The causal variant used to
    fold [b, h] into one dim, which made XLA gather head-sharded inputs."""
    from transformer_engine_lite.jax.softmax import SoftmaxFusionType, softmax

    mesh = mesh_of("dp_tp")
    x, dy = rand(10, (4, 8, 16, 16), BF16, 3.0), rand(11, (4, 8, 16, 16), BF16)
    mask = jax.random.bernoulli(jax.random.PRNGKey(12), 0.3, (4, 1, 16, 16)).astype(jnp.uint8)
    ftype = SoftmaxFusionType[kind]

    def loss(x, mask, dy):
        m = mask if ftype is SoftmaxFusionType.SCALED_MASKED else None
        return jnp.sum(softmax(x, m, 0.5, ftype).astype(jnp.float32) * dy.astype(jnp.float32))

    grad = jax.value_and_grad(loss)
    want = jax.jit(grad)(x, mask, dy)
    xs = NamedSharding(mesh, P("dp", "tp", None, None))
    ms = NamedSharding(mesh, P("dp", None, None, None))
    f = jax.jit(grad, in_shardings=(xs, ms, xs))
    args = (jax.device_put(x, xs), jax.device_put(mask, ms), jax.device_put(dy, xs))
    got = f(*args)
    np.testing.assert_array_equal(np.asarray(got[1], np.float32), np.asarray(want[1], np.float32))
    gathers = all_gathers(f, args)
    assert not gathers, f"softmax {kind} on P('dp', 'tp'): all-gathers {gathers}"


# lhs [T, K] . rhs [K, N]; the specs of lhs and rhs per layout
GEMMS = {
    "dp": ("dp", ("dp", None), (None, None)),
    "tp_col": ("tp", (None, None), (None, "tp")),
    "tp_row": ("tp", (None, "tp"), ("tp", None)),
    "dp_tp_col": ("dp_tp", ("dp", None), (None, "tp")),
    "dp_tp_row": ("dp_tp", ("dp", "tp"), ("tp", None)),
    "m_n_same_axis": ("tp", ("tp", None), (None, "tp")),  # one of them must be gathered
    "k_mismatch": ("dp_tp", (None, "dp"), ("tp", None)),  # K sharded differently: gathered
}


@pytest.mark.parametrize("layout", list(GEMMS))
@pytest.mark.parametrize("epilogue", ["plain", "bias_gelu"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_gemm(layout, epilogue, dtype):
    mesh_name, lspec, rspec = GEMMS[layout]
    mesh = mesh_of(mesh_name)
    lhs, rhs, bias = rand(10, (64, 128), BF16), rand(11, (128, 64), BF16, 0.1), rand(12, (64,), BF16)
    si = jnp.full((1,), 0.5, F32)

    def fn(lhs, rhs, bias):
        kw = {"bias": bias, "fuse_gelu": True} if epilogue == "bias_gelu" else {}
        if dtype == "fp8":
            lq, rq = (lhs * 2).astype(E4M3), (rhs * 2).astype(E4M3)
            return tex.gemm(lq, rq, ((1,), (0,)), si, si, out_dtype=BF16, **kw)
        return tex.gemm(lhs, rhs, ((1,), (0,)), **kw)

    f, args = check(fn, (lhs, rhs, bias), (lspec, rspec, None), mesh, layout)
    if layout == "dp" and epilogue == "plain":
        gathers = all_gathers(f, args)
        assert not gathers, f"DP GEMM: all-gathers {gathers}"


@pytest.mark.parametrize("mesh_name", ["dp", "dp_tp"])
def test_gemm_wgrad(mesh_name):
    """dk = x^T @ g contracting the dp-sharded token dim: partial products summed over dp."""
    mesh = mesh_of(mesh_name)
    x, g = rand(13, (8, 8, 64), BF16), rand(14, (8, 8, 96), BF16)
    fn = lambda x, g: tex.gemm(x, g, ((0, 1), (0, 1)), out_dtype=F32)
    f, args = check(fn, (x, g), (("dp",), ("dp", None, "tp")), mesh, "wgrad")
    assert f(*args).shape == (64, 96)


# ----------------------------------------------------------------------------- functional
FUNCS = ["dense", "layernorm_mlp"]
# spec per argument, per mesh layout (axes a mesh lacks are dropped by `put`)
X_SPEC = ("dp", None, None)
SPECS = {
    "dense": {"x": X_SPEC, "k": (None, "tp"), "b": ("tp",)},
    "layernorm_mlp": {"x": X_SPEC, "gamma": (), "beta": (), "k1": (None, None, "tp"),
                      "k2": ("tp", None), "b1": (None, "tp"), "b2": ()},
}


def _functional_args(name):
    x = rand(20, (8, 8, 64), BF16)
    if name == "dense":
        return {"x": x, "k": rand(21, (64, 128), BF16, 0.125), "b": rand(22, (128,), BF16, 0.1)}
    return {"x": x, "gamma": rand(23, (64,), BF16, 0.1) + 1, "beta": rand(24, (64,), BF16, 0.1),
            "k1": rand(25, (64, 2, 128), BF16, 0.125), "k2": rand(26, (128, 64), BF16, 0.09),
            "b1": rand(27, (2, 128), BF16, 0.1), "b2": rand(28, (64,), BF16, 0.1)}


def _functional_fn(name):
    cot = rand(29, (8, 8, 128 if name == "dense" else 64), F32)

    def loss(p, qsets):
        if name == "dense":
            out = te.dense(p["x"], p["k"], p["b"], quantizer_set=qsets[0])
        else:
            out = te.layernorm_mlp(p["x"], p["gamma"], p["beta"], [p["k1"], p["k2"]],
                                   [p["b1"], p["b2"]], activation_type=("gelu", "linear"),
                                   quantizer_sets=qsets)
        return jnp.sum(out.astype(F32) * cot), out

    return jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)


@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_functional(name, mesh_name, recipe):
    if recipe == "current":
        pytest.skip("TE-JAX's AmaxScope gives each dp / tp shard its own current-scaling scale, so "
                    "sharded != unsharded: test_distributed_amax_scope.py checks these layers "
                    "against the single-device layer run on each shard")
    mesh = mesh_of(mesh_name)
    resource = te.MeshResource(dp_resource="dp", tp_resource="tp")
    r = RECIPES[recipe]
    with te.autocast(r is not None, r() if r else None, mesh_resource=resource):
        qsets = QuantizerFactory.create_set(n_quantizer_sets=2)
        p = _functional_args(name)
        specs = SPECS[name]
        fn = _functional_fn(name)
        f = jax.jit(fn)
        ref = f(p, qsets)
        ps = {k: put(mesh, v, specs[k]) for k, v in p.items()}
        out = f(ps, qsets)
        new_qsets = out[1][1]
        assert_same(out, ref, f"{name} {recipe} on {mesh_name}",
                    lambda path: "'gamma'" in path or "'beta'" in path, mesh.shape.get("dp", 1))
        if recipe == "delayed":  # the new fp8_metas: amax reduced across the mesh
            leaves = [np.asarray(v) for v in jax.tree.leaves(new_qsets)]
            assert any(v.shape != (1,) and v.max() > 0 for v in leaves), "no amax recorded"
            for o, e in zip(leaves, jax.tree.leaves(ref[1][1])):
                np.testing.assert_array_equal(np.asarray(o), np.asarray(e))
        if mesh_name == "dp" and recipe == "bf16" and name == "dense":
            gathers = all_gathers(f, (ps, qsets))
            assert not gathers, f"DP dense fwd+bwd: all-gathers {gathers}"


@pytest.mark.filterwarnings("ignore:.*context manager has been deprecated:DeprecationWarning")
@pytest.mark.parametrize("context", ["set_mesh", "with_mesh"])
def test_logical_axes(context):
    """TE's usage: unsharded inputs, a mesh context and MeshResource; the logical axes shard x
    and the kernel, and the GEMM runs on local shards (no all-gather)."""
    mesh = mesh_of("dp_tp")
    x, k = rand(40, (8, 8, 64), BF16), rand(41, (64, 128), BF16, 0.125)
    axes = {"input_axes": (te_sh.BATCH_AXES, te_sh.SEQLEN_AXES, te_sh.HIDDEN_AXES),
            "kernel_axes": (te_sh.W_FSDP_AXES, te_sh.W_TP_AXES)}
    fn = lambda x, k: jax.value_and_grad(
        lambda x, k: jnp.sum(te.dense(x, k, **axes).astype(F32) ** 2), argnums=(0, 1))(x, k)
    ref = jax.jit(fn)(x, k)
    with (jax.set_mesh(mesh) if context == "set_mesh" else mesh), \
            te.autocast(False, mesh_resource=te.MeshResource(dp_resource="dp", tp_resource="tp")):
        assert te_sh.generate_pspec(axes["input_axes"]) == P("dp", None, None)
        f = jax.jit(fn)
        out = f(x, k)
        gathers = all_gathers(f, (x, k))
    assert_same(out, ref, context)
    assert out[1][1].sharding.spec == P(None, "tp"), out[1][1].sharding
    assert not gathers, f"dense under {context}: all-gathers {gathers}"


# ----------------------------------------------------------------------------- Flax
@pytest.mark.parametrize("recipe", ["bf16", "delayed"])
def test_flax_layernorm_mlp(recipe):
    import flax.linen as nn

    import transformer_engine_lite.jax.flax as te_flax

    mesh = mesh_of("dp_tp")
    resource = te.MeshResource(dp_resource="dp", tp_resource="tp")
    r = RECIPES[recipe]
    layer = te_flax.LayerNormMLP(
        intermediate_dim=128, activations=("gelu", "linear"), use_bias=True, dtype=BF16,
        kernel_axes_1=(te_sh.W_FSDP_AXES, te_sh.W_JOINED_AXES, te_sh.W_TP_AXES),
        kernel_axes_2=(te_sh.W_TP_AXES, te_sh.W_FSDP_AXES),
        bias_axes_1=(te_sh.W_JOINED_AXES, te_sh.W_TP_AXES), bias_axes_2=(te_sh.W_NO_SHARD_AXES,),
        scale_axes=(te_sh.W_NO_SHARD_AXES,), ln_bias_axes=(te_sh.W_NO_SHARD_AXES,),
        layernorm_input_axes=(te_sh.BATCH_AXES, te_sh.SEQLEN_AXES, te_sh.HIDDEN_AXES),
        dot_1_input_axes=(te_sh.BATCH_AXES, te_sh.SEQLEN_AXES, te_sh.HIDDEN_AXES),
        dot_2_input_axes=(te_sh.BATCH_AXES, te_sh.SEQLEN_AXES, te_sh.HIDDEN_TP_AXES))
    x = rand(30, (8, 8, 64), BF16)
    cot = rand(31, (8, 8, 64), F32)

    def step(variables, x):
        def loss(v):
            out, _ = layer.apply(v, x)
            return jnp.sum(out.astype(F32) * cot)
        return jax.value_and_grad(loss)(variables)

    def run(sharded):
        with te.autocast(r is not None, r() if r else None, mesh_resource=resource):
            if not sharded:
                v = jax.jit(layer.init)(jax.random.PRNGKey(0), x)
                return v, jax.jit(step)(v, x)
            with jax.set_mesh(mesh):
                rules = te_flax.extend_logical_axis_rules(())
                with nn.logical_axis_rules(rules):
                    abstract = jax.eval_shape(layer.init, jax.random.PRNGKey(0), x)
                    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract),
                                                            mesh, rules)
                    xs = put(mesh, x, ("dp",))
                    v = jax.jit(layer.init, out_shardings=shardings)(jax.random.PRNGKey(0), xs)
                    return v, jax.jit(step)(v, xs)

    v_ref, out_ref = run(False)
    v, out = run(True)
    assert_same(v, v_ref, "init")
    wi = v["params"]["wi_kernel"]
    assert getattr(wi, "value", wi).sharding.spec == P(None, None, "tp"), "wi_kernel not TP-sharded"
    assert_same(out, out_ref, f"LayerNormMLP {recipe}",
                lambda path: "'scale'" in path or "'ln_bias'" in path, mesh.shape.get("dp", 1))


@pytest.mark.parametrize("act", [("gelu",), ("gelu", "linear")])
def test_tensor_parallel_mlp_stays_local(act):
    """Megatron-style TP MLP (kernel_1 column-parallel on I, kernel_2 row-parallel): forward and
    backward run on local shards, with no all-gather (only the row-parallel reductions)."""
    mesh = mesh_of("dp_tp")
    n = len(act)
    x = put(mesh, rand(1, (8, 16, 64), jnp.bfloat16), P("dp"))
    k1 = put(mesh, rand(2, (64, n, 128), jnp.bfloat16, 0.1), P(None, None, "tp"))
    k2 = put(mesh, rand(3, (128, 64), jnp.bfloat16, 0.1), P("tp", None))
    g, b = jnp.ones((64,), jnp.bfloat16), jnp.zeros((64,), jnp.bfloat16)

    def f(x, k1, k2):
        y = te.layernorm_mlp(x, g, b, [k1, k2], [None, None], activation_type=act)
        return jnp.sum(y.astype(F32) ** 2)

    gathers = all_gathers(jax.jit(jax.grad(f, (0, 1, 2))), (x, k1, k2))
    assert not gathers, f"TP MLP {act}: all-gathers {gathers}"
