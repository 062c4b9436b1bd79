"""pytorch.cross_entropy.parallel_cross_entropy (TE's) against torch.nn.functional.cross_entropy in
fp64: dtypes, (B, SQ, V) and (SQ, B, V), label smoothing, ignore_idx, reduce_loss on and off,
forward and backward with a non-trivial grad_output, is_cg_capturable; the vocab split over 2 gloo
processes equal to one process; argument errors; torch.compile; the opcheck cases of the ops
(CROSS_ENTROPY_OPCHECK_CASES, collected by test_ops.py)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

pytest.importorskip(
    "transformer_engine_lite.pytorch.te_lite_ops",
    reason="PyTorch extension not built",
    exc_type=ImportError,
)

from utils import assert_close  # noqa: E402

import transformer_engine_lite.pytorch as te  # noqa: E402
from transformer_engine_lite.pytorch.cross_entropy import parallel_cross_entropy  # noqa: E402

IGNORE = -100


def _inputs(shape, dtype, seed=0, ignore=True, ignore_idx=IGNORE):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype)
    t = torch.randint(0, shape[-1], shape[:2], generator=g)
    if ignore:
        t.view(-1)[::5] = ignore_idx
    return x, t


def _reference(x, t, label_smoothing, reduce_loss, ignore_idx=IGNORE):
    """fp64 loss (TE's shape / reduction: the mean over all B * SQ tokens) and its gradient."""
    x64 = x.detach().double().requires_grad_(True)
    per = F.cross_entropy(
        x64.reshape(-1, x.shape[-1]),
        t.reshape(-1),
        label_smoothing=label_smoothing,
        reduction="none",
        ignore_index=ignore_idx,
    ).reshape(x.shape[:2])
    loss = per.sum() / per.numel() if reduce_loss else per
    return x64, loss


def _run(x, t, label_smoothing, reduce_loss, g_out, **kw):
    xi = x.clone().requires_grad_(True)
    loss = parallel_cross_entropy(xi, t, label_smoothing, reduce_loss, None, IGNORE, **kw)
    loss.backward(g_out)
    return loss, xi.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduce_loss", [False, True], ids=["none", "mean"])
@pytest.mark.parametrize("shape", [(2, 5, 301), (7, 1, 1000), (1, 1, 3)], ids=str)
def test_matches_torch(dtype, label_smoothing, reduce_loss, shape):
    x, t = _inputs(shape, dtype, seed=shape[2])
    g = torch.Generator().manual_seed(1)
    g_out = torch.tensor(0.7) if reduce_loss else torch.rand(shape[:2], generator=g) + 0.5
    loss, dx = _run(x, t, label_smoothing, reduce_loss, g_out)
    x64, ref = _reference(x, t, label_smoothing, reduce_loss)
    ref.backward(g_out.double())
    assert loss.dtype == torch.float32 and loss.shape == ref.shape
    assert dx.dtype == dtype
    assert_close(loss, ref, torch.float32, "loss")
    assert_close(dx, x64.grad, dtype, "grad")
    if not reduce_loss:
        assert torch.all(loss.view(-1)[t.view(-1) == IGNORE] == 0)
        assert torch.all(dx.view(-1, shape[2])[t.view(-1) == IGNORE] == 0)


def test_input_not_overwritten_and_grad_output_one():
    x, t = _inputs((3, 4, 50), torch.float32)
    keep = x.clone()
    xi = x.requires_grad_(True)
    loss = parallel_cross_entropy(xi, t, 0.0, True)
    loss.backward()  # grad_output exactly 1: the saved gradient itself, copied into .grad
    assert torch.equal(x.detach(), keep)
    x64, ref = _reference(keep, t, 0.0, True)
    ref.backward()
    assert_close(xi.grad, x64.grad, torch.float32, "grad")


@pytest.mark.parametrize("capturable", [False, True])
def test_retain_graph_twice_and_capturable(capturable):
    """Two backward calls through one graph give the same gradient (the saved one is not scaled in
    place); is_cg_capturable changes nothing observable."""
    x, t = _inputs((2, 3, 40), torch.bfloat16)
    xi = x.clone().requires_grad_(True)
    loss = parallel_cross_entropy(xi, t, 0.1, False, None, IGNORE, capturable)
    g_out = torch.full((2, 3), 2.0)
    loss.backward(g_out, retain_graph=True)
    first = xi.grad.clone()
    xi.grad = None
    loss.backward(g_out)
    assert torch.equal(first, xi.grad)


def test_custom_ignore_idx_and_int32_target():
    x, t = _inputs((2, 6, 33), torch.float32, ignore_idx=7)
    xi = x.clone().requires_grad_(True)
    loss = parallel_cross_entropy(xi, t.to(torch.int32), 0.0, False, None, 7)
    loss.sum().backward()
    x64, ref = _reference(x, t, 0.0, False, ignore_idx=7)
    ref.sum().backward()
    assert_close(loss, ref, torch.float32, "loss")
    assert_close(xi.grad, x64.grad, torch.float32, "grad")


def test_swapped_dims_equal_to_batch_first():
    x, t = _inputs((3, 4, 64), torch.float32)
    a = parallel_cross_entropy(x, t, 0.1, False)
    b = parallel_cross_entropy(x.transpose(0, 1), t.transpose(0, 1), 0.1, False)
    assert torch.equal(a, b.transpose(0, 1))


def test_exported_where_te_exports_it():
    assert te.parallel_cross_entropy is parallel_cross_entropy
    import transformer_engine_lite.pytorch.cross_entropy as ce

    assert ce.__all__ == ["parallel_cross_entropy"]


@pytest.mark.parametrize(
    "args, match",
    [
        ((torch.randn(4, 10), torch.zeros(4, dtype=torch.long)), r"'_input'.*3-D.*shape \(4, 10\)"),
        ((torch.randn(2, 2, 10), torch.zeros(3, dtype=torch.long)), r"'target'.*expected 4.*(3,)"),
        ((torch.randn(2, 2, 10), torch.zeros(2, 2)), r"'target'.*integer tensor.*float32"),
        ((torch.randn(2, 2, 10).int(), torch.zeros(2, 2, dtype=torch.long)), r"'_input'.*int32"),
        ((torch.randn(2, 2, 10), torch.zeros(2, 2, dtype=torch.long), 1.5), r"'label_smoothing'"),
    ],
)
def test_bad_arguments_raise_value_error(args, match):
    with pytest.raises(ValueError, match=match):
        parallel_cross_entropy(*args)


def test_target_out_of_range_raises():
    t = torch.tensor([[0, 10]])
    with pytest.raises(RuntimeError, match=r"'target'.*\[0, 10\).*got 10 at row 1"):
        parallel_cross_entropy(torch.randn(1, 2, 10), t)
    with pytest.raises(RuntimeError, match=r"'target'.*got -1 at row 0"):
        parallel_cross_entropy(torch.randn(1, 2, 10), torch.tensor([[-1, 0]]))


def test_compile_fullgraph():
    x, t = _inputs((2, 3, 40), torch.float32)

    def f(x, t):
        return parallel_cross_entropy(x, t, 0.1, True)

    xe = x.clone().requires_grad_(True)
    xc = x.clone().requires_grad_(True)
    eager = f(xe, t)
    eager.backward()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(xc, t)
    compiled.backward()
    assert_close(compiled, eager, "compiled", "loss")
    assert_close(xc.grad, xe.grad, "compiled", "grad")


# ------------------------------------------------------------------------- 2 processes (gloo)
def _grad_out(reduce_loss: bool) -> torch.Tensor:
    return torch.tensor(1.3) if reduce_loss else torch.linspace(0.5, 1.5, 12).view(3, 4)


def _vocab_parallel_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for ls in (0.0, 0.2):
            for reduce_loss in (False, True):
                for dtype in (torch.float32, torch.bfloat16):
                    x, t = _inputs((3, 4, 2 * 75), dtype, seed=5)
                    shard = x.chunk(world, dim=-1)[rank].clone().requires_grad_(True)
                    loss = parallel_cross_entropy(shard, t, ls, reduce_loss, dist.group.WORLD)
                    loss.backward(_grad_out(reduce_loss))
                    results[(ls, reduce_loss, str(dtype))] = (loss.detach(), shard.grad)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_two_processes_equal_one_process():
    world = 2
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(
            _vocab_parallel_worker,
            args=(world, os.path.join(d, "pg"), d),
            nprocs=world,
            join=True,
        )
        ranks = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(world)]
    for (ls, reduce_loss, dtype_name), _ in ranks[0].items():
        dtype = getattr(torch, dtype_name.split(".")[1])
        x, t = _inputs((3, 4, 150), dtype, seed=5)
        loss1, dx1 = _run(x, t, ls, reduce_loss, _grad_out(reduce_loss))
        what = f"ls={ls} reduce={reduce_loss} {dtype_name}"
        for r in range(world):
            loss_r, dx_r = ranks[r][(ls, reduce_loss, dtype_name)]
            # Same kernels, the sums split at the shard boundary: fp32 rounding only.
            assert_close(loss_r, loss1, torch.float32, f"loss of rank {r}, {what}")
            assert_close(dx_r, dx1.chunk(world, dim=-1)[r], dtype, f"grad of rank {r}, {what}")


