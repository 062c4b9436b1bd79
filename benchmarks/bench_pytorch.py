#!/usr/bin/env python
"""Times the PyTorch modules (te.Linear, te.LayerNormMLP), forward + backward, in bf16 and under
fp8_autocast(Float8CurrentScaling), against the equivalent torch modules in bf16 and against a
pure-torch FP8 emulation; checks every result (output and all gradients) before its time counts.

    python benchmarks/bench_pytorch.py                     # all cases, full sizes
    python benchmarks/bench_pytorch.py --quick             # small sizes (smoke test)
    python benchmarks/bench_pytorch.py --cases linear_bf16,linear_fp8 --json out.json

Sizes: hidden 2048, ffn 8192, 4096 tokens (--quick: 256, 1024, 512), bf16 parameters and
activations. One timed call = parameter/input gradients reset to None, forward, backward with a
fixed output gradient. References: torch.nn.Linear; torch.nn.LayerNorm + nn.Linear + GELU (tanh,
as TE's) + nn.Linear; the FP8 emulation quantizes each GEMM operand to FP8 with a current
(per-tensor, amax) scale, dequantizes it to bf16 and runs a bf16 matmul (TE's HYBRID format: E4M3
forward, E5M2 gradients; the bias gradient from the unquantized gradient, as TE).
layernorm_mlp_fp8_vs_bf16: our LayerNormMLP under FP8 current scaling against itself in bf16.
Attention cases (attention_fwd_bf16, attention_fwd_bwd_bf16): te.DotProductAttention vs
torch's scaled_dot_product_attention, bf16 causal B=2 H=16 S=2048 D=64; see _attention_cases.py
(peak memory at S up to 8192: bench_attention_memory.py).
TransformerLayer cases (transformer_layer_bf16, transformer_layer_bf16_vs_compile): te.TransformerLayer
vs the same block in plain torch, eager and compiled; see _transformer_cases.py.
Timing, ratio (= ref_ms / ours_ms), JSON and exit status: as bench_core.py (benchmarks/_common.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

import functools
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _attention_cases import CASES as ATTENTION_CASES
from _common import Case, bf16_peer_check, cli, fwd_bwd_step, rel_err
from _transformer_cases import CASES as TRANSFORMER_CASES

import transformer_engine_lite.pytorch as te
from transformer_engine_lite.common import build_info
from transformer_engine_lite.common.recipe import Float8CurrentScaling

LN_EPS = 1e-5
BF16 = torch.bfloat16
# HYBRID: E4M3 for forward operands, E5M2 for gradients
FWD_FP8, BWD_FP8 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {FWD_FP8: 448.0, BWD_FP8: 57344.0}
RECIPE = Float8CurrentScaling()
FP8_TOL = 0.1  # check_fp8: allowed error, as a fraction of the FP8 rounding's own effect


def sizes(quick: bool) -> tuple[int, int, int]:
    """(hidden, ffn, tokens)"""
    return (256, 1024, 512) if quick else (2048, 8192, 4096)


# --------------------------------------------------------------------------- FP8 emulation (torch)
def fake_quant(t: torch.Tensor, dtype: torch.dtype, out_dtype: torch.dtype) -> torch.Tensor:
    """Current scaling round trip: scale = max / amax (fp32, a true division, as TE), cast to FP8
    (nearest even; clamped first, i.e. satfinite), dequantize with 1/scale into out_dtype."""
    amax = t.abs().amax().float()
    scale = torch.full((), FP8_MAX[dtype]) / amax
    q = (t.float() * scale).clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype)
    return (q.float() * (1.0 / scale)).to(out_dtype)


class _EmuFP8Linear(torch.autograd.Function):
    """y = Q(x) Q(W)^T + b; dx = Q(dy) Q(W); dW = Q(dy)^T Q(x); db = sum(dy) (unquantized dy).

    Q dequantizes into W's dtype and the GEMMs run in it; y and dx come out in x's dtype. bf16
    parameters: the benchmark's emulation (bf16 dequantized operands, bf16 matmul). fp32 parameters
    with bf16 x: the exact FP8 computation (FP8 values and scales in fp32, fp32 accumulation, bf16
    results), i.e. what our path computes up to summation order."""

    @staticmethod
    def forward(ctx, x, w, b):
        ct = w.dtype
        x2 = x.reshape(-1, x.shape[-1])
        xq, wq = fake_quant(x2, FWD_FP8, ct), fake_quant(w, FWD_FP8, ct)
        ctx.save_for_backward(xq, wq)
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        y = torch.addmm(b, xq, wq.t()) if b is not None else xq @ wq.t()
        return y.to(x.dtype).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        xq, wq = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        gq = fake_quant(dy2, BWD_FP8, wq.dtype)
        dx = (gq @ wq).to(ctx.x_dtype).reshape(ctx.x_shape)
        dw = gq.t() @ xq
        db = dy2.to(wq.dtype).sum(0)
        return dx, dw, db


class EmuFP8Linear(torch.nn.Linear):
    """nn.Linear whose GEMMs are FP8-emulated (_EmuFP8Linear)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _EmuFP8Linear.apply(x, self.weight, self.bias)


