"""Userbuffers (TE's tensor-parallel comm/GEMM overlap), single process: initialize_ub's
validation and configuration, the modules' ub_* flag rules, BasicLinear(userbuffers_options=)
and the op fuser's choice of UserbuffersForwardLinear / UserbuffersBackwardLinear (TE's rule,
with torch.distributed monkeypatched as TE's test_backward_override does). The numerics (ub vs
non-ub, 2 ranks) are in test_userbuffers_distributed.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import transformer_engine_lite.pytorch as te
import transformer_engine_lite.pytorch.ops as te_ops
from transformer_engine_lite.common.recipe import Float8CurrentScaling
from transformer_engine_lite.pytorch.module import userbuffers as ub_mod
from transformer_engine_lite.pytorch.module.base import get_ub, is_ub_initialized
from transformer_engine_lite.pytorch.ops.fused import (
    ForwardLinearBiasActivation,
    UserbuffersBackwardLinear,
    UserbuffersForwardLinear,
)

Mode = te.UserBufferQuantizationMode
TE_NAMES = {"qkv_fprop", "qkv_dgrad", "qkv_wgrad", "proj_fprop", "proj_dgrad", "proj_wgrad",
            "fc1_fprop", "fc1_dgrad", "fc1_wgrad", "fc2_fprop", "fc2_dgrad", "fc2_wgrad"}


@pytest.fixture
def world1():
    """A real one-rank gloo group (initialize_ub needs torch.distributed)."""
    if dist.is_initialized():
        pytest.skip("a process group already exists")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    te.destroy_ub()
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _no_ub():
    yield
    te.destroy_ub()


def _init(**kw):
    kw.setdefault("quantization_modes", [Mode.NONE])
    te.initialize_ub([8, 16], 1, **kw)


# ---- initialize_ub / get_ub / destroy_ub ----------------------------------------------------


def test_initialize_ub_needs_torch_distributed():
    with pytest.raises(RuntimeError, match="torch.distributed must be initialized"):
        _init()
    assert not is_ub_initialized()


def test_initialize_ub_creates_te_names(world1):
    te.initialize_ub([8, 16], 1, quantization_modes=[Mode.NONE, Mode.FP8], dtype=torch.float32)
    for mode in (False, True):
        names = {n for (n, m) in ub_mod._communicators if (m == Mode.FP8) == mode}
        assert names == TE_NAMES
    c = get_ub("qkv_fprop", False)
    assert c.method == "ring_exchange" and not c.is_reduce_scatter and c.is_p2p_overlap()
    assert c.buffer_dtype == torch.float32 and not c.is_fp8_ubuf()
    assert get_ub("qkv_fprop", True).is_fp8_ubuf()  # AG buffers hold FP8 in the FP8 set
    p = get_ub("proj_fprop", True)
    assert p.method == "pipeline" and p.is_reduce_scatter and not p.is_fp8_ubuf()
    assert get_ub("qkv_dgrad", False).method == "bulk"
    assert get_ub("proj_wgrad", False).method == "external"
    assert get_ub("qkv_fprop", False).config["num_splits"] == 1  # tp_size for ring exchange


def test_initialize_ub_use_fp8_is_deprecated(world1):
    with pytest.warns(DeprecationWarning, match="quantization_modes"):
        te.initialize_ub([8, 16], 1, use_fp8=True)
    assert get_ub("fc1_fprop", True) is not None
    with pytest.raises(KeyError, match="use_fp8=False is not registered"):
        get_ub("fc1_fprop", False)


def test_initialize_ub_twice_and_destroy(world1):
    _init()
    with pytest.raises(RuntimeError, match="already initialized"):
        _init()
    te.destroy_ub()
    assert not is_ub_initialized()
    with pytest.raises(RuntimeError, match="not initialized"):
        get_ub("qkv_fprop", False)
    _init()
    assert is_ub_initialized()


def test_get_ub_unknown_name(world1):
    _init()
    with pytest.raises(KeyError, match="foo_fprop"):
        get_ub("foo_fprop", False)


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        ({"shape": [8]}, ValueError, "shape"),
        ({"shape": [8, 0]}, ValueError, "shape"),
        ({"shape": "8x16"}, ValueError, "shape"),
        ({"tp_size": 0}, ValueError, "tp_size"),
        ({"tp_size": 2}, ValueError, "divisor of the world size 1"),
        ({"bootstrap_backend": "ucc"}, ValueError, "bootstrap_backend"),
        ({"quantization_modes": Mode.NONE}, TypeError, "quantization_modes"),
        ({"quantization_modes": ["fp8"]}, TypeError, "UserBufferQuantizationMode"),
        ({"dtype": torch.int8}, ValueError, "dtype"),
        ({"ub_cfgs": [{}, {}]}, ValueError, "Number of ub_cfgs"),
        ({"ub_cfgs": 3}, TypeError, "ub_cfgs"),
        ({"ub_cfgs": {"qkv_fprop": {"num_sm": 2, "bogus": 1}}}, TypeError, "bogus"),
        ({"ub_cfgs": {"qkv_fprop": 1}}, TypeError, "qkv_fprop"),
        ({"ub_cfgs": {"qkv_fprop": {"method": "pipeline"}}}, ValueError, "not supported for AllGather"),
        ({"ub_cfgs": {"qkv_fprop": {"method": "teleport"}}}, ValueError, "method"),
        ({"ub_cfgs": {"qkv_fprop": {"atomic_gemm": True}}}, ValueError, "only for FP8"),
        ({"ub_cfgs": {"proj_wgrad": {"method": "bulk"}}}, ValueError, "external"),
        ({"ub_cfgs": {"qkv_dgrad": {"method": "ring_exchange"}, "qkv_wgrad": {}}},
         ValueError, "Cannot specify user UB config for 'qkv_wgrad'"),
    ],
)
def test_initialize_ub_rejects(world1, kw, exc, match):
    args = {"shape": [8, 16], "tp_size": 1, "quantization_modes": [Mode.NONE]}
    args.update(kw)
    with pytest.raises(exc, match=match):
        te.initialize_ub(**args)
    assert not is_ub_initialized()


def test_initialize_ub_atomic_ring_pairs(world1):
    # atomic ring-exchange on an AG/RS pair's AG side needs the same on its RS side
    cfg = {"qkv_fprop": {"atomic_gemm": True}}
    with pytest.raises(ValueError, match="proj_fprop"):
        te.initialize_ub([8, 16], 1, quantization_modes=[Mode.FP8], ub_cfgs=cfg)
    te.destroy_ub()
    cfg["proj_fprop"] = {"atomic_gemm": True, "method": "ring_exchange"}
    te.initialize_ub([8, 16], 1, quantization_modes=[Mode.FP8], ub_cfgs=cfg)
    assert get_ub("proj_fprop", True).is_atomic_gemm()


def test_initialize_ub_user_config(world1):
    cfgs = {"qkv_fprop": {"num_sm": 4, "cga_size": 4},
            "fc1_dgrad": {"method": "ring_exchange"},
            "fc2_fprop": {"fp8_buf": True}}
    te.initialize_ub([8, 16], 1, quantization_modes=[Mode.NONE, Mode.FP8],
                     ub_cfgs=[cfgs, cfgs], bootstrap_backend="nccl")  # Megatron's default
    assert get_ub("qkv_fprop", False).config["num_sm"] == 4
    d = get_ub("fc1_dgrad", False)  # a non-bulk dgrad becomes a reduce-scatter overlap
    assert d.method == "ring_exchange" and d.is_reduce_scatter
    assert not get_ub("fc1_wgrad", False).is_reduce_scatter
    assert get_ub("fc2_fprop", True).is_fp8_ubuf()  # fp8_buf honoured for a pipeline RS
    assert not get_ub("fc2_fprop", False).is_fp8_ubuf()


def test_initialize_ub_cublasmp(world1):
    with pytest.warns(UserWarning, match="cuBLASMp"):
        _init(with_cublasmp=True)
    assert ub_mod.using_cublasmp_backend()
    assert get_ub("qkv_dgrad", False).method == "ring_exchange"
    assert get_ub("qkv_dgrad", False).is_reduce_scatter
    with pytest.raises(KeyError):
        get_ub("qkv_wgrad", False)  # no bulk overlaps


# ---- module flags -------------------------------------------------------------------------


def _tp2(**kw):
    # tp_size=2 without a process group: TE's masking and checks run at construction
    return dict(tp_size=2, sequence_parallel=True, **kw)


@pytest.mark.parametrize(
    "make",
    [
        lambda: te.Linear(16, 16, parallel_mode="column", ub_overlap_ag=True, ub_name="qkv",
                          **_tp2()),
        lambda: te.Linear(16, 16, parallel_mode="row", ub_overlap_rs=True, ub_name="proj",
                          **_tp2()),
        lambda: te.LayerNormLinear(16, 16, parallel_mode="column", ub_bulk_wgrad=True,
                                   ub_name="qkv", **_tp2()),
        lambda: te.LayerNormMLP(16, 32, set_parallel_mode=True, ub_overlap_rs=True, **_tp2()),
        lambda: te.TransformerLayer(16, 32, 2, set_parallel_mode=True, ub_tp_comm_overlap=True,
                                    **_tp2()),
    ],
)
def test_module_flags_need_initialize_ub(make):
    with pytest.raises(RuntimeError, match="initialize_ub"):
        make()


def test_module_flags_masked_as_te():
    # TE's rule: an overlap applies only to its parallel mode and with sequence parallelism;
    # otherwise the flag is inert (no initialize_ub needed)
    m = te.Linear(16, 16, ub_overlap_ag=True, ub_overlap_rs=True, ub_bulk_dgrad=True,
                  ub_bulk_wgrad=True, ub_overlap_rs_dgrad=True, ub_name="qkv")
    assert not any((m.ub_overlap_ag_fprop, m.ub_overlap_rs_fprop, m.ub_overlap_ag_dgrad,
                    m.ub_overlap_rs_dgrad, m.ub_bulk_dgrad, m.ub_bulk_wgrad))
    m = te.Linear(16, 16, parallel_mode="column", tp_size=2, ub_overlap_rs=True)
    assert not m.ub_overlap_rs_fprop
    te.Linear(16, 16, ub_overlap_ag=True, ub_name="qkv")(torch.randn(4, 16))  # inert flag
    t = te.TransformerLayer(16, 32, 2, ub_tp_comm_overlap=False, ub_overlap_ag=True)
    assert not t.layernorm_mlp.ub_overlap_ag


def test_module_flag_types():
    with pytest.raises(TypeError, match="ub_name"):
        te.Linear(16, 16, ub_name=3)
    with pytest.raises(TypeError, match="ub_overlap_ag"):
        te.Linear(16, 16, ub_overlap_ag="yes")


# ---- BasicLinear(userbuffers_options=) and the op fuser -------------------------------------


@pytest.mark.parametrize(
    "opts, exc, match",
    [
        (["qkv"], TypeError, "userbuffers_options"),
        ({}, ValueError, "comm_name"),
        ({"comm_name": 1}, ValueError, "comm_name"),
        ({"comm_name": "qkv", "method": "bulk"}, ValueError, "unknown key"),
    ],
)
def test_basic_linear_userbuffers_options_rejects(opts, exc, match):
    with pytest.raises(exc, match=match):
        te_ops.BasicLinear(16, 16, userbuffers_options=opts)


@pytest.fixture
def fake_world2(monkeypatch):
    """TE's test_backward_override setup: a 2-rank job as far as the fusion rule can tell."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *_a, **_k: 2)


