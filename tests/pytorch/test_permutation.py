"""MoE token permutation (transformer_engine_lite.pytorch.permutation, TE's API): forward and
gradients against a pure-torch fp64 reference and against Megatron-Core's unfused functions
(moe_utils.permute / unpermute / sort_chunks_by_idxs, fused=False), every dtype, num_out_tokens
dropping, probs (with TE's zero-prob padding rows), Float8Tensor inputs (bytes permuted, scale_inv
kept), MXFP8Tensor inputs (bytes and scale rows permuted), TE's row_id_map layout, the index map
(map_type="index": TE's [topK * num_tokens] row_id_map from a stable sort, against a pure-torch
reference), errors naming the argument, and the opcheck cases of the moe_* ops
(PERMUTATION_OPCHECK_CASES, collected by test_ops.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytest.importorskip(
    "transformer_engine_lite.pytorch.te_lite_ops",
    reason="PyTorch extension not built",
    exc_type=ImportError,
)

from op_helpers import run_opcheck  # noqa: E402
from utils import DTYPES, assert_close  # noqa: E402

from transformer_engine_lite.pytorch import permutation as perm  # noqa: E402
from transformer_engine_lite.pytorch.tensor import (  # noqa: E402
    Float8Quantizer,
    Float8Tensor,
    MXFP8Quantizer,
    MXFP8Tensor,
)

# (tokens, experts, hidden, topk, dropped routes)
SHAPES = [(1, 1, 1, 1, 0), (7, 8, 5, 2, 0), (33, 16, 67, 4, 5), (20, 37, 129, 5, 11)]


def _routing(t: int, e: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(t, e, generator=g)
    idx = scores.topk(k, dim=1).indices
    return torch.zeros(t, e, dtype=torch.bool).scatter_(1, idx, True)


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


# ------------------------------------------------------------------------------ fp64 reference
def _routes(routing_map: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, expert) of each kept route in permuted order: expert-major, tokens ascending."""
    t = routing_map.shape[0]
    flat = routing_map.bool().T.reshape(-1).nonzero().flatten()[:n]
    return flat % t, flat // t


def ref_permute(x, routing_map, n, probs=None):
    tok, exp = _routes(routing_map, n)
    out = x.double()[tok]
    if probs is None:
        return out, None
    pp = probs.double()[tok, exp]
    return out * (pp != 0).double().unsqueeze(1), pp


def ref_unpermute(y, routing_map, n, num_tokens, merging=None):
    tok, exp = _routes(routing_map, n)
    rows = y.double()[: tok.numel()]
    if merging is not None:
        rows = rows * merging.double()[tok, exp].unsqueeze(1)
    return torch.zeros(num_tokens, y.shape[1], dtype=torch.float64).index_add_(0, tok, rows)


# ------------------------------------------------------------------------------ forward + grads
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_permute_with_probs_matches_reference(shape, dtype):
    t, e, h, k, drop = shape
    rm = _routing(t, e, k, seed=t)
    n = t * k - drop
    x = _randn(t, h, dtype=dtype, seed=1).requires_grad_()
    probs = torch.rand(t, e, generator=torch.Generator().manual_seed(2)).to(dtype)
    probs[0, rm[0].nonzero()[0, 0]] = 0.0  # a padding slot
    probs.requires_grad_()
    out, pp, row_id_map = perm.moe_permute_with_probs(x, probs, rm, num_out_tokens=n)
    ref_out, ref_pp = ref_permute(x.detach(), rm, n, probs.detach())
    assert out.dtype == dtype and out.shape == (n, h) and row_id_map.dtype == torch.int32
    assert torch.equal(out.double(), ref_out)
    assert torch.equal(pp.double(), ref_pp)
    gy, gp = _randn(n, h, dtype=dtype, seed=3), _randn(n, dtype=dtype, seed=4)
    torch.autograd.backward((out, pp), (gy, gp))
    # d/dx: the permuted gradient summed back per token (padding rows pass their gradient as TE).
    assert_close(x.grad, ref_unpermute(gy, rm, n, t), dtype, "grad inp")
    tok, exp = _routes(rm, n)
    ref_gp = torch.zeros(t, e, dtype=torch.float64).index_put_((tok, exp), gp.double())
    assert torch.equal(probs.grad.double(), ref_gp)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("merge", [False, True], ids=["sum", "merging_probs"])
