"""TE's ZeRO helpers for FP8 primary weights (tensor.utils.cast_master_weights_to_fp8 /
quantize_master_weights, post_all_gather_processing), in one process.

The reference of every case is the quantizer run on the whole master weight (cast to the model
dtype, as TE does): bytes and scales must be equal, bit for bit. Shards split across "ranks" are
run one after another with the amax all-reduce simulated (the MAX of what every rank contributes);
the real 2-process gloo run is in test_distributed.py.
"""

from __future__ import annotations

import copy

import pytest
import torch

import transformer_engine_lite.pytorch as te
import transformer_engine_lite.pytorch.tensor._master_weights as mw
from transformer_engine_lite.common import recipe
from transformer_engine_lite.pytorch.tensor.utils import (
    cast_master_weights_to_fp8,
    post_all_gather_processing,
    quantize_master_weights,
)

RECIPES = {
    "delayed": recipe.DelayedScaling,
    "current": recipe.Float8CurrentScaling,
    "mxfp8": recipe.MXFP8BlockScaling,
}


def fp8_weight(kind: str, shape=(70, 45), dtype=torch.bfloat16) -> torch.Tensor:
    with te.quantized_model_init(enabled=True, recipe=RECIPES[kind]()):
        lin = te.Linear(shape[1], shape[0], params_dtype=dtype)
    w = lin.weight
    if kind == "delayed":
        w._quantizer.scale.fill_(3.0)  # a scale other than 1 so that 1/scale is checked
    return w


def master_weight(shape=(70, 45)) -> torch.Tensor:
    # rows spanning six decades: MXFP8 blocks get different scales
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g) * torch.logspace(-3, 3, shape[0]).unsqueeze(1)


def buffers(w) -> dict[str, torch.Tensor]:
    names = ("_data", "_scale_inv", "_rowwise_data", "_rowwise_scale_inv",
             "_columnwise_data", "_columnwise_scale_inv")
    return {n: getattr(w, n).view(torch.uint8) for n in names if getattr(w, n, None) is not None}


def reference(w, master):
    return w._quantizer.copy()(master.to(w.dtype)) if hasattr(w._quantizer, "copy") else \
        copy.deepcopy(w._quantizer)(master.to(w.dtype))


class _Stop(Exception):
    pass


def run_ranks(w, master, cuts):
    """Each 'rank' k owns master.flatten()[cuts[k]:cuts[k+1]] and its own copy of w; the all-reduce
    is simulated: a first pass records every rank's contribution, a second uses their MAX."""
    flat = master.reshape(-1)
    contributions = []

    def record(t, group):
        contributions.append(t.clone())
        raise _Stop

    orig = mw._all_reduce_max
    out = []
    try:
        mw._all_reduce_max = record
        for k in range(len(cuts) - 1):
            with pytest.raises(_Stop):
                cast_master_weights_to_fp8([copy.deepcopy(w)], [flat[cuts[k]:cuts[k + 1]]],
                                           [cuts[k]], None)
        reduced = torch.stack(contributions).amax(0)
        mw._all_reduce_max = lambda t, group: t.copy_(reduced)
        for k in range(len(cuts) - 1):
            wk = copy.deepcopy(w)
            cast_master_weights_to_fp8([wk], [flat[cuts[k]:cuts[k + 1]]], [cuts[k]], None)
            out.append(wk)
    finally:
        mw._all_reduce_max = orig
    return out


@pytest.mark.parametrize("kind", list(RECIPES))
def test_whole_weight_equals_quantizer(kind):
    w, master = fp8_weight(kind), master_weight()
    ref = buffers(reference(w, master))
    cast_master_weights_to_fp8([w], [master.reshape(-1)], [0], None)
    got = buffers(w)
    assert got.keys() == ref.keys()
    for name in ref:
        assert torch.equal(got[name], ref[name]), name
    if kind == "delayed":
        assert w._scale_inv.item() == pytest.approx(1 / 3.0, rel=1e-7)
        assert w._quantizer.amax.item() == master.to(torch.bfloat16).abs().max().item()


@pytest.mark.parametrize("kind", list(RECIPES))
@pytest.mark.parametrize("shape", [(96, 64), (70, 45)])
def test_shards_across_ranks_give_the_whole_weights_bytes(kind, shape):
    # cuts inside MXFP8 blocks and rows, a one-element shard, an empty shard
    w, master = fp8_weight(kind, shape), master_weight(shape)
    n = master.numel()
    cuts = [0, 1000, 1001, 1001, 3001, n]
    ref = buffers(reference(w, master))
    for k, wk in enumerate(run_ranks(w, master, cuts)):
        got = buffers(wk)
        for name in ref:
            if name.endswith("data"):
                a, b = got[name].reshape(-1), ref[name].reshape(-1)
                assert torch.equal(a[cuts[k]:cuts[k + 1]], b[cuts[k]:cuts[k + 1]]), (k, name)
            else:  # every rank has the scales of the whole weight
                assert torch.equal(got[name], ref[name]), (k, name)


def test_none_master_leaves_bytes_and_several_weights_at_once():
    ws = [fp8_weight("current"), fp8_weight("current", (8, 32)), fp8_weight("delayed")]
    before = ws[1]._data.clone()
    masters = [master_weight().reshape(-1), None, master_weight().reshape(-1)[:100]]
    quantize_master_weights(ws, masters, [0, None, 5], None)
    assert torch.equal(ws[1]._data, before)
    # a weight whose shard lives elsewhere still gets the reduced (here: zero) amax's scale_inv
    assert ws[1]._scale_inv.item() == 1.0
    assert torch.equal(ws[0]._data, reference(fp8_weight("current"), master_weight())._data)