def _model(mode, *tail, options={"comm_name": "qkv"}, size=2):  # noqa: B006 (read only)
    linear = te_ops.BasicLinear(16, 16, userbuffers_options=options)
    linear.tensor_parallel_mode, linear.tensor_parallel_size = mode, size
    linear.sequence_parallel = mode is not None
    model = te_ops.Sequential(linear, *tail)
    fuser = model._make_module_groups(model._modules.values())[0]
    return linear, fuser


def _kinds(ops):
    return [type(op).__name__ for op, _ in ops]


def test_fuser_selects_userbuffers_column_bias(fake_world2):
    linear, fuser = _model("column", te_ops.Bias(16))
    fuser.maybe_fuse_ops(True, None, torch.empty(0), [(), ()])
    (op, idxs), = fuser._forward_ops
    assert isinstance(op, UserbuffersForwardLinear) and idxs == [0, 1]
    assert op.tensor_parallel_mode == "column" and op.basic_ops[0] is linear
    (bop, bidx), = fuser._backward_ops
    assert isinstance(bop, UserbuffersBackwardLinear) and sorted(bidx) == [0, 1]


def test_fuser_selects_userbuffers_reduce_scatter(fake_world2):
    _, fuser = _model(None, te_ops.Bias(16), te_ops.ReduceScatter())
    (op, idxs), = fuser._forward_ops
    assert isinstance(op, UserbuffersForwardLinear) and idxs == [0, 1, 2]
    assert op.tensor_parallel_mode == "row" and op.sequence_parallel
    assert op.tensor_parallel_size == 2
    assert _kinds(fuser._backward_ops) == ["UserbuffersBackwardLinear"]


