"""FP8 attention (fp8_dpa / fp8_mha) under activation recompute: checkpoint_core_attention and
te.checkpoint are the same arithmetic as the plain forward, so outputs, gradients and every
module's delayed-scaling state (amax histories, scales) must equal it bit for bit, step after step.

The recompute runs in the backward, after the autocast's end-of-forward update has changed the
delayed-scaling scales: it must quantize with the forward's scales (checkpoint.stash_scales) and
must not record its amaxes a second time (checkpoint.recomputing). Current scaling recomputes its
scales from the same tensors. Also with context parallelism (2 gloo processes): each rank's
results with checkpoint_core_attention equal its results without.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_context_parallel import _shard

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import recipe as R
from transformer_engine_lite.pytorch.checkpoint import activation_recompute_forward
from transformer_engine_lite.pytorch.module.base import TransformerEngineBaseModule
from transformer_engine_lite.pytorch.tensor import Float8Tensor

STEPS = 3


def _recipe(mode: str, flag: str):
    """The recipe with fp8_dpa or fp8_mha set (a short history, so the 3 steps roll it)."""
    if mode == "delayed":
        return R.DelayedScaling(amax_history_len=4, **{flag: True})
    return R.Float8CurrentScaling(**{flag: True})


def _fp8_state(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every TE module's amax histories and scales (forward and backward)."""
    return [t.clone() for m in model.modules() if isinstance(m, TransformerEngineBaseModule)
            for fwd in (True, False) for t in m.fp8_meta_tensors(fwd)[:2]]


def _assert_same(plain: list, ckpt: list, what: str) -> None:
    for step, (a, b) in enumerate(zip(plain, ckpt)):
        assert len(a) == len(b)
        for i, (x, y) in enumerate(zip(a, b)):
            assert torch.equal(x, y), f"{what}: step {step}, item {i} differs"


def _train(model, make_inputs, call, recipe, seed=0):
    """STEPS steps of forward (under the autocast) and backward; per step: output, input and
    parameter gradients, then the FP8 state."""
    out_steps = []
    for step in range(STEPS):
        torch.manual_seed(seed + step)  # dropout masks: the same draws in both runs
        g = torch.Generator().manual_seed(100 + step)
        xs = make_inputs(g)
        with te.fp8_autocast(fp8_recipe=recipe):
            out = call(model, *xs)
        if isinstance(out, Float8Tensor):  # fp8_output
            raw = [out._data.clone(), out._scale_inv.clone()]
            out = out.dequantize()
        else:
            raw = [out.detach().clone()]
        out.float().backward(torch.randn(out.shape, generator=g))
        grads = [x.grad for x in xs] + [p.grad.clone() for p in model.parameters()
                                        if p.grad is not None]
        out_steps.append(raw + grads + _fp8_state(model))
    return out_steps


def _qkv(g, b=2, s=16, h=4, d=32, fmt="bshd"):
    shape = (b, s) if fmt == "bshd" else (s, b)
    return [(torch.randn(*shape, h, d, generator=g) * sc).to(torch.bfloat16).requires_grad_(True)
            for sc in (1.0, 1.5, 2.0)]


@pytest.mark.parametrize("mode", ["delayed", "current"])
@pytest.mark.parametrize("flag", ["fp8_dpa", "fp8_mha"])
@pytest.mark.parametrize("variant", ["causal", "nomask_dropout", "fp8_output", "f16_bwd"])
def test_dpa_checkpoint_core_attention(mode, flag, variant, monkeypatch):
    monkeypatch.setenv("NVTE_FP8_DPA_BWD", "0" if variant == "f16_bwd" else "1")
    mask = "no_mask" if variant == "nomask_dropout" else "causal"
    dropout = 0.1 if variant == "nomask_dropout" else 0.0
    fp8_output = variant == "fp8_output"
    results = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        dpa = te.DotProductAttention(4, 32, qkv_format="bshd", attn_mask_type=mask,
                                     attention_dropout=dropout)
        call = lambda m, q, k, v: m(q, k, v, checkpoint_core_attention=ckpt,  # noqa: E731
                                    fp8_output=fp8_output)
        results.append(_train(dpa, _qkv, call, _recipe(mode, flag)))
    _assert_same(*results, f"DotProductAttention {mode} {flag} {variant}")


def _mha():
    return te.MultiheadAttention(64, 4, attention_dropout=0.0, params_dtype=torch.bfloat16,
                                 attn_mask_type="causal")


def _layer():
    return te.TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0,
                               params_dtype=torch.bfloat16, self_attn_mask_type="causal")


def _hidden(g):
    return [torch.randn(16, 2, 64, generator=g).to(torch.bfloat16).requires_grad_(True)]


@pytest.mark.parametrize("mode", ["delayed", "current"])
@pytest.mark.parametrize("flag", ["fp8_dpa", "fp8_mha"])
@pytest.mark.parametrize("how", ["mha_core", "layer_core", "layer_te_checkpoint",
                                 "layer_te_checkpoint_and_core"])
def test_modules_under_recompute(mode, flag, how):
    """MultiheadAttention / TransformerLayer with checkpoint_core_attention, te.checkpoint around
    a TransformerLayer (its Linears and the attention recomputed), and both nested."""
    make = _mha if how.startswith("mha") else _layer
    core = how.endswith("core")
    results = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = make()

        def call(m, x, ckpt=ckpt):
            if ckpt and "te_checkpoint" in how:
                return te.checkpoint(m, x, checkpoint_core_attention=core, use_reentrant=False)
            return m(x, checkpoint_core_attention=ckpt and core)

        results.append(_train(model, _hidden, call, _recipe(mode, flag)))
    _assert_same(*results, f"{how} {mode} {flag}")


