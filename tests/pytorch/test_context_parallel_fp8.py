"""FP8 attention (recipe fp8_dpa / fp8_mha) with context parallelism 'a2a', 2 and 4 gloo processes
against one process's FP8 attention, bit for bit.

With 'a2a' every rank runs one process's FP8 attention (the unfused backend's quantization
points, fp8_attention.py) on its share of heads over the whole sequence, and every point's amax
is the max over the CP group (TE reduces FP8 amaxes over the CP group likewise), so each point's
scale, hence every FP8 byte, equals one process's: output, dq / dk / dv, the Float8Tensor output
(fp8_output, TE's fp8_mha), and under DelayedScaling the amax history the step recorded.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch
import torch.distributed as dist
from test_context_parallel import _shard, _spawn

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import DelayedScaling, Float8CurrentScaling

B, H, HKV, D = 2, 4, 4, 16
SEQ = {2: 12, 4: 16}
# (name, recipe, mask, fmt, fp8_output)
CASES = [
    ("delayed_causal_bshd", "delayed", "causal", "bshd", False),
    ("current_nomask_sbhd", "current", "no_mask", "sbhd", False),
    ("current_causal_bshd_mha", "current", "causal", "bshd", True),
]


def _recipe(kind: str):
    if kind == "delayed":
        return DelayedScaling(fp8_dpa=True)
    return Float8CurrentScaling(fp8_dpa=True)


def _inputs(case, s: int):
    g = torch.Generator().manual_seed(zlib.crc32(case[0].encode()))
    shape = (B, s) if case[3] == "bshd" else (s, B)
    q, k, v = (torch.randn(*shape, n, D, generator=g).to(torch.bfloat16) for n in (H, HKV, HKV))
    dout = torch.randn(*shape, H * D, generator=g).to(torch.bfloat16)
    return q, k, v, dout


def _run(case, q, k, v, dout, cp_group=None):
    name, recipe, mask, fmt, fp8_output = case
    torch.manual_seed(0)
    m = te.DotProductAttention(H, D, num_gqa_groups=HKV, qkv_format=fmt, attn_mask_type=mask,
                               cp_group=cp_group, cp_comm_type="a2a")  # fmt: skip
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    with te.fp8_autocast(fp8_recipe=_recipe(recipe)):
        out = m(q, k, v, fp8_output=fp8_output)
    out.backward(dout)
    raw = out.detach()
    if fp8_output:  # the Float8Tensor's bytes and scale
        raw = (raw._data.clone(), raw._scale_inv.clone())
    hist = [t.clone() for t in m.fp8_meta_tensors(True)[:1] + m.fp8_meta_tensors(False)[:1]]
    return raw, [q.grad, k.grad, v.grad], hist


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for case in CASES:
            sdim = 1 if case[3] == "bshd" else 0
            q, k, v, dout = (_shard(t, sdim, world, rank) for t in _inputs(case, SEQ[world]))
            results[case[0]] = _run(case, q, k, v, dout, dist.group.WORLD)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def cp_results():
    return {world: _spawn(world, _worker) for world in (2, 4)}


@pytest.mark.parametrize("world", [2, 4])
def test_fp8_a2a_equals_one_process_bit_for_bit(world, cp_results):
    for case in CASES:
        name, recipe, _, fmt, fp8_output = case
        sdim = 1 if fmt == "bshd" else 0
        out1, grads1, hist1 = _run(case, *_inputs(case, SEQ[world]))
        for r in range(world):
            out_r, grads_r, hist_r = cp_results[world][r][name]
            what = f"{name} rank {r}/{world}"
            if fp8_output:
                assert torch.equal(out_r[1], out1[1]), f"O scale of {what}"
                assert torch.equal(out_r[0], _shard(out1[0], sdim, world, r)), f"O bytes of {what}"
            else:
                assert torch.equal(out_r, _shard(out1, sdim, world, r)), f"out of {what}"
            for label, g, g1 in zip("qkv", grads_r, grads1):
                assert torch.equal(g, _shard(g1, sdim, world, r)), f"d{label} of {what}"
            if recipe == "delayed":  # the amax the step recorded: the whole tensor's
                for h, h1 in zip(hist_r, hist1):
                    assert torch.equal(h, h1), f"amax history of {what}"