@pytest.mark.parametrize(
    "mode, tail, size, options",
    [
        ("column", ("bias",), 1, {"comm_name": "qkv"}),  # TP size 1
        (None, ("bias",), 2, {"comm_name": "qkv"}),  # not parallel, no ReduceScatter
        ("column", ("bias",), 2, None),  # no userbuffers_options
    ],
)
def test_fuser_does_not_select_userbuffers(fake_world2, mode, tail, size, options):
    ops = [te_ops.Bias(16) for _ in tail]
    linear, fuser = _model(mode, *ops, options=options, size=size)
    kinds = _kinds(fuser._forward_ops)
    assert "UserbuffersForwardLinear" not in kinds
    assert "UserbuffersBackwardLinear" not in _kinds(fuser._backward_ops)


def test_fuser_row_parallel_alone(fake_world2):
    _, fuser = _model("row", options={"comm_name": "proj"})
    assert _kinds(fuser._forward_ops) == ["UserbuffersForwardLinear"]
    # a row-parallel bias follows the reduction: it stays a separate op (TE's window)
    _, fuser = _model("row", te_ops.Bias(16), options={"comm_name": "proj"})
    assert _kinds(fuser._forward_ops) == ["UserbuffersForwardLinear", "Bias"]
    assert _kinds(fuser._backward_ops) == ["Bias", "UserbuffersBackwardLinear"]


