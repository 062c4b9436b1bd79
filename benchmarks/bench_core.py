#!/usr/bin/env python
"""Times the core CPU kernels (through the ctypes C API, on torch tensors) against PyTorch eager and
torch.compile equivalents; checks every output against a reference before its time counts.

    python benchmarks/bench_core.py                       # all cases, full sizes
    python benchmarks/bench_core.py --quick               # small sizes (smoke test)
    python benchmarks/bench_core.py --cases gemm_bf16,gemm_fp8 --json out.json

Timing: `--warmup` calls, then the median of `--repeat` timed calls (time.perf_counter; ours and the
reference alternate call by call), both sides on all cores (torch.set_num_threads and
OMP_NUM_THREADS = os.cpu_count()). Handles and buffers are made once, outside the timed region, so
"ours" is the nvte_* calls alone (ctypes overhead included).
ratio = ref_ms / ours_ms (> 1: ours is faster). A case whose output disagrees with the reference is
reported as a mismatch, left out of the JSON, and makes the exit status 1.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _capi import workspace_for
from _common import Case, MissingOp, NotAvailable, bf16_close, check_call_time, cli, first_error
from _block_cases import CASES as BLOCK_CASES
from _norm_cases import CASES as NORM_CASES

from transformer_engine_lite.common import build_info, capi, get_lib

E4M3_MAX = 448.0
LN_EPS = 1e-5
FP8 = torch.float8_e4m3fn


def require(*ops: str) -> None:
    lib = get_lib()
    missing = [op for op in ops if not hasattr(lib, op)]
    if missing:
        raise MissingOp(", ".join(missing))


# ------------------------------------------------------------------------------------- helpers
def quantize_composite(x: torch.Tensor) -> torch.Tensor:
    """Eager current-scaling E4M3 quantize (amax in fp32, as TE computes the scale)."""
    amax = x.abs().amax().float()
    # A true division: `448.0 / amax` is reciprocal-times-448 in torch, 1 ulp off at times.
    scale = torch.full((), E4M3_MAX) / amax
    return (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


def ln_quantize_composite(x, gamma, beta):
    return quantize_composite(F.layer_norm(x, (x.shape[-1],), gamma, beta, LN_EPS))


def fp8_ordinal(q: torch.Tensor) -> torch.Tensor:
    """Sign-magnitude FP8 codes as ordered integers: neighbours differ by 1, and -0 == +0."""
    c = q.view(torch.uint8).to(torch.int16)
    return torch.where(c >= 128, 128 - c, c)


def fp8_codes_close(
    ours: torch.Tensor, expect: torch.Tensor, what: str, max_frac: float = 1e-3
) -> str | None:
    """Bytes equal except a few that are one code apart (fp32 rounding-order differences)."""
    a, b = fp8_ordinal(ours), fp8_ordinal(expect)
    diff = a != b
    n = int(diff.sum())
    if n == 0:
        return None
    far = int(((a - b).abs() > 1)[diff].sum())
    if far or n > max_frac * a.numel():
        return f"{what}: {n}/{a.numel()} FP8 bytes differ, {far} by more than one code"
    return None


# --------------------------------------------------------------------------------------- cases
def case_quantize(quick: bool, compiled: bool = False) -> Case:
    require("nvte_compute_amax", "nvte_compute_scale_from_amax", "nvte_quantize")
    rows, cols = (1024, 1024) if quick else (8192, 4096)
    torch.manual_seed(0)
    x = (torch.randn(rows, cols) * 3).to(torch.bfloat16)
    q = torch.empty(rows, cols, dtype=FP8)
    scale, amax, scale_inv = torch.zeros(1), torch.zeros(1), torch.zeros(1)
    tx = capi.Tensor(x)
    tq = capi.Tensor(q, scale=scale, amax=amax, scale_inv=scale_inv)

    def ours():
        capi.call("nvte_compute_amax", tx, tq, None)
        capi.call("nvte_compute_scale_from_amax", tq, None, None)
        capi.call("nvte_quantize", tx, tq, None)

    ref = torch.compile(quantize_composite) if compiled else quantize_composite
    notes: list[str] = []

    def check() -> str | None:
        ours()
        expect = quantize_composite(x)
        ref_amax = x.abs().amax().float()
        msgs = [fp8_codes_close(q, expect, "quantized data", max_frac=0.0)]
        if amax.item() != ref_amax.item():
            msgs.append(f"amax {amax.item()} != {ref_amax.item()}")
        ref_scale = (torch.full((), E4M3_MAX) / ref_amax).item()
        if scale.item() != ref_scale:
            msgs.append(f"scale {scale.item()} != {ref_scale} (fp32 448 / amax)")
        if scale_inv.item() != (1.0 / scale).item():
            msgs.append(f"scale_inv {scale_inv.item()} != 1/scale")
        if compiled and not torch.equal(ref(x).view(torch.uint8), expect.view(torch.uint8)):
            notes.append("torch.compile's quantize differs from eager's bytes")
        return first_error(*msgs)

    if compiled:
        ref(x)  # compile outside the timed region
    return Case(ours, lambda: ref(x), check, notes)


def _ln_inputs(quick: bool):
    rows, hidden = (1024, 1024) if quick else (8192, 4096)
    torch.manual_seed(1)
    x = (torch.randn(rows, hidden) * 2 + 0.5).to(torch.bfloat16)
    gamma = (1 + 0.1 * torch.randn(hidden)).to(torch.bfloat16)
    beta = (0.1 * torch.randn(hidden)).to(torch.bfloat16)
    mu, rsigma = torch.empty(rows), torch.empty(rows)
    return x, gamma, beta, mu, rsigma


def _ln_ref32(x, gamma, beta):
    return F.layer_norm(x.float(), (x.shape[-1],), gamma.float(), beta.float(), LN_EPS)


def _ln_call(tx, tg, tb, tz, tmu, trs):
    def call(ws):
        capi.call("nvte_layernorm_fwd", tx, tg, tb, LN_EPS, tz, tmu, trs, ws, 0, False, None)

    return call


def _check_mu_rsigma(x, mu, rsigma) -> str | None:
    xf = x.double()
    mu_ref = xf.mean(-1)
    rs_ref = torch.rsqrt(xf.var(-1, unbiased=False) + LN_EPS)
    if not torch.allclose(mu.double(), mu_ref, rtol=1e-5, atol=1e-5):
        return "mu differs from the fp64 mean"
    if not torch.allclose(rsigma.double(), rs_ref, rtol=1e-5, atol=1e-6):
        return "rsigma differs from fp64"
    return None


def case_layernorm_bf16(quick: bool) -> Case:
    require("nvte_layernorm_fwd")
    x, gamma, beta, mu, rsigma = _ln_inputs(quick)
    z = torch.empty_like(x)
    tx, tg, tb, tz = capi.Tensor(x), capi.Tensor(gamma), capi.Tensor(beta), capi.Tensor(z)
    tmu, trs = capi.Tensor(mu), capi.Tensor(rsigma)
    call = _ln_call(tx, tg, tb, tz, tmu, trs)
    ws = workspace_for(call)

    def ref():
        return F.layer_norm(x, (x.shape[-1],), gamma, beta, LN_EPS)

    def check() -> str | None:
        call(ws)
        return first_error(
            bf16_close(z, ref(), _ln_ref32(x, gamma, beta), "z"), _check_mu_rsigma(x, mu, rsigma)
        )

    return Case(lambda: call(ws), ref, check)


def case_layernorm_fp8(quick: bool, compiled: bool = False) -> Case:
    require("nvte_layernorm_fwd")
    x, gamma, beta, mu, rsigma = _ln_inputs(quick)
    ref32 = _ln_ref32(x, gamma, beta)
    # Delayed scaling: the scale comes from an earlier amax (here that of this very output).
    scale = torch.tensor([E4M3_MAX / ref32.abs().amax().item()])
    amax, scale_inv = torch.zeros(1), torch.zeros(1)
    zq = torch.empty(x.shape, dtype=FP8)
    tx, tg, tb = capi.Tensor(x), capi.Tensor(gamma), capi.Tensor(beta)
    tz = capi.Tensor(zq, scale=scale, amax=amax, scale_inv=scale_inv)
    tmu, trs = capi.Tensor(mu), capi.Tensor(rsigma)
    call = _ln_call(tx, tg, tb, tz, tmu, trs)
    ws = workspace_for(call)
    ref = torch.compile(ln_quantize_composite) if compiled else ln_quantize_composite
    notes: list[str] = []
    if compiled:
        ref(x, gamma, beta)

    def check() -> str | None:
        call(ws)
        expect = (ref32 * scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
        msgs = [fp8_codes_close(zq, expect, "z (fp8)"), _check_mu_rsigma(x, mu, rsigma)]
        ref_amax = ref32.abs().amax().item()
        if abs(amax.item() - ref_amax) > 1e-5 * ref_amax:
            msgs.append(f"amax {amax.item()} != {ref_amax}")
        if scale_inv.item() != (1.0 / scale).item():
            msgs.append(f"scale_inv {scale_inv.item()} != 1/scale")
        if compiled:
            eager = ln_quantize_composite(x, gamma, beta)
            if fp8_codes_close(ref(x, gamma, beta), eager, "compiled"):
                notes.append("torch.compile's LN+quantize differs from eager's beyond one code")
        return first_error(*msgs)

    return Case(lambda: call(ws), lambda: ref(x, gamma, beta), check, notes)


def _gemm_call(tA, tB, tD):
    bias, pre_gelu, ws = capi.Tensor(), capi.Tensor(), capi.Tensor()

    def call():
        # TE's Linear forward: D = B @ A^T, A = weight [n_out, k], B = input [m, k].
        capi.call(
            "nvte_cublas_gemm",
            tA,
            tB,
            tD,
            bias,
            pre_gelu,
            True,
            False,
            False,
            ws,
            False,
            False,
            0,
            None,
        )

    return call


def case_gemm_bf16(quick: bool) -> Case:
    require("nvte_cublas_gemm")
    m = n = k = 512 if quick else 4096
    torch.manual_seed(2)
    w = torch.randn(n, k).to(torch.bfloat16)
    inp = torch.randn(m, k).to(torch.bfloat16)
    d = torch.empty(m, n, dtype=torch.bfloat16)
    call = _gemm_call(capi.Tensor(w), capi.Tensor(inp), capi.Tensor(d))

    def check() -> str | None:
        call()
        rows = slice(0, 64)  # a row slice keeps the fp32 reference cheap
        ref = inp[rows].float() @ w.float().t()
        return bf16_close(d[rows], torch.matmul(inp[rows], w.t()), ref, "D")

    return Case(call, lambda: torch.matmul(inp, w.t()), check)


def _fp8_operand(rows: int, cols: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    hp = torch.randn(rows, cols, generator=g)
    scale = E4M3_MAX / hp.abs().amax().item()
    q = (hp * scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)
    return q, torch.tensor([1.0 / scale])


def _fp8_gemm_setup(size: int):
    w8, w_si = _fp8_operand(size, size, 3)
    x8, x_si = _fp8_operand(size, size, 4)
    d = torch.empty(size, size, dtype=torch.bfloat16)
    call = _gemm_call(
        capi.Tensor(w8, scale_inv=w_si), capi.Tensor(x8, scale_inv=x_si), capi.Tensor(d)
    )

    def check() -> str | None:
        call()
        rows = slice(0, 64)
        xd, wd = x8[rows].float() * x_si, w8.float() * w_si
        ref = xd @ wd.t()
        return bf16_close(d[rows], (xd.bfloat16() @ wd.bfloat16().t()), ref, "D")

    return w8, w_si, x8, x_si, d, call, check


def case_gemm_fp8(quick: bool) -> Case:
    require("nvte_cublas_gemm")
    size = 256 if quick else 2048
    _, _, _, _, _, call, check = _fp8_gemm_setup(size)
    torch.manual_seed(5)
    a = torch.randn(size, size).to(torch.bfloat16)
    b = torch.randn(size, size).to(torch.bfloat16)
    return Case(call, lambda: torch.matmul(a, b.t()), check)


def _probe_scaled_mm(size: int, probe: int = 128) -> None:
    """torch._scaled_mm exists here, and one size^3 call fits the per-call limit: timed at probe^3
    and scaled by the flop count, because on some CPUs it falls into oneDNN's reference matmul
    (6.8 s at 512^3 on a Xeon with AMX, minutes at 2048^3), and the check would call it before the
    timing could bound it."""
    a = torch.randn(probe, probe).to(FP8)
    one = torch.ones(())
    try:
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        t0 = time.perf_counter()
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        seconds = time.perf_counter() - t0
    except (RuntimeError, NotImplementedError, AttributeError) as e:
        raise NotAvailable(f"torch._scaled_mm on the CPU: {type(e).__name__}: {e}") from None
    check_call_time(f"torch._scaled_mm at {size}^3 ({seconds * 1e3:.1f} ms at {probe}^3)",
                    seconds * (size / probe) ** 3, predicted=True)


def case_gemm_fp8_vs_scaled_mm(quick: bool, size: int | None = None) -> Case:
    require("nvte_cublas_gemm")
    size = size or (128 if quick else 512)
    w8, w_si, x8, x_si, d, call, check = _fp8_gemm_setup(size)
    sa, sb = x_si.reshape(()), w_si.reshape(())

    def ref():
        return torch._scaled_mm(x8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

    _probe_scaled_mm(size)

    def check_both() -> str | None:
        msg = check()
        if msg:
            return msg
        ref32 = (x8.float() * x_si) @ (w8.float() * w_si).t()
        return bf16_close(d, ref(), ref32, "D vs _scaled_mm")

    return Case(call, ref, check_both)


def _fp8_vs_scaled_mm_2048(quick: bool) -> Case:
    return case_gemm_fp8_vs_scaled_mm(quick, size=256 if quick else 2048)


def _matmul_path() -> str:
    return build_info()["cpu_isa"].get("matmul_path", "bf16_dot")


# Targets that depend on the CPU's matmul path (platform/cpu_isa.h): where ours widens to fp32
# (Intel without AMX) fp32 FMAs beat torch's bf16 dot products by ~1.75x; where both sides run
# the same bf16 instructions (AMX tiles, AMD's dot products) parity is the goal.
GEMM_BF16_TARGET = {"f32": 1.5, "bf16_dot": 1.0, "bf16_tiles": 1.0}
FP8_VS_SCALED_MM_TARGET = {"f32": 1.3, "bf16_dot": 1.3, "bf16_tiles": 1.0}

# name: (builder, target ratio or None for report-only)
CASES: dict[str, tuple[Callable[[bool], Case], float | None]] = {
    "quantize_current_e4m3": (case_quantize, 4.0),
    "layernorm_fwd_bf16": (case_layernorm_bf16, 1.0),
    "layernorm_fwd_fp8out": (case_layernorm_fp8, 3.0),
    "gemm_bf16": (case_gemm_bf16, GEMM_BF16_TARGET.get(_matmul_path(), 1.0)),
    "gemm_fp8": (case_gemm_fp8, 0.8),
    "gemm_fp8_vs_scaled_mm": (case_gemm_fp8_vs_scaled_mm, None),
    "gemm_fp8_vs_scaled_mm_2048": (
        _fp8_vs_scaled_mm_2048, FP8_VS_SCALED_MM_TARGET.get(_matmul_path(), 1.0)),
    "quantize_current_e4m3_vs_compile": (lambda q: case_quantize(q, compiled=True), 1.0),
    "layernorm_fwd_fp8out_vs_compile": (lambda q: case_layernorm_fp8(q, compiled=True), 1.0),
    **NORM_CASES,
    **BLOCK_CASES,
}


def header() -> str:
    info = build_info()
    return (
        f"transformer_engine_lite {info['version']} ({info['library_path']}), "
        f"gemm: {info.get('gemm_cpu')} (oneDNN ISA {info.get('onednn_isa')}), CPU level "
        f"{info['cpu_isa']['level']} (detected {info['cpu_isa']['detected']}), matmul path "
        f"{info['cpu_isa'].get('matmul_path')}, library threads {info.get('max_threads')}; torch "
        f"{torch.__version__} threads {torch.get_num_threads()}"
    )


def main(argv: list[str] | None = None) -> int:
    return cli(
        __doc__,
        CASES,
        header,
        argv,
        fatal=(capi.NVTEError,),
        describe=lambda e: f"ERROR {e.status.name}: {e}",
    )


if __name__ == "__main__":
    sys.exit(main())
