#!/usr/bin/env python
"""Times TE's fusible-ops API (te.ops.Sequential, through the op fuser) against the module path
(te.LayerNormMLP, te.Linear) with the same parameters, forward + backward; checks that both give
the same results first.

    python benchmarks/bench_fusible_ops.py                 # all cases, full sizes
    python benchmarks/bench_fusible_ops.py --quick         # small sizes (smoke test)

Cases (ratio = module ms / ops ms: > 1 means the ops path is faster):
  ops_mlp_bf16 / ops_mlp_fp8: Sequential(LayerNorm, Linear, GELU, Linear) vs te.LayerNormMLP
      (gelu), bf16, and under fp8_autocast(Float8CurrentScaling). hidden 1024, ffn 4096, 4096
      tokens (--quick: 256, 1024, 512).
  ops_linear_residual_bf16: Sequential(Linear, AddExtraInput(in_place=True)) - the GEMM
      accumulates into the residual (ForwardLinearBiasAdd) - vs te.Linear followed by `+ residual`.
The module path fuses LayerNorm into the first GEMM's input cast and GELU into its epilogue; the
ops path runs them as separate kernels, so these ratios show what the op fuser's fusions recover
and what it leaves. Timing, JSON and exit status: as bench_core.py (benchmarks/_common.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Case, cli, rel_err

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import build_info
from transformer_engine_lite.common.recipe import Float8CurrentScaling

BF16 = torch.bfloat16
RECIPE = Float8CurrentScaling()
# Both sides are our kernels in the same precision; they differ in what is fused (rounding points).
MAX_REL_ERR = {False: 1e-2, True: 6e-2}


def sizes(quick: bool) -> tuple[int, int, int]:
    """(hidden, ffn, tokens)"""
    return (256, 1024, 512) if quick else (1024, 4096, 4096)


def _step(model, x, dy, fp8: bool, extra=None):
    params = list(model.parameters())

    def run():
        for p in params:
            p.grad = None
        x.grad = None
        with te.fp8_autocast(enabled=fp8, fp8_recipe=RECIPE):
            y = model(x) if extra is None else model(x, extra())
        y.backward(dy)
        return y

    return run


def _results(run, model, x) -> dict[str, torch.Tensor]:
    y = run()
    out = {"y": y.detach().float(), "dx": x.grad.float()}
    for name, p in model.named_parameters():
        out[name] = p.grad.float()
    return out


def _check(a: dict, b: dict, names: dict[str, str], fp8: bool) -> str | None:
    for ka, kb in names.items():
        err = rel_err(a[ka], b[kb])
        if not err <= MAX_REL_ERR[fp8]:
            return f"{ka}: relative difference {err:.3g} > {MAX_REL_ERR[fp8]:g}"
    return None


def _mlp(fp8: bool):
    def build(quick: bool) -> Case:
        h, f, t = sizes(quick)
        torch.manual_seed(0)
        module = te.LayerNormMLP(h, f, activation="gelu", params_dtype=BF16)
        seq = te.ops.Sequential(
            te.ops.LayerNorm(h, dtype=BF16), te.ops.Linear(h, f, dtype=BF16), te.ops.GELU(),
            te.ops.Linear(f, h, dtype=BF16),
        )
        with torch.no_grad():
            seq[0].weight.copy_(module.layer_norm_weight)
            seq[0].bias.copy_(module.layer_norm_bias)
            seq[1].weight.copy_(module.fc1_weight)
            seq[1].bias.copy_(module.fc1_bias)
            seq[3].weight.copy_(module.fc2_weight)
            seq[3].bias.copy_(module.fc2_bias)
        x = torch.randn(t, h, dtype=BF16, requires_grad=True)
        dy = torch.randn(t, h, dtype=BF16)
        ours, ref = _step(seq, x, dy, fp8), _step(module, x, dy, fp8)
        names = {"y": "y", "dx": "dx", "0.weight": "layer_norm_weight", "1.weight": "fc1_weight",
                 "3.weight": "fc2_weight", "3.bias": "fc2_bias"}
        return Case(ours, ref, lambda: _check(_results(ours, seq, x), _results(ref, module, x),
                                              names, fp8))

    return build


def _linear_residual(quick: bool) -> Case:
    h, _, t = sizes(quick)
    torch.manual_seed(1)
    module = te.Linear(h, h, params_dtype=BF16)
    seq = te.ops.Sequential(te.ops.Linear(h, h, dtype=BF16), te.ops.AddExtraInput(in_place=True))
    with torch.no_grad():
        seq[0].weight.copy_(module.weight)
        seq[0].bias.copy_(module.bias)
    x = torch.randn(t, h, dtype=BF16, requires_grad=True)
    dy = torch.randn(t, h, dtype=BF16)
    res = torch.randn(t, h, dtype=BF16)
    fresh = res.clone  # the in-place add consumes its residual: a new copy per call, both sides

    class _Residual(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = module

        def forward(self, inp, r):
            return self.linear(inp) + r

    ref_model = _Residual()
    ours = _step(seq, x, dy, False, fresh)
    ref = _step(ref_model, x, dy, False, fresh)
    names = {"y": "y", "dx": "dx", "0.weight": "linear.weight", "0.bias": "linear.bias"}
    return Case(ours, ref, lambda: _check(_results(ours, seq, x), _results(ref, ref_model, x),
                                          names, False))


CASES = {
    "ops_mlp_bf16": (_mlp(False), None),
    "ops_mlp_fp8": (_mlp(True), None),
    "ops_linear_residual_bf16": (_linear_residual, None),
}


def header() -> str:
    info = build_info()
    return (
        f"transformer_engine_lite {info['version']} (gemm: {info.get('gemm_cpu')}); torch "
        f"{torch.__version__} threads {torch.get_num_threads()}"
    )


def main(argv: list[str] | None = None) -> int:
    return cli(__doc__, CASES, header, argv, default_repeat=(5, 3), fatal=(RuntimeError,))


if __name__ == "__main__":
    sys.exit(main())
