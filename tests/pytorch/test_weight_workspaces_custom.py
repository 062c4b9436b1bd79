"""TE's cached weight casts (module._fp8_workspaces, module/_weight_workspace.py) under a
CustomRecipe (the weight quantizer's own tensor: a HybridQuantizedTensor for a HybridQuantizer,
refreshed in place; a reference quantizer's storage) and TE's FSDP2 rule (Linear,
LayerNormLinear and LayerNormMLP cache nothing under fully_shard, GroupedLinear still caches).
Helpers shared with test_weight_workspaces.py."""

from __future__ import annotations

import pytest
import torch

import transformer_engine_lite.pytorch as te
from test_weight_workspaces import BF16, HIDDEN, MODULES, _build, _snapshot, _step


# ----------------------------------------------------------------- CustomRecipe / hybrid
def _hybrid_factory(role):
    """Weights and inputs: HybridQuantizer (MXFP8 row-wise, FP8 current scaling column-wise);
    grads: FP8 E5M2 current scaling (each GEMM's operands share a format)."""
    from transformer_engine_lite.pytorch.tensor import (
        Float8CurrentScalingQuantizer,
        HybridQuantizer,
        MXFP8Quantizer,
    )

    e4m3, e5m2 = te.DType.kFloat8E4M3, te.DType.kFloat8E5M2
    if role is not None and role.tensor_type in ("input", "weight"):
        return HybridQuantizer(rowwise_quantizer=MXFP8Quantizer(e4m3),
                               columnwise_quantizer=Float8CurrentScalingQuantizer(e4m3))
    if role is not None and role.tensor_type == "grad_output":
        return Float8CurrentScalingQuantizer(e5m2)
    return MXFP8Quantizer(e4m3)


def _ref_factory(role):
    """Custom (reference) quantizers in every slot: their GEMMs run the reference qgemm."""
    from transformer_engine_lite.pytorch.custom_recipes.reference_current_scaling import (
        CurrentScalingQuantizerRef,
    )

    grad = role is not None and role.tensor_type == "grad_output"
    return CurrentScalingQuantizerRef(torch.float8_e5m2 if grad else torch.float8_e4m3fn)


@pytest.mark.parametrize("module", ["Linear", "LayerNormMLP", "GroupedLinear"])
def test_hybrid_weight_is_cached_refreshed_in_place_and_exact(module):
    """TE's quantize_weight with a HybridQuantizer: a HybridQuantizedTensor per weight key,
    refreshed in place (each direction's buffers keep their addresses), and cached microbatches
    equal uncached ones bit for bit."""
    from transformer_engine_lite.common.recipe import CustomRecipe
    from transformer_engine_lite.pytorch.tensor import HybridQuantizedTensor

    rec = CustomRecipe(qfactory=_hybrid_factory)
    cached, plain = _build(module), _build(module)
    xs = [torch.randn(32, HIDDEN, dtype=BF16) for _ in range(3)]
    ys = []
    for i, x in enumerate(xs):
        ys.append((_step(cached, rec, x, i == 0), _step(plain, rec, x, None)))
    assert sorted(cached._fp8_workspaces) == sorted(MODULES[module][1])
    for ws in cached._fp8_workspaces.values():
        assert type(ws) is HybridQuantizedTensor
        assert ws._rowwise_storage is not None and ws._columnwise_storage is not None
    for i, ((y, dx), (y_ref, dx_ref)) in enumerate(ys):
        assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref), f"microbatch {i}"
    for (n, p), (_, q) in zip(cached.named_parameters(), plain.named_parameters()):
        assert torch.equal(p.grad, q.grad), n
    before = _snapshot(cached)
    with torch.no_grad():
        for m in (cached, plain):
            for p in m.parameters():
                p.mul_(0.5).add_(0.03)
    y, dx = _step(cached, rec, xs[0], True)
    y_ref, dx_ref = _step(plain, rec, xs[0], None)
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    after = _snapshot(cached)
    for key, bufs in before.items():
        assert {n: p for n, (p, _) in after[key].items()} == {n: p for n, (p, _) in bufs.items()}
        assert any(not torch.equal(after[key][n][1], old) for n, (_, old) in bufs.items())


@pytest.mark.parametrize("factory", ["hybrid", "reference"])
def test_custom_gemm_reads_the_cached_weight(factory):
    """is_first_microbatch=False: the GEMMs read the cached cast, not the weight (TE's contract:
    the weight does not change in between), so a changed weight is not seen until a refresh."""
    from transformer_engine_lite.common.recipe import CustomRecipe

    rec = CustomRecipe(qfactory=_hybrid_factory if factory == "hybrid" else _ref_factory)
    cached, plain = _build("Linear"), _build("Linear")
    x = torch.randn(32, HIDDEN, dtype=BF16)
    _step(cached, rec, x, True)
    with torch.no_grad():
        cached.weight.mul_(0.5)
    y, dx = _step(cached, rec, x, False)
    y_ref, dx_ref = _step(plain, rec, x, None)  # the old weight
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    y, dx = _step(cached, rec, x, True)
    assert not torch.equal(y, y_ref)


