"""TE-JAX API edges that TE's own tests/jax files use (issue #25): version_utils, DType,
make_swa_mask, the (bool, str) support queries, is_softmax_kernel_available's two signatures, LoRA
(scope names, TE's parameter layout), ScalingMode's scale shapes and QuantizeConfig's fields."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_engine_lite.jax as te
from transformer_engine_lite.common import recipe
from transformer_engine_lite.jax import version_utils
from transformer_engine_lite.jax.attention import AttnSoftmaxType, make_swa_mask
from transformer_engine_lite.jax.cpp_extensions import is_softmax_kernel_available
from transformer_engine_lite.jax.cpp_extensions.misc import (
    jax_dtype_to_te_dtype,
    te_dtype_to_jax_dtype,
)
from transformer_engine_lite.jax.flax.module import _apply_low_rank_adaptation
from transformer_engine_lite.jax.flax.transformer import LoRAScope, _canonicalize_lora_scope
from transformer_engine_lite.jax.quantize import (
    QuantizeLayout,
    ScalingMode,
    get_quantize_config_with_recipe,
    is_fp8_available,
    is_scaling_mode_supported,
)
from transformer_engine_lite.jax.quantize.helper import DType, _format2dtypes
from transformer_engine_lite.jax.softmax import SoftmaxFusionType


# ------------------------------------------------------------------------------ version_utils
def test_version_utils():
    assert version_utils.TRITON_EXTENSION_MIN_JAX_VERSION == "0.8.0"
    assert version_utils.is_triton_extension_supported() is False  # no Triton kernels here
    assert version_utils.jax_version_meet_requirement("0.0.1")
    assert not version_utils.jax_version_meet_requirement("999.0")
    with pytest.raises(ValueError, match="version"):
        version_utils.jax_version_meet_requirement("latest")


# ------------------------------------------------------------------------------ DType
def test_dtype_values_and_round_trip():
    assert (DType.kByte, DType.kFloat32, DType.kBFloat16, DType.kFloat8E4M3, DType.kFloat4E2M1) \
        == (0, 4, 6, 7, 10)  # TE's C enum values
    for d in (jnp.uint8, jnp.int32, jnp.float32, jnp.float16, jnp.bfloat16, jnp.float8_e4m3fn,
              jnp.float8_e5m2, jnp.float8_e8m0fnu, jnp.float4_e2m1fn):
        assert np.dtype(te_dtype_to_jax_dtype(jax_dtype_to_te_dtype(d))) == np.dtype(d)
    with pytest.raises(ValueError, match="complex64"):
        jax_dtype_to_te_dtype(jnp.complex64)


# ------------------------------------------------------------------------------ make_swa_mask
def _swa_ref(pos_q, pos_kv, window, ids_q=None, ids_kv=None):
    """Loop reference: per (b, i, j), the window test around the (bottom-right) diagonal."""
    def run_len(ids):
        out = np.zeros_like(ids)
        for b in range(ids.shape[0]):
            for t in range(ids.shape[1]):
                lo = t
                while lo > 0 and ids[b, lo - 1] == ids[b, t]:
                    lo -= 1
                hi = t
                while hi + 1 < ids.shape[1] and ids[b, hi + 1] == ids[b, t]:
                    hi += 1
                out[b, t] = hi - lo + 1
        return out

    left, right = window if window is not None else (-1, -1)
    b, sq, skv = pos_q.shape[0], pos_q.shape[1], pos_kv.shape[1]
    lq = run_len(ids_q) if ids_q is not None else None
    lkv = run_len(ids_kv) if ids_kv is not None else None
    out = np.zeros((b, 1, sq, skv))
    for bb, i, j in itertools.product(range(b), range(sq), range(skv)):
        qi = pos_q[bb, i] + (lkv[bb, j] - lq[bb, i] if lq is not None else 0)
        ok = (left < 0 or pos_kv[bb, j] >= qi - left) and (right < 0 or pos_kv[bb, j] <= qi + right)
        out[bb, 0, i, j] = ok
    return out


@pytest.mark.parametrize("window", [None, (-1, -1), (2, 0), (1, 3), (0, 0), (-1, 1)])
def test_make_swa_mask(window):
    pos = np.tile(np.arange(7), (2, 1))
    got = make_swa_mask(jnp.asarray(pos), jnp.asarray(pos), window, jnp.float32)
    assert got.shape == (2, 1, 7, 7) and got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), _swa_ref(pos, pos, window))


def test_make_swa_mask_bottom_right_segments():
    ids_q = np.array([[1, 1, 2, 2, 2, 0]])
    ids_kv = np.array([[1, 1, 1, 2, 2, 2, 2, 0]])
    pos_q = np.array([[0, 1, 0, 1, 2, 0]])
    pos_kv = np.array([[0, 1, 2, 0, 1, 2, 3, 0]])
    got = make_swa_mask(jnp.asarray(pos_q), jnp.asarray(pos_kv), (1, 0), jnp.uint8,
                        jnp.asarray(ids_q), jnp.asarray(ids_kv))
    assert got.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(got), _swa_ref(pos_q, pos_kv, (1, 0), ids_q, ids_kv))
    with pytest.raises(ValueError, match="both or neither"):
        make_swa_mask(pos_q, pos_kv, (1, 0), jnp.float32, segment_ids_q=ids_q)
    with pytest.raises(ValueError, match="window_size"):
        make_swa_mask(pos_q, pos_q, (1, 0, 2))


# ------------------------------------------------------------------------------ support queries
def test_support_queries_give_string_reasons():
    for mode in (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING,
                 ScalingMode.MXFP8_1D_SCALING, ScalingMode.NVFP4_1D_SCALING,
                 ScalingMode.NVFP4_2D_SCALING):
        assert is_scaling_mode_supported(mode) == (True, "")
    with pytest.warns(DeprecationWarning):
        ok, reason = is_fp8_available()
    assert ok is True and isinstance(reason, str)  # pytest.skipif(reason=...) needs a str


def test_softmax_kernel_available_signatures():
    args = (2, 4, 16, 16)
    for kind in SoftmaxFusionType:
        assert is_softmax_kernel_available(kind, AttnSoftmaxType.VANILLA_SOFTMAX, *args, jnp.bfloat16)
        assert is_softmax_kernel_available(kind, "vanilla", *args, jnp.float32)
        assert is_softmax_kernel_available(kind, *args, jnp.float16)  # TE 2.8's form
        assert not is_softmax_kernel_available(kind, AttnSoftmaxType.OFF_BY_ONE_SOFTMAX, *args,
                                               jnp.float32)
        assert not is_softmax_kernel_available(kind, "vanilla", *args, jnp.int32)
    tri = SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED
    assert not is_softmax_kernel_available(tri, "vanilla", 2, 4, 8, 16, jnp.bfloat16)
    assert is_softmax_kernel_available(SoftmaxFusionType.SCALED, "vanilla", 2, 4, 8, 16, jnp.bfloat16)
    from transformer_engine_lite.jax.softmax import softmax

    for exc in (ValueError, AssertionError):  # ours is a ValueError; TE code expects assert's
        with pytest.raises(exc, match="sq == sk"):
            softmax(jnp.zeros((1, 1, 8, 16), jnp.bfloat16), None, 1.0, tri)
    with pytest.raises(TypeError, match="got 3 arguments"):
        is_softmax_kernel_available(SoftmaxFusionType.SCALED, 1, 2)


# ------------------------------------------------------------------------------ LoRA
def test_lora_scopes():
    assert _canonicalize_lora_scope(None) == LoRAScope()
    assert _canonicalize_lora_scope("ALL") == LoRAScope(True, True, True)
    assert _canonicalize_lora_scope("exclude_mlp") == LoRAScope(True, True, False)
    assert _canonicalize_lora_scope("output_proj") == LoRAScope(False, True, False)
    assert _canonicalize_lora_scope("mlp") != LoRAScope(True, False, True)
    for exc in (ValueError, AssertionError):  # ours is a ValueError; TE code catches assert's
        with pytest.raises(exc, match="messing_up"):
            _canonicalize_lora_scope("messing_up")


@pytest.mark.parametrize("features,alpha", [((8,), None), ((3, 8), 4.0)])
def test_apply_low_rank_adaptation(features, alpha):
    rank = 4
    k = jax.random.split(jax.random.PRNGKey(3), 3)
    x = jax.random.normal(k[0], (2, 5, 16), jnp.float32)
    a = jax.random.normal(k[1], (16, *features[:-1], rank), jnp.float32)
    b = jax.random.normal(k[2], (*features[:-1], rank, features[-1]), jnp.float32)
    got = _apply_low_rank_adaptation(x, (2,), features, a, b, alpha)
    xd, ad, bd = (np.asarray(t, np.float64) for t in (x, a, b))
    if len(features) == 1:
        want = xd @ ad @ bd
    else:
        want = np.stack([xd @ ad[:, g] @ bd[g] for g in range(features[0])], axis=-2)
    want *= (alpha / rank) if alpha is not None else 1.0
    assert got.shape == (2, 5, *features)
    # fp32 products of 16 then 4 terms of unit normals: relative error well under 1e-5.
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="rank"):
        _apply_low_rank_adaptation(x, (2,), features, a, b[..., :2, :], alpha)


def test_lora_parameter_layout_is_tes():
    layer = te.flax.DenseGeneral((3, 8), enable_low_rank_adaptation=True, low_rank_adaptation_dim=4)
    x = jnp.ones((2, 16), jnp.float32)
    p = layer.init(jax.random.PRNGKey(0), x)["params"]
    assert p["lora_a_kernel"].shape == (16, 3, 4) and p["lora_b_kernel"].shape == (3, 4, 8)


# ------------------------------------------------------------------------------ ScalingMode
def test_scaling_mode_predicates_and_dtypes():
    m = ScalingMode
    assert m.NVFP4_1D_SCALING.is_nvfp4_scaling and not m.MXFP8_1D_SCALING.is_nvfp4_scaling
    assert m.MXFP8_1D_SCALING.is_1d_block_scaling() and m.NVFP4_2D_SCALING.is_block_scaling
    assert not m.CURRENT_TENSOR_SCALING.is_block_scaling
    assert m.CURRENT_TENSOR_SCALING.is_tensor_scaling()
    assert not m.MXFP8_1D_SCALING.is_tensor_scaling()
    assert m.DELAYED_TENSOR_SCALING.get_compatible_q_dtypes() == {jnp.float8_e4m3fn,
                                                                  jnp.float8_e5m2}
    assert jnp.bfloat16 in m.NO_SCALING.get_compatible_q_dtypes()
    assert m.MXFP8_1D_SCALING.get_scale_dtype() == jnp.float8_e8m0fnu
    assert m.NVFP4_2D_SCALING.is_1d_block_scaling()  # TE-JAX's: 2D scales are broadcast to 1x16
    assert m.NVFP4_1D_SCALING.get_scale_dtype() == jnp.float8_e4m3fn
    assert m.NVFP4_1D_SCALING.get_compatible_q_dtypes() == {jnp.float4_e2m1fn}
    assert m.NVFP4_2D_SCALING.get_data_layout() == "NT" and m.NVFP4_1D_SCALING.is_colwise_transposed


@pytest.mark.parametrize("shape,axis,padded,want", [
    ((256, 128), -1, True, ((256, 4), (8, 128))),
    ((32, 64), -1, False, ((32, 2), (1, 64))),
    ((32, 64), -1, True, ((128, 4), (4, 128))),
    ((2, 64, 96), -1, True, ((2, 64, 4), (2, 2, 128))),
    ((64, 2, 32), 1, False, ((64, 2, 1), (2, 2, 32))),
])
def test_mxfp8_scale_shapes(shape, axis, padded, want):
    got = ScalingMode.MXFP8_1D_SCALING.get_scale_shape_2x(shape, padded, axis)
    assert got == want


def test_mxfp8_scale_shape_matches_quantizer():
    """The unpadded shape is the number of scales the quantizer actually produces."""
    from transformer_engine_lite.jax.quantize import QuantizerFactory

    x = jax.random.normal(jax.random.PRNGKey(0), (64, 96), jnp.bfloat16)
    q = QuantizerFactory.create(1, ScalingMode.MXFP8_1D_SCALING, jnp.float8_e4m3fn,
                                QuantizeLayout.ROWWISE_COLWISE)
    t = q.quantize(x)
    rows, cols = ScalingMode.MXFP8_1D_SCALING.get_scale_shape_2x(x.shape, is_padded=False)
    assert int(np.prod(t.rowwise_tensor.scale_inv.shape)) == int(np.prod(rows))
    assert int(np.prod(t.colwise_tensor.scale_inv.shape)) == int(np.prod(cols))


def test_tensor_scale_shapes_and_errors():
    for m in (ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.CURRENT_TENSOR_SCALING):
        assert m.get_scale_shape_2x((4, 8)) == ((1,), (1,))
        assert m.get_scale_shape((0, 8)) == (0,)
    assert ScalingMode.NO_SCALING.get_scale_shape((4, 8)) == (0,)
    with pytest.raises(ValueError, match="divisible"):
        ScalingMode.MXFP8_1D_SCALING.get_scale_shape((32, 48))
    with pytest.raises(ValueError, match="flatten_axis"):
        ScalingMode.MXFP8_1D_SCALING.get_scale_shape((32, 64), flatten_axis=0)
    with pytest.raises(ValueError, match="data_layout"):
        ScalingMode.MXFP8_1D_SCALING.get_scale_shape((32, 64), data_layout="T")


# ------------------------------------------------------------------------------ QuantizeConfig
def test_quantize_config_fields():
    c = get_quantize_config_with_recipe(recipe.DelayedScaling(margin=2, amax_history_len=16,
                                                              amax_compute_algo="most_recent"))
    assert (c.FWD_DTYPE, c.BWD_DTYPE) == (jnp.float8_e4m3fn, jnp.float8_e5m2)  # HYBRID default
    assert (c.MARGIN, c.AMAX_HISTORY_LEN, c.AMAX_COMPUTE_ALGO.value) == (2, 16, "most_recent")
    c = get_quantize_config_with_recipe(recipe.Float8CurrentScaling(fp8_format=recipe.Format.E4M3))
    assert (c.FWD_DTYPE, c.BWD_DTYPE, c.MARGIN) == (jnp.float8_e4m3fn, jnp.float8_e4m3fn, None)
    assert get_quantize_config_with_recipe(None).FWD_DTYPE is None
    assert _format2dtypes(recipe.Format.E5M2) == (jnp.float8_e5m2, jnp.float8_e5m2)
    with pytest.raises(TypeError, match="Format"):
        _format2dtypes("E4M3")


# ------------------------------------------------------------------------------ QuantizerFactory
def test_quantizer_factory_create_signature():
    from transformer_engine_lite.jax.quantize import (
        CurrentScaleQuantizer,
        DelayedScaleQuantizer,
        QuantizerFactory,
    )

    q = QuantizerFactory.create(scaling_mode=ScalingMode.CURRENT_TENSOR_SCALING,
                                q_dtype=jnp.float8_e4m3fn, q_layout=QuantizeLayout.ROWWISE)
    assert isinstance(q, CurrentScaleQuantizer) and q.q_layout == QuantizeLayout.ROWWISE
    qs = QuantizerFactory.create(3, ScalingMode.DELAYED_TENSOR_SCALING, jnp.float8_e5m2)
    assert len(qs) == 3 and all(isinstance(x, DelayedScaleQuantizer) for x in qs)
    assert qs[0].q_layout == QuantizeLayout.ROWWISE_COLWISE
    assert QuantizerFactory.create(2, ScalingMode.NO_SCALING) == (None, None)
    g = QuantizerFactory.create(1, ScalingMode.CURRENT_TENSOR_SCALING, jnp.float8_e4m3fn,
                                n_groups=4)  # grouped: tests/jax/test_te_api_grouped.py
    assert len(g.quantizers) == 4
    assert all(isinstance(x, CurrentScaleQuantizer) for x in g.quantizers)
    with pytest.raises(ValueError, match="n_quantizers"):
        QuantizerFactory.create(0, ScalingMode.CURRENT_TENSOR_SCALING, jnp.float8_e4m3fn)
    with pytest.raises(ValueError, match="scaling_mode"):
        QuantizerFactory.create(1)


@pytest.mark.parametrize("mode", [ScalingMode.CURRENT_TENSOR_SCALING,
                                  ScalingMode.DELAYED_TENSOR_SCALING, ScalingMode.MXFP8_1D_SCALING])
def test_quantizer_checkpoint_name_tags_outputs(mode):
    from transformer_engine_lite.jax.quantize import QuantizerFactory

    def names(cp):
        q = QuantizerFactory.create(1, mode, jnp.float8_e4m3fn, QuantizeLayout.ROWWISE,
                                    checkpoint_name=cp)
        jaxpr = jax.make_jaxpr(lambda x: q.quantize(x))(jnp.ones((32, 64), jnp.bfloat16))
        return [e.params["name"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "name"]

    assert names(None) == []
    got = names("qx")
    assert got and set(got) == {"qx"}  # data and scale_inv (and amax where kept) are named


@pytest.mark.parametrize("rc,per_quantization", [
    (recipe.Float8CurrentScaling(), 3),  # data, scale_inv, amax (shared by both usages)
    (recipe.MXFP8BlockScaling(), 4),  # row-wise and column-wise data + block scales
], ids=["Float8CurrentScaling", "MXFP8BlockScaling"])
def test_module_quantization_checkpoint_name(rc, per_quantization):
    """A DenseGeneral's forward quantizations (x, kernel) carry the name; the gradient's
    quantization (never a residual) does not."""
    x = jnp.ones((32, 64), jnp.bfloat16)

    def names(cp):
        with te.autocast(enabled=True, recipe=rc):
            layer = te.flax.DenseGeneral(64, quantization_checkpoint_name=cp, dtype=jnp.bfloat16)
            vs = layer.init(jax.random.PRNGKey(0), x)
            jaxpr = jax.make_jaxpr(jax.grad(lambda x: jnp.sum(layer.apply(vs, x))))(x)
        return [e.params["name"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "name"]

    assert names(None) == []
    got = names("q")
    assert set(got) == {"q"} and len(got) == 2 * per_quantization


def test_softmax_module_causal_non_square_falls_back():
    """te.flax.Softmax with the causal type on sq != sk: top-left causal mask (TE's fallback)."""
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 4, 12), jnp.float32)
    m = te.flax.Softmax(scale_factor=0.5,
                        softmax_fusion_type=SoftmaxFusionType.SCALED_UPPER_TRIANG_MASKED)
    got = np.asarray(m.apply({}, x), np.float64)
    z = np.asarray(x, np.float64) * 0.5
    z = np.where(np.arange(12)[None, :] > np.arange(4)[:, None], -np.inf, z)
    want = np.exp(z - z.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # fp32 softmax of <= 12 terms
