"""Userbuffers on 2 ranks (gloo): every module / fused op with its ub_* flags (or
userbuffers_options) gives the bytes of the same module without them (the ordinary
sequence-parallel collectives), outputs and gradients, and the runtime checks TE makes.

Run: torchrun --nproc_per_node=2 -m pytest tests/pytorch/test_userbuffers_distributed.py
(skipped when not launched by torchrun; ci/pytorch.sh runs it so)."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist

import transformer_engine_lite.pytorch as te
import transformer_engine_lite.pytorch.ops as te_ops
from transformer_engine_lite.pytorch.module import userbuffers as ub_mod
from transformer_engine_lite.common.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
)
from transformer_engine_lite.pytorch.ops.fused import (
    UserbuffersBackwardLinear,
    UserbuffersForwardLinear,
)

Mode = te.UserBufferQuantizationMode
S, B, H, FFN = 8, 2, 16, 32  # sequence (global), batch, hidden, ffn


@pytest.fixture(scope="module", autouse=True)
def process_group():
    if "WORLD_SIZE" not in os.environ:
        pytest.skip("run under torchrun --nproc_per_node=2")
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    assert dist.get_world_size() == 2, "these tests expect 2 ranks"
    yield
    dist.barrier()


@pytest.fixture
def ub():
    te.initialize_ub([S * B, H], 2, quantization_modes=[Mode.NONE, Mode.FP8],
                     dtype=torch.float32, bootstrap_backend="gloo")
    yield
    te.destroy_ub()


def _local(shape):
    """The same global tensor on every rank (same seed), and this rank's sequence slice."""
    torch.manual_seed(7)
    g = torch.randn(shape)
    return g.chunk(2, 0)[dist.get_rank()].contiguous()


def _run(m, x, dy, recipe=None):
    x = x.clone().requires_grad_(True)
    with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
        y = m(x)
    if isinstance(y, tuple):
        y = y[0]
    y.backward(dy)
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in m.named_parameters()
                                 if p.grad is not None}


def _same(ref, got):
    (y0, dx0, g0), (y1, dx1, g1) = ref, got
    assert torch.equal(y0, y1), "output"
    assert torch.equal(dx0, dx1), "input gradient"
    assert g0.keys() == g1.keys()
    for n in g0:
        assert torch.equal(g0[n], g1[n]), f"grad of {n}"


def _pair(make, **ub_kw):
    """(module without ub flags, the same module with them, same parameters)."""
    torch.manual_seed(1)
    ref = make()
    torch.manual_seed(1)
    got = make(**ub_kw)
    got.load_state_dict(ref.state_dict())
    return ref, got


COL = {"ub_overlap_ag": True, "ub_bulk_dgrad": True, "ub_bulk_wgrad": True, "ub_name": "qkv"}
COL_RS = {"ub_overlap_ag": True, "ub_overlap_rs_dgrad": True, "ub_name": "qkv"}
ROW = {"ub_overlap_rs": True, "ub_overlap_ag": True, "ub_name": "proj"}
SP = {"tp_size": 2, "sequence_parallel": True}


@pytest.mark.parametrize("recipe", [None, Float8CurrentScaling(), DelayedScaling()],
                         ids=["hp", "current", "delayed"])