def test_unpermute_matches_reference(shape, dtype, merge):
    t, e, h, k, drop = shape
    rm = _routing(t, e, k, seed=t + 1)
    n = t * k - drop
    _, row_id_map = perm.moe_permute(_randn(t, h, dtype=dtype), rm, num_out_tokens=n)
    y = _randn(n, h, dtype=dtype, seed=5).requires_grad_()
    mp = torch.rand(t, e, generator=torch.Generator().manual_seed(6)).to(dtype).requires_grad_()
    out = perm.moe_unpermute(y, row_id_map, merging_probs=mp if merge else None,
                             restore_shape=torch.Size((t, h)))
    y64 = y.detach().double().requires_grad_()
    mp64 = mp.detach().double().requires_grad_()
    ref = ref_unpermute(y64, rm, n, t, mp64 if merge else None)
    assert_close(out, ref, dtype, "unpermute")
    g = _randn(t, h, dtype=dtype, seed=7)
    out.backward(g)
    ref.backward(g.double())
    assert_close(y.grad, y64.grad, dtype, "grad inp")
    if merge:
        assert_close(mp.grad, mp64.grad, dtype, "grad merging_probs")
    else:
        assert mp.grad is None


def test_row_id_map_is_te_layout():
    # TE's make_row_id_map docstring example.
    rm = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 1], [1, 1, 0], [0, 0, 0]], dtype=torch.int32)
    _, row_id_map = perm.moe_permute(torch.zeros(5, 2), rm)
    expected = [[3, 0, -1, 1, 0, -1, 2], [5, 1, -1, 2, 0, -1, 2], [6, -1, -1, 2, -1, -1, 1],
                [4, 2, -1, 1, 0, -1, 2], [-1, -1, -1, -1, -1, -1, 0]]
    assert row_id_map.tolist() == expected


def test_num_out_tokens_default_keeps_every_route_and_extra_rows_are_zero():
    rm = _routing(9, 4, 2)
    x = _randn(9, 6)
    out, _ = perm.moe_permute(x, rm)
    assert out.shape == (18, 6)
    out_pad, _ = perm.moe_permute(x, rm, num_out_tokens=20)
    assert torch.equal(out_pad[:18], out) and not out_pad[18:].any()


# ------------------------------------------------------------------------------ vs Megatron
moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("drop", [0, 7])
def test_matches_megatron_unfused(dtype, drop):
    t, e, h, k = 40, 8, 24, 2
    rm = _routing(t, e, k, seed=3)
    n = t * k - drop
    x = _randn(t, h, dtype=dtype, seed=8)
    probs = (torch.rand(t, e, generator=torch.Generator().manual_seed(9)) + 0.1).to(dtype)
    probs = probs * rm
    ours, ours_pp, row_id_map = perm.moe_permute_with_probs(x, probs, rm, num_out_tokens=n)
    theirs, theirs_pp, sorted_indices, _, _ = moe_utils.permute(
        x, rm, probs=probs, num_out_tokens=n, fused=False
    )
    assert torch.equal(ours, theirs) and torch.equal(ours_pp, theirs_pp)
    y = _randn(n, h, dtype=dtype, seed=10)
    ours_u = perm.moe_unpermute(y, row_id_map, restore_shape=x.shape)
    theirs_u = moe_utils.unpermute(y, sorted_indices, x.shape, fused=False)
    assert_close(ours_u, theirs_u.double(), dtype, "unpermute")
    if drop == 0:  # Megatron's merging path re-derives the probs from the whole routing map
        ours_m = perm.moe_unpermute(y, row_id_map, merging_probs=probs, restore_shape=x.shape)
        theirs_m = moe_utils.unpermute(y, sorted_indices, x.shape, probs=probs, routing_map=rm)
        assert_close(ours_m, theirs_m.double(), dtype, "unpermute merging_probs")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sort_chunks_matches_megatron_and_reference(dtype):
    sizes = torch.tensor([3, 0, 5, 2, 4])
    order = torch.tensor([2, 4, 0, 3, 1], dtype=torch.int32)
    x = _randn(14, 9, dtype=dtype).requires_grad_()
    p = torch.rand(14).to(dtype).requires_grad_()
    out, pp = perm.moe_sort_chunks_by_index_with_probs(x, p, sizes, order)
    ref, ref_p = moe_utils.sort_chunks_by_idxs(x.detach(), sizes, order, probs=p.detach())
    assert torch.equal(out, ref) and torch.equal(pp, ref_p)
    assert torch.equal(perm.moe_sort_chunks_by_index(x.detach(), sizes, order), ref)
    gy, gp = _randn(14, 9, dtype=dtype, seed=1), torch.rand(14).to(dtype)
    torch.autograd.backward((out, pp), (gy, gp))
    inverse = torch.cat([torch.split(torch.arange(14), sizes.tolist())[i] for i in order.tolist()])
    assert torch.equal(x.grad[inverse], gy) and torch.equal(p.grad[inverse], gp)


