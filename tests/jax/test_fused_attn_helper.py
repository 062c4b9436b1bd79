"""TE-JAX's fused-attention probe (cpp_extensions.FusedAttnHelper, NVTE_Fused_Attn_Backend,
get_fused_attn_backend), the device queries TE's tests gate on (get_device_compute_capability and
its min / all forms) and attention.run_length_fill: what TE's tests/jax/test_fused_attn.py needs
to run its cases here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_utils import set_mode

from transformer_engine_lite.jax import attention as A
from transformer_engine_lite.jax import cpp_extensions as tex
from transformer_engine_lite.jax.cpp_extensions import misc
from transformer_engine_lite.jax.quantize.helper import DType as TEDType

Backend = tex.NVTE_Fused_Attn_Backend


def _helper(layout=A.QKVLayout.BSHD_BSHD_BSHD, bias=A.AttnBiasType.NO_BIAS,
            mask=A.AttnMaskType.CAUSAL_MASK, softmax=A.AttnSoftmaxType.VANILLA_SOFTMAX,
            dtype=jnp.bfloat16, kv_dtype=None, dropout=0.0, h=4, h_kv=4, s=128, d=64,
            window=(-1, -1), training=True):
    return tex.FusedAttnHelper(training, dtype, dtype if kv_dtype is None else kv_dtype, layout,
                               bias, mask, softmax, dropout, h, h_kv, s, s, d, d, window)


def test_enum_has_te_values():
    assert {m.name: int(m) for m in Backend} == {
        "NVTE_No_Backend": -1, "NVTE_F16_max512_seqlen": 0, "NVTE_F16_arbitrary_seqlen": 1,
        "NVTE_FP8": 2}


@pytest.mark.parametrize("layout", list(A.QKVLayout), ids=lambda l: l.value)
@pytest.mark.parametrize("mask", list(A.AttnMaskType), ids=lambda m: m.value)
def test_helper_agrees_with_is_fused_attn_kernel_available(layout, mask, monkeypatch):
    set_mode(monkeypatch, "auto")
    helper = _helper(layout=layout, mask=mask)
    expect = A.is_fused_attn_kernel_available(True, jnp.bfloat16, jnp.bfloat16, layout,
                                              A.AttnBiasType.NO_BIAS, mask,
                                              A.AttnSoftmaxType.VANILLA_SOFTMAX, 0.0, 4, 4, 128,
                                              128, 64, 64, None)
    got = helper.get_fused_attn_backend()
    assert got == (Backend.NVTE_F16_arbitrary_seqlen if expect else Backend.NVTE_No_Backend)
    assert helper.is_fused_attn_kernel_available() is expect


def test_flash_on_the_host_is_f16_arbitrary_seqlen(monkeypatch):
    set_mode(monkeypatch, "auto")  # the host's fused kernel (flash) is selected
    assert _helper().get_fused_attn_backend() is Backend.NVTE_F16_arbitrary_seqlen


def test_unfused_only_is_no_backend(monkeypatch):
    set_mode(monkeypatch, "unfused")  # only the unfused math may run: no fused kernel
    assert _helper().get_fused_attn_backend() is Backend.NVTE_No_Backend


@pytest.mark.parametrize("kw", [
    {"softmax": A.AttnSoftmaxType.OFF_BY_ONE_SOFTMAX},  # sinks run in the unfused math only
    {"softmax": A.AttnSoftmaxType.LEARNABLE_SOFTMAX},
    {"dtype": jnp.float8_e4m3fn},  # no FP8 attention
    {"kv_dtype": jnp.float16},  # q and kv dtypes differ
], ids=["off_by_one", "learnable", "fp8", "mixed-dtypes"])
def test_no_fused_kernel(kw, monkeypatch):
    set_mode(monkeypatch, "auto")
    assert _helper(**kw).get_fused_attn_backend() is Backend.NVTE_No_Backend
    assert not _helper(**kw).is_fused_attn_kernel_available()


def test_thd_bias_runs_the_fused_kernel_as_the_probe_says(monkeypatch):
    """thd + post_scale_bias: the probe says F16_arbitrary_seqlen and fused_attn runs it (the
    numerics: test_attention.py's thd bias cases)."""
    set_mode(monkeypatch, "auto")
    helper = _helper(layout=A.QKVLayout.THD_THD_THD, bias=A.AttnBiasType.POST_SCALE_BIAS,
                     mask=A.AttnMaskType.PADDING_MASK)
    assert helper.get_fused_attn_backend() is Backend.NVTE_F16_arbitrary_seqlen
    used = []
    fused = A._fused

    def spy(*args, **kwargs):
        used.append("flash")
        return fused(*args, **kwargs)

    monkeypatch.setattr(A, "_fused", spy)
    q = jnp.ones((1, 8, 2, 16), jnp.bfloat16)
    seg = jnp.ones((1, 8), jnp.int32)
    desc = A.SequenceDescriptor.from_segment_ids_and_pos((seg, seg), (jnp.arange(8)[None],) * 2)
    out = A.fused_attn((q, q, q), jnp.ones((1, 2, 8, 8), jnp.bfloat16), desc, None,
                       "post_scale_bias", "padding", "thd_thd_thd", "vanilla", 1.0, 0.0, True)
    assert used == ["flash"] and out.shape == (1, 8, 2, 16)
    assert bool(jnp.all(out == 1))  # v is all ones: any convex combination of it is 1


def test_te_dtypes_and_value_strings_are_accepted(monkeypatch):
    set_mode(monkeypatch, "auto")
    got = tex.get_fused_attn_backend(True, TEDType.kBFloat16, TEDType.kBFloat16, "bshd_bshd_bshd",
                                     "no_bias", "causal", "vanilla", 0.0, 4, 4, 128, 128, 64, 64,
                                     -1, -1, False)
    assert got is Backend.NVTE_F16_arbitrary_seqlen


def test_window_size_checked():
    with pytest.raises(ValueError, match="window_size"):
        _helper(window=(-1,)).get_fused_attn_backend()


@pytest.mark.parametrize("value, expect", [("1", True), ("0", False), (None, True)])
def test_is_non_deterministic_allowed(value, expect, monkeypatch):
    if value is None:
        monkeypatch.delenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", raising=False)
    else:
        monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", value)
    assert tex.FusedAttnHelper.is_non_deterministic_allowed() is expect


def test_is_non_deterministic_allowed_bad_value(monkeypatch):
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "yes")
    with pytest.raises(ValueError, match="NVTE_ALLOW_NONDETERMINISTIC_ALGO"):
        tex.FusedAttnHelper.is_non_deterministic_allowed()


