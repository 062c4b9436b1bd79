"""Grouped NVFP4 in the JAX front end (cpp_extensions/grouped_nvfp4.py): grouped_quantize gives
each group the bytes, scales and amax of quantizing that group alone (row-wise and column-wise
copies, 1D and 2D blocks); grouped_gemm / grouped_dense give each group's rows the bits of that
group's own NVFP4 GEMM in the FP4 tensor core's order (tex.gemm of the group's own copies), the
wgrad included; unaligned groups are refused where the blocks would span two groups."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.dense import grouped_dense
from transformer_engine_lite.jax.quantize import (
    GroupedNoScaleTensor,
    QuantizeLayout,
    QuantizerFactory,
    ScaledTensor2x,
    ScalingMode,
)

M1, M2 = ScalingMode.NVFP4_1D_SCALING, ScalingMode.NVFP4_2D_SCALING
FP4 = jnp.float4_e2m1fn
SIZES = np.array([32, 0, 16, 48], np.int32)  # multiples of 16, an empty group
BOUNDS = np.concatenate([[0], np.cumsum(SIZES)])
G = len(SIZES)


def _x(shape, seed):
    g = np.random.default_rng(seed)
    x = g.standard_normal(shape) * np.exp(g.standard_normal((1,) * (len(shape) - 1) + (shape[-1],)))
    return jnp.asarray(x.astype(np.float32)).astype(jnp.bfloat16)


def _u8(a):
    return np.asarray(jax.lax.bitcast_convert_type(a, jnp.uint8) if a.dtype != FP4 else
                      jax.lax.bitcast_convert_type(a.reshape(*a.shape[:-1], -1, 2), jnp.uint8))


def _alone(x, mode=M1, layout=QuantizeLayout.ROWWISE_COLWISE):
    q = QuantizerFactory.create(scaling_mode=mode, q_dtype=FP4, q_layout=layout)
    return q.quantize(x)


def _bits(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32)).view(np.uint32)


@pytest.mark.parametrize("mode", [M1, M2])
def test_grouped_quantize_equals_each_group_alone(mode):
    x = _x((96, 64), 1)
    q = QuantizerFactory.create(scaling_mode=mode, q_dtype=FP4,
                                q_layout=QuantizeLayout.ROWWISE_COLWISE, n_groups=G)
    out = jax.jit(lambda v, s: tex.grouped_quantize(v, q, s))(x, jnp.asarray(SIZES))
    assert isinstance(out, ScaledTensor2x)
    r, c = out.rowwise_tensor, out.colwise_tensor
    assert r.data_layout == "N" and c.data_layout == "T" and c.data.shape == (64, 96)
    assert r.amax.shape == (G,) and c.amax.shape == (G,)
    for g in range(G):
        a, b = BOUNDS[g], BOUNDS[g + 1]
        if a == b:
            assert float(r.amax[g]) == 0.0
            continue
        own = _alone(x[a:b], mode)
        np.testing.assert_array_equal(_u8(r.data)[a:b], _u8(own.rowwise_tensor.data))
        np.testing.assert_array_equal(_u8(r.scale_inv)[a:b], _u8(own.rowwise_tensor.scale_inv))
        np.testing.assert_array_equal(_u8(c.data)[:, a // 2:b // 2], _u8(own.colwise_tensor.data))
        np.testing.assert_array_equal(_u8(c.scale_inv)[:, a // 16:b // 16],
                                      _u8(own.colwise_tensor.scale_inv))
        assert float(r.amax[g]) == float(own.rowwise_tensor.amax[0])
        assert float(c.amax[g]) == float(own.colwise_tensor.amax[0])
    # dequantize: each group's rows with its own amax
    full = r.dequantize_full(jnp.float32)
    for g in range(G):
        a, b = BOUNDS[g], BOUNDS[g + 1]
        if a < b:
            want = _alone(x[a:b], mode).rowwise_tensor.dequantize(jnp.float32)
            np.testing.assert_array_equal(np.asarray(full[a:b]), np.asarray(want))


def test_grouped_quantize_refuses_unaligned_groups():
    x = _x((96, 64), 2)
    q = QuantizerFactory.create(scaling_mode=M1, q_dtype=FP4,
                                q_layout=QuantizeLayout.ROWWISE_COLWISE, n_groups=2)
    with pytest.raises(ValueError, match="multiples of 16"):
        tex.grouped_quantize(x, q, jnp.asarray([40, 56], jnp.int32))
    kernels = QuantizerFactory.create(scaling_mode=M1, q_dtype=FP4,
                                      q_layout=QuantizeLayout.ROWWISE_COLWISE, n_groups=2)
    with pytest.raises(ValueError, match="each group's 8 rows"):
        tex.grouped_quantize(_x((2, 8, 32), 3), kernels, None)
    # row-wise 1x16 blocks lie inside a row: any sizes
    qr = QuantizerFactory.create(scaling_mode=M1, q_dtype=FP4, q_layout=QuantizeLayout.ROWWISE,
                                 n_groups=2)
    t = tex.grouped_quantize(x, qr, jnp.asarray([40, 56], jnp.int32))
    own = _alone(x[:40], layout=QuantizeLayout.ROWWISE)
    np.testing.assert_array_equal(_u8(t.data)[:40], _u8(own.data))


@pytest.mark.parametrize("rc", [1, 2])
def test_grouped_gemm_equals_each_group_gemm(rc):
    x = _x((96, 64), 3)
    w = _x((G, 64, 32) if rc == 1 else (G, 32, 64), 4)
    sizes = jnp.asarray(SIZES)
    qs = QuantizerFactory.create_set(scaling_mode=M1, fwd_dtype=FP4, bwd_dtype=FP4, n_groups=G)
    out = jax.jit(tex.grouped_gemm, static_argnames=("contracting_dims",))(
        GroupedNoScaleTensor(x, None, sizes, None, x.shape),
        GroupedNoScaleTensor(w, None, None, None, w.shape),
        contracting_dims=((1,), (rc,)), quantizer_set=qs)
    assert out.shape == (96, 32) and out.dtype == jnp.bfloat16
    for g in range(G):
        a, b = BOUNDS[g], BOUNDS[g + 1]
        if a == b:
            continue
        xq = _alone(x[a:b], layout=QuantizeLayout.ROWWISE)
        wq = _alone(w[g])
        wq = wq.colwise_tensor if rc == 1 else wq.rowwise_tensor
        want = tex.gemm(xq, wq, ((1,), (0,) if rc == 1 else (1,)), out_dtype=jnp.bfloat16)
        np.testing.assert_array_equal(_bits(out[a:b]), _bits(want))


def test_grouped_dense_forward_and_grads():
    x, w = _x((96, 64), 5), _x((G, 64, 32), 6)
    sizes = jnp.asarray(SIZES)
    qs = QuantizerFactory.create_set(scaling_mode=M1, fwd_dtype=FP4, bwd_dtype=FP4, n_groups=G)
    dy = _x((96, 32), 7)

    def f(x_, w_):
        y = grouped_dense(x_, w_, sizes, contracting_dims=((1,), (1,)), quantizer_set=qs)
        return jnp.sum(y.astype(jnp.float32) * dy.astype(jnp.float32)), y

    (_, y), (dx, dw) = jax.jit(jax.value_and_grad(f, (0, 1), has_aux=True))(x, w)
    for g in range(G):
        a, b = BOUNDS[g], BOUNDS[g + 1]
        if a == b:
            assert float(jnp.abs(dw[g].astype(jnp.float32)).max()) == 0.0
            continue
        xq, wq, gq = _alone(x[a:b]), _alone(w[g]), _alone(dy[a:b])
        want_y = tex.gemm(xq.rowwise_tensor, wq.colwise_tensor, ((1,), (0,)),
                          out_dtype=jnp.bfloat16)
        np.testing.assert_array_equal(_bits(y[a:b]), _bits(want_y))
        want_dx = tex.gemm(gq.rowwise_tensor, wq.rowwise_tensor, ((1,), (1,)),
                           out_dtype=jnp.bfloat16)
        np.testing.assert_array_equal(_bits(dx[a:b]), _bits(want_dx))
        want_dw = tex.gemm(xq.colwise_tensor, gq.colwise_tensor, ((0,), (0,)),
                           out_dtype=jnp.bfloat16)
        np.testing.assert_array_equal(_bits(dw[g]), _bits(want_dw))
