"""The JAX and PyTorch front ends agree bit for bit: FP8 bytes of the same input and scale, and the
delayed-scaling state (amax history, scale) of a GEMM after several training steps on the same data
(te.pytorch.Linear vs te.dense / te_flax.DenseGeneral). Skipped without the PyTorch front end."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from utils import FP8, assert_bytes_equal

import transformer_engine_lite.jax as te
from transformer_engine_lite.common import recipe
from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.quantize import QuantizerFactory

torch = pytest.importorskip("torch")
te_torch = pytest.importorskip("transformer_engine_lite.pytorch")

TORCH_FP8 = {np.dtype(jnp.float8_e4m3fn): torch.float8_e4m3fn,
             np.dtype(jnp.float8_e5m2): torch.float8_e5m2,
             np.dtype(jnp.float8_e4m3fnuz): torch.float8_e4m3fnuz,
             np.dtype(jnp.float8_e5m2fnuz): torch.float8_e5m2fnuz}


def _t(x):
    return torch.from_numpy(np.asarray(x, np.float32).copy())


@pytest.mark.parametrize("q_dtype", FP8)
def test_quantize_bytes_equal_pytorch(q_dtype):
    x = np.random.default_rng(0).standard_normal((33, 70)).astype(np.float32) * 50
    x[0, :4] = [np.nan, np.inf, -np.inf, 1e-7]
    scale = np.array([3.0], np.float32)
    q, amax, si = tex.quantize(jnp.asarray(x), jnp.asarray(scale), q_dtype)
    tq, tamax, tsi = torch.ops.te_lite.quantize(_t(x), _t(scale), TORCH_FP8[np.dtype(q_dtype)])
    assert_bytes_equal(q, tq.view(torch.uint8).numpy().view(np.dtype(q_dtype)))
    np.testing.assert_array_equal(np.asarray(amax), tamax.numpy())
    np.testing.assert_array_equal(np.asarray(si), tsi.numpy())


def test_mxfp8_bytes_equal_pytorch():
    x = np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32) * 10
    got = tex.quantize_mxfp8(jnp.asarray(x), jnp.float8_e4m3fn, True, True)
    want = torch.ops.te_lite.quantize_mxfp8(_t(x), torch.float8_e4m3fn, True, True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g).view(np.uint8), w.view(torch.uint8).numpy())


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_state_equals_pytorch_linear(algo):
    """Same weights, inputs and output gradients for 5 steps: the FP8 state of te.pytorch.Linear
    (input, weight, grad-output columns) equals the JAX quantizer states bit for bit."""
    rc = recipe.DelayedScaling(amax_history_len=4, margin=1, amax_compute_algo=algo)
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((24, 32)) * 0.2).astype(np.float32)  # JAX kernel [in, out]
    lin = te_torch.Linear(24, 32, bias=False)
    with torch.no_grad():
        lin.weight.copy_(_t(w.T))
    q = QuantizerFactory.create_set(fp8_recipe=rc)
    kernel = jnp.asarray(w)

    def loss(x, q, g):
        return jnp.sum(te.dense(x, kernel, None, quantizer_set=q) * g)

    step = jax.jit(jax.value_and_grad(loss, argnums=1))
    for i in range(5):
        x = (rng.standard_normal((16, 24)) * (1 + i)).astype(np.float32)
        g = (rng.standard_normal((16, 32)) * (0.5 + i)).astype(np.float32)
        xt = _t(x).requires_grad_(True)
        with te_torch.fp8_autocast(enabled=True, fp8_recipe=rc):
            yt = lin(xt)
        yt.backward(_t(g))
        _, q = step(jnp.asarray(x), q, jnp.asarray(g))
        fwd_hist, fwd_scale = lin.fp8_fwd_amax_history.numpy(), lin.fp8_fwd_scale.numpy()
        bwd_hist, bwd_scale = lin.fp8_bwd_amax_history.numpy(), lin.fp8_bwd_scale.numpy()
        np.testing.assert_array_equal(np.asarray(q.x.amax_history), fwd_hist[:, 0])
        np.testing.assert_array_equal(np.asarray(q.x.scale), fwd_scale[:1])
        np.testing.assert_array_equal(np.asarray(q.kernel.amax_history), fwd_hist[:, 1])
        np.testing.assert_array_equal(np.asarray(q.kernel.scale), fwd_scale[1:2])
        np.testing.assert_array_equal(np.asarray(q.dgrad.amax_history), bwd_hist[:, 0])
        np.testing.assert_array_equal(np.asarray(q.dgrad.scale), bwd_scale[:1])


def test_denormal_inputs_as_pytorch():
    """XLA's CPU threads flush denormals; the handlers run the core with IEEE denormals on every
    thread, as PyTorch does: amax and FP8 bytes of denormal inputs are not read as zero."""
    x = np.full((4096,), 1e-39, np.float32)
    x[::7] = -3e-39
    scale = np.array([2.0**126], np.float32)
    for _ in range(3):
        q, amax, _ = jax.jit(lambda a: tex.quantize(a, jnp.asarray(scale), jnp.float8_e4m3fn))(
            jnp.asarray(x))
        tq, tamax, _ = torch.ops.te_lite.quantize(_t(x), _t(scale), torch.float8_e4m3fn)
        assert float(amax[0]) == float(tamax[0]) > 0
        assert_bytes_equal(q, tq.view(torch.uint8).numpy().view(np.dtype(jnp.float8_e4m3fn)))