# ------------------------------------------------------------------------------ FP8
@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_float8_tensor_bytes_permuted_scale_kept(fp8_dtype):
    t, e, h, k = 12, 6, 32, 2
    rm = _routing(t, e, k, seed=5)
    q = Float8Quantizer(torch.tensor([4.0]), torch.zeros(1), fp8_dtype, columnwise=False)
    xq = q(_randn(t, h, dtype=torch.bfloat16))
    assert isinstance(xq, Float8Tensor)
    out, row_id_map = perm.moe_permute(xq, rm)
    assert isinstance(out, Float8Tensor) and out._scale_inv is xq._scale_inv
    tok, _ = _routes(rm, t * k)
    assert torch.equal(out._data, xq._data[tok])
    assert torch.equal(out.dequantize(), xq.dequantize()[tok])
    sizes, order = torch.tensor([5, 7]), torch.tensor([1, 0])
    sq = perm.moe_sort_chunks_by_index(xq, sizes, order)
    assert isinstance(sq, Float8Tensor)
    assert torch.equal(sq._data, torch.cat([xq._data[5:], xq._data[:5]]))
    with pytest.raises(NotImplementedError, match="inp"):
        perm.moe_unpermute(out, row_id_map)


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_mxfp8_tensor_bytes_and_scale_rows_permuted(fp8_dtype):
    t, e, h, k = 12, 6, 96, 2
    rm = _routing(t, e, k, seed=6)
    xq = MXFP8Quantizer(fp8_dtype, rowwise=True, columnwise=True)(_randn(t, h, seed=3) * 4)
    n = t * k - 3
    out, row_id_map = perm.moe_permute(xq, rm, num_out_tokens=n)
    assert isinstance(out, MXFP8Tensor) and out._columnwise_data is None  # TE's: row-wise only
    tok, _ = _routes(rm, n)
    assert torch.equal(out._rowwise_data, xq._rowwise_data[tok])
    assert torch.equal(out._rowwise_scale_inv, xq._rowwise_scale_inv[tok])
    assert torch.equal(out.dequantize(), xq.dequantize()[tok])
    # unpermute's backward (no merging probs) permutes an MXFP8 gradient the same way.
    y = _randn(n, h, seed=4).requires_grad_()
    z = perm.moe_unpermute(y, row_id_map, restore_shape=(t, h))
    gq = MXFP8Quantizer(fp8_dtype, rowwise=True, columnwise=False)(_randn(t, h, seed=5))
    (gy,) = torch.autograd.grad(z, y, gq)
    assert isinstance(gy, MXFP8Tensor)
    assert torch.equal(gy._rowwise_data, gq._rowwise_data[tok])
    assert torch.equal(gy._rowwise_scale_inv, gq._rowwise_scale_inv[tok])
    col_only = MXFP8Quantizer(fp8_dtype, rowwise=False, columnwise=True)(_randn(32, h))
    with pytest.raises(ValueError, match="row-wise"):
        perm.moe_permute(col_only, _routing(32, e, k))
    with pytest.raises(NotImplementedError, match="inp"):
        perm.moe_sort_chunks_by_index(xq, torch.tensor([5, 7]), torch.tensor([1, 0]))


# ------------------------------------------------------------------------------ index map
def ref_index_permute(x, idx, n):
    """Routes sorted stably by expert (route id t * topK + k breaks ties), first n kept."""
    order = torch.argsort(idx.reshape(-1).long(), stable=True)
    k = idx.shape[1]
    return x.double()[order[:n] // k], order


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 0), (9, 4, 5, 2, 3), (40, 7, 67, 3, 0),
                                   (33, 70, 33, 5, 17)], ids=lambda s: "x".join(map(str, s)))