# ------------------------------------------------------------------------- opcheck cases
def _stats_case():
    x, t = _inputs((2, 3, 17), torch.float32)
    return x, t, 0, 1, IGNORE


def _fwd_case(dtype):
    x, t = _inputs((2, 3, 17), dtype)
    stats = torch.ops.te_lite.cross_entropy_row_stats(x, t, 0, 1, IGNORE)
    return x, t, stats.unsqueeze(0), 0, IGNORE, 0.1, True


CROSS_ENTROPY_OPCHECK_CASES: list[tuple[str, str, Callable[[], tuple]]] = [
    ("cross_entropy_row_stats", "float32", _stats_case),
    ("cross_entropy_fwd", "float32", lambda: _fwd_case(torch.float32)),
    ("cross_entropy_fwd", "bfloat16", lambda: _fwd_case(torch.bfloat16)),
    ("cross_entropy_bwd", "bf16-per-row", lambda: (torch.randn(6, 17).bfloat16(), torch.rand(6))),
    ("cross_entropy_bwd", "float32-scalar", lambda: (torch.randn(2, 3, 17), torch.tensor(0.5))),
]


@pytest.mark.parametrize(
    "name, factory",
    [(c[0], c[2]) for c in CROSS_ENTROPY_OPCHECK_CASES],
    ids=[f"{c[0]}-{c[1]}" for c in CROSS_ENTROPY_OPCHECK_CASES],
)
def test_opcheck(name, factory):
    torch.library.opcheck(getattr(torch.ops.te_lite, name), factory())
