"""Context parallelism with padding between thd sequences (TE's cu_seqlens_q_padded /
pad_between_seqs) and with a post_scale_bias ('p2p', bshd / sbhd), 2 and 4 gloo processes
against one process (test_context_parallel.py's harness: DualChunkSwap shares, same tolerances).

The one-process reference of the padded cases is DotProductAttention's own padded path (the
real tokens gathered, tests/pytorch/test_context_parallel_pad_bias.py::test_padded_thd_one_process
checks it against fp64); padding rows must be exactly zero in the output and every gradient.
The bias is sharded as TE's runner shards it: the rank's query rows, every key column.
"""

from __future__ import annotations

import os
import tempfile
import zlib

import pytest
import torch
import torch.distributed as dist
from test_context_parallel import _groups, _shard, _spawn
from utils import assert_close

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch.attention.dot_product_attention.context_parallel import (
    attn_forward_func_with_cp,
    cp_rank_indices,
)

B, H, HKV, D = 2, 8, 4, 16
# thd: real lengths and their padded lengths (multiples of 2 cp; an empty sequence, one that is
# all padding, one without padding)
REAL = {2: [5, 0, 12, 1], 4: [3, 16, 0, 9]}
PADDED = {2: [8, 4, 12, 4], 4: [8, 16, 8, 16]}
SEQ = {2: 12, 4: 16}

# (name, cp_comm_type, mask, fmt, dtype, bias shape or None)
CASES = {
    2: [
        ("pad_p2p_causal_f32", "p2p", "padding_causal", "thd", torch.float32, None),
        ("pad_p2p_nomask_bf16", "p2p", "padding", "thd", torch.bfloat16, None),
        ("pad_a2a_causal_f32", "a2a", "padding_causal", "thd", torch.float32, None),
        ("bias_p2p_causal_bshd_f32", "p2p", "causal", "bshd", torch.float32, "1hss"),
        ("bias_p2p_nomask_sbhd_bf16", "p2p", "no_mask", "sbhd", torch.bfloat16, "b1ss"),
        ("bias_p2p_causal_sbhd_f32", "p2p", "causal", "sbhd", torch.float32, "11ss"),
    ],
    4: [
        ("pad_p2p_causal_f32", "p2p", "padding_causal", "thd", torch.float32, None),
        ("pad_a2a_nomask_f32", "a2a", "padding", "thd", torch.float32, None),
        ("pad_a2a+p2p_causal_f32", "a2a+p2p", "padding_causal", "thd", torch.float32, None),
        ("bias_p2p_causal_bshd_f32", "p2p", "causal", "bshd", torch.float32, "bhss"),
        ("bias_p2p_nomask_bshd_bf16", "p2p", "no_mask", "bshd", torch.bfloat16, "11ss"),
    ],
}


def _cu(lens) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def _bias_shape(kind: str, s: int):
    return {"1hss": (1, H, s, s), "b1ss": (B, 1, s, s), "bhss": (B, H, s, s),
            "11ss": (1, 1, s, s)}[kind]  # fmt: skip


def _inputs(case, world: int):
    name, _, _, fmt, dtype, bias_kind = case
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    s = int(_cu(PADDED[world])[-1]) if fmt == "thd" else SEQ[world]
    shape = {"bshd": (B, s), "sbhd": (s, B), "thd": (s,)}[fmt]
    q = torch.randn(*shape, H, D, generator=g).to(dtype)
    k = torch.randn(*shape, HKV, D, generator=g).to(dtype)
    v = torch.randn(*shape, HKV, D, generator=g).to(dtype)
    dout = torch.randn(*shape, H * D, generator=g).to(dtype)
    bias = None
    if bias_kind is not None:
        bias = torch.randn(*_bias_shape(bias_kind, s), generator=g).to(dtype)
    return q, k, v, dout, bias


