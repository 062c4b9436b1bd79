"""GPU against CPU, the JAX front end (ci/gpu_check.sh, step jax): each te_flax module initialised
once, then applied under jax.jit with its variables and inputs committed to the CPU and to the GPU
(so the XLA FFI GPU handlers run), forward + gradients of the inputs and of every parameter, in
bf16 and under each recipe, two steps (delayed scaling's second one uses the first one's amaxes);
compared with utils.TOLS: "bfloat16" without FP8, "fp8" under a recipe, the absolute part scaled
by max(1, max|cpu|) as the PyTorch table does.

Without a JAX GPU platform, a GPU build of the library or GPU handlers every test skips, so the CPU
suites stay green; GPU_CHECK_STRICT=1 (set by ci/gpu_check.sh) makes that a failure.
GPU_PARITY_DEVICE=cpu runs the "GPU" side on the CPU: a check of this file on a machine without
one (CPU against CPU must agree)."""

from __future__ import annotations

import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from utils import TOLS, randn

import transformer_engine_lite.jax as te
import transformer_engine_lite.jax.flax as te_flax
from transformer_engine_lite.common import build_info, recipe
from transformer_engine_lite.jax.cpp_extensions import base

DEVICE = os.environ.get("GPU_PARITY_DEVICE", "gpu")
BF16, F32 = jnp.bfloat16, jnp.float32
RECIPES = {
    "bf16": None,
    "delayed": lambda: recipe.DelayedScaling(amax_history_len=4),
    "current": recipe.Float8CurrentScaling,
    "mxfp8": recipe.MXFP8BlockScaling,
}
SWITCHES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_FUSED_ATTN_CK", "NVTE_FUSED_ATTN_AOTRITON")
FLASH_MODE = {"NVTE_FUSED_ATTN": "0", "NVTE_FUSED_ATTN_CK": "0", "NVTE_FUSED_ATTN_AOTRITON": "0"}


def _gpu_device():
    """(the device, None) or (None, why it cannot run here)."""
    if DEVICE == "cpu":
        return jax.devices("cpu")[0], None
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as e:
        return None, f"no JAX GPU platform ({e})"
    if not {"cuda", "rocm"} & set(build_info()["device_backends"]):
        return None, f"the library has no GPU backend ({build_info()['device_backends']})"
    if not any("gpu" in e for e in base.registrations().values()):
        return None, "the JAX front end has no GPU handlers in this build"
    return gpu, None


@pytest.fixture(params=[DEVICE])
def device(request):
    dev, why = _gpu_device()
    if why:
        if os.environ.get("GPU_CHECK_STRICT") == "1":
            pytest.fail(f"GPU_CHECK_STRICT=1 and the device side cannot run: {why}")
        pytest.skip(why)
    return dev


def _attn_mode(monkeypatch, mode: dict[str, str] | None) -> None:
    for k in SWITCHES:
        monkeypatch.delenv(k, raising=False)
    for k, v in (mode or {}).items():
        monkeypatch.setenv(k, v)


def _close(got, want, kind: str, what: str) -> None:
    rtol, atol = TOLS[kind]
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(w).max())) if w.size else 1.0
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * scale, err_msg=what)


def _first(out):
    return out[0] if isinstance(out, tuple) else out  # LayerNormMLP returns (out, ln_out)


# name -> (module, input shape [b, s, hidden], call keywords). Sizes are multiples of 32 (MXFP8
# blocks along either dimension).
DET = {"deterministic": True}
MODULES = {
    "DenseGeneral": (lambda: te_flax.DenseGeneral(96), (2, 32, 128), {}),
    "LayerNormMLP": (
        lambda: te_flax.LayerNormMLP(intermediate_dim=256, activations=("gelu", "linear")),
        (2, 32, 128),
        DET,
    ),
    "TransformerLayer": (
        lambda: te_flax.TransformerLayer(hidden_size=128, mlp_hidden_size=256,
                                         num_attention_heads=4, mlp_activations=("gelu", "linear"),
                                         hidden_dropout=0.0, attention_dropout=0.0),
        (2, 32, 128),
        DET,
    ),
}