class TorchMLP(torch.nn.Module):
    """nn.LayerNorm + nn.Linear + GELU (tanh) + nn.Linear with parameters in `dtype`.
    fp8: each GEMM FP8-emulated. act_dtype (default `dtype`): activations are rounded to it between
    the ops (fp32 parameters + bf16 act_dtype: fp32 math with our path's bf16 tensors)."""

    def __init__(
        self, hidden: int, ffn: int, dtype: torch.dtype, fp8: bool, act_dtype: torch.dtype | None
    ) -> None:
        super().__init__()
        lin = EmuFP8Linear if fp8 else torch.nn.Linear
        self.ln = torch.nn.LayerNorm(hidden, eps=LN_EPS, dtype=dtype)
        self.fc1 = lin(hidden, ffn, dtype=dtype)
        self.fc2 = lin(ffn, hidden, dtype=dtype)
        self.dt, self.act = dtype, act_dtype or dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt, act = self.dt, self.act
        h = self.fc1(self.ln(x.to(dt)).to(act))
        h = F.gelu(h.to(dt), approximate="tanh").to(act)
        return self.fc2(h).to(act)


# ------------------------------------------------------------------------------------- setups
# te name -> torch name of each parameter
LINEAR_NAMES = {"weight": "weight", "bias": "bias"}
MLP_NAMES = {
    "layer_norm_weight": "ln.weight",
    "layer_norm_bias": "ln.bias",
    "fc1_weight": "fc1.weight",
    "fc1_bias": "fc1.bias",
    "fc2_weight": "fc2.weight",
    "fc2_bias": "fc2.bias",
}
# torch references: (parameter dtype, FP8 emulation, activation dtype)
REFERENCES = {
    "bf16": (BF16, False, BF16),  # the timed torch modules
    "fp32": (torch.float32, False, torch.float32),  # the bf16 cases' accuracy reference
    "fp8_emulation": (BF16, True, BF16),  # the pure-torch FP8 emulation (timed in one case)
    "fp8_exact": (torch.float32, True, BF16),  # the FP8 cases' accuracy reference
}


class Setup:
    """Our module, its inputs, and a factory of torch references with the same parameters."""

    def __init__(self, kind: str, quick: bool) -> None:
        hidden, ffn, tokens = sizes(quick)
        torch.manual_seed(0)
        self.kind, self.quick = kind, quick
        self.names = LINEAR_NAMES if kind == "linear" else MLP_NAMES
        if kind == "linear":
            self.ours = te.Linear(hidden, hidden, params_dtype=BF16, device="cpu")
        else:
            self.ours = te.LayerNormMLP(hidden, ffn, params_dtype=BF16, device="cpu")
        with torch.no_grad():  # non-trivial biases and norm parameters
            for n, p in self.ours.named_parameters():
                if n.endswith("bias"):
                    p.copy_(0.1 * torch.randn_like(p, dtype=torch.float32))
                elif n == "layer_norm_weight":
                    p.copy_(1 + 0.1 * torch.randn_like(p, dtype=torch.float32))
        self.x = torch.randn(tokens, hidden).to(BF16).requires_grad_()
        self.dy = torch.randn(tokens, hidden).to(BF16)
        self.hidden, self.ffn = hidden, ffn

    def torch_module(self, which: str) -> torch.nn.Module:
        dtype, fp8, act = REFERENCES[which]
        if self.kind == "linear":
            lin = EmuFP8Linear if fp8 else torch.nn.Linear
            m: torch.nn.Module = lin(self.hidden, self.hidden, dtype=dtype)
        else:
            m = TorchMLP(self.hidden, self.ffn, dtype, fp8, act)
        params = dict(m.named_parameters())
        with torch.no_grad():
            for ours_name, ref_name in self.names.items():
                params[ref_name].copy_(getattr(self.ours, ours_name))
        return m

    def ours_step(self, fp8: bool) -> Callable[[], torch.Tensor]:
        mod, x, dy = self.ours, self.x, self.dy
        params = list(mod.parameters())

        def step() -> torch.Tensor:
            for p in params:
                p.grad = None
            x.grad = None
            if fp8:
                with te.fp8_autocast(enabled=True, fp8_recipe=RECIPE):
                    y = mod(x)
            else:
                y = mod(x)
            y.backward(dy)
            return y

        return step

    def ref_step(self, mod: torch.nn.Module, x: torch.Tensor | None = None) -> Callable:
        x = self.x if x is None else x
        dy = self.dy.to(x.dtype)
        return fwd_bwd_step(mod, list(mod.parameters()), x, dy)

    def results(self, step: Callable[[], torch.Tensor], mod: torch.nn.Module, x, ours: bool):
        """{name: tensor}: the output, dx and each parameter's gradient (our names)."""
        y = step()
        out = {"y": y.detach().clone(), "dx": x.grad.detach().clone()}
        params = dict(mod.named_parameters())
        for ours_name, ref_name in self.names.items():
            p = params[ours_name if ours else ref_name]
            out[f"d{ours_name}"] = p.grad.detach().clone()
        return out

    def ours_results(self, fp8: bool) -> dict[str, torch.Tensor]:
        return self.results(self.ours_step(fp8), self.ours, self.x, ours=True)

    def ref_results(self, which: str) -> dict[str, torch.Tensor]:
        mod = self.torch_module(which)
        x = self.x.detach().to(REFERENCES[which][2]).requires_grad_()
        return self.results(self.ref_step(mod, x), mod, x, ours=False)