def _run(case, world, q, k, v, dout, bias, cp_group=None):
    name, comm_type, mask, fmt, _, bias_kind = case
    m = te.DotProductAttention(H, D, num_gqa_groups=HKV, qkv_format=fmt, attn_mask_type=mask,
                               cp_group=cp_group, cp_comm_type=comm_type)  # fmt: skip
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    kw = {}
    if fmt == "thd":
        cu, cup = _cu(REAL[world]), _cu(PADDED[world])
        kw = dict(cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cup,
                  cu_seqlens_kv_padded=cup, pad_between_seqs=True)  # fmt: skip
    if bias is not None:
        bias = bias.clone().requires_grad_(True)
        kw.update(core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    out = m(q, k, v, **kw)
    out.backward(dout)
    grads = [q.grad, k.grad, v.grad] + ([bias.grad] if bias is not None else [])
    return out.detach(), grads


def _share(x, fmt, world, r, bias_rows=False):
    if fmt == "thd":
        return x.index_select(0, cp_rank_indices(_cu(PADDED[world]), world, r))
    if bias_rows:
        return _shard(x, x.dim() - 2, world, r)
    return _shard(x, 1 if fmt == "bshd" else 0, world, r)


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for case in CASES[world]:
            fmt = case[3]
            q, k, v, dout, bias = _inputs(case, world)
            q, k, v, dout = (_share(t, fmt, world, rank) for t in (q, k, v, dout))
            if bias is not None:
                bias = _share(bias, fmt, world, rank, bias_rows=True)
            results[case[0]] = _run(case, world, q, k, v, dout, bias, _groups(world, case[1]))
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def cp_results():
    return {world: _spawn(world, _worker) for world in (2, 4)}


@pytest.mark.parametrize("world", [2, 4])
def test_cp_pad_and_bias_equal_one_process(world, cp_results):
    for case in CASES[world]:
        name, comm_type, _, fmt, dtype, bias_kind = case
        q, k, v, dout, bias = _inputs(case, world)
        out1, grads1 = _run(case, world, q, k, v, dout, bias)
        kind = "compiled" if comm_type == "a2a" else dtype  # a2a: bit for bit
        for r in range(world):
            out_r, grads_r = cp_results[world][r][name]
            what = f"{name} rank {r}/{world}"
            assert_close(out_r, _share(out1, fmt, world, r), kind, f"out of {what}")
            for label, g, g1 in zip("qkv", grads_r, grads1):
                assert_close(g, _share(g1, fmt, world, r), kind, f"d{label} of {what}")
        if bias_kind is not None:  # the rank's rows of dbias
            for r in range(world):
                db = cp_results[world][r][name][1][3]
                assert_close(db, _share(grads1[3], fmt, world, r, True), dtype,
                             f"dbias of {name} rank {r}")  # fmt: skip
        if fmt == "thd":  # padding rows: exact zeros in the output and every gradient
            cu, cup = _cu(REAL[world]), _cu(PADDED[world])
            pad = torch.ones(int(cup[-1]), dtype=torch.bool)
            for i in range(len(REAL[world])):
                pad[int(cup[i]) : int(cup[i]) + int(cu[i + 1] - cu[i])] = False
            for r in range(world):
                mine = _share(pad, fmt, world, r)
                out_r, grads_r = cp_results[world][r][name]
                for t in (out_r, *grads_r):
                    assert not t[mine].any(), f"{name} rank {r}: nonzero padding rows"


def test_padded_thd_one_process():
    """DotProductAttention's padded thd path against an fp64 per-sequence reference."""
    torch.manual_seed(3)
    real, padded = [5, 0, 7, 3], [8, 4, 8, 4]
    cu, cup = _cu(real), _cu(padded)
    t = int(cup[-1])
    q, k, v = (torch.randn(t, H, D, dtype=torch.float64) for _ in range(3))
    m = te.DotProductAttention(H, D, qkv_format="thd", attn_mask_type="padding_causal")
    qf, kf, vf = (x.float().requires_grad_(True) for x in (q, k, v))
    out = m(qf, kf, vf, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cup,
            cu_seqlens_kv_padded=cup)  # fmt: skip
    out.sum().backward()
    for i, n in enumerate(real):
        p = int(cup[i])
        s = torch.einsum("qhd,khd->hqk", q[p : p + n], k[p : p + n]) * D**-0.5
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
        ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), v[p : p + n]).reshape(n, H * D)
        assert_close(out[p : p + n].double(), ref, torch.float32, f"sequence {i}")
        assert not out[p + n : int(cup[i + 1])].any()
        for g in (qf.grad, kf.grad, vf.grad):
            assert not g[p + n : int(cup[i + 1])].any()


