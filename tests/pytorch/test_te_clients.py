"""What unmodified TE clients (Megatron-Core, HF accelerate) call: the `transformer_engine` alias
(transformer_engine_lite.as_te and the TE_LITE_AS_TRANSFORMER_ENGINE startup hook) and the TE API
they use that our own suites did not (issue #22)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import transformer_engine_lite.pytorch as te
from transformer_engine_lite import as_te
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    NVFP4BlockScaling,
    QParams,
)
from transformer_engine_lite.pytorch import fp8 as te_fp8
from transformer_engine_lite.pytorch.distributed import (
    activation_recompute_forward,
    in_fp8_activation_recompute_phase,
    is_fp8_activation_recompute_enabled,
)


def _run(code: str, env_extra: dict[str, str] | None = None, cwd: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "TE_LITE_AS_TRANSFORMER_ENGINE"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------- the alias
@pytest.fixture
def alias():
    assert as_te.install()
    yield
    as_te.uninstall()


def test_alias_maps_modules_to_ours(alias):
    import importlib

    import transformer_engine
    import transformer_engine.pytorch as tep
    import transformer_engine_torch
    from transformer_engine.common.recipe import DelayedScaling as TEDelayed
    from transformer_engine.pytorch.module.base import TransformerEngineBaseModule

    assert transformer_engine.__version__ == as_te.TE_API_VERSION
    assert tep is te and transformer_engine.pytorch is te
    assert TEDelayed is DelayedScaling
    assert TransformerEngineBaseModule is te.module.base.TransformerEngineBaseModule
    assert transformer_engine_torch is importlib.import_module("transformer_engine_lite.pytorch.tex")
    # our modules keep their own names and specs (relative imports, pickling, torch.compile)
    assert te.__name__ == "transformer_engine_lite.pytorch"
    assert te.__spec__.name == "transformer_engine_lite.pytorch"
    r = pickle.loads(pickle.dumps(TEDelayed(margin=1)))
    assert type(r) is DelayedScaling and r.margin == 1
    with pytest.raises(ModuleNotFoundError, match="transformer_engine.pytorch.no_such_module"):
        import transformer_engine.pytorch.no_such_module  # noqa: F401
    # no fake distribution metadata
    import importlib.metadata

    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("transformer-engine")


def test_alias_off_by_default_and_uninstall():
    as_te.uninstall()
    with pytest.raises(ModuleNotFoundError):
        import transformer_engine  # noqa: F401
    r = _run("import transformer_engine")
    assert r.returncode != 0 and "No module named 'transformer_engine'" in r.stderr


def test_startup_hook_env_var():
    """TE_LITE_AS_TRANSFORMER_ENGINE=1: the .pth hook the install put in site-packages."""
    code = """
        import sys
        import transformer_engine, transformer_engine.pytorch as te
        from packaging.version import Version
        assert Version(transformer_engine.__version__) >= Version("2.0"), transformer_engine.__version__
        print(te.__name__, transformer_engine.__version__)
    """
    r = _run(code, {"TE_LITE_AS_TRANSFORMER_ENGINE": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["transformer_engine_lite.pytorch", as_te.TE_API_VERSION]
    r0 = _run(code, {"TE_LITE_AS_TRANSFORMER_ENGINE": "0"})
    assert r0.returncode != 0 and "No module named 'transformer_engine'" in r0.stderr


def test_real_te_is_never_shadowed(tmp_path):
    real = tmp_path / "transformer_engine"
    real.mkdir()
    (real / "__init__.py").write_text("__version__ = 'real'\n")
    code = """
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import transformer_engine_lite.as_te as a
        import transformer_engine
        assert transformer_engine.__version__ == "real"
        assert not a.is_installed()
        assert any("real TransformerEngine is installed" in str(x.message) for x in w), w
        print("ok")
    """
    r = _run(code, {"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# ---------------------------------------------------------------- activation_recompute_forward
def test_activation_recompute_forward_reuses_forward_scales():
    """Megatron's CheckpointWithoutOutput: forward inside (True, False), recompute inside (True,
    True) under its own fp8_autocast, after the scales were updated: same output, no amax
    recorded by the recompute."""
    torch.manual_seed(0)
    lin = te.Linear(32, 32, params_dtype=torch.float32)
    recipe = DelayedScaling(amax_history_len=4)
    x = torch.randn(8, 32)
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        lin(x * 7.0)  # a first step: scales move after this autocast
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        with activation_recompute_forward(activation_recompute=True, recompute_phase=False):
            assert is_fp8_activation_recompute_enabled()
            y = lin(x)
    scale_after = lin.fp8_fwd_scale.clone()
    history_after = lin.fp8_fwd_amax_history.clone()
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        lin(x * 100.0)  # another step in between: the scales change again
    history_mid = lin.fp8_fwd_amax_history.clone()
    with activation_recompute_forward(activation_recompute=True, recompute_phase=True):
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
            assert in_fp8_activation_recompute_phase()
            y_re = lin(x)
    assert torch.equal(y, y_re)
    assert not torch.equal(lin.fp8_fwd_scale, scale_after) or not torch.equal(
        history_mid, history_after)
    assert torch.equal(lin.fp8_fwd_amax_history, history_mid)  # the recompute recorded nothing
    with activation_recompute_forward(activation_recompute=True, recompute_phase=True):
        with te.fp8_autocast(enabled=True, fp8_recipe=recipe), pytest.raises(RuntimeError, match="no forward scales"):
            lin(x)
    with activation_recompute_forward(activation_recompute=False):  # a no-op
        lin(x)
    with pytest.raises(TypeError, match="activation_recompute"):
        with activation_recompute_forward(activation_recompute=1):
            pass


# ---------------------------------------------------------------- module and recipe arguments
def test_norm_normalized_shape():
    for cls in (te.LayerNorm, te.RMSNorm):
        n = cls(normalized_shape=16)
        assert n.normalized_shape == (16,) and n.hidden_size == 16 and n.weight.shape == (16,)
        assert cls((8,)).normalized_shape == (8,)
        assert cls(hidden_size=4).normalized_shape == (4,)
        assert cls(8, dtype=torch.bfloat16).weight.dtype == torch.bfloat16
        with pytest.raises(TypeError, match="exactly one of normalized_shape and hidden_size"):
            cls()
        with pytest.raises(TypeError, match="exactly one"):
            cls(8, hidden_size=8)
        with pytest.raises(NotImplementedError, match="normalized_shape"):
            cls((4, 8))


def test_delayed_scaling_te1_keywords():
    with pytest.warns(DeprecationWarning, match="override_linear_precision, interval"):
        r = DelayedScaling(fp8_format=Format.HYBRID, override_linear_precision=(False, False, False),
                           interval=1, params_dtype=torch.bfloat16, device="cpu")
    assert r.amax_history_len == 1024 and "interval" not in vars(r)
    with pytest.raises(NotImplementedError, match="override_linear_precision"):
        DelayedScaling(override_linear_precision=(False, False, True))
    with pytest.raises(TypeError, match="override_linear_precision"):
        DelayedScaling(override_linear_precision=[False, False])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DelayedScaling()  # no legacy keyword: no warning


def test_float8_block_scaling_recipe(monkeypatch):
    r = Float8BlockScaling()
    assert r.float8_block_scaling() and not r.delayed() and not r.mxfp8()
    assert r.fp8_format == Format.E4M3
    assert (r.x_block_scaling_dim, r.w_block_scaling_dim, r.grad_block_scaling_dim) == (1, 2, 1)
    assert r.fp8_quant_fwd_inp == QParams(power_2_scale=True, amax_epsilon=0.0)
    monkeypatch.setenv("NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "1")
    r32 = Float8BlockScaling()
    assert r32.use_f32_scales and not r32.fp8_quant_fwd_weight.power_2_scale
    with pytest.raises(ValueError, match="2D-by-2D"):
        Float8BlockScaling(x_block_scaling_dim=2)
    with pytest.raises(ValueError, match="x_block_scaling_dim"):
        Float8BlockScaling(x_block_scaling_dim=3)
    with pytest.raises(ValueError, match="fp8_dpa"):
        Float8BlockScaling(fp8_dpa=True)
    lin = te.Linear(16, 16)
    with te.fp8_autocast(enabled=True, fp8_recipe=r):
        y = lin(torch.randn(2, 16))
    assert y.shape == (2, 16) and torch.isfinite(y).all()
    assert te_fp8.check_fp8_block_scaling_support() == (True, "")


def test_check_support_functions():
    assert te_fp8.check_fp8_support() == (True, "")
    assert te_fp8.check_mxfp8_support() == (True, "")
    assert te_fp8.check_nvfp4_support() == (True, "")
    te_fp8.check_recipe_support(Float8CurrentScaling())
    te_fp8.check_recipe_support(Float8BlockScaling())
    te_fp8.check_recipe_support(NVFP4BlockScaling())


@pytest.mark.parametrize("mode", [None, "column", "row"])
def test_tensor_parallel_attributes(mode):
    """TE tags weights (and column-parallel biases) for Megatron's grad-norm / clipping."""
    def tags(p):
        return (p.tensor_model_parallel, p.partition_dim, p.partition_stride)

    dim = 1 if mode == "row" else 0
    mods = [te.Linear(8, 16, parallel_mode=mode), te.GroupedLinear(2, 8, 16, parallel_mode=mode)]
    if mode != "row":  # LayerNormLinear has no row-parallel mode here
        mods.append(te.LayerNormLinear(8, 16, parallel_mode=mode))
    for mod in mods:
        weights = [p for n, p in mod.named_parameters() if "weight" in n and "layer_norm" not in n]
        assert weights and all(tags(w) == (True, dim, 1) for w in weights), type(mod).__name__
        biases = [p for n, p in mod.named_parameters() if "bias" in n and "layer_norm" not in n]
        for b in biases:
            assert (tags(b) == (True, 0, 1)) if mode == "column" else not hasattr(
                b, "tensor_model_parallel")
    mlp = te.LayerNormMLP(8, 32)
    assert tags(mlp.fc1_weight) == (True, 0, 1) and tags(mlp.fc2_weight) == (True, 1, 1)
    assert tags(mlp.fc1_bias) == (True, 0, 1) and not hasattr(mlp.fc2_bias, "tensor_model_parallel")


