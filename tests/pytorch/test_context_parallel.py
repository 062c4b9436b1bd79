"""Context parallelism of DotProductAttention (2 and 4 processes over gloo) against one process.

Each worker builds the same full q, k, v, d_out from a seed, keeps its DualChunkSwap share (rank r:
chunks r and 2 cp - 1 - r of the sequence), runs DotProductAttention with its CP group and saves
its output rows and gradients; the test compares them with the same rows of one process's
DotProductAttention over the whole sequence. Exactness: 'a2a' computes every head over the whole
sequence with the same kernel, and its all-to-alls are permutations, so it must agree bit for bit;
'all_gather' runs each query row against the same keys in the same order (output and dQ bit for
bit), but dK / dV are sums over the ranks; 'p2p' merges per-chunk (out, LSE) in fp32. Those agree
to fp32 rounding in fp32 (measured <= 1.5e-6) and to the table's few-ulp tolerance in bf16
(measured: 1 ulp; each chunk's output and gradients are rounded to bf16 before the fp32 combine).
"""

from __future__ import annotations

import os
import tempfile
import zlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from utils import assert_close

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.pytorch.attention.dot_product_attention.context_parallel import (
    attn_forward_func_with_cp,
    cp_rank_indices,
    get_batch_on_this_cp_rank,
)

B, D_QK, D_V = 2, 24, 16

# (name, cp_comm_type, mask, window, qkv_format, dtype, heads, gqa heads, softmax_type)
CASES_2 = [
    ("p2p_causal_bshd_f32", "p2p", "causal", None, "bshd", torch.float32, 4, 2, "vanilla"),
    ("p2p_nomask_sbhd_f32", "p2p", "no_mask", None, "sbhd", torch.float32, 4, 4, "vanilla"),
    ("p2p_causal_sbhd_bf16", "p2p", "causal", None, "sbhd", torch.bfloat16, 4, 2, "vanilla"),
    ("ag_causal_bshd_f32", "all_gather", "causal", None, "bshd", torch.float32, 4, 2, "vanilla"),
    ("ag_window_sbhd_f32", "all_gather", "causal", (3, 0), "sbhd", torch.float32, 4, 2, "vanilla"),
    ("ag_nomask_bshd_bf16", "all_gather", "no_mask", None, "bshd", torch.bfloat16, 4, 4, "vanilla"),
    ("a2a_causal_bshd_f32", "a2a", "causal", None, "bshd", torch.float32, 4, 2, "vanilla"),
    ("a2a_window_sbhd_bf16", "a2a", "no_mask", (2, 3), "sbhd", torch.bfloat16, 4, 2, "vanilla"),
    ("a2a_sink_bshd_f32", "a2a", "causal", None, "bshd", torch.float32, 4, 2, "learnable"),
    ("p2p_causal_thd_f32", "p2p", "padding_causal", None, "thd", torch.float32, 4, 2, "vanilla"),
    ("p2p_nomask_thd_bf16", "p2p", "padding", None, "thd", torch.bfloat16, 4, 2, "vanilla"),
    ("a2a_causal_thd_f32", "a2a", "padding_causal", None, "thd", torch.float32, 4, 2, "vanilla"),
]
CASES_4 = [
    ("p2p_causal_bshd_f32", "p2p", "causal", None, "bshd", torch.float32, 4, 2, "vanilla"),
    ("p2p_causal_bshd_bf16", "p2p", "causal", None, "bshd", torch.bfloat16, 4, 2, "vanilla"),
    ("ag_causal_sbhd_f32", "all_gather", "causal", None, "sbhd", torch.float32, 4, 2, "vanilla"),
    ("a2a_causal_bshd_f32", "a2a", "causal", None, "bshd", torch.float32, 4, 4, "vanilla"),
    ("a2a+p2p_causal_bshd_f32", "a2a+p2p", "causal", None, "bshd", torch.float32, 4, 2, "vanilla"),
    ("a2a+p2p_nomask_sbhd_bf16", "a2a+p2p", "no_mask", None, "sbhd", torch.bfloat16, 4, 2,
     "vanilla"),  # fmt: skip
    ("p2p_causal_thd_f32", "p2p", "padding_causal", None, "thd", torch.float32, 4, 2, "vanilla"),
    ("a2a+p2p_causal_thd_f32", "a2a+p2p", "padding_causal", None, "thd", torch.float32, 4, 2,
     "vanilla"),  # fmt: skip
]
SEQ = {2: 20, 4: 24}  # divisible by 2 * cp; chunks of 5 and 3 tokens (odd sizes on purpose)
# thd: packed sequence lengths (multiples of 2 * cp; an empty one, as TE's runner draws them)
THD_LENS = {2: [12, 4, 0, 20], 4: [8, 24, 0, 16]}


