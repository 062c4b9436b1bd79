"""LayerNormMLP with an activation tuple that has no fused kernel (TE's test_layer.py uses
mlp_activations=("relu", "relu")): as in TE, activation i runs on slice i of the first GEMM's
[..., n, mlp] output and the results are multiplied. Checked against a float64 reference built
from the module's own parameters."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_engine_lite.jax import flax as te_flax

NP_ACT = {"relu": lambda v: np.maximum(v, 0.0), "linear": lambda v: v,
          "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)), "tanh": np.tanh}


def _ref(x, p, acts, eps=1e-6):
    x = np.float64(x)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * np.float64(p["scale"]) + np.float64(p["ln_bias"])
    h = np.einsum("bh,hnm->bnm", y, np.float64(p["wi_kernel"]))
    a = np.ones_like(h[:, 0])
    for i, name in enumerate(acts):
        a = a * NP_ACT[name](h[:, i])
    return a @ np.float64(p["wo_kernel"])


@pytest.mark.parametrize("acts", [("relu", "relu"), ("tanh",), ("sigmoid", "relu", "linear")])
def test_composed_activations_match_reference(acts):
    mlp = te_flax.LayerNormMLP(intermediate_dim=16, activations=acts)
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 8), jnp.float32)
    variables = mlp.init(jax.random.PRNGKey(1), x, deterministic=True)
    p = nn.unbox(variables["params"])
    assert p["wi_kernel"].shape == (8, len(acts), 16)
    out, _ = mlp.apply(variables, x, deterministic=True)
    np.testing.assert_allclose(np.float64(out), _ref(x, p, acts), rtol=2e-5, atol=2e-5)


def test_linear_first_is_te_order():
    """("linear", "gelu") is TE's GEGLU (the tuple is reversed), the fused kind."""
    x = jnp.ones((2, 8), jnp.float32)
    a = te_flax.LayerNormMLP(intermediate_dim=16, activations=("linear", "gelu"))
    b = te_flax.LayerNormMLP(intermediate_dim=16, activations=("gelu", "linear"))
    va = a.init(jax.random.PRNGKey(1), x, deterministic=True)
    np.testing.assert_array_equal(a.apply(va, x, deterministic=True)[0],
                                  b.apply(va, x, deterministic=True)[0])


def test_unknown_activation_named():
    mlp = te_flax.LayerNormMLP(intermediate_dim=16, activations=("relu", "no_such_fn"))
    with pytest.raises(ValueError, match="'no_such_fn'"):
        mlp.init(jax.random.PRNGKey(1), jnp.ones((2, 8)), deterministic=True)


def test_activation_params_need_a_fused_kind():
    mlp = te_flax.LayerNormMLP(intermediate_dim=16, activations=("relu", "relu"),
                               activation_params={"limit": 7.0})
    with pytest.raises(ValueError, match="activation_params"):
        mlp.init(jax.random.PRNGKey(1), jnp.ones((2, 8)), deterministic=True)
