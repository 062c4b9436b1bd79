"""Attention cases of bench_pytorch.py: te.DotProductAttention (flash backend) against
torch.nn.functional.scaled_dot_product_attention on the CPU, bf16, causal, B=2, H=16, S=2048, D=64
(--quick: B=1, H=4, S=256). Each side gets its natural layout: ours bshd [B, S, H, D], SDPA
[B, H, S, D]. Checked first against an fp64 SDPA (math) on the same values: output and the three
input gradients within 2x of SDPA's own bf16 error (flash-attention's rule, _common.bf16_close).

peak_memory(): peak resident memory of one fwd+bwd at S = 2048, 4096, 8192 (B=1, H=4), ours vs
SDPA's math path, each in a fresh subprocess (ru_maxrss minus the process's baseline): ours grows
linearly in S, the math path quadratically (it materialises [B, H, S, S] scores and probabilities).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import Case, MissingOp, bf16_close, first_error

BF16 = torch.bfloat16


def _sizes(quick: bool) -> tuple[int, int, int, int]:
    return (1, 4, 256, 64) if quick else (2, 16, 2048, 64)


class _Setup:
    def __init__(self, quick: bool) -> None:
        try:
            import transformer_engine_lite.pytorch as te

            self.dpa = te.DotProductAttention(16 if not quick else 4, 64, attn_mask_type="causal",
                                              qkv_format="bshd", attention_dropout=0.0)
        except (ImportError, AttributeError) as e:
            raise MissingOp(f"te.DotProductAttention: {e}") from e
        b, h, s, d = _sizes(quick)
        g = torch.Generator().manual_seed(0)
        self.q, self.k, self.v, self.dout = (
            torch.randn(b, s, h, d, generator=g).to(BF16) for _ in range(4))
        for t in (self.q, self.k, self.v):
            t.requires_grad_()
        # SDPA's layout, contiguous (not a strided view: each side gets the layout it is built for)
        self.qt, self.kt, self.vt = (
            t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (self.q, self.k, self.v))
        self.dout_t = self.dout.transpose(1, 2).contiguous()

    def ours_fwd(self) -> torch.Tensor:
        # TE's DotProductAttention returns [b, s, h * d]; viewed back as bshd for the checks
        with torch.no_grad():
            return self.dpa(self.q, self.k, self.v).view(self.q.shape)

    def ref_fwd(self) -> torch.Tensor:
        with torch.no_grad():
            return F.scaled_dot_product_attention(self.qt, self.kt, self.vt, is_causal=True)

    def ours_fwd_bwd(self) -> list[torch.Tensor]:
        for t in (self.q, self.k, self.v):
            t.grad = None
        out = self.dpa(self.q, self.k, self.v).view(self.q.shape)
        out.backward(self.dout)
        return [out.detach(), self.q.grad, self.k.grad, self.v.grad]

    def ref_fwd_bwd(self) -> list[torch.Tensor]:
        for t in (self.qt, self.kt, self.vt):
            t.grad = None
        out = F.scaled_dot_product_attention(self.qt, self.kt, self.vt, is_causal=True)
        out.backward(self.dout_t)
        return [out.detach(), self.qt.grad, self.kt.grad, self.vt.grad]

    def fp64(self) -> list[torch.Tensor]:
        """fp64 math reference, bhsd: output and gradients."""
        q, k, v = (t.detach().transpose(1, 2).double().requires_grad_() for t in (self.q, self.k, self.v))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(self.dout_t.double())
        return [out.detach(), q.grad, k.grad, v.grad]


_SETUPS: dict[bool, _Setup] = {}


def _setup(quick: bool) -> _Setup:
    if quick not in _SETUPS:
        _SETUPS[quick] = _Setup(quick)
    return _SETUPS[quick]


def _check(s: _Setup, backward: bool) -> str | None:
    ref = s.fp64()
    names = ["output", "dq", "dk", "dv"] if backward else ["output"]
    ours = s.ours_fwd_bwd() if backward else [s.ours_fwd()]
    base = s.ref_fwd_bwd() if backward else [s.ref_fwd()]
    # ours is bshd; compare in bhsd
    return first_error(*(bf16_close(o.transpose(1, 2), b_, r, n)
                         for o, b_, r, n in zip(ours, base, ref, names)))


def fwd_case(quick: bool) -> Case:
    s = _setup(quick)
    return Case(s.ours_fwd, s.ref_fwd, lambda: _check(s, False))


def fwd_bwd_case(quick: bool) -> Case:
    s = _setup(quick)
    return Case(s.ours_fwd_bwd, s.ref_fwd_bwd, lambda: _check(s, True))


CASES: dict[str, tuple[Callable[[bool], Case], float | None]] = {
    "attention_fwd_bf16": (fwd_case, 1.2),
    "attention_fwd_bwd_bf16": (fwd_bwd_case, 1.5),
}


# ------------------------------------------------------------------------------- peak memory
_MEASURE = r"""
import json, resource, sys, torch
import torch.nn.functional as F
which, s = sys.argv[1], int(sys.argv[2])
b, h, d = 1, 4, 64
import transformer_engine_lite.pytorch as te
dpa = te.DotProductAttention(h, d, attn_mask_type="causal", qkv_format="bshd")
shape = (b, s, h, d) if which == "ours" else (b, h, s, d)
q, k, v, g = (torch.randn(*shape).to(torch.bfloat16) for _ in range(4))
for t in (q, k, v):
    t.requires_grad_()
# baseline: the current resident size with inputs allocated (ru_maxrss counts in KiB, statm in pages)
import os
base = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
if which == "ours":
    out = dpa(q, k, v).view(q.shape)
else:
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
out.backward(g)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"extra_mib": (peak - base) / 1024}))
"""


def peak_memory(seqlens: tuple[int, ...] = (2048, 4096, 8192)) -> dict[str, dict[int, float]]:
    """{"ours" | "sdpa_math": {S: extra MiB over the inputs}} for one causal fwd+bwd, B=1, H=4."""
    result: dict[str, dict[int, float]] = {"ours": {}, "sdpa_math": {}}
    for which, key in (("ours", "ours"), ("math", "sdpa_math")):
        for s in seqlens:
            proc = subprocess.run([sys.executable, "-c", _MEASURE, which, str(s)], check=True,
                                  capture_output=True, text=True, env=dict(os.environ))
            result[key][s] = json.loads(proc.stdout.strip().splitlines()[-1])["extra_mib"]
    return result


def print_peak_memory() -> None:
    mem = peak_memory()
    print("peak extra memory, causal fwd+bwd, bf16, B=1 H=4 D=64 (MiB):")
    print(f"  {'S':>6} {'ours':>10} {'sdpa math':>10}")
    for s in mem["ours"]:
        print(f"  {s:>6} {mem['ours'][s]:>10.1f} {mem['sdpa_math'][s]:>10.1f}")