def test_ub_name_is_a_label():
    te.GroupedLinear(2, 8, 8, ub_name="fc1")
    te.Linear(8, 8, ub_name="proj")
    with pytest.raises(TypeError, match="ub_name"):
        te.Linear(8, 8, ub_name=3)
    te.Linear(8, 8, ub_name="proj", ub_overlap_rs=True)  # TE: inert without sequence parallel
    with pytest.raises(RuntimeError, match="initialize_ub"):
        te.Linear(8, 8, ub_name="proj", ub_overlap_rs=True, parallel_mode="row", tp_size=2,
                  sequence_parallel=True)


def test_input_dtype_must_match_parameters():
    lin = te.Linear(8, 8, params_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="input dtype torch.float32 differs from parameter 'weight'"):
        lin(torch.randn(2, 8))
    assert lin(torch.randn(2, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast the autocast dtype rules
        assert lin(torch.randn(2, 8)).dtype == torch.bfloat16


# ---------------------------------------------------------------- smaller TE names clients import
def test_constants_and_module_paths():
    from transformer_engine_lite.pytorch import constants, tex
    from transformer_engine_lite.pytorch.float8_tensor import Float8Tensor
    from transformer_engine_lite.pytorch.tensor import Float8Tensor as F8

    assert Float8Tensor is F8
    assert constants.TE_DType[torch.bfloat16] == tex.DType.kBFloat16 == 6
    assert constants.TE_DType_To_Torch[tex.DType.kFloat8E4M3] is torch.float8_e4m3fn
    assert constants.MXFP8_BLOCK_SCALING_SIZE == 32 and constants.NVFP4_BLOCK_SCALING_SIZE == 16
    assert len(constants.QKVLayouts) == 25 and constants.QKVLayouts[2] == "sbhd_sb2hd"
    assert constants.QKVLayouts[-1] == "paged_kv_thd_sbhd_sbhd"
    assert constants.dist_group_type is torch.distributed.ProcessGroup


def test_graph_helpers_save_and_restore_fp8_state():
    from transformer_engine_lite.pytorch import graph

    graph.set_capture_start()
    assert graph.is_graph_capturing()
    graph.set_capture_end()
    assert not graph.is_graph_capturing()
    model = torch.nn.Sequential(te.Linear(16, 16), torch.nn.ReLU(), te.Linear(16, 16))
    recipe = DelayedScaling(amax_history_len=4)
    assert graph.save_fp8_tensors([model], Float8CurrentScaling()) is None
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        model(torch.randn(4, 16))
    saved = graph.save_fp8_tensors([model], recipe)
    assert [s is None for s in saved] == [True, False, True, False]
    before = [model[0].fp8_fwd_scale.clone(), model[2].fp8_fwd_amax_history.clone()]
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):  # a warm-up step changes the state
        model(torch.randn(4, 16) * 50)
    assert not torch.equal(model[2].fp8_fwd_amax_history, before[1])
    graph.restore_fp8_tensors([model], saved)
    assert torch.equal(model[0].fp8_fwd_scale, before[0])
    assert torch.equal(model[2].fp8_fwd_amax_history, before[1])
    with pytest.raises(ValueError, match="fewer entries"):
        graph.restore_fp8_tensors([model], saved[:2])


def test_utils_workspace_and_rng_registry():
    from transformer_engine_lite.pytorch import utils
    from transformer_engine_lite.pytorch.distributed import CudaRNGStatesTracker, get_all_rng_states
    from transformer_engine_lite.pytorch.module.base import get_workspace

    assert get_workspace().numel() == 0 and get_workspace().dtype == torch.uint8
    assert utils.round_up_to_nearest_multiple(33, 16) == 48
    assert utils.round_up_to_nearest_multiple(32, 16) == 32
    with pytest.raises(ValueError, match="multiple"):
        utils.round_up_to_nearest_multiple(3, 0)
    utils.nvtx_range_push("outer")
    utils.nvtx_range_pop("outer")
    with pytest.raises(RuntimeError, match="no range is open"):
        utils.nvtx_range_pop()
    x = torch.randn(3, requires_grad=True) * 2
    w = utils.make_weak_ref({"a": [x, None]})
    assert w["a"][0].data_ptr() == x.data_ptr() and not w["a"][0].requires_grad
    tracker = CudaRNGStatesTracker()
    tracker.add("te-test-rng", 1234)
    state = get_all_rng_states()["te-test-rng"]
    with tracker.fork("te-test-rng"):
        torch.rand(4)
    assert not torch.equal(get_all_rng_states()["te-test-rng"], state)  # follows the tracker


def test_cpu_offload_context():
    from transformer_engine_lite.pytorch import cpu_offload

    lin = te.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    ref = lin(lin(x)).square().sum()
    ref.backward()
    gx, gw = x.grad.clone(), lin.weight.grad.clone()
    x.grad, lin.weight.grad = None, None
    # TE's v2 schedule: model_layers forwards, each in the context, then the backward
    with pytest.warns(UserWarning, match="not recommended"):
        ctx, sync = cpu_offload.get_cpu_offload_context(enabled=True, num_layers=1, model_layers=2)
    y = x
    for _ in range(2):
        with ctx:
            assert cpu_offload.is_cpu_offload_enabled()
            y = lin(y)
        y = sync(y)
    assert not cpu_offload.is_cpu_offload_enabled()
    y.square().sum().backward()
    assert torch.equal(x.grad, gx) and torch.equal(lin.weight.grad, gw)
    with pytest.raises(ValueError, match="what to offload"):
        cpu_offload.get_cpu_offload_context(True, offload_activations=False, offload_weights=False)
    with pytest.raises(ValueError, match="Cannot offload all layers"):
        cpu_offload.get_cpu_offload_context(True, num_layers=1, model_layers=1)
    with pytest.warns(DeprecationWarning, match="Offloading weights is deprecated"):
        ctx, sync = cpu_offload.get_cpu_offload_context(
            True, offload_weights=True, offload_activations=False)
    # host tensors stay where they are (tests/pytorch/test_cpu_offload.py: the copies)
    assert sync(x) is x


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_apply_fused_qkv_rotary_pos_emb(fmt):
    """Megatron's fused-QKV RoPE: 2 groups of 3 query heads + 1 key + 1 value head (GQA), head 16,
    rotating the first 8 features; q/k/v equal splitting then rotating each with its own freqs."""
    from transformer_engine_lite.pytorch.attention.rope import (
        apply_fused_qkv_rotary_pos_emb,
        apply_rotary_pos_emb,
    )

    torch.manual_seed(0)
    s, b, g, hd = 6, 2, 2, 16
    lead = (s, b) if fmt == "sbhd" else (b, s)
    qkv = torch.randn(*lead, g, 5 * hd, requires_grad=True)
    qf, kf = te.RotaryPositionEmbedding(8)(s), te.RotaryPositionEmbedding(8, rotary_base=500)(s)
    q, k, v = apply_fused_qkv_rotary_pos_emb(qkv, qf, kf, [3 * hd, hd, hd], tensor_format=fmt)
    q0, k0, v0 = torch.split(qkv, [3 * hd, hd, hd], dim=-1)
    q_ref = apply_rotary_pos_emb(q0.reshape(*lead, 3 * g, hd), qf, fmt)
    k_ref = apply_rotary_pos_emb(k0, kf, fmt)
    assert q.shape == (*lead, 3 * g, hd) and k.shape == (*lead, g, hd) and v.shape == (*lead, g, hd)
    torch.testing.assert_close(q, q_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k, k_ref, rtol=1e-6, atol=1e-6)
    assert torch.equal(v, v0)
    (q.sum() + 2 * k.sum() + 3 * v.sum()).backward()
    g_fused = qkv.grad.clone()
    qkv.grad = None
    (q_ref.sum() + 2 * k_ref.sum() + 3 * v0.sum()).backward()
    torch.testing.assert_close(g_fused, qkv.grad, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="qkv_split_arg_list"):
        apply_fused_qkv_rotary_pos_emb(qkv, qf, kf, [3 * hd, hd, hd + 1])
    # start_positions are integer offsets (tests/pytorch/test_rope.py covers them): floats are not.
    with pytest.raises(ValueError, match="start_positions must be an integer"):
        apply_fused_qkv_rotary_pos_emb(qkv, qf, kf, [3 * hd, hd, hd], start_positions=torch.zeros(b))