def _steps(layer, kw, variables, xs, dys, rc, dev):
    """Two jitted forward + backward steps on `dev`; the FP8 state advanced between them by TE's
    gradient idiom. Returns [(out, dx, param grads)] per step, on the host."""
    cpu = jax.devices("cpu")[0]

    def loss(vs, x, dy):
        out = _first(layer.apply(vs, x, **kw))
        return jnp.sum(out.astype(F32) * dy), out

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    results = []
    with te.autocast(enabled=rc is not None, recipe=rc):
        vs = jax.device_put(variables, dev)
        for x, dy in zip(xs, dys):
            (_, out), (gvs, gx) = step(vs, jax.device_put(x, dev), jax.device_put(dy, dev))
            assert next(iter(out.devices())) == dev
            others, gparams = flax.core.pop(gvs, "params")
            results.append(jax.device_put((out, gx, gparams), cpu))
            vs = te.update_collections(others, vs)
    return results


@pytest.mark.parametrize("rc_name", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULES))
def test_module_matches_cpu(device, module, rc_name, monkeypatch):
    _attn_mode(monkeypatch, FLASH_MODE)
    make, shape, kw = MODULES[module]
    layer = make()
    rc = RECIPES[rc_name]() if RECIPES[rc_name] else None
    cpu = jax.devices("cpu")[0]
    xs = [randn(10 + i, shape, BF16) for i in range(2)]
    with jax.default_device(cpu), te.autocast(enabled=rc is not None, recipe=rc):
        variables = layer.init(jax.random.PRNGKey(3), xs[0], **kw)
        out_shape = _first(layer.apply(variables, xs[0], **kw)).shape
    dys = [randn(20 + i, out_shape, F32) for i in range(2)]
    want = _steps(layer, kw, variables, xs, dys, rc, cpu)
    got = _steps(layer, kw, variables, xs, dys, rc, device)
    kind = "bfloat16" if rc is None else "fp8"
    for i, ((o, dx, gp), (o_ref, dx_ref, gp_ref)) in enumerate(zip(got, want)):
        what = f"{module} {rc_name} step {i}"
        _close(o, o_ref, kind, f"{what}: output")
        _close(dx, dx_ref, kind, f"{what}: input grad")
        flat, flat_ref = (jax.tree_util.tree_leaves_with_path(t) for t in (gp, gp_ref))
        assert [p for p, _ in flat] == [p for p, _ in flat_ref]
        for (path, g), (_, g_ref) in zip(flat, flat_ref):
            _close(g, g_ref, kind, f"{what}: grad of {jax.tree_util.keystr(path)}")


# ------------------------------------------------------------------------------ attention
DPA_CASES = {"causal": ("causal", 4, 64), "gqa_no_mask": ("no_mask", 2, 128)}  # mask, h_kv, d


def _dpa(case: str, dev):
    mask, h_kv, d = DPA_CASES[case]
    b, s, h = 2, 97, 8 if h_kv == 2 else 4
    dpa = te_flax.DotProductAttention(head_dim=d, num_attention_heads=h, num_gqa_groups=h_kv,
                                      attn_mask_type=mask, transpose_batch_sequence=False)
    q = randn(1, (b, s, h, d), BF16)
    k, v = (randn(i, (b, s, h_kv, d), BF16) for i in (2, 3))
    dout = randn(4, (b, s, h, d), F32)

    def loss(q, k, v):
        out = dpa.apply({}, q, k, v, deterministic=True)
        return jnp.sum(out.astype(F32) * dout.reshape(out.shape)), out

    args = jax.device_put((q, k, v), dev)
    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(*args)
    assert next(iter(out.devices())) == dev
    return jax.device_put((out, *grads), jax.devices("cpu")[0])


def _check_dpa(case: str, dev) -> None:
    got, want = _dpa(case, dev), _dpa(case, jax.devices("cpu")[0])
    for name, a, b in zip(("output", "dq", "dk", "dv"), got, want):
        _close(a, b, "bfloat16", f"DotProductAttention {case}: {name}")


@pytest.mark.parametrize("case", list(DPA_CASES))
def test_dot_product_attention_flash_matches_cpu(device, case, monkeypatch):
    _attn_mode(monkeypatch, FLASH_MODE)
    _check_dpa(case, device)


def test_dot_product_attention_default_selection_runs(device, monkeypatch):
    """No switch set: whatever the selection picks on this device must run (on sm_90 with this
    build's AOTriton images that is aotriton for this case)."""
    _attn_mode(monkeypatch, None)
    _check_dpa("causal", device)


def test_tolerance_kinds_exist():
    # The kinds this file takes from the table: a renamed entry fails here, not on the GPU machine.
    assert {"bfloat16", "fp8"} <= TOLS.keys()
