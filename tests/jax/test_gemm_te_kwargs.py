"""tex.gemm's keyword forms from TE-JAX's earlier API that TE's tests still pass
(tests/jax/test_distributed_dense.py calls gemm(..., bias=b, fuse_bias=True)): fuse_bias True adds
the bias in the GEMM, False after it (unfused), both equal to the float64 reference to the
output's rounding; quantizer_set supplies the quantizers."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.quantize import QuantizerFactory, ScalingMode

RNG = np.random.default_rng(7)
X = jnp.asarray(RNG.standard_normal((4, 8, 32)), jnp.float32)
W = jnp.asarray(RNG.standard_normal((32, 16)), jnp.float32)
BIAS = jnp.asarray(RNG.standard_normal((16,)), jnp.float32)
REF = np.einsum("bsk,kn->bsn", np.float64(X), np.float64(W)) + np.float64(BIAS)


@pytest.mark.parametrize("fuse_bias", [True, False, None])
def test_fuse_bias_adds_the_bias(fuse_bias):
    got = tex.gemm(X, W, ((2,), (0,)), bias=BIAS, fuse_bias=fuse_bias)
    np.testing.assert_allclose(np.float64(got), REF, rtol=1e-5, atol=1e-5)


def test_unfused_bias_bf16_rounds_once_more():
    x, w, b = X.astype(jnp.bfloat16), W.astype(jnp.bfloat16), BIAS.astype(jnp.bfloat16)
    plain = tex.gemm(x, w, ((2,), (0,)))
    got = tex.gemm(x, w, ((2,), (0,)), bias=b, fuse_bias=False)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.float32(got), np.float32((plain + b).astype(jnp.bfloat16)))


def test_fuse_bias_errors():
    with pytest.raises(TypeError, match="argument 'fuse_bias'"):
        tex.gemm(X, W, ((2,), (0,)), bias=BIAS, fuse_bias=1)
    with pytest.raises(ValueError, match="'fuse_gelu'"):
        tex.gemm(X, W, ((2,), (0,)), bias=BIAS, fuse_bias=False, fuse_gelu=True)
    with pytest.raises(ValueError, match="argument 'bias'"):
        tex.gemm(X, W, ((2,), (0,)), bias=BIAS[:8], fuse_bias=False)


def test_quantizer_set_supplies_the_quantizers():
    qs = QuantizerFactory.create_set(scaling_mode=ScalingMode.CURRENT_TENSOR_SCALING,
                                     fwd_dtype=jnp.float8_e4m3fn, bwd_dtype=jnp.float8_e5m2)
    got = tex.gemm(X, W, ((2,), (0,)), quantizer_set=qs)
    want = tex.gemm(X, W, ((2,), (0,)), lhs_quantizer=qs.x, rhs_quantizer=qs.kernel)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert not np.array_equal(np.asarray(got), np.asarray(tex.gemm(X, W, ((2,), (0,)))))