def _cu(world: int) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(THD_LENS[world]).cumsum(0).tolist()], dtype=torch.int32)


def _inputs(case, s: int):
    _, _, _, _, fmt, dtype, h, hkv, _ = case
    g = torch.Generator().manual_seed(zlib.crc32(case[0].encode()))
    shape = {"bshd": (B, s), "sbhd": (s, B), "thd": (s,)}[fmt]
    q = torch.randn(*shape, h, D_QK, generator=g).to(dtype)
    k = torch.randn(*shape, hkv, D_QK, generator=g).to(dtype)
    v = torch.randn(*shape, hkv, D_V, generator=g).to(dtype)
    dout = torch.randn(*shape, h * D_V, generator=g).to(dtype)
    offset = torch.randn(h, generator=g)
    return q, k, v, dout, offset


def _shard(x: torch.Tensor, sdim: int, cp: int, r: int, thd: bool = False) -> torch.Tensor:
    if thd:  # every packed sequence cut in 2 cp chunks (get_batch_on_this_cp_rank's layout)
        return x.index_select(0, cp_rank_indices(_cu(cp), cp, r))
    c = x.chunk(2 * cp, sdim)
    return torch.cat((c[r], c[2 * cp - 1 - r]), sdim)


def _module(case, cp_group=None, cp_comm_type="p2p"):
    _, _, mask, window, fmt, _, h, hkv, softmax_type = case
    return te.DotProductAttention(
        h,
        (D_QK, D_V),
        num_gqa_groups=hkv,
        qkv_format=fmt,
        attn_mask_type=mask,
        window_size=window,
        softmax_type=softmax_type,
        cp_group=cp_group,
        cp_comm_type=cp_comm_type,
    )


def _run(m, q, k, v, dout, offset, cu=None):
    if m.softmax_type == "learnable":
        with torch.no_grad():
            m.softmax_offset.copy_(offset)
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = m(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu)
    out.backward(dout)
    grads = [q.grad, k.grad, v.grad]
    if m.softmax_type == "learnable":
        grads.append(m.softmax_offset.grad.clone())
    return out.detach(), grads