def test_fuser_userbuffers_needs_distributed():
    _, fuser = _model("column", te_ops.Bias(16))
    assert _kinds(fuser._forward_ops) == ["ForwardLinearBiasActivation"]


@pytest.mark.parametrize("override", ["high_precision", "dequantized"])
def test_fuser_rebuilds_on_backward_override_switch(fake_world2, override):
    _, fuser = _model("column", te_ops.Bias(16))
    extra = [() for _ in range(fuser._num_basic_ops)]
    x = torch.randn(4, 16, requires_grad=True)
    fuser.maybe_fuse_ops(is_grad_enabled=True, recipe=Float8CurrentScaling(), input_=x,
                         extra_inputs=extra)
    assert _kinds(fuser._forward_ops) == ["UserbuffersForwardLinear"]
    fuser.maybe_fuse_ops(is_grad_enabled=True,
                         recipe=Float8CurrentScaling(backward_override=override), input_=x,
                         extra_inputs=extra)
    # TE: the forward takes the standard path under a backward_override...
    assert isinstance(fuser._forward_ops[0][0], ForwardLinearBiasActivation)
    # ... while its backward fusion has no such condition
    assert _kinds(fuser._backward_ops) == ["UserbuffersBackwardLinear"]
    fuser.maybe_fuse_ops(True, None, x, extra)
    assert _kinds(fuser._forward_ops) == ["UserbuffersForwardLinear"]


def test_userbuffers_forward_checks_configuration(fake_world2):
    # TE's runtime checks: sequence parallelism, and the named communicator
    linear, fuser = _model("column", te_ops.Bias(16))
    linear.sequence_parallel = False
    op = fuser._forward_ops[0][0]
    op.sequence_parallel = False
    with pytest.raises(RuntimeError, match="sequence_parallel=False"):
        op.fuser_forward(torch.randn(4, 16), ())
    op.sequence_parallel = True
    with pytest.raises(RuntimeError, match="UB manager is not initialized"):
        op.fuser_forward(torch.randn(4, 16), ())