def test_index_map_matches_reference(shape, dtype):
    t, e, h, k, drop = shape
    g = torch.Generator().manual_seed(t)
    idx = torch.randint(-2, e - 2, (t, k), generator=g, dtype=torch.int32)  # repeats, negatives
    n = t * k - drop
    x = _randn(t, h, dtype=dtype, seed=1).requires_grad_()
    out, row_id_map = perm.moe_permute(x, idx, num_out_tokens=n, map_type="index")
    ref, order = ref_index_permute(x.detach(), idx, n)
    assert torch.equal(out.double(), ref)
    ref_map = torch.full((t * k,), -1, dtype=torch.int32)
    pos = torch.arange(t * k, dtype=torch.int32)
    ref_map[order] = torch.where(pos < n, pos, -1)
    # TE's layout: route (t, k) at k * num_tokens + t.
    assert torch.equal(row_id_map, ref_map.reshape(t, k).T.reshape(-1))
    gy = _randn(n, h, dtype=dtype, seed=2)
    (gx,) = torch.autograd.grad(out, x, gy)
    ref_gx = torch.zeros(t, h, dtype=torch.float64).index_add_(0, order[:n] // k, gy.double())
    assert_close(gx, ref_gx.to(dtype), dtype)  # up to topK terms summed in fp32

    y = out.detach().requires_grad_()
    probs = torch.rand(t, k, generator=g).to(dtype).requires_grad_()
    if dtype == torch.float32:
        z = perm.moe_unpermute(y, row_id_map, merging_probs=probs, map_type="index")
    else:  # TE's warning, then probs taken in fp32
        with pytest.warns(UserWarning, match="float32"):
            z = perm.moe_unpermute(y, row_id_map, merging_probs=probs, map_type="index")
    w = torch.zeros(t * k, dtype=torch.float64)
    w[order[:n]] = 1.0
    rows = torch.zeros(t * k, h, dtype=torch.float64)
    rows[order[:n]] = y.detach().double()
    p64 = probs.detach().float().double()
    ref_z = (rows.view(t, k, h) * p64.unsqueeze(-1)).sum(1)
    assert_close(z, ref_z.to(dtype), dtype)
    gz = _randn(t, h, dtype=dtype, seed=3)
    gy2, gp = torch.autograd.grad(z, (y, probs), gz)
    ref_gy = (gz.double().unsqueeze(1) * p64.unsqueeze(-1)).reshape(t * k, h)[order[:n]]
    assert_close(gy2, ref_gy.to(dtype), dtype)
    ref_gp = (rows.view(t, k, h) * gz.double().unsqueeze(1)).sum(-1) * w.view(t, k)
    assert gp.dtype == dtype
    assert_close(gp, ref_gp.to(dtype), dtype)


def test_index_map_topk1_no_probs_is_the_inverse():
    x = _randn(10, 6, seed=7).requires_grad_()
    idx = torch.tensor([[3], [1], [3], [0], [2], [1], [0], [3], [2], [2]], dtype=torch.int32)
    out, row_id_map = perm.moe_permute(x, idx, map_type="index")
    z = perm.moe_unpermute(out, row_id_map, map_type="index")  # TE: topK = 1 without probs
    assert torch.equal(z, x.detach())
    (gx,) = torch.autograd.grad(z, x, torch.ones_like(z))
    assert torch.equal(gx, torch.ones_like(x))
    with pytest.warns(UserWarning, match="int32"):
        out64, _ = perm.moe_permute(x, idx.long(), map_type="index")
    assert torch.equal(out64, out)
    empty, emap = perm.moe_permute(torch.zeros(0, 4), torch.zeros(0, 2, dtype=torch.int32),
                                   map_type="index")
    assert empty.shape == (0, 4) and emap.numel() == 0


def test_index_map_errors_name_the_argument():
    x, idx = torch.zeros(4, 3), torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="routing_map"):
        perm.moe_permute(x, torch.zeros(5, 2, dtype=torch.int32), map_type="index")
    with pytest.raises(TypeError, match="index"):
        perm.moe_permute(x, idx.float(), map_type="index")
    with pytest.raises(TypeError, match="inp"):
        perm.moe_permute(x.int(), idx, map_type="index")
    q = Float8Quantizer(torch.tensor([1.0]), torch.zeros(1), torch.float8_e4m3fn)
    with pytest.raises(NotImplementedError, match="inp"):
        perm.moe_permute(q(x), idx, map_type="index")
    out, row_id_map = perm.moe_permute(x, idx, map_type="index")
    with pytest.raises(ValueError, match="merging_probs"):
        perm.moe_unpermute(out, row_id_map, merging_probs=torch.ones(4, 3), map_type="index")
    with pytest.raises(ValueError, match="row_id_map"):
        perm.moe_unpermute(out, row_id_map.view(4, 2), map_type="index")


