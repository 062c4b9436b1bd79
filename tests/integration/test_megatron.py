"""Megatron-Core, unmodified (megatron-core 0.19.2 from PyPI), trains its GPTModel with the TE layer
spec on transformer_engine_lite through the `transformer_engine` alias (issue #22). Each run is
tests/integration/megatron_gpt.py in its own process; it names the Megatron CUDA-only spots it
patches. What is compared:
- fp32: the TE spec's losses equal Megatron's local (pure-torch) spec's on the same weights and data
  (rtol 1e-6: the attention and norm kernels round differently from torch's in the last bits);
- activation recompute (full, uniform) changes nothing (exact);
- bf16 and each FP8 recipe Megatron offers: finite, decreasing, and close to fp32 / bf16;
  blockwise (Float8BlockScaling) included; fp8_dot_product_attention (FP8 attention) under the
  delayed and tensorwise recipes: the attention runs in FP8 and the losses stay close to bf16;
- MoE with grouped GEMM and TE's fused router (our router functions are called);
- use_te_op_fuser: the MLP as TE fusible ops (ops.Sequential runs) equals the module MLP;
- cross_entropy_loss_fusion with the "te" impl: TE's parallel_cross_entropy (ours) gives the losses
  of Megatron's unfused vocab-parallel cross entropy, at TP=1 and vocab-parallel at TP=2;
- TP=2 with sequence parallelism under torchrun (gloo): the losses of TP=1; with Megatron's
  --tp-comm-overlap (Userbuffers: initialize_ub, ub_* flags, the fusible ops' Userbuffers
  fusions): exactly the losses without it;
- FP8 weights under ZeRO (what Megatron's distributed optimizer does with fp8_param_gather, through
  Megatron's own fp8_utils.quantize_param_shard / post_all_gather_processing -> TE's
  cast_master_weights_to_fp8): DP=2 gives exactly the losses of DP=1, for each FP8 recipe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is installed by ci/install_deps.sh")

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "megatron_gpt.py"
_CACHE: dict[tuple[str, ...], dict] = {}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TE_LITE_AS_TRANSFORMER_ENGINE"}
    env["PYTHONWARNINGS"] = "ignore"
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "2")
    return env


def _result(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, out[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def run(*args: str, nproc: int = 1) -> dict:
    """Losses of one configuration (cached: several tests compare the same runs)."""
    key = (str(nproc), *args)
    if key not in _CACHE:
        if nproc == 1:
            cmd = [sys.executable, str(SCRIPT), *args]
        else:
            port = str(29700 + os.getpid() % 200)
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                   f"--master_port={port}", str(SCRIPT), *args]
        p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
        _CACHE[key] = _result(p.stdout)
    return _CACHE[key]


def _close(a: list[float], b: list[float], rtol: float) -> bool:
    return all(abs(x - y) <= rtol * abs(y) for x, y in zip(a, b, strict=True))


def test_te_spec_equals_local_spec_fp32():
    te, local = run("--spec", "te"), run("--spec", "local")
    assert _close(te["losses"], local["losses"], 1e-6), (te["losses"], local["losses"])
    assert te["losses"][-1] < te["losses"][0]
    # the TE spec really ran on our modules
    assert {"LayerNormLinear", "Linear", "DotProductAttention"} <= set(te["te_lite_modules"])
    assert not {"LayerNormLinear", "Linear", "DotProductAttention"} & set(local["te_lite_modules"])


def test_recompute_changes_nothing():
    assert run("--recompute")["losses"] == run("--spec", "te")["losses"]
    fp8 = ("--dtype", "bf16", "--fp8", "delayed")
    assert run(*fp8, "--recompute")["losses"] == run(*fp8)["losses"]


def test_bf16_tracks_fp32():
    bf16, fp32 = run("--dtype", "bf16")["losses"], run("--spec", "te")["losses"]
    assert _close(bf16, fp32, 2e-3), (bf16, fp32)


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "mxfp8"])
def test_fp8_recipes_track_bf16(recipe):
    fp8, bf16 = run("--dtype", "bf16", "--fp8", recipe)["losses"], run("--dtype", "bf16")["losses"]
    assert fp8[-1] < fp8[0] - 0.3, fp8
    assert _close(fp8, bf16, 1e-2), (recipe, fp8, bf16)


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fp8_dot_product_attention(recipe):
    # Megatron's fp8_dot_product_attention sets the recipe's fp8_dpa: TE's FP8 attention
    r = run("--dtype", "bf16", "--fp8", recipe, "--fp8-dpa")
    assert r["calls"]["fp8_attention"] == 2 * 3, r["calls"]  # 2 layers x 3 steps
    fp8 = r["losses"]
    assert fp8 != run("--dtype", "bf16", "--fp8", recipe)["losses"]  # the attention changed
    assert fp8[-1] < fp8[0] - 0.3, fp8
    assert _close(fp8, run("--dtype", "bf16")["losses"], 1e-2), (recipe, fp8)


def test_fp8_params():
    # FP8 weights updated in place by a plain SGD (no master copy, which Megatron's distributed
    # optimizer would keep): it trains, near the bf16 run
    fp8p = run("--dtype", "bf16", "--fp8", "delayed", "--fp8-param")["losses"]
    assert fp8p[-1] < fp8p[0] - 0.3, fp8p
    assert _close(fp8p, run("--dtype", "bf16")["losses"], 5e-2), fp8p


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "mxfp8"])
def test_zero_fp8_param_gather_dp2_equals_dp1(recipe):
    # each rank steps its fp32 master piece and writes its piece's FP8 bytes; gathered, they are
    # the bytes of the whole weights: DP=2 == DP=1 exactly (same data on both ranks)
    args = ("--dtype", "bf16", "--fp8", recipe, "--fp8-param", "--zero")
    one, two = run(*args), run(*args, nproc=2)
    assert one["calls"]["cast_master_weights_to_fp8"] == 3, one["calls"]
    assert one["calls"]["post_all_gather_processing"] == 3, one["calls"]
    assert two["losses"] == one["losses"], (two["losses"], one["losses"])
    assert one["losses"][-1] < one["losses"][0] - 0.3, one["losses"]
    assert _close(one["losses"], run("--dtype", "bf16")["losses"], 5e-2), one["losses"]


def test_blockwise_recipe_trains():
    # Megatron's fp8_recipe=blockwise: TE's Float8BlockScaling (1x128 / 128x128 blocks)
    r = run("--dtype", "bf16", "--fp8", "blockwise")
    assert r["losses"][-1] < r["losses"][0] - 0.3, r["losses"]
    assert _close(r["losses"], run("--dtype", "bf16")["losses"], 5e-2), r["losses"]


def test_moe_grouped_gemm_with_fused_router():
    r = run("--moe")
    assert "GroupedLinear" in r["te_lite_modules"]
    assert r["calls"].get("fused_topk_with_score_function", 0) >= 2 * 3  # 2 layers x 3 steps
    assert r["losses"][-1] < r["losses"][0]
    fp8 = run("--moe", "--dtype", "bf16", "--fp8", "delayed")["losses"]
    assert _close(fp8, run("--moe", "--dtype", "bf16")["losses"], 1e-2), fp8


def test_moe_fused_permutation():
    """moe_permute_fusion: Megatron permutes tokens with TE's moe_permute / moe_unpermute: the
    losses of its own (unfused) permutation."""
    r = run("--moe", "--permute-fusion")
    assert r["calls"].get("moe_permute", 0) + r["calls"].get("moe_permute_with_probs", 0) >= 6
    assert r["calls"].get("moe_unpermute", 0) >= 6, r["calls"]
    assert _close(r["losses"], run("--moe")["losses"], 1e-6), r["losses"]


def test_op_fuser_mlp():
    """use_te_op_fuser: Megatron's TEFusedMLP runs TE's fusible ops (ops.Sequential)."""
    r = run("--op-fuser")
    assert r["calls"].get("ops.Sequential", 0) >= 2 * 3, r["calls"]  # 2 layers x 3 steps
    assert _close(r["losses"], run("--spec", "te")["losses"], 1e-6), r["losses"]
    fp8 = run("--op-fuser", "--dtype", "bf16", "--fp8", "delayed")["losses"]
    assert _close(fp8, run("--dtype", "bf16", "--fp8", "delayed")["losses"], 1e-2), fp8


def test_te_cross_entropy_fusion():
    """cross_entropy_fusion_impl="te": Megatron's loss is TE's parallel_cross_entropy (ours), with
    the losses of its own vocab_parallel_cross_entropy; at TP=2 the vocab is split over 2 ranks."""
    r = run("--ce-fusion")
    assert r["calls"].get("parallel_cross_entropy", 0) >= 3, r["calls"]  # once per step
    assert _close(r["losses"], run("--spec", "te")["losses"], 1e-6), r["losses"]
    tp2 = run("--tp", "2", "--ce-fusion", nproc=2)
    assert tp2["calls"].get("parallel_cross_entropy", 0) >= 3, tp2["calls"]
    assert _close(tp2["losses"], run("--spec", "te")["losses"], 1e-6), tp2["losses"]


def test_tensor_parallel_2_with_sequence_parallel_equals_tp1():
    tp2 = run("--tp", "2", nproc=2)["losses"]
    tp1 = run("--spec", "te")["losses"]
    assert _close(tp2, tp1, 1e-6), (tp2, tp1)


@pytest.mark.parametrize("extra", [(), ("--fp8", "tensorwise"), ("--op-fuser",)],
                         ids=["modules", "fp8", "op_fuser"])
def test_tp_comm_overlap_equals_tp2(extra):
    """Megatron's --tp-comm-overlap (initialize_ub + the TE layers' ub_* flags, or
    userbuffers_options on the fusible-ops MLP): the same losses, bit for bit, as TP=2 with
    sequence parallelism without it; every ub layer (qkv, proj, fc1, fc2) has the overlap on."""
    ub = run("--tp", "2", "--tp-comm-overlap", *extra, nproc=2)
    assert ub["ub_layers"] == ["fc1", "fc2", "proj", "qkv"], ub
    if extra == ("--op-fuser",):
        assert ub["calls"].get("UserbuffersForwardLinear", 0) >= 4, ub["calls"]
        assert ub["calls"].get("UserbuffersBackwardLinear", 0) >= 4, ub["calls"]
    assert ub["losses"] == run("--tp", "2", *extra, nproc=2)["losses"]


def test_example_trains(tmp_path):
    """examples/megatron/train_gpt.py (the README's showcase) at smoke size."""
    example = HERE.parents[1] / "examples" / "megatron" / "train_gpt.py"
    out = tmp_path / "loss.png"
    p = subprocess.run([sys.executable, str(example), "--quick", "--steps", "4", "--recipes",
                        "bf16,delayed", "--no-progress", "--out", str(out)], env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "FP8 DelayedScaling" in p.stdout and out.stat().st_size > 0
