#!/usr/bin/env python
"""Times the MoE router and token permutation (transformer_engine_lite.pytorch.router /
.permutation, TE's API), forward + backward, against plain-torch equivalents; checks every result
(outputs and gradients) before its time counts.

    python benchmarks/bench_moe.py                     # all cases, full sizes
    python benchmarks/bench_moe.py --quick             # small sizes (smoke test)

Sizes: 4096 tokens, 64 experts, top-8, hidden 1024, bf16 activations (--quick: 256, 16, 4, 128).
Cases (one timed call = gradients reset to None, forward, backward with a fixed output gradient):
- router_topk_softmax: fused_topk_with_score_function (softmax after top-k, fp32 logits) vs torch
  topk + softmax + scatter into the dense probs and routing map;
- permute_mask_probs: moe_permute_with_probs (mask map) vs Megatron's unfused permute (argsort of
  the transposed mask, index_select) and the probs gathered with masked_select;
- unpermute_mask_merge: moe_unpermute with merging probs (mask map) vs rows * probs + scatter_add;
- permute_unpermute_index: moe_permute + moe_unpermute(merging probs) with map_type="index" vs
  TE's test reference (stable argsort of the indices, index_select, index_copy, weighted sum).
Timing, ratio (= ref_ms / ours_ms, > 1: ours faster), JSON and exit status: benchmarks/_common.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Case, cli, first_error  # noqa: E402

from transformer_engine_lite.common import build_info  # noqa: E402
from transformer_engine_lite.pytorch import permutation as perm  # noqa: E402
from transformer_engine_lite.pytorch import router  # noqa: E402

BF16 = torch.bfloat16


def sizes(quick: bool) -> tuple[int, int, int, int]:
    """(tokens, experts, topk, hidden)."""
    return (256, 16, 4, 128) if quick else (4096, 64, 8, 1024)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _inputs(quick: bool):
    t, e, k, h = sizes(quick)
    logits = torch.randn(t, e, generator=_gen(0))
    idx = logits.topk(k, dim=1).indices
    rm = torch.zeros(t, e, dtype=torch.bool).scatter_(1, idx, True)
    probs = torch.zeros(t, e).scatter_(1, idx, torch.rand(t, k, generator=_gen(1)))
    x = torch.randn(t, h, generator=_gen(2)).to(BF16)
    return t, e, k, h, logits, idx.to(torch.int32), rm, probs, x


def _max_err(what: str, a, b, tol: float) -> str | None:
    """max |ours - ref| <= tol * max(1, max |ref|) (tol 0: bit for bit)."""
    if not a.numel():
        return None
    err = (a.double() - b.double()).abs().max().item()
    bound = tol * max(1.0, b.double().abs().max().item())
    return None if err <= bound else f"{what}: max |ours - ref| = {err:.3g} > {bound:.3g}"


def _step(fn: Callable, leaves: list[torch.Tensor], dys: list) -> Callable[[], list]:
    """Gradients reset, outs = fn(), backward of the differentiable outs with dys; returns outs +
    the leaves' gradients."""

    def run() -> list:
        for p in leaves:
            p.grad = None
        outs = fn()
        pairs = [(o, d) for o, d in zip(outs, dys) if d is not None]
        torch.autograd.backward([o for o, _ in pairs], [d for _, d in pairs])
        return [o.detach() for o in outs] + [p.grad for p in leaves]

    return run


def _compare(ours: Callable, ref: Callable, tols: list[float], names: list[str]) -> Callable:
    def check() -> str | None:
        a, b = ours(), ref()
        return first_error(*(_max_err(n, x, y, tl) for n, x, y, tl in zip(names, a, b, tols)))

    return check


def _router(quick: bool) -> Case:
    t, e, k, _, logits, *_ = _inputs(quick)
    lo, lr = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    dy = torch.randn(t, e, generator=_gen(3))

    def ours_fn():
        probs, rmap = router.fused_topk_with_score_function(lo, k, False, None, None, None,
                                                            "softmax", None)
        return [probs, rmap]

    def ref_fn():
        top, ids = lr.topk(k, dim=1)
        p = torch.softmax(top, dim=-1)
        probs = torch.zeros_like(lr).scatter(1, ids, p)
        return [probs, torch.zeros(t, e, dtype=torch.bool).scatter_(1, ids, True)]

    ours, ref = _step(ours_fn, [lo], [dy, None]), _step(ref_fn, [lr], [dy, None])
    names = ["probs", "routing_map", "dlogits"]
    return Case(ours, ref, _compare(ours, ref, [1e-6, 0, 1e-6], names))