@pytest.mark.parametrize("reentrant", [True, False])
def test_layer_te_checkpoint_reentrant(reentrant):
    """te.checkpoint's reentrant form (its default) around a layer under fp8_dpa."""
    results = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        call = (lambda m, x: te.checkpoint(m, x, use_reentrant=reentrant)) if ckpt else (
            lambda m, x: m(x))
        results.append(_train(_layer(), _hidden, call, _recipe("delayed", "fp8_dpa")))
    _assert_same(*results, f"te.checkpoint(reentrant={reentrant})")


def test_activation_recompute_forward_dpa():
    """TE's lower-level form (Megatron's CheckpointWithoutOutput): the forward inside
    activation_recompute_forward(True, False) without grad, the recompute in the backward inside
    (True, True) under its own autocast, and the recompute's backward there too (its dO / dP /
    dQKV amaxes are recorded: only the forward's are not recorded twice)."""
    recipe = _recipe("delayed", "fp8_dpa")

    class Ckpt(torch.autograd.Function):
        @staticmethod
        def forward(ctx, m, q, k, v):
            ctx.m = m
            ctx.save_for_backward(q, k, v)
            with activation_recompute_forward(True, False):
                return m(q, k, v)

        @staticmethod
        def backward(ctx, g):
            q, k, v = (t.detach().requires_grad_(True) for t in ctx.saved_tensors)
            with activation_recompute_forward(True, True), torch.enable_grad():
                with te.fp8_autocast(fp8_recipe=recipe):
                    out = ctx.m(q, k, v)
                torch.autograd.backward(out, g)
            return None, q.grad, k.grad, v.grad

    results = []
    for call in (lambda m, q, k, v: m(q, k, v), Ckpt.apply):
        torch.manual_seed(0)
        dpa = te.DotProductAttention(4, 32, qkv_format="bshd", attn_mask_type="causal")
        results.append(_train(dpa, _qkv, call, recipe))
    _assert_same(*results, "activation_recompute_forward")


@pytest.mark.parametrize("mode", ["delayed", "current"])
def test_torch_compile(mode):
    """torch.compile of FP8 attention with checkpoint_core_attention (te.checkpoint runs eagerly
    at a graph break) equals eager FP8 attention without it."""
    results = []
    for ckpt, compiled in ((False, False), (True, True)):
        torch._dynamo.reset()
        torch.manual_seed(0)
        dpa = te.DotProductAttention(4, 32, qkv_format="bshd", attn_mask_type="causal")
        fn = lambda m, q, k, v, ckpt=ckpt: m(q, k, v, checkpoint_core_attention=ckpt)  # noqa
        results.append(_train(dpa, _qkv, torch.compile(fn) if compiled else fn,
                              _recipe(mode, "fp8_dpa")))
    _assert_same(*results, f"torch.compile {mode}")


def test_fullgraph_compile_without_fp8():
    """Without FP8 attention checkpoint_core_attention stays torch's checkpoint, which
    torch.compile(fullgraph=True) traces (te.checkpoint's bookkeeping would not trace)."""
    torch._dynamo.reset()
    dpa = te.DotProductAttention(4, 32, qkv_format="bshd", attn_mask_type="causal")
    q, k, v = _qkv(torch.Generator().manual_seed(0))
    fn = torch.compile(lambda q, k, v: dpa(q, k, v, checkpoint_core_attention=True),
                       fullgraph=True)
    out = fn(q, k, v)
    out.float().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = dpa(q, k, v)
    ref.float().sum().backward()
    torch.testing.assert_close(out, ref)
    for g, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(g, t.grad)


# ------------------------------------------------------------------ context parallelism
CP_CASES = [  # (name, cp_comm_type, recipe, fmt, fp8_output)
    ("p2p_delayed_bshd", "p2p", "delayed", "bshd", False),
    ("p2p_current_sbhd", "p2p", "current", "sbhd", False),
    ("ag_delayed_sbhd_mha", "all_gather", "delayed", "sbhd", True),
    ("a2a_delayed_bshd", "a2a", "delayed", "bshd", False),
    ("a2a_current_bshd_mha", "a2a", "current", "bshd", True),
]


def _cp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for name, comm, mode, fmt, fp8_output in CP_CASES:
            sdim = 1 if fmt == "bshd" else 0

            def inputs(g, fmt=fmt, sdim=sdim):
                full = _qkv(g, s=16, d=16, fmt=fmt)
                return [_shard(t.detach(), sdim, world, rank).requires_grad_(True) for t in full]

            runs = []
            for ckpt in (False, True):
                torch.manual_seed(0)
                dpa = te.DotProductAttention(4, 16, qkv_format=fmt, attn_mask_type="causal",
                                             cp_group=dist.group.WORLD, cp_comm_type=comm)
                call = lambda m, q, k, v, ckpt=ckpt, o=fp8_output: m(  # noqa: E731
                    q, k, v, checkpoint_core_attention=ckpt, fp8_output=o)
                runs.append(_train(dpa, inputs, call, _recipe(mode, "fp8_mha" if fp8_output
                                                                else "fp8_dpa")))
            results[name] = runs
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_context_parallel_checkpoint_core_attention():
    """2 gloo processes, every CP_CASES case: per rank, checkpoint_core_attention equals the
    plain forward bit for bit (outputs, gradients, amax histories and scales)."""
    world = 2
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_cp_worker, args=(world, os.path.join(d, "pg"), d), nprocs=world,
                           join=True, start_method="fork")  # fmt: skip
        results = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(world)]
    for r, res in enumerate(results):
        for name, (plain, ckpt) in res.items():
            _assert_same(plain, ckpt, f"CP {name} rank {r}")