def test_fsdp_shard_is_written_instead_of_the_model_weight():
    w, master = fp8_weight("current"), master_weight()
    before = w._data.clone()
    shard = torch.zeros(200, dtype=torch.uint8)
    cast_master_weights_to_fp8([w], [master.reshape(-1)[100:300]], [100], None, [shard])
    assert torch.equal(w._data, before)
    # the scale is that of the shard's amax (one process): quantize the shard alone to compare
    ref = reference(w, master.reshape(-1)[100:300])
    assert torch.equal(shard, ref._data)


def test_manual_post_all_gather_processing_keeps_then_drops_the_transpose():
    w = fp8_weight("delayed")
    w._transpose, w._transpose_invalid = torch.zeros(45, 70, dtype=torch.uint8), False
    cast_master_weights_to_fp8([w], [master_weight().reshape(-1)], [0], None,
                               manual_post_all_gather_processing=True)
    assert w._transpose is not None
    post_all_gather_processing(w)
    assert w._transpose is None and w._transpose_invalid
    w._transpose, w._transpose_invalid = torch.zeros(45, 70, dtype=torch.uint8), False
    cast_master_weights_to_fp8([w], [master_weight().reshape(-1)], [0], None)
    assert w._transpose is None
    post_all_gather_processing([fp8_weight("mxfp8"), torch.zeros(3)])  # nothing to do


def test_bad_arguments():
    w, m = fp8_weight("current"), master_weight().reshape(-1)
    with pytest.raises(ValueError, match="start_offset must not be None"):
        cast_master_weights_to_fp8([w], [m], [None], None)
    with pytest.raises(ValueError, match=r"end_offset \(3151\) exceeds model_weight numel"):
        cast_master_weights_to_fp8([w], [m], [1], None)
    with pytest.raises(ValueError, match="master_weights: expected 1 entries"):
        cast_master_weights_to_fp8([w], [m, m], [0], None)
    with pytest.raises(ValueError, match="not supported yet"):
        cast_master_weights_to_fp8([torch.zeros(3)], [torch.zeros(3)], [0], None)
    other = fp8_weight("current")
    other._quantizer.amax_epsilon = 1e-3
    with pytest.raises(ValueError, match="same amax_epsilon"):
        cast_master_weights_to_fp8([w, other], [m, m], [0, 0], None)
    with pytest.raises(ValueError, match="group: expected None"):
        cast_master_weights_to_fp8([w], [m], [0], object())
    with pytest.raises(ValueError, match="must be 2D for MXFP8"):
        w3 = fp8_weight("mxfp8")
        cast_master_weights_to_fp8([w3.view(2, 35, 45)], [m], [0], None)


def test_mxfp8_empty_weight_beside_another():
    """A weight without rows (an empty expert's): its block grids are empty (no reshape with an
    inferred -1 of zero elements); a weight after it in the same call gets its own amaxes."""
    q = te.MXFP8Quantizer(te.DType.kFloat8E4M3)
    empty = q(torch.zeros(0, 64, dtype=torch.bfloat16))
    w = fp8_weight("mxfp8")
    m = master_weight()
    quantize_master_weights([empty, w], [torch.zeros(0), m.reshape(-1)], [0, 0], None)
    assert empty._rowwise_data.shape == (0, 64) and empty._columnwise_scale_inv.shape == (0, 64)
    want = reference(w, m)
    for name, buf in buffers(w).items():
        assert torch.equal(buf, buffers(want)[name]), name


def test_hybrid_weight_each_direction_written():
    """A HybridQuantizedTensor model weight: each direction as its own format's weight would be
    (FP8 current-scaling rows: the bytes of the whole weight's quantization; a high-precision
    column direction: the master values), across two ranks' shards."""
    from transformer_engine_lite.pytorch.tensor import HybridQuantizer, IdentityQuantizer

    m = master_weight()
    hq = HybridQuantizer(rowwise_quantizer=te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3),
                         columnwise_quantizer=IdentityQuantizer())
    w = hq(torch.zeros(m.shape, dtype=torch.bfloat16))
    flat = m.reshape(-1)
    cuts = [0, 1000, flat.numel()]
    ranks = run_ranks(w, m, cuts)
    data = torch.cat([r.rowwise_sub_storage._data.view(torch.uint8).reshape(-1)[a:b]
                      for r, a, b in zip(ranks, cuts, cuts[1:])])
    hp = torch.cat([r.columnwise_sub_storage.reshape(-1)[a:b]
                    for r, a, b in zip(ranks, cuts, cuts[1:])])
    want = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3)(m.to(torch.bfloat16))
    assert torch.equal(data, want._data.view(torch.uint8).reshape(-1))
    for r in ranks:
        assert torch.equal(r.rowwise_sub_storage._scale_inv, want._scale_inv)
    assert torch.equal(hp, flat.to(torch.bfloat16))
    post_all_gather_processing([w])
    hq2 = HybridQuantizer(rowwise_quantizer=te.MXFP8Quantizer(te.DType.kFloat8E4M3),
                          columnwise_quantizer=te.MXFP8Quantizer(te.DType.kFloat8E4M3),
                          columnwise_source="rowwise_dequantized")
    with pytest.raises(NotImplementedError, match="rowwise_dequantized"):
        quantize_master_weights([hq2(m.to(torch.bfloat16))], [flat], [0], None)


def test_block_and_nvfp4_weights_are_not_implemented():
    for q in (te.Float8BlockQuantizer(te.DType.kFloat8E4M3, rowwise=True, columnwise=True),
              te.NVFP4Quantizer()):
        w = q(torch.zeros(0, 64, dtype=torch.bfloat16))
        with pytest.raises(NotImplementedError, match=type(q).__name__):
            quantize_master_weights([w], [torch.zeros(0)], [0], None)