def test_pad_and_bias_argument_checks():
    q = torch.randn(1, 4, 2, 8)
    m = te.DotProductAttention(2, 8, qkv_format="bshd")
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="pad_between_seqs=True: .* 'thd', got 'bshd'"):
        m(q, q, q, pad_between_seqs=True)
    with pytest.raises(ValueError, match="pad_between_seqs: expected a bool or None, got 1"):
        m(q, q, q, pad_between_seqs=1)
    t = torch.randn(4, 2, 8)
    mt = te.DotProductAttention(2, 8, qkv_format="thd", attn_mask_type="padding")
    with pytest.raises(ValueError, match=r"within its padded length"):
        mt(t, t, t, cu_seqlens_q=torch.tensor([0, 5], dtype=torch.int32), cu_seqlens_kv=cu,
           cu_seqlens_q_padded=cu, cu_seqlens_kv_padded=cu)  # fmt: skip
    fd, path = tempfile.mkstemp()
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    try:
        g = dist.group.WORLD
        bias = torch.randn(1, 1, 4, 4)
        args = (True, q, q, q, None, None, None, None, None, None, 0.0, g, None, None)
        for comm_type, exc, msg in (
            ("a2a+p2p", ValueError, "not with 'a2a\\+p2p'"),
            ("a2a", NotImplementedError, "cp_comm_type='a2a' \\(only 'p2p'\\)"),
            ("all_gather", NotImplementedError, "only 'p2p'"),
        ):
            cp_group = [g, g] if comm_type == "a2a+p2p" else g
            with pytest.raises(exc, match=msg):
                attn_forward_func_with_cp(*args[:11], cp_group, None, None, comm_type,
                                          attn_bias_type="post_scale_bias",
                                          attn_bias=bias)  # fmt: skip
        with pytest.raises(ValueError, match=r"attn_bias: expected \[1 or 1, 1 or 2, 4, 4\]"):
            attn_forward_func_with_cp(*args, "p2p", attn_bias_type="post_scale_bias",
                                      attn_bias=torch.randn(1, 1, 4, 8))  # fmt: skip
        with pytest.raises(ValueError, match="needs attn_bias, got None"):
            attn_forward_func_with_cp(*args, "p2p", attn_bias_type="post_scale_bias")
    finally:
        dist.destroy_process_group()
        os.close(fd)


def test_combine_and_quantize_shares_one_scale():
    """TE's utils.combine_and_quantize (its CP runner's fp8_mha inputs): q, k, v quantized with
    one current scale from their joint amax; bytes against torch's own float8 cast."""
    from transformer_engine_lite.pytorch import DType, Float8CurrentScalingQuantizer
    from transformer_engine_lite.pytorch.attention.dot_product_attention.utils import (
        combine_and_quantize,
    )

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 8, 4, 16, generator=g, dtype=torch.float32) * s for s in (1, 2, 3))
    quantizer = Float8CurrentScalingQuantizer(fp8_dtype=DType.kFloat8E4M3, device="cpu")
    qf, kf, vf, layout, fmt = combine_and_quantize("bshd_bshd_bshd", q, k, v, quantizer)
    assert layout == "bshd_bshd_bshd" and fmt is None
    amax = max(t.abs().max() for t in (q, k, v))
    scale = torch.tensor(448.0) / amax
    for t, f in ((q, qf), (k, kf), (v, vf)):
        want = (t * scale).to(torch.float8_e4m3fn).view(torch.uint8)
        assert f.shape == t.shape and f.dtype == t.dtype
        assert torch.equal(f._data.reshape(t.shape), want)
        assert torch.equal(f._scale_inv.reshape(()), (1 / scale).reshape(()))
    with pytest.raises(NotImplementedError, match="qkv_quantizer: .* got object"):
        combine_and_quantize("bshd_bshd_bshd", q, k, v, object())
