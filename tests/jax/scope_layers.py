"""The TE-JAX layers the amax-scope suites run under a mesh (test_distributed_amax_scope.py,
test_distributed_nvfp4_scope.py): one loss-and-grad function per layer, its parameters with kernel
rows scaled apart per fsdp shard (so a per-shard, LOCAL, kernel scale would differ from a scoped
one), and the kernels' fsdp shardings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import transformer_engine_lite.jax as te
from transformer_engine_lite.jax.quantize import QuantizerFactory

KERNEL_SPECS = {"k": P("fsdp", None), "k1": P("fsdp", None, None), "k2": P("fsdp", None)}


def layer_grad(name: str, tbs: bool = False):  # noqa: ANN201
    """jit(value_and_grad) of loss(params, x, cot) = sum(layer(x) * cot) for one TE-JAX layer
    ('dense', 'layernorm_dense', 'layernorm_mlp') with transpose_batch_sequence=tbs."""
    def run(p, x):  # noqa: ANN001, ANN202
        qs = QuantizerFactory.create_set(n_quantizer_sets=2)
        if name == "dense":
            return te.dense(x, p["k"], p["b"], transpose_batch_sequence=tbs, quantizer_set=qs[0])
        if name == "layernorm_dense":
            return te.layernorm_dense(x, p["k"], p["gamma"], p["beta"], p["b"],
                                      transpose_batch_sequence=tbs, quantizer_set=qs[0])
        return te.layernorm_mlp(x, p["gamma"], p["beta"], [p["k1"], p["k2"]], [p["b1"], p["b2"]],
                                activation_type=("gelu", "linear"), transpose_batch_sequence=tbs,
                                quantizer_sets=qs)

    def loss(p, x, cot):  # noqa: ANN001, ANN202
        out = run(p, x)
        return jnp.sum(out * cot), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def layer_params(name: str, h: int, out: int) -> dict:
    """The layer's parameters for hidden size h (dense kernels [h, out]; the MLP's [h, 2, 64] and
    [64, h]), each kernel's second half of rows scaled by 6."""
    r = lambda k, s, sc: sc * jax.random.normal(jax.random.PRNGKey(k), s, jnp.float32)  # noqa: E731
    if name == "layernorm_mlp":
        k1 = r(11, (h, 2, 64), 0.2).at[h // 2:].mul(6.0)
        k2 = r(12, (64, h), 0.2).at[32:].mul(6.0)
        return {"gamma": r(13, (h,), 0.1) + 1, "beta": r(14, (h,), 0.1), "k1": k1, "k2": k2,
                "b1": r(15, (2, 64), 0.1), "b2": r(16, (h,), 0.1)}
    p = {"k": r(11, (h, out), 0.2).at[h // 2:].mul(6.0), "b": r(12, (out,), 0.1)}
    if name == "layernorm_dense":
        p.update(gamma=r(13, (h,), 0.1) + 1, beta=r(14, (h,), 0.1))
    return p