@functools.cache
def setup(kind: str, quick: bool) -> Setup:
    return Setup(kind, quick)


@functools.cache
def reference(kind: str, quick: bool, which: str) -> dict[str, torch.Tensor]:
    """Results of a torch reference (cached: cases share them)."""
    return setup(kind, quick).ref_results(which)


# -------------------------------------------------------------------------------------- checks
def check_bf16(s: Setup) -> str | None:
    """torch bf16 as the peer (_common.bf16_peer_check)."""
    return bf16_peer_check(s.ours_results(fp8=False), reference(s.kind, s.quick, "bf16"),
                           reference(s.kind, s.quick, "fp32"))


def check_fp8(s: Setup) -> str | None:
    """Against the exact FP8 computation (same quantization points and current scales, fp32 math,
    bf16 tensors between the ops): each result's relative error at most FP8_TOL of what the FP8
    rounding itself changes (the unquantized fp32 result's distance to it), plus twice the error of
    rounding the exact result to bf16. An unquantized or mis-scaled path fails."""
    ours = s.ours_results(fp8=True)
    exact = reference(s.kind, s.quick, "fp8_exact")
    unquantized = reference(s.kind, s.quick, "fp32")
    for k in ours:
        fp8_effect = rel_err(unquantized[k], exact[k])
        rounding = rel_err(exact[k].to(BF16), exact[k])
        err = rel_err(ours[k], exact[k])
        if err > FP8_TOL * fp8_effect + 2 * rounding + 1e-5:
            return (
                f"{k}: relative error {err:.3g} vs the exact FP8 computation > {FP8_TOL:g} x the "
                f"FP8 rounding's effect {fp8_effect:.3g} + 2 x bf16 rounding {rounding:.3g}"
            )
    return None


# --------------------------------------------------------------------------------------- cases
def _case(kind: str, fp8: bool, vs_emulation: bool = False) -> Callable[[bool], Case]:
    def build(quick: bool) -> Case:
        s = setup(kind, quick)
        ours = s.ours_step(fp8)
        ref = s.ref_step(s.torch_module("fp8_emulation" if vs_emulation else "bf16"))
        check = (lambda: check_fp8(s)) if fp8 else (lambda: check_bf16(s))
        return Case(ours, ref, check)

    return build


def _fp8_vs_bf16(quick: bool) -> Case:
    """Our LayerNormMLP under FP8 current scaling against itself in bf16 (what FP8 buys us)."""
    s = setup("mlp", quick)
    return Case(s.ours_step(True), s.ours_step(False), lambda: check_fp8(s))


# name: (builder, target ratio or None for report-only)
CASES: dict[str, tuple[Callable[[bool], Case], float | None]] = {
    "linear_bf16": (_case("linear", False), 1.0),
    "linear_fp8": (_case("linear", True), 0.8),
    "layernorm_mlp_bf16": (_case("mlp", False), 1.0),
    "layernorm_mlp_fp8": (_case("mlp", True), 0.8),
    "layernorm_mlp_fp8_vs_emulation": (_case("mlp", True, vs_emulation=True), None),
    "layernorm_mlp_fp8_vs_bf16": (_fp8_vs_bf16, 1.0),
    **ATTENTION_CASES,  # attention_fwd_bf16, attention_fwd_bwd_bf16 (_attention_cases.py)
    # transformer_layer_bf16, transformer_layer_bf16_vs_compile (_transformer_cases.py)
    **TRANSFORMER_CASES,
}


def header() -> str:
    info = build_info()
    return (
        f"transformer_engine_lite {info['version']} (gemm: {info.get('gemm_cpu')}, library threads "
        f"{info.get('max_threads')}); torch {torch.__version__} threads {torch.get_num_threads()}; "
        f"fp8 recipe Float8CurrentScaling({RECIPE.fp8_format.name})"
    )


def main(argv: list[str] | None = None) -> int:
    return cli(__doc__, CASES, header, argv, default_repeat=(7, 5), fatal=(RuntimeError,))


if __name__ == "__main__":
    sys.exit(main())