# ------------------------------------------------------------------ device compute capability
def test_compute_capability_of_host_devices_is_zero():
    if jax.default_backend() != "cpu":
        pytest.skip("checks the host backend's answer")
    n = len(jax.local_devices())
    assert misc.get_device_compute_capability(0) == 0
    assert misc.get_min_device_compute_capability() == 0
    assert misc.get_all_device_compute_capability() == (0,) * n


@pytest.mark.parametrize("gpu_id", [-1, 10**6, "0", True, 0.0])
def test_compute_capability_bad_gpu_id(gpu_id):
    with pytest.raises(ValueError, match="argument 'gpu_id'"):
        misc.get_device_compute_capability(gpu_id)


# ------------------------------------------------------------------ run_length_fill
def test_run_length_fill_matches_te_example():
    ids = jnp.array([[1, 1, 2, 2, 2, 0, 3, 0, 4, 4, 4, 4, 4, 0, 0, 0],
                     [1, 0, 0, 2, 2, 2, 0, 0, 3, 3, 4, 4, 4, 4, 0, 0]], jnp.int32)
    want = [[2, 2, 3, 3, 3, 0, 1, 0, 5, 5, 5, 5, 5, 0, 0, 0],
            [1, 0, 0, 3, 3, 3, 0, 0, 2, 2, 4, 4, 4, 4, 0, 0]]
    got = A.run_length_fill(ids)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == jnp.int32


def test_run_length_fill_keeps_leading_dims():
    ids = jnp.array([[[1, 1, 0], [2, 3, 3]]], jnp.int32)  # [1, 2, 3]
    np.testing.assert_array_equal(A.run_length_fill(ids), [[[2, 2, 0], [1, 2, 2]]])
