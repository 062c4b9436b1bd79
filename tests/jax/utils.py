"""Shared helpers of the JAX suites: the one tolerance table, fp64 references, byte views."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# (rtol, atol) per compute dtype: one table for every float comparison of the JAX suites.
TOLS = {
    "float32": (1e-5, 1e-5),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
    "fp8": (0.15, 0.15),  # results of FP8 GEMMs vs a high-precision reference
}
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
FP8 = (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float8_e4m3fnuz, jnp.float8_e5m2fnuz)


def require_host_devices(n: int) -> None:
    """Skip the calling test module (at its import) unless jax sees n devices: the distributed
    suites run on host devices made by XLA_FLAGS, which must be set before jax is imported."""
    import pytest  # noqa: PLC0415

    if jax.device_count() < n:
        pytest.skip(f"needs {n} devices, found {jax.device_count()} (set XLA_FLAGS="
                    f"--xla_force_host_platform_device_count={n} before jax is first imported)",
                    allow_module_level=True)


def tols(dtype) -> dict:
    key = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    rtol, atol = TOLS[key]
    return {"rtol": rtol, "atol": atol}


def assert_close(got, want, dtype, scale=1.0):
    t = tols(dtype)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=t["rtol"] * scale, atol=t["atol"] * scale)


def assert_bytes_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def randn(key, shape, dtype, scale=1.0):
    return (jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32) * scale).astype(dtype)


def f64(x):
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)