def _groups(world: int, comm_type: str):
    """The CP group(s): the whole world, or for a2a+p2p TE's hierarchy (a2a groups of 2
    consecutive ranks, p2p groups striding over them). Every rank creates every group."""
    if comm_type != "a2a+p2p":
        return dist.group.WORLD
    a = 2
    mine = []
    for i in range(world // a):
        g = dist.new_group(list(range(i * a, (i + 1) * a)))
        if dist.get_rank() // a == i:
            mine.append(g)
    for j in range(a):
        g = dist.new_group(list(range(j, world, a)))
        if dist.get_rank() % a == j:
            mine.append(g)
    return mine


# TransformerLayer with RoPE (the attention's CP setup reaches it through
# set_context_parallel_group; RoPE takes the rank's positions from the CP size / rank).
LAYER_COMM = {2: "p2p", 4: "a2a+p2p"}
HIDDEN, FFN, LAYER_HEADS = 32, 48, 4


def _layer_inputs(s: int):
    torch.manual_seed(7)
    layer = te.TransformerLayer(
        HIDDEN, FFN, LAYER_HEADS, hidden_dropout=0.0, attention_dropout=0.0,
        self_attn_mask_type="causal", attn_input_format="bshd",
    )  # fmt: skip
    x = torch.randn(B, s, HIDDEN)
    dy = torch.randn(B, s, HIDDEN)
    freqs = te.attention.RotaryPositionEmbedding(HIDDEN // LAYER_HEADS)(s)
    return layer, x, dy, freqs


def _run_layer(layer, x, dy, freqs):
    x = x.clone().requires_grad_(True)
    y = layer(x, rotary_pos_emb=freqs)
    y.backward(dy)
    wgrads = {n: p.grad.clone() for n, p in layer.named_parameters()}
    return y.detach(), x.grad, wgrads


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for case in CASES_2 if world == 2 else CASES_4:
            fmt, comm_type = case[4], case[1]
            sdim, thd = (1 if fmt == "bshd" else 0), fmt == "thd"
            s = int(_cu(world)[-1]) if thd else SEQ[world]
            q, k, v, dout, offset = _inputs(case, s)
            q, k, v, dout = (_shard(t, sdim, world, rank, thd) for t in (q, k, v, dout))
            m = _module(case, _groups(world, comm_type), comm_type)
            results[case[0]] = _run(m, q, k, v, dout, offset, _cu(world) if thd else None)
        layer, x, dy, freqs = _layer_inputs(SEQ[world])
        groups = _groups(world, LAYER_COMM[world])
        layer.set_context_parallel_group(groups, None, None, LAYER_COMM[world])
        x, dy = (_shard(t, 1, world, rank) for t in (x, dy))
        results["layer"] = _run_layer(layer, x, dy, freqs)
        # FP8 attention with the ring on thd (TE's FP8 CP takes bshd / sbhd only; the FP8 CP
        # itself: test_context_parallel_fp8*.py): refused, never silently run in high precision
        from transformer_engine_lite.common.recipe import DelayedScaling

        case = next(c for c in CASES_2 if c[0] == "p2p_causal_thd_f32")
        q, k, v, _, _ = _inputs(case, int(_cu(world)[-1]))
        q, k, v = (_shard(t, 0, world, rank, True) for t in (q, k, v))
        try:
            with te.fp8_autocast(fp8_recipe=DelayedScaling(fp8_dpa=True)):
                _run(_module(case, dist.group.WORLD, "p2p"), q, k, v, None, None, _cu(world))
            results["fp8_refused"] = ""
        except ValueError as e:
            results["fp8_refused"] = str(e)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _spawn(world: int, worker=_worker):
    """worker(rank, world, init_file, out_dir) in `world` forked processes, each saving
    out_dir/rank{r}.pt: the ranks' results (the other context-parallel test files pass theirs)."""
    with tempfile.TemporaryDirectory() as d:
        # fork: the workers inherit the imported torch / library (an import costs seconds on a
        # busy 2-core runner); this runs before the parent computes anything (no OpenMP pool yet).
        mp.start_processes(
            worker,
            args=(world, os.path.join(d, "pg"), d),
            nprocs=world,
            join=True,
            start_method="fork",
        )
        return [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(world)]


@pytest.fixture(scope="module")
def cp_results():
    # Both worlds are forked before this process computes anything (see _spawn).
    return {world: _spawn(world) for world in (2, 4)}


@pytest.mark.parametrize("world", [2, 4])
def test_cp_equals_one_process(world, cp_results):
    ranks = cp_results[world]
    for case in CASES_2 if world == 2 else CASES_4:
        name, comm_type, fmt, dtype = case[0], case[1], case[4], case[5]
        sdim, thd = (1 if fmt == "bshd" else 0), fmt == "thd"
        s = int(_cu(world)[-1]) if thd else SEQ[world]
        q, k, v, dout, offset = _inputs(case, s)
        out1, grads1 = _run(_module(case), q, k, v, dout, offset, _cu(world) if thd else None)
        exact = "compiled"  # (0, 0): bit for bit
        kind = exact if comm_type == "a2a" else dtype
        kind_q = exact if comm_type in ("a2a", "all_gather") else dtype  # out and dq
        for r in range(world):
            out_r, grads_r = ranks[r][name]
            what = f"{name} rank {r}/{world}"
            assert_close(out_r, _shard(out1, sdim, world, r, thd), kind_q, f"out of {what}")
            for label, g, g1 in zip("qkv", grads_r, grads1):
                k_ = kind_q if label == "q" else kind
                assert_close(g, _shard(g1, sdim, world, r, thd), k_, f"d{label} of {what}")
        if len(grads1) == 4:  # learnable sinks: each rank has its heads' share; the sum is whole
            total = sum(ranks[r][name][1][3] for r in range(world))
            assert_close(total, grads1[3], torch.float32, f"d softmax_offset of {name}")


# ------------------------------------------------------------------------- argument checks
class _FakeGroupEnv:
    """A one-process gloo group, enough for the argument checks (size 1: no CP)."""

    def __enter__(self):
        self.fd, path = tempfile.mkstemp()
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
        return dist.group.WORLD

    def __exit__(self, *exc):
        dist.destroy_process_group()
        os.close(self.fd)


def test_bad_cp_arguments():
    with pytest.raises(ValueError, match=r"cp_comm_type: expected one of .*got 'ring'"):
        te.DotProductAttention(2, 8, cp_comm_type="ring")
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        te.DotProductAttention(2, 8, cp_group=object())
    with _FakeGroupEnv() as g:
        with pytest.raises(ValueError, match=r"a2a\+p2p' needs cp_group = \[a2a_group, p2p_grou"):
            te.DotProductAttention(2, 8, cp_group=g, cp_comm_type="a2a+p2p")
        with pytest.raises(ValueError, match="a list of groups is for cp_comm_type='a2a\\+p2p'"):
            te.DotProductAttention(2, 8, cp_group=[g, g], cp_comm_type="p2p")
        with pytest.raises(ValueError, match=r"cp_global_ranks: expected .*\[0\], got \[3\]"):
            te.DotProductAttention(2, 8, cp_group=g, cp_global_ranks=[3])
        q = torch.randn(1, 4, 2, 8)
        q3 = q[0]
        with pytest.raises(ValueError, match="'thd' needs cu_seqlens_q_padded"):
            attn_forward_func_with_cp(True, q3, q3, q3, None, None, None, None, None, None, 0.0,
                                      g, None, None, "p2p", qkv_format="thd")  # fmt: skip
        cu, cu2 = torch.tensor([0, 4], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32)
        with pytest.raises(NotImplementedError, match="cross attention"):
            attn_forward_func_with_cp(True, q3, q3, q3, cu, cu2, None, None, cu, cu, 0.0, g,
                                      None, None, "p2p", qkv_format="thd")  # fmt: skip
        with pytest.raises(NotImplementedError, match="'thd' with cp_comm_type='all_gather'"):
            attn_forward_func_with_cp(True, q3, q3, q3, cu, cu, None, None, cu, cu, 0.0, g,
                                      None, None, "all_gather", qkv_format="thd")  # fmt: skip
        with pytest.raises(NotImplementedError, match="dropout"):
            attn_forward_func_with_cp(True, q, q, q, None, None, None, None, None, None, 0.1, g,
                                      None, None, "p2p")  # fmt: skip
        with pytest.raises(NotImplementedError, match=r"window_size=\(2, 0\) with cp_comm_type="):
            attn_forward_func_with_cp(True, q, q, q, None, None, None, None, None, None, 0.0, g,
                                      None, None, "p2p", window_size=(2, 0))  # fmt: skip
        with pytest.raises(NotImplementedError, match="attn_mask_type='padding'"):
            attn_forward_func_with_cp(True, q, q, q, None, None, None, None, None, None, 0.0, g,
                                      None, None, "all_gather",
                                      attn_mask_type="padding")  # fmt: skip
        with pytest.raises(ValueError, match="local sequence length 3: expected an even number"):
            q3 = torch.randn(1, 3, 2, 8)
            attn_forward_func_with_cp(True, q3, q3, q3, None, None, None, None, None, None, 0.0,
                                      g, None, None, "p2p")  # fmt: skip


def test_get_batch_on_this_cp_rank_layout(monkeypatch):
    """Every rank's share, over all ranks, is the whole batch once; rank r holds chunks r and
    2 cp - 1 - r of every sequence (TE's DualChunkSwap)."""
    cu = torch.tensor([0, 8, 24, 32])
    ids = torch.arange(32).view(1, 32)
    for cp in (2, 4):
        seen = []
        for r in range(cp):
            monkeypatch.setattr(dist, "get_world_size", lambda group=None, cp=cp: cp)
            monkeypatch.setattr(dist, "get_rank", lambda group=None, r=r: r)
            a, b, p = get_batch_on_this_cp_rank(cu, ids, ids[0] * 10, ids[0])
            assert torch.equal(b, a[0] * 10) and torch.equal(p, a[0])
            for start, n in ((0, 8), (8, 16), (24, 8)):
                c = n // (2 * cp)
                want = list(range(start + r * c, start + (r + 1) * c))
                want += list(range(start + (2 * cp - 1 - r) * c, start + (2 * cp - r) * c))
                assert all(t in a[0].tolist() for t in want)
            seen += a[0].tolist()
        assert sorted(seen) == list(range(32))
    with pytest.raises(ValueError, match="multiple of 2 \\* cp_size = 8"):
        get_batch_on_this_cp_rank(torch.tensor([0, 6]), ids[:, :6], ids[0, :6], ids[0, :6])


@pytest.mark.parametrize("world", [2, 4])
def test_fp8_attention_with_cp_is_refused(world, cp_results):
    for r in cp_results[world]:
        msg = r["fp8_refused"]
        assert "FP8 attention" in msg and "qkv_format='thd'" in msg
        assert "context parallelism" in msg


@pytest.mark.parametrize("world", [2, 4])
def test_transformer_layer_cp_equals_one_process(world, cp_results):
    """TransformerLayer (RoPE, causal) with set_context_parallel_group: each rank's output rows
    and input gradient equal one process's; weight gradients summed over the ranks (as a data /
    context-parallel all-reduce would) equal one process's."""
    ranks = cp_results[world]
    y1, dx1, w1 = _run_layer(*_layer_inputs(SEQ[world]))
    for r in range(world):
        y, dx, _ = ranks[r]["layer"]
        assert_close(y, _shard(y1, 1, world, r), torch.float32, f"layer out, rank {r}/{world}")
        assert_close(dx, _shard(dx1, 1, world, r), torch.float32, f"layer dx, rank {r}/{world}")
    for name, g1 in w1.items():
        total = sum(ranks[r]["layer"][2][name] for r in range(world))
        assert_close(total, g1, torch.float32, f"layer grad of {name} ({world} ranks)")


def test_thd_get_partitioned_indices():
    """TE's tex helper: TE's dual-chunk example, int32."""
    from transformer_engine_lite.pytorch import tex

    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    assert torch.equal(
        tex.thd_get_partitioned_indices(cu, 16, 2, 0),
        torch.tensor([0, 1, 6, 7, 8, 9, 14, 15], dtype=torch.int32),
    )
    assert torch.equal(
        tex.thd_get_partitioned_indices(cu, 16, 2, 1),
        torch.tensor([2, 3, 4, 5, 10, 11, 12, 13], dtype=torch.int32),
    )
    with pytest.raises(ValueError, match=r"rank 2: expected \[0, 2\)"):
        tex.thd_get_partitioned_indices(cu, 16, 2, 2)


def test_get_cu_seqlens_on_cp_rank():
    """Real tokens per rank: sequences of 10 and 3 real tokens padded to 16 and 8 (cp 2: chunks
    of 4 and 2). Rank 0 holds chunks 0 and 3: 4 + 0 and 2 + 0 real tokens; rank 1 chunks 1 and
    2: 4 + 2 and 1 + 0; every real token is held once over the ranks."""
    from transformer_engine_lite.pytorch.attention.dot_product_attention.context_parallel import (
        get_cu_seqlens_on_cp_rank,
    )

    cu = torch.tensor([0, 10, 13], dtype=torch.int32)
    local = torch.tensor([0, 16, 24], dtype=torch.int32) // 2
    r0 = get_cu_seqlens_on_cp_rank(cu, local, 2, 0, True, True)
    r1 = get_cu_seqlens_on_cp_rank(cu, local, 2, 1, True, True)
    assert r0.tolist() == [0, 4, 6] and r0.dtype == torch.int32
    assert r1.tolist() == [0, 6, 7]
    assert get_cu_seqlens_on_cp_rank(cu, local, 2, 1, False, True).tolist() == [0, 2, 2]