def _permute(quick: bool) -> Case:
    t, e, k, h, _, _, rm, probs, x = _inputs(quick)
    n = t * k
    xo, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    po, pr = probs.clone().requires_grad_(), probs.clone().requires_grad_()
    dy, dp = torch.randn(n, h, generator=_gen(4)).to(BF16), torch.randn(n, generator=_gen(5))

    def ours_fn():
        out, pp, _ = perm.moe_permute_with_probs(xo, po, rm, num_out_tokens=n)
        return [out, pp]

    def ref_fn():
        rmt = rm.T.contiguous()
        token_idx = torch.arange(t).unsqueeze(0).expand(e, -1)
        sorted_idx = token_idx.masked_select(rmt)
        return [xr.index_select(0, sorted_idx), pr.T.contiguous().masked_select(rmt)]

    ours, ref = _step(ours_fn, [xo, po], [dy, dp]), _step(ref_fn, [xr, pr], [dy, dp])
    # dx sums topk bf16 rows: ours in fp32 rounded once, torch's index_add in bf16 (a few ulps).
    return Case(ours, ref, _compare(ours, ref, [0, 0, 2e-2, 0], ["out", "probs", "dx", "dprobs"]))


def _unpermute(quick: bool) -> Case:
    t, e, k, h, _, _, rm, probs, x = _inputs(quick)
    n = t * k
    _, row_id_map = perm.moe_permute(x, rm, num_out_tokens=n)
    y = torch.randn(n, h, generator=_gen(6)).to(BF16)
    yo, yr = y.clone().requires_grad_(), y.clone().requires_grad_()
    po, pr = probs.clone().requires_grad_(), probs.clone().requires_grad_()
    dz = torch.randn(t, h, generator=_gen(7)).to(BF16)
    rmt = rm.T.contiguous()
    sorted_idx = torch.arange(t).unsqueeze(0).expand(e, -1).masked_select(rmt)

    def ours_fn():
        return [perm.moe_unpermute(yo, row_id_map, merging_probs=po, restore_shape=(t, h))]

    def ref_fn():
        w = pr.T.contiguous().masked_select(rmt)
        rows = yr.float() * w.unsqueeze(-1)
        out = torch.zeros(t, h).scatter_add_(0, sorted_idx.unsqueeze(1).expand(-1, h), rows)
        return [out.to(BF16)]

    ours, ref = _step(ours_fn, [yo, po], [dz]), _step(ref_fn, [yr, pr], [dz])
    # bf16 outputs of fp32 sums (both sides), dprobs fp32 dot products over the hidden size.
    return Case(ours, ref, _compare(ours, ref, [1e-2, 1e-2, 1e-4], ["out", "dy", "dprobs"]))


def _index(quick: bool) -> Case:
    t, e, k, h, _, idx, _, _, x = _inputs(quick)
    w = torch.rand(t, k, generator=_gen(8))
    xo, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    wo, wr = w.clone().requires_grad_(), w.clone().requires_grad_()
    dz = torch.randn(t, h, generator=_gen(9)).to(BF16)

    def ours_fn():
        y, row_id_map = perm.moe_permute(xo, idx, map_type="index")
        return [perm.moe_unpermute(y, row_id_map, merging_probs=wo, map_type="index")]

    def ref_fn():
        order = torch.argsort(idx.reshape(-1), stable=True)
        y = xr.index_select(0, order // k)
        back = torch.zeros(t * k, h, dtype=BF16).index_copy(0, order, y)
        return [(back.view(t, k, h).float() * wr.unsqueeze(-1)).sum(1).to(BF16)]

    ours, ref = _step(ours_fn, [xo, wo], [dz]), _step(ref_fn, [xr, wr], [dz])
    return Case(ours, ref, _compare(ours, ref, [1e-2, 2e-2, 1e-4], ["out", "dx", "dprobs"]))


CASES: dict[str, tuple[Callable[[bool], Case], float | None]] = {
    "router_topk_softmax": (_router, None),
    "permute_mask_probs": (_permute, None),
    "unpermute_mask_merge": (_unpermute, None),
    "permute_unpermute_index": (_index, None),
}


def header() -> str:
    info = build_info()
    t, e, k, h = sizes(False)
    return (
        f"transformer_engine_lite {info['version']} (library threads {info.get('max_threads')}); "
        f"torch {torch.__version__} threads {torch.get_num_threads()}; full sizes: tokens {t}, "
        f"experts {e}, topk {k}, hidden {h}, bf16"
    )


def main(argv: list[str] | None = None) -> int:
    return cli(__doc__, CASES, header, argv, default_repeat=(10, 5), fatal=(RuntimeError,))


if __name__ == "__main__":
    sys.exit(main())