@pytest.mark.parametrize(
    "make, kw, in_shape, dy_shape",
    [  # in_shape: the global input (split over the ranks along dim 0); dy_shape: per rank
        (lambda **k: te.Linear(H, H, parallel_mode="column", **SP, **k), COL, (S * B, H),
         (S * B, H // 2)),
        (lambda **k: te.Linear(H, H, parallel_mode="column", **SP, **k), COL_RS, (S * B, H),
         (S * B, H // 2)),
        (lambda **k: te.Linear(H, H, parallel_mode="row", **SP, **k), ROW, (2 * S * B, H // 2),
         (S * B // 2, H)),
        (lambda **k: te.LayerNormLinear(H, H, parallel_mode="column", **SP, **k), COL,
         (S * B, H), (S * B, H // 2)),
        (lambda **k: te.LayerNormMLP(H, FFN, set_parallel_mode=True, **SP, **k),
         {"ub_overlap_ag": True, "ub_overlap_rs": True, "ub_bulk_dgrad": True,
          "ub_bulk_wgrad": True}, (S * B, H), (S * B // 2, H)),
    ],
    ids=["linear_col", "linear_col_rs_dgrad", "linear_row", "ln_linear", "ln_mlp"],
)
def test_module_ub_equals_sequence_parallel(ub, make, kw, in_shape, dy_shape, recipe):
    if kw.get("ub_overlap_rs_dgrad"):
        # Megatron's setup for a dgrad + RS overlap: qkv_dgrad as a ring-exchange RS (TE's
        # default bulk AG buffer holds FP8, which would make the input gradient FP8)
        te.destroy_ub()
        te.initialize_ub([S * B, H], 2, quantization_modes=[Mode.NONE, Mode.FP8],
                         dtype=torch.float32, ub_cfgs={"qkv_dgrad": {"method": "ring_exchange"}})
    ref, got = _pair(make, **kw)
    x = _local(in_shape)
    torch.manual_seed(3)
    dy = torch.randn(dy_shape)
    _same(_run(ref, x, dy, recipe), _run(got, x, dy, recipe))


def test_transformer_layer_ub_tp_comm_overlap(ub):
    def make(**k):
        return te.TransformerLayer(H, FFN, 2, hidden_dropout=0.0, attention_dropout=0.0,
                                   set_parallel_mode=True, **SP, **k)

    ref, got = _pair(make, ub_tp_comm_overlap=True)
    assert got.self_attention.layernorm_qkv.ub_overlap_ag_fprop
    assert got.self_attention.proj.ub_overlap_rs_fprop
    assert got.layernorm_mlp.ub_overlap_rs and got.layernorm_mlp.ub_bulk_wgrad
    x = _local((S, B, H))
    torch.manual_seed(3)
    dy = torch.randn(S // 2, B, H)
    _same(_run(ref, x, dy), _run(got, x, dy))


def test_module_ub_checks(ub):
    with pytest.raises(ValueError, match="ub_name"):
        te.Linear(H, H, parallel_mode="column", ub_overlap_ag=True, **SP)
    with pytest.raises(NotImplementedError, match="delay_wgrad_compute"):
        te.Linear(H, H, parallel_mode="column", ub_bulk_wgrad=True, ub_name="qkv",
                  delay_wgrad_compute=True, **SP)
    m = te.Linear(H, H, parallel_mode="column", ub_overlap_ag=True, ub_name="attn", **SP)
    with pytest.raises(KeyError, match="attn_fprop"):  # no such communicator
        m(_local((S * B, H)))
    # the backward's communicators are only needed when a gradient flows (every TE name has
    # its _wgrad partner, so drop one by hand)
    del ub_mod._communicators[("qkv_wgrad", Mode.NONE)]
    m = te.Linear(H, H, parallel_mode="column", ub_bulk_wgrad=True, ub_name="qkv", **SP)
    with torch.no_grad():
        m(_local((S * B, H)))
    with pytest.raises(KeyError, match="qkv_wgrad"):
        m(_local((S * B, H)))


def test_module_ub_tp_size_must_match():
    te.initialize_ub([S * B, H], 1, quantization_modes=[Mode.NONE])
    try:
        with pytest.raises(ValueError, match="tp_size"):
            te.Linear(H, H, parallel_mode="column", ub_overlap_ag=True, ub_name="qkv", **SP)
    finally:
        te.destroy_ub()


def test_module_ub_fp8_reduce_scatter_buffer():
    # TE returns an FP8 output / input gradient from an FP8 reduce-scatter buffer
    te.initialize_ub([S * B, H], 2, quantization_modes=[Mode.FP8],
                     ub_cfgs={"proj_fprop": {"fp8_buf": True}})
    try:
        m = te.Linear(H, H, parallel_mode="row", ub_overlap_rs=True, ub_name="proj", **SP)
        with pytest.raises(NotImplementedError, match="'proj_fprop' has an FP8 buffer"):
            with te.fp8_autocast(fp8_recipe=Float8CurrentScaling()):
                m(_local((S * B * 2, H // 2)))
        m = te.Linear(H, H, parallel_mode="column", ub_overlap_rs_dgrad=True, ub_name="qkv", **SP)
        with pytest.raises(NotImplementedError, match="'qkv_dgrad' has an FP8 buffer"):
            with te.fp8_autocast(fp8_recipe=Float8CurrentScaling()):
                m(_local((S * B, H)).requires_grad_())
    finally:
        te.destroy_ub()


def _ops_pair(mode, tail, comm):
    torch.manual_seed(1)
    lin_kw = {"tensor_parallel_mode": mode, "sequence_parallel": mode is not None}
    ref = te_ops.Sequential(te_ops.BasicLinear(H, H, **lin_kw), *tail())
    torch.manual_seed(1)
    got = te_ops.Sequential(
        te_ops.BasicLinear(H, H, userbuffers_options={"comm_name": comm}, **lin_kw), *tail())
    got.load_state_dict(ref.state_dict())
    return ref, got


@pytest.mark.parametrize("recipe", [None, Float8CurrentScaling()], ids=["hp", "current"])
@pytest.mark.parametrize(
    "mode, tail, comm, rows_in, rows_out, cols_out",
    [
        ("column", lambda: [te_ops.Bias(H // 2)], "qkv", S, 2 * S, H // 2),
        ("row", lambda: [], "proj", 2 * S, S, H),
        (None, lambda: [te_ops.Bias(H), te_ops.ReduceScatter()], "fc2", 2 * S, S, H),
    ],
    ids=["column_bias", "row", "reduce_scatter_op"],
)
def test_fusible_ops_userbuffers_exact(ub, mode, tail, comm, rows_in, rows_out, cols_out, recipe):
    ref, got = _ops_pair(mode, tail, comm)
    cols_in = H // 2 if mode == "row" else H
    torch.manual_seed(5)
    x = torch.randn(rows_in, cols_in)
    dy = torch.randn(rows_out, cols_out)
    _same(_run(ref, x, dy, recipe), _run(got, x, dy, recipe))
    fuser = got._module_groups[0]
    assert isinstance(fuser._forward_ops[0][0], UserbuffersForwardLinear)
    assert isinstance(fuser._backward_ops[0][0], UserbuffersBackwardLinear)


def test_fusible_ops_userbuffers_checks(ub):
    _, got = _ops_pair("column", lambda: [], "nope")
    with pytest.raises(KeyError, match="nope_fprop"):
        got(torch.randn(S, H))
    _, got = _ops_pair("column", lambda: [], "qkv")
    with pytest.raises(RuntimeError, match="Unsupported recipe for Userbuffers"):
        with te.fp8_autocast(fp8_recipe=Float8BlockScaling()):
            got(torch.randn(S, H))
    # without a weight gradient the column-parallel dgrad reduce-scatters through qkv_dgrad,
    # whose default buffer holds FP8 in the FP8 set: TE refuses that reduce-scatter
    got[0].weight.requires_grad_(False)
    with te.fp8_autocast(fp8_recipe=Float8CurrentScaling()):
        y = got(torch.randn(S, H, requires_grad=True))
    with pytest.raises(RuntimeError, match="not supported with FP8 buffers"):
        y.sum().backward()


def test_fusible_ops_userbuffers_tp_size_must_match():
    te.initialize_ub([S * B, H], 1, quantization_modes=[Mode.NONE])
    try:
        _, got = _ops_pair("column", lambda: [], "qkv")
        with pytest.raises(ValueError, match="tensor_parallel_size"):
            got(torch.randn(S, H))
    finally:
        te.destroy_ub()