# ------------------------------------------------------------------------------ errors
def test_errors_name_the_argument():
    x, rm = torch.zeros(4, 3), torch.zeros(4, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="map_type"):
        perm.moe_permute(x, rm, map_type="dense")
    with pytest.raises(TypeError, match="routing_map"):
        perm.moe_permute(x, rm.float())
    with pytest.raises(ValueError, match="routing_map"):
        perm.moe_permute(x, torch.zeros(5, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="inp"):
        perm.moe_permute(x.int(), rm)
    with pytest.raises(TypeError, match="num_out_tokens"):
        perm.moe_permute(x, rm, num_out_tokens=2.0)
    with pytest.raises(ValueError, match="probs"):
        perm.moe_permute_with_probs(x, torch.zeros(4, 3), rm)
    _, row_id_map = perm.moe_permute(x, rm)
    with pytest.raises(ValueError, match="merging_probs"):
        perm.moe_unpermute(x, row_id_map, merging_probs=torch.ones(4, 3))
    with pytest.raises(ValueError, match="probs"):
        perm.moe_unpermute(x, row_id_map, merging_probs=torch.ones(4, 2), probs=torch.ones(4, 2))
    with pytest.raises(TypeError, match="row_id_map"):
        perm.moe_unpermute(x, row_id_map.long())
    with pytest.raises(ValueError, match="sorted_index"):
        perm.moe_sort_chunks_by_index(x, torch.tensor([1, 3]), torch.tensor([0]))
    with pytest.raises((ValueError, RuntimeError), match="split_sizes"):
        perm.moe_sort_chunks_by_index(x, torch.tensor([1, 2]), torch.tensor([1, 0]))


# ------------------------------------------------------------------------------ opcheck cases
def _map_case(t=6, e=5, k=2, n=None):
    rm = _routing(t, e, k, seed=11)
    return perm._ops.moe_make_row_id_map(rm, -1 if n is None else n)


PERMUTATION_OPCHECK_CASES: list[tuple[str, str, Callable[[], tuple]]] = [
    ("moe_make_row_id_map", "bool", lambda: (_routing(6, 5, 2), -1)),
    ("moe_make_row_id_map", "int32-drop", lambda: (_routing(6, 5, 2).int(), 9)),
    ("moe_permute_with_mask_map", "probs-bf16",
     lambda: (_randn(6, 7, dtype=torch.bfloat16), _map_case(), torch.rand(6, 5), 12)),
    ("moe_permute_with_mask_map", "fp8",
     lambda: (_randn(6, 7).to(torch.float8_e4m3fn), _map_case(), None, 12)),
    ("moe_unpermute_with_mask_map", "merging-probs",
     lambda: (_randn(12, 7), _map_case(), torch.rand(6, 5), torch.rand(12), 6)),
    ("moe_unpermute_with_mask_map", "sum-fp16",
     lambda: (_randn(12, 7, dtype=torch.float16), _map_case(), None, None, 6)),
    ("moe_unpermute_with_mask_map_bwd_with_merging_probs", "fp32",
     lambda: (_randn(6, 7), _map_case(), _randn(12, 7, seed=1), torch.rand(6, 5))),
    ("moe_index_make_row_id_map", "drop",
     lambda: (torch.tensor([[2, 0], [1, 2], [0, 0]], dtype=torch.int32), 5)),
    ("moe_permute_with_index_map", "bf16",
     lambda: (_randn(3, 7, dtype=torch.bfloat16),
              torch.tensor([4, 2, 0, 5, 1, 3], dtype=torch.int32), 6)),
    ("moe_unpermute_with_index_map", "probs",
     lambda: (_randn(6, 7), torch.tensor([4, 2, 0, 5, 1, -1], dtype=torch.int32),
              torch.rand(3, 2), 3)),
    ("moe_unpermute_with_index_map_bwd", "fp16",
     lambda: (_randn(3, 7, dtype=torch.float16),
              torch.tensor([4, 2, 0, 5, 1, 3], dtype=torch.int32),
              _randn(6, 7, dtype=torch.float16, seed=1), torch.rand(3, 2))),
    ("moe_make_chunk_sort_map", "int64",
     lambda: (torch.tensor([2, 0, 3, 1]), torch.tensor([3, 1, 0, 2]), 6)),
    ("moe_sort_chunks_by_map", "fwd-probs",
     lambda: (_randn(6, 7), torch.tensor([1, 2, 4, 5, 0, 3], dtype=torch.int32), torch.rand(6),
              True)),
    ("moe_sort_chunks_by_map", "bwd-bf16",
     lambda: (_randn(6, 7, dtype=torch.bfloat16),
              torch.tensor([1, 2, 4, 5, 0, 3], dtype=torch.int32), None, False)),
]


@pytest.mark.parametrize(
    "name,factory",
    [(c[0], c[2]) for c in PERMUTATION_OPCHECK_CASES],
    ids=[f"{c[0]}-{c[1]}" for c in PERMUTATION_OPCHECK_CASES],
)
def test_opcheck(name, factory):
    run_opcheck(name, factory())