def test_hybrid_inference_refresh_rewrites_both_directions():
    """A refresh under no_grad (row-wise use only) still rewrites the cached column-wise
    direction, so a later training microbatch's dgrad reads the new weight."""
    from transformer_engine_lite.common.recipe import CustomRecipe

    rec = CustomRecipe(qfactory=_hybrid_factory)
    cached, plain = _build("Linear"), _build("Linear")
    x = torch.randn(32, HIDDEN, dtype=BF16)
    _step(cached, rec, x, True)
    with torch.no_grad():
        for m in (cached, plain):
            m.weight.mul_(0.5)
        with te.autocast(recipe=rec):
            cached(x, is_first_microbatch=True)
    y, dx = _step(cached, rec, x, False)
    y_ref, dx_ref = _step(plain, rec, x, None)
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)


def test_custom_reference_weight_cast_is_cached_and_exact():
    """A CustomRecipe of reference quantizers caches the weight quantizer's own tensor (TE's
    quantize_weight): reused on later microbatches, re-made on a refresh (the reference quantizer
    has no in-place update), outputs and gradients equal uncached ones bit for bit."""
    from transformer_engine_lite.common.recipe import CustomRecipe
    from transformer_engine_lite.pytorch.custom_recipes.reference_current_scaling import (
        CurrentScalingTensorRef,
    )

    rec = CustomRecipe(qfactory=_ref_factory)
    cached, plain = _build("Linear"), _build("Linear")
    xs = [torch.randn(32, HIDDEN, dtype=BF16) for _ in range(2)]
    for i, x in enumerate(xs):
        y, dx = _step(cached, rec, x, i == 0)
        ws = cached._fp8_workspaces["weight"]
        assert type(ws) is CurrentScalingTensorRef
        if i:
            assert ws is first
        first = ws
        y_ref, dx_ref = _step(plain, rec, x, None)
        assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref), f"microbatch {i}"
    with torch.no_grad():
        for m in (cached, plain):
            m.weight.mul_(0.5)
    y, dx = _step(cached, rec, xs[0], True)
    y_ref, dx_ref = _step(plain, rec, xs[0], None)
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref)
    assert cached._fp8_workspaces["weight"] is not first
    assert torch.equal(cached.weight.grad, plain.weight.grad)


# ----------------------------------------------------------------- FSDP2
_FSDP2_SCRIPT = r"""
import sys, tempfile, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import Float8CurrentScaling

dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
bf16 = torch.bfloat16  # modules on the CPU, the mesh's device (a CUDA build defaults them to cuda)
torch.manual_seed(0)


class Root(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = te.Linear(128, 256, params_dtype=bf16, device="cpu")
        self.mlp = te.LayerNormMLP(128, 256, params_dtype=bf16, device="cpu")
        self.ln_lin = te.LayerNormLinear(128, 256, params_dtype=bf16, device="cpu")
        self.grouped = te.GroupedLinear(2, 128, 256, params_dtype=bf16, device="cpu")

    def forward(self, x, first):
        return (self.lin(x, is_first_microbatch=first).float().sum()
                + self.mlp(x, is_first_microbatch=first).float().sum()
                + self.ln_lin(x, is_first_microbatch=first).float().sum()
                + self.grouped(x, [16, 16], is_first_microbatch=first).float().sum())


root = Root()
lin, mlp, ln_lin, grouped = root.lin, root.mlp, root.ln_lin, root.grouped
alone = te.Linear(128, 256, params_dtype=bf16, device="cpu")
fully_shard(lin, mesh=mesh)  # a module wrapped itself ...
fully_shard(root, mesh=mesh)  # ... and ones wrapped through their parent only
x = torch.randn(32, 128, dtype=bf16)
with te.autocast(recipe=Float8CurrentScaling()):
    for first in (True, False):
        root(x, first).backward()
        alone(x, is_first_microbatch=first).float().sum().backward()
print("is_fsdp2", lin.is_fsdp2, mlp.is_fsdp2, ln_lin.is_fsdp2, grouped.is_fsdp2, alone.is_fsdp2)
print("keys", sorted(lin._fp8_workspaces), sorted(mlp._fp8_workspaces),
      sorted(ln_lin._fp8_workspaces), sorted(grouped._fp8_workspaces),
      sorted(alone._fp8_workspaces))
dist.destroy_process_group()
"""


def test_fsdp2_modules_cache_as_te():
    """TE's FSDP2 rule (module.is_fsdp2: the module or an ancestor under fully_shard): Linear,
    LayerNormLinear and LayerNormMLP cache no weight cast, GroupedLinear caches as without FSDP2.
    One process (gloo, world size 1) in a subprocess, leaving this one's default group alone."""
    import os
    import subprocess
    import sys

    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])  # this checkout's transformer_engine_lite
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", _FSDP2_SCRIPT], capture_output=True, text=True,
                         timeout=300, env=env, cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in res.stdout.splitlines() if " " in line)
    assert lines["is_fsdp2"] == "True True True True False"
    assert lines["keys"] == "[] [] [] ['weight0', 'weight1'] ['weight']"
