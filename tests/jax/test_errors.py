"""Bad input gives an exception naming the argument (at trace time from the primitives' checks, or
at run time from the handlers as JaxRuntimeError), never a crash; empty inputs work."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_engine_lite.jax as te
import transformer_engine_lite.jax.flax as te_flax
from transformer_engine_lite.common import recipe
from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.cpp_extensions.normalization import LayerNormFwdPrimitive
from transformer_engine_lite.jax.quantize import QuantizerFactory

F32 = jnp.float32


@pytest.mark.parametrize("call, match", [
    (lambda: tex.quantize(jnp.ones((4,), jnp.int32), jnp.ones((1,)), jnp.float8_e4m3fn),
     "argument 'x': expected dtype"),
    (lambda: tex.quantize(jnp.ones((4,)), jnp.ones((2,)), jnp.float8_e4m3fn),
     "argument 'scale'"),
    (lambda: tex.quantize(jnp.ones((4,)), jnp.ones((1,)), jnp.float32), "argument 'q_dtype'"),
    (lambda: tex.layernorm_fwd(jnp.ones((4, 8)), jnp.ones((7,)), jnp.zeros((8,))),
     "argument 'gamma'"),
    (lambda: tex.layernorm_fwd(jnp.ones((4, 8)), jnp.ones((8,)), jnp.zeros((8,)),
                               out_dtype=jnp.float8_e4m3fn), "argument 'scale'"),
    (lambda: tex.act_lu(jnp.ones((4, 3, 8)), ("gelu", "linear")), "argument 'x'"),
    (lambda: tex.act_lu(jnp.ones((4, 8)), ("tanh",)), "activation_type"),
    (lambda: tex.gemm(jnp.ones((4, 8)), jnp.ones((7, 3))), "contracting_dims"),
    (lambda: tex.gemm(jnp.ones((4, 8)), jnp.ones((8, 3)), bias=jnp.ones((4,))), "argument 'bias'"),
    (lambda: tex.scaled_softmax_fwd(jnp.ones((4, 8)), 1.0), "argument 'x'"),
    (lambda: tex.scaled_masked_softmax_fwd(jnp.ones((2, 2, 4, 4)), jnp.ones((3, 1, 4, 4), bool),
                                           1.0), "argument 'mask'"),
    (lambda: tex.delayed_scaling_update(jnp.ones((4, 2)), jnp.ones((3,)), "max",
                                        jnp.float8_e4m3fn, 0.0), "argument 'scale'"),
    (lambda: tex.delayed_scaling_update(jnp.ones((4, 2)), jnp.ones((2,)), "mean",
                                        jnp.float8_e4m3fn, 0.0), "amax_compute_algo"),
    (lambda: tex.quantize_mxfp8(jnp.ones((4, 32)), jnp.float8_e4m3fnuz), "argument 'q_dtype'"),
    (lambda: tex.fused_rope_fwd(jnp.ones((4, 2, 3, 8)), jnp.ones((4, 1, 1, 10)), "sbhd"),
     "argument 'freqs'"),
    (lambda: te.dense(jnp.ones((4, 8)), jnp.ones((9, 3))), "argument 'kernel'"),
    (lambda: te.layernorm(jnp.ones((4, 8)), jnp.ones((8,)), None, "batchnorm"), "norm_type"),
    (lambda: te.layernorm_mlp(jnp.ones((2, 8)), jnp.ones((8,)), jnp.zeros((8,)),
                              [jnp.ones((8, 1, 16)), jnp.ones((16, 8))], None,
                              activation_type=("gelu", "linear")), "kernels\\[0\\]"),
])
def test_trace_time_errors(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_unsupported_recipe_fields():
    with pytest.raises(ValueError, match="scaling_factor_compute_algo"):
        with te.autocast(True, recipe.DelayedScaling(scaling_factor_compute_algo=lambda *a: a)):
            pass
    with pytest.raises(ValueError, match="reduce_amax"):
        with te.autocast(True, recipe.DelayedScaling(reduce_amax=False)):
            pass
    with pytest.raises(NotImplementedError, match="backward_override"):
        with te.autocast(True, recipe.Float8CurrentScaling(backward_override="high_precision")):
            pass


def test_handler_errors_come_back_as_exceptions():
    """The handler's own checks, reached by calling it with a wrong result shape."""
    x = jnp.ones((4, 8), F32)
    g = jnp.ones((8,), F32)
    call = jax.ffi.ffi_call("te_lite_layernorm_fwd_ffi", (
        jax.ShapeDtypeStruct((4, 8), F32), jax.ShapeDtypeStruct((5,), F32),
        jax.ShapeDtypeStruct((4,), F32), jax.ShapeDtypeStruct((0,), F32),
        jax.ShapeDtypeStruct((0,), F32)))
    with pytest.raises(jax.errors.JaxRuntimeError, match="te_lite::layernorm_fwd: result 'mu'"):
        jax.block_until_ready(call(x, g, g, jnp.zeros((0,), F32), eps=1e-6,
                                   zero_centered_gamma=False))
    assert LayerNormFwdPrimitive.name == "NormFwdPrimitive"


@pytest.mark.parametrize("rc", [None, recipe.DelayedScaling(), recipe.Float8CurrentScaling(),
                                recipe.MXFP8BlockScaling()],
                         ids=["bf16", "delayed", "current", "mxfp8"])
def test_empty_batch(rc):
    x = jnp.zeros((0, 32), jnp.bfloat16)
    layer = te_flax.LayerNormMLP(intermediate_dim=64)
    with te.autocast(enabled=rc is not None, recipe=rc):
        vs = layer.init(jax.random.PRNGKey(0), jnp.ones((2, 32), jnp.bfloat16))
        out, grads = jax.value_and_grad(
            lambda p: jnp.sum(layer.apply({**vs, "params": p}, x)[0].astype(F32)))(vs["params"])
    assert float(out) == 0.0
    wi = jax.tree_util.tree_leaves(grads)
    assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in wi)


def test_empty_dense_fp8_state_keeps_scale():
    q = QuantizerFactory.create_set(fp8_recipe=recipe.DelayedScaling(amax_history_len=4))
    w = jnp.ones((8, 4), F32)
    new_q = jax.grad(lambda x, q: jnp.sum(te.dense(x, w, None, quantizer_set=q)), argnums=1)(
        jnp.zeros((0, 8), F32), q)
    np.testing.assert_array_equal(np.asarray(new_q.x.scale), [1.0])
    np.testing.assert_array_equal(np.asarray(new_q.x.amax_history), np.zeros(4))


# AOTriton runs through the core's fused call (the flash path); CK has no binding. The selection
# never picks either for host arrays, so it is stubbed.
@pytest.mark.parametrize("picked,runs", [("aotriton", "flash"), ("flash", "flash"),
                                         ("unfused", "unfused"), ("ck", None)])
def test_selected_backend_binding(monkeypatch, picked, runs):
    from transformer_engine_lite.jax import attention as attn

    monkeypatch.setattr(attn.selection, "select", lambda *key, **kw: (picked, {}))
    args = (jnp.bfloat16, attn.QKVLayout.BSHD_BSHD_BSHD, attn.AttnBiasType.NO_BIAS,
            attn.AttnMaskType.NO_MASK, 0.0, 4, 4, 16, 16, 64, 64)
    if runs is None:
        with pytest.raises(NotImplementedError, match="backend 'ck' was selected"):
            attn.attention_backend(*args)
    else:
        assert attn.attention_backend(*args) == runs
