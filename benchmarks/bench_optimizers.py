#!/usr/bin/env python
"""Times one step of TE's FusedAdam (ours) against torch.optim.AdamW (its CPU default, foreach, and
fused=True where this torch build runs it on the CPU); checks the parameters after a few steps against an fp64 AdamW
before a time counts.

    python benchmarks/bench_optimizers.py                  # all cases, full sizes
    python benchmarks/bench_optimizers.py --quick          # small sizes (smoke test)
    python benchmarks/bench_optimizers.py --cases adam_fp32_vs_foreach --json out.json

Parameters: 100 tensors totalling 50M elements (`--quick`: 20 tensors, 2M), sizes in the ratio
1 : 2 : ... : 10 repeating, so that small and large tensors mix as in a model. One timed call = one
`step()` with fixed gradients (AdamW: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01).
ratio = ref_ms / ours_ms (> 1: ours is faster).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

import sys
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Case, NotAvailable, bf16_close, cli, first_error

from transformer_engine_lite.common import build_info
from transformer_engine_lite.pytorch.optimizers import FusedAdam

OPTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
CHECK_STEPS = 3


def _sizes(quick: bool) -> list[int]:
    n, total = (20, 2_000_000) if quick else (100, 50_000_000)
    weights = [i % 10 + 1 for i in range(n)]
    sizes = [total * w // sum(weights) for w in weights]
    sizes[-1] += total - sum(sizes)
    return sizes


def _tensors(quick: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """fp32 initial values and gradients (the same for every side)."""
    g = torch.Generator().manual_seed(1234)
    sizes = _sizes(quick)
    vals = [torch.randn(s, generator=g) for s in sizes]
    grads = [torch.randn(s, generator=g) * 1e-2 for s in sizes]
    return vals, grads


def _adamw_fp64(vals: list[torch.Tensor], grads: list[torch.Tensor],
                steps: int) -> list[torch.Tensor]:
    """AdamW (decoupled weight decay, bias correction) in fp64: the independent reference."""
    lr, (b1, b2), eps, wd = OPTS["lr"], OPTS["betas"], OPTS["eps"], OPTS["weight_decay"]
    out = []
    for v, gr in zip(vals, grads):
        p, g = v.double(), gr.double()
        m, s = torch.zeros_like(p), torch.zeros_like(p)
        for t in range(1, steps + 1):
            p = p * (1 - lr * wd)
            m = b1 * m + (1 - b1) * g
            s = b2 * s + (1 - b2) * g * g
            p = p - lr * (m / (1 - b1**t)) / ((s / (1 - b2**t)).sqrt() + eps)
        out.append(p)
    return out


def _torch_adamw(params: list[torch.Tensor], variant: str) -> torch.optim.Optimizer:
    """variant: "default" (torch's choice for CPU tensors: the per-tensor loop), "foreach" or
    "fused"."""
    kw = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[variant]
    try:
        opt = torch.optim.AdamW(params, **OPTS, **kw)
        if variant == "fused":  # torch checks device support at the first step
            probe = [torch.zeros(1, requires_grad=True)]
            probe[0].grad = torch.zeros(1)
            torch.optim.AdamW(probe, **OPTS, fused=True).step()
    except (RuntimeError, ValueError) as e:
        raise NotAvailable(f"torch.optim.AdamW(fused=True) on the CPU: {e}") from e
    return opt


def _cat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


def _fp32_case(variant: str) -> Callable[[bool], Case]:
    """fp32 parameters, fp32 states: FusedAdam vs AdamW(default | foreach | fused)."""

    def build(quick: bool) -> Case:
        vals, grads = _tensors(quick)

        def make() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
            ours = [torch.nn.Parameter(v.clone()) for v in vals]
            ref = [torch.nn.Parameter(v.clone()) for v in vals]
            for p, q, g in zip(ours, ref, grads):
                p.grad, q.grad = g, g.clone()
            return ours, ref

        ours_p, ref_p = make()
        ours_opt, ref_opt = FusedAdam(ours_p, **OPTS), _torch_adamw(ref_p, variant)

        def check() -> str | None:
            cp, rp = make()
            co, ro = FusedAdam(cp, **OPTS), _torch_adamw(rp, variant)
            for _ in range(CHECK_STEPS):
                co.step()
                ro.step()
            exact = _cat(_adamw_fp64(vals, grads, CHECK_STEPS))
            return bf16_close(_cat(cp).detach(), _cat(rp).detach(), exact, "params")

        return Case(ours_opt.step, ref_opt.step, check,
                    notes=[f"{len(vals)} fp32 tensors, {sum(v.numel() for v in vals):,} elements"])

    return build


def _bf16_master_case(variant: str) -> Callable[[bool], Case]:
    """bf16 parameters with fp32 master weights: FusedAdam(master_weights=True) (one fused pass:
    update the master, write the bf16 parameter) vs AdamW(variant) on fp32 master copies, then the
    copy back into the bf16 parameters (what mixed-precision training does with torch alone)."""
    return lambda quick: _bf16_master(quick, variant)


def _bf16_master(quick: bool, variant: str) -> Case:
    vals, grads = _tensors(quick)
    vals = [v.bfloat16().float() for v in vals]  # masters start at the bf16 values on both sides

    def make() -> tuple[list[torch.Tensor], FusedAdam, Callable[[], None], list[torch.Tensor],
                        list[torch.Tensor]]:
        ours = [torch.nn.Parameter(v.bfloat16()) for v in vals]
        for p, g in zip(ours, grads):
            p.grad = g.bfloat16()
        opt = FusedAdam(ours, **OPTS, master_weights=True)
        model = [torch.nn.Parameter(v.bfloat16()) for v in vals]
        master = [torch.nn.Parameter(v.clone()) for v in vals]
        for p, g in zip(master, grads):
            p.grad = g.bfloat16().float()
        ref_opt = _torch_adamw(master, variant)

        @torch.no_grad()
        def ref_step() -> None:
            ref_opt.step()
            for m, w in zip(model, master):  # a loop: torch's CPU _foreach_copy_ is far slower
                m.copy_(w)

        return ours, opt, ref_step, model, master

    ours_p, ours_opt, ref_step, _, _ = make()

    def check() -> str | None:
        cp, co, rstep, model, master = make()
        for _ in range(CHECK_STEPS):
            co.step()
            rstep()
        exact = _cat(_adamw_fp64(vals, [g.bfloat16().float() for g in grads], CHECK_STEPS))
        ours_master = _cat([co.get_unscaled_state(p, "master_param") for p in cp])
        return first_error(
            bf16_close(ours_master, _cat(master).detach(), exact, "master weights"),
            bf16_close(_cat(cp).detach().float(), _cat(model).detach().float(), exact,
                       "bf16 params"),
        )

    return Case(ours_opt.step, ref_step, check,
                notes=[f"{len(vals)} bf16 tensors + fp32 masters, "
                       f"{sum(v.numel() for v in vals):,} elements"])


CASES: dict[str, tuple[Callable[[bool], Case], float | None]] = {
    "adam_fp32_vs_default": (_fp32_case("default"), None),
    "adam_fp32_vs_foreach": (_fp32_case("foreach"), None),
    "adam_fp32_vs_fused": (_fp32_case("fused"), None),
    "adam_bf16_master_vs_default": (_bf16_master_case("default"), None),
    "adam_bf16_master_vs_fused": (_bf16_master_case("fused"), None),
}


def header() -> str:
    info = build_info()
    return (
        f"transformer_engine_lite {info['version']} (library threads {info.get('max_threads')}); "
        f"torch {torch.__version__} threads {torch.get_num_threads()}"
    )


def main(argv: list[str] | None = None) -> int:
    return cli(__doc__, CASES, header, argv, default_repeat=(10, 5), fatal=(RuntimeError,))


if __name__ == "__main__":
    sys.exit(main())
