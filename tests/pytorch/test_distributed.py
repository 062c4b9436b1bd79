"""Tensor / sequence parallel modules (2 ranks, gloo) against the single-process module.

Run: torchrun --nproc_per_node=2 -m pytest tests/pytorch/test_distributed.py
(skipped when not launched by torchrun). Every rank builds the same single-process module from the
same seed, copies its shard into the parallel module, and compares outputs and gradients.
"""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist
from utils import assert_close

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common.recipe import DelayedScaling, Float8CurrentScaling

S, B, H, OUT, FFN = 6, 2, 16, 12, 20


@pytest.fixture(scope="module", autouse=True)
def process_group():
    if "WORLD_SIZE" not in os.environ:
        pytest.skip("run under torchrun --nproc_per_node=2")
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    assert dist.get_world_size() == 2, "these tests expect 2 ranks"
    yield
    dist.barrier()


def _shard(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t.chunk(dist.get_world_size(), dim)[dist.get_rank()]


def _run(m, x, dy, recipe=None):
    x = x.clone().requires_grad_(True)
    with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
        y = m(x)
    y.backward(dy)
    return y, x.grad


def _load(tp_mod, ref, shard_dims: dict[str, int | None]):
    with torch.no_grad():
        for name, p in tp_mod.named_parameters():
            full = dict(ref.named_parameters())[name]
            d = shard_dims.get(name)
            p.copy_(full if d is None else _shard(full, d))


def _check_grads(tp_mod, ref, shard_dims, kind=torch.float32):
    te.allreduce_sequence_parallel_grads(tp_mod)
    for name, p in tp_mod.named_parameters():
        d = shard_dims.get(name)
        full = dict(ref.named_parameters())[name].grad
        assert_close(p.grad, full if d is None else _shard(full, d), kind, f"grad of {name}")


def _inputs(sp: bool, features: int, out_features: int):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(S, B, features, generator=g)
    dy = torch.randn(S, B, out_features, generator=g)
    return x, dy


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp_sp"])
@pytest.mark.parametrize("mode", ["column", "row"])
def test_linear(mode, sp):
    torch.manual_seed(0)
    ref = te.Linear(H, OUT)
    with torch.no_grad():
        ref.bias.normal_()
    tp = te.Linear(H, OUT, parallel_mode=mode, tp_group=dist.group.WORLD, sequence_parallel=sp)
    dims = {"weight": 0, "bias": 0} if mode == "column" else {"weight": 1, "bias": None}
    _load(tp, ref, dims)
    x, dy = _inputs(sp, H, OUT)
    y_ref, dx_ref = _run(ref, x, dy)
    if mode == "column":
        x_in = _shard(x, 0) if sp else x
        y, dx = _run(tp, x_in, _shard(dy, 2))
        assert_close(y, _shard(y_ref, 2), torch.float32, "output")
        assert_close(dx, _shard(dx_ref, 0) if sp else dx_ref, torch.float32, "input grad")
    else:
        y, dx = _run(tp, _shard(x, 2), _shard(dy, 0) if sp else dy)
        assert_close(y, _shard(y_ref, 0) if sp else y_ref, torch.float32, "output")
        assert_close(dx, _shard(dx_ref, 2), torch.float32, "input grad")
    _check_grads(tp, ref, dims)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp_sp"])
def test_layernorm_linear_column(sp):
    torch.manual_seed(1)
    ref = te.LayerNormLinear(H, OUT, normalization="RMSNorm")
    tp = te.LayerNormLinear(
        H,
        OUT,
        normalization="RMSNorm",
        parallel_mode="column",
        tp_group=dist.group.WORLD,
        sequence_parallel=sp,
    )
    dims = {"weight": 0, "bias": 0}
    _load(tp, ref, dims)
    x, dy = _inputs(sp, H, OUT)
    y_ref, dx_ref = _run(ref, x, dy)
    y, dx = _run(tp, _shard(x, 0) if sp else x, _shard(dy, 2))
    assert_close(y, _shard(y_ref, 2), torch.float32, "output")
    assert_close(dx, _shard(dx_ref, 0) if sp else dx_ref, torch.float32, "input grad")
    _check_grads(tp, ref, dims)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp_sp"])
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_layernorm_mlp(activation, sp):
    torch.manual_seed(2)
    ref = te.LayerNormMLP(H, FFN, activation=activation)
    tp = te.LayerNormMLP(
        H,
        FFN,
        activation=activation,
        set_parallel_mode=True,
        tp_group=dist.group.WORLD,
        sequence_parallel=sp,
    )
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    if activation == "swiglu":
        # fc1 rows are [act input | linear]: each rank holds its shard of both halves.
        def fc1_shard(t):
            a, lin = t.chunk(2, 0)
            return torch.cat([_shard(a, 0), _shard(lin, 0)])
    else:

        def fc1_shard(t):
            return _shard(t, 0)

    with torch.no_grad():
        for name, p in tp.named_parameters():
            full = dict(ref.named_parameters())[name]
            p.copy_(
                fc1_shard(full)
                if name.startswith("fc1")
                else _shard(full, 1)
                if name == "fc2_weight"
                else full
            )
    x, dy = _inputs(sp, H, H)
    y_ref, dx_ref = _run(ref, x, dy)
    y, dx = _run(tp, _shard(x, 0) if sp else x, _shard(dy, 0) if sp else dy)
    assert_close(y, _shard(y_ref, 0) if sp else y_ref, torch.float32, "output")
    assert_close(dx, _shard(dx_ref, 0) if sp else dx_ref, torch.float32, "input grad")
    te.allreduce_sequence_parallel_grads(tp)
    refp = dict(ref.named_parameters())
    for name, p in tp.named_parameters():
        full = refp[name].grad
        want = (
            fc1_shard(full)
            if name.startswith("fc1")
            else (_shard(full, 1) if name == "fc2_weight" else full)
        )
        assert_close(p.grad, want, torch.float32, f"grad of {name}")


def test_delayed_scaling_amax_reduction_matches_single_process():
    """Column-parallel FP8 Linear with reduce_amax: the weight amax is all-reduced (MAX), so the
    scales, and with them the outputs, equal those of the single-process module."""
    torch.manual_seed(3)
    recipe = DelayedScaling(amax_history_len=4)
    ref = te.Linear(H, OUT)
    tp = te.Linear(H, OUT, parallel_mode="column", tp_group=dist.group.WORLD)
    dims = {"weight": 0, "bias": 0}
    _load(tp, ref, dims)
    for step in range(3):
        x, dy = _inputs(False, H, OUT)
        x = x * (step + 1)
        y_ref, dx_ref = _run(ref, x, dy, recipe)
        y, dx = _run(tp, x, _shard(dy, 2), recipe)
        assert_close(y, _shard(y_ref, 2), torch.float32, f"step {step} output")
        assert_close(dx, dx_ref, torch.float32, f"step {step} input grad")
        assert torch.equal(tp.fp8_bwd_scale, ref.fp8_bwd_scale), f"step {step} backward scales"
        assert torch.equal(tp.fp8_fwd_scale, ref.fp8_fwd_scale), f"step {step} forward scales"
        assert torch.equal(tp.fp8_fwd_amax_history, ref.fp8_fwd_amax_history)
        scales = [torch.zeros_like(tp.fp8_bwd_scale) for _ in range(2)]
        dist.all_gather(scales, tp.fp8_bwd_scale)
        assert torch.equal(scales[0], scales[1]), "backward scales differ across ranks"
        ref.zero_grad()
        tp.zero_grad()


def test_delayed_scaling_update_with_a_module_alive_on_one_rank_only():
    """A dropped FP8 module held by a reference cycle lives until the cyclic collector runs, on
    each rank at its own moment. The delayed-scaling update must not depend on it: the reduction
    covers the modules that ran (the same on every rank), so the ranks agree and nothing aborts."""
    import gc

    recipe = DelayedScaling(amax_history_len=2)
    x = torch.randn(4, H)
    gc.disable()
    try:
        lingering = te.Linear(H, H)
        with te.fp8_autocast(fp8_recipe=recipe):
            lingering(x)
        lingering.cycle = lingering  # freed only by the cyclic collector
        del lingering
        if dist.get_rank() == 1:
            gc.collect()  # rank 1 collects it, rank 0 keeps it alive
        shared = te.Linear(H, H)
        for step in range(2):
            with te.fp8_autocast(fp8_recipe=recipe):
                shared(x * (dist.get_rank() + step + 1))
        scales = [torch.zeros_like(shared.fp8_fwd_scale) for _ in range(2)]
        dist.all_gather(scales, shared.fp8_fwd_scale)
        assert torch.equal(scales[0], scales[1]), "forward scales differ across ranks"
    finally:
        gc.enable()
        gc.collect()


def test_current_scaling_row_parallel_close_to_single_process():
    torch.manual_seed(4)
    ref = te.Linear(H, OUT)
    tp = te.Linear(H, OUT, parallel_mode="row", tp_group=dist.group.WORLD)
    _load(tp, ref, {"weight": 1, "bias": None})
    x, dy = _inputs(False, H, OUT)
    y_ref, _ = _run(ref, x, dy, Float8CurrentScaling())
    y, _ = _run(tp, _shard(x, 2), dy, Float8CurrentScaling())
    # Per-shard scales differ from the full tensor's: FP8 tolerance.
    assert_close(y, y_ref, "fp8", "output")


def test_bad_tp_arguments():
    with pytest.raises(ValueError, match="divisible by tp_size"):
        te.Linear(H, 7, parallel_mode="column", tp_group=dist.group.WORLD)
    with pytest.raises(ValueError, match="tp_size=4"):
        te.Linear(H, OUT, parallel_mode="column", tp_size=4)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp_sp"])
@pytest.mark.parametrize("fused", [False, True], ids=["split", "fused"])
def test_multihead_attention(sp, fused):
    """Heads split over the ranks: QKV column-parallel, output projection row-parallel."""
    torch.manual_seed(3)
    kw = {
        "attention_dropout": 0.0,
        "input_layernorm": True,
        "num_gqa_groups": 2,
        "fuse_qkv_params": fused,
    }
    ref = te.MultiheadAttention(H, 4, **kw)
    tp = te.MultiheadAttention(
        H, 4, set_parallel_mode=True, tp_group=dist.group.WORLD, sequence_parallel=sp, **kw
    )
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    qkv = (
        ("weight", "bias")
        if fused
        else tuple(f"{n}_{k}" for n in ("query", "key", "value") for k in ("weight", "bias"))
    )
    dims = {f"layernorm_qkv.{n}": 0 for n in qkv} | {"proj.weight": 1}
    _load(tp, ref, dims)
    x, dy = _inputs(sp, H, H)
    y_ref, dx_ref = _run(ref, x, dy)
    y, dx = _run(tp, _shard(x, 0) if sp else x, _shard(dy, 0) if sp else dy)
    assert_close(y, _shard(y_ref, 0) if sp else y_ref, torch.float32, "output")
    assert_close(dx, _shard(dx_ref, 0) if sp else dx_ref, torch.float32, "input grad")
    _check_grads(tp, ref, dims)


@pytest.mark.parametrize("kind", ["delayed", "current", "mxfp8"])
def test_cast_master_weights_to_fp8_shards_equal_one_process(kind):
    # ZeRO: each rank owns a flat piece of the fp32 master weights (cut inside rows and MXFP8
    # blocks; one weight entirely on rank 0); after the cast and a gather of the owned bytes every
    # rank has the bytes and scales of the whole weights quantized in one process.
    from transformer_engine_lite.common import recipe as r
    from transformer_engine_lite.pytorch.tensor.float8_tensor import Float8Quantizer
    from transformer_engine_lite.pytorch.tensor.utils import cast_master_weights_to_fp8

    rec = {"delayed": r.DelayedScaling, "current": r.Float8CurrentScaling,
           "mxfp8": r.MXFP8BlockScaling}[kind]
    shapes = [(70, 45), (32, 64)]
    with te.quantized_model_init(enabled=True, recipe=rec()):
        ws = [te.Linear(k, n, params_dtype=torch.bfloat16).weight for n, k in shapes]
    g = torch.Generator().manual_seed(5)
    masters = [torch.randn(*s, generator=g) * torch.logspace(-2, 2, s[0]).unsqueeze(1)
               for s in shapes]
    refs = [w._quantizer.copy()(m.bfloat16()) if kind != "delayed" else None
            for w, m in zip(ws, masters)]
    if kind == "delayed":
        for w in ws:
            w._quantizer.scale.fill_(0.5)
        refs = [Float8Quantizer(
            torch.full((1,), 0.5), torch.zeros(1), torch.float8_e4m3fn)(m.bfloat16())
            for m in masters]
    rank = dist.get_rank()
    cuts = [(0, 1001), (0, 32 * 64)] if rank == 0 else [(1001, 70 * 45), None]
    mine = [None if c is None else m.reshape(-1)[c[0]:c[1]] for m, c in zip(masters, cuts)]
    cast_master_weights_to_fp8(ws, mine, [None if c is None else c[0] for c in cuts], None)
    names = ["_data", "_scale_inv"] if kind != "mxfp8" else [
        "_rowwise_data", "_columnwise_data", "_rowwise_scale_inv", "_columnwise_scale_inv"]
    for w, ref, c in zip(ws, refs, cuts):
        for name in names:
            got, want = getattr(w, name).view(torch.uint8), getattr(ref, name).view(torch.uint8)
            if name.endswith("_data"):
                # the owned bytes of each rank, gathered (rank 0's where it owns them)
                own = torch.zeros(got.numel(), dtype=torch.uint8)
                if c is not None:
                    own[c[0]:c[1]] = 1
                parts = [torch.zeros_like(got.reshape(-1)) for _ in range(2)]
                owns = [torch.zeros_like(own) for _ in range(2)]
                dist.all_gather(parts, got.reshape(-1).contiguous())
                dist.all_gather(owns, own)
                got = torch.where(owns[0].bool(), parts[0], parts[1])
                want = want.reshape(-1)
            assert torch.equal(got, want), (kind, name)
    if kind == "delayed":  # the amaxes are reduced over the ranks
        for w, m in zip(ws, masters):
            assert w._quantizer.amax.item() == m.bfloat16().abs().max().item()
            assert w._scale_inv.item() == 2.0


@pytest.mark.parametrize("rht", [False, True], ids=["plain", "rht"])
def test_nvfp4_amax_reduction_takes_the_group_amax(rht):
    """NVFP4Quantizer(with_amax_reduction=True) (TE: the amaxes all-reduced with MAX over
    amax_reduction_group before the cast): each rank's shard is scaled by the group's amax (the
    column-wise copy by the post-RHT one): amaxes = the max of every rank's own, bytes = the shard
    quantized with them given (the core's given-amax path, checked against its oracle in
    tests/cpp/test_nvfp4.cpp), and other bytes than the shard's own scaling on the smaller rank."""
    from transformer_engine_lite.pytorch.quantization import ops
    from transformer_engine_lite.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

    torch.manual_seed(5)
    full = torch.randn(2, 32, 64).to(torch.bfloat16) * torch.tensor([1.0, 7.0]).view(2, 1, 1)
    shard = full[dist.get_rank()]
    kw = dict(with_rht=rht, with_post_rht_amax=rht)
    own = [NVFP4Quantizer(**kw)(full[r]) for r in range(2)]
    t = NVFP4Quantizer(with_amax_reduction=True, amax_reduction_group=dist.group.WORLD, **kw)(shard)
    want_r = torch.maximum(own[0]._amax_rowwise, own[1]._amax_rowwise)
    want_c = torch.maximum(own[0]._amax_columnwise, own[1]._amax_columnwise)
    assert torch.equal(t._amax_rowwise, want_r) and torch.equal(t._amax_columnwise, want_c)
    mask = NVFP4Quantizer(**kw).rht_matrix_random_sign_mask_t
    r, rs, _, c, cs, _ = ops().quantize_nvfp4(shard.contiguous(), True, True, False, rht, mask,
                                              False, 0, 0, row_amax_in=want_r,
                                              col_amax_in=want_c)
    assert torch.equal(t._rowwise_data, r) and torch.equal(t._columnwise_data, c)
    assert torch.equal(t._rowwise_scale_inv, rs) and torch.equal(t._columnwise_scale_inv, cs)
    if dist.get_rank() == 0:
        assert not torch.equal(t._rowwise_data, own[0]._rowwise_data)
